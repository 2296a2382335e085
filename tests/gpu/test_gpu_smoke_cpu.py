"""CPU-side checks of the GPU smoke (run/gpu-smoke, issue 11): what can be proven without a GPU.

The recipe validates; the scripts parse; the trainer's slime CLI subset; the exporter on a tiny
torch DCP checkpoint (skipped without torch/safetensors); the engine patch still applies. With
megatron-core importable and SHOPRLD_GPU_SMOKE_CPU=1, the trainer itself runs on CPU
(``--device cpu-emulate``: gloo, megatron-core's CUDA calls patched) through a save and a resume.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.foundation.storage.checkpoints import IterationMapping
from shoprld.daemon.foundation.config.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "run" / "gpu-smoke"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_smoke_{name}", SMOKE / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _has(*mods: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in mods)
    except (ImportError, ValueError):  # a dotted name whose parent is missing
        return False


def test_recipe_validates_and_maps_rounds(tmp_path: Path) -> None:
    shutil.copy(SMOKE / "campaign.toml", tmp_path / "campaign.toml")
    cfg = load_config(tmp_path / "campaign.toml")
    assert (cfg.campaign.rounds, cfg.campaign.steps_per_round, cfg.train.end_offset) == (3, 4, -1)
    assert cfg.export.mode == "convert" and "export_dcp_to_hf.py" in " ".join(cfg.export.command)
    assert "{checkpoint_dir}" in cfg.export.command and "{hf_tmp_dir}" in cfg.export.command
    assert not cfg.sidecar.enabled and not cfg.wandb.enabled and not cfg.disk.require_mount
    argv = " ".join(cfg.train.command)
    assert "torch.distributed.run" in argv and "{recipe_dir}/train_mcore.py" in argv
    for flag in ("--load", "--save", "--save-interval", "--num-rollout"):
        assert flag in cfg.train.command
    assert cfg.train.env["NCCL_NVLS_ENABLE"] == "0" and cfg.train.env["NVSHMEM_DISABLE_NVLS"] == "1"
    m = IterationMapping(cfg.campaign.steps_per_round, cfg.train.end_offset)
    assert [m.end_iteration(r) for r in range(3)] == [3, 7, 11]
    # a mid-round save exists in every round: (id+1) % save_interval == 0 inside the round
    for r in range(3):
        first = m.end_iteration(r - 1) + 1 if r else 0
        mid = [i for i in range(first, m.end_iteration(r)) if (i + 1) % cfg.train.save_interval == 0]
        assert mid, r
    # the required secrets come from the demo tree's fake .env (gate's analyst key only)
    assert set(cfg.required_secrets()) == {"BAILIAN_API_KEY"}


def test_scripts_parse() -> None:
    for name in ("train_mcore", "export_dcp_to_hf", "monitor", "report"):
        py_compile.compile(str(SMOKE / f"{name}.py"), doraise=True)
    subprocess.run(["bash", "-n", str(SMOKE / "smoke.sh")], check=True)


def test_trainer_cli_is_slimes_subset() -> None:
    tm = _module("train_mcore")  # argparse only: torch is imported inside main()
    args, unknown = tm.parse_args(["--load", "/l", "--save", "/s", "--save-interval", "2", "--num-rollout", "8",
                                   "--rollout-batch-size", "16", "--custom-config-path", "x.yaml"])
    assert (args.load, args.save, args.save_interval, args.num_rollout) == ("/l", "/s", 2, 8)
    assert args.optimizer == "megatron" and args.device == "cuda" and not args.cpu_emulate
    assert unknown == ["--rollout-batch-size", "16", "--custom-config-path", "x.yaml"]
    with pytest.raises(SystemExit):
        tm.parse_args(["--load", "/l", "--save", "/s", "--num-rollout", "8"])  # --save-interval is required


def test_trainer_tracker_rules(tmp_path: Path) -> None:
    tm = _module("train_mcore")
    assert tm.read_tracker(str(tmp_path)) is None
    (tmp_path / tm.TRACKER).write_text("7\n")
    assert tm.read_tracker(str(tmp_path)) == 7
    (tmp_path / tm.TRACKER).write_text("")
    with pytest.raises(SystemExit) as exc:  # an unparseable tracker stops the trainer, as Megatron
        tm.read_tracker(str(tmp_path))
    assert exc.value.code == 2


def test_short_mp_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    tm = _module("train_mcore")
    long = tmp_path / ("x" * 90)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    monkeypatch.setenv("TMPDIR", str(long))  # restored afterwards: the trainer sets it for its children
    swapped = tm.short_mp_tmpdir("auto")
    assert swapped is not None and swapped[0] == str(long)
    assert len(tempfile.gettempdir()) + 32 <= tm.AF_UNIX_MAX
    assert os.environ["TMPDIR"] == tempfile.gettempdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    assert tm.short_mp_tmpdir("keep") is None


def test_exporter_refuses_a_partial_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "iter_0000003"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"x" * 64)  # torn: no .metadata, no metadata.json
    proc = subprocess.run([sys.executable, str(SMOKE / "export_dcp_to_hf.py"), "--input-dir", str(d),
                           "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "partial checkpoint" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not _has("torch", "safetensors"), reason="needs torch and safetensors")
def test_exporter_writes_real_safetensors(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "iter_0000003"
    layers, hidden, vocab = 2, 16, 64
    state = {
        "embedding.word_embeddings.weight": torch.randn(vocab, hidden),
        "decoder.layers.self_attention.linear_qkv.weight": torch.randn(layers, 3 * hidden, hidden),
        "decoder.layers.mlp.linear_fc1.weight": torch.randn(layers, 4 * hidden, hidden),
        "decoder.final_layernorm.weight": torch.ones(hidden),
        "output_layer.weight": torch.randn(vocab, hidden),
        "optimizer.state.exp_avg.output_layer.weight": torch.zeros(vocab, hidden),
    }
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(d)), no_dist=True)
    (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    out = tmp_path / "hf"
    proc = subprocess.run([sys.executable, str(SMOKE / "export_dcp_to_hf.py"), "--input-dir", str(d),
                           "--output-dir", str(out), "--max-shard-size", "4KiB"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"])
    assert "model.layers.1.self_attention.linear_qkv.weight" in names and "lm_head.weight" in names
    assert not any("exp_avg" in n for n in names)  # optimizer state is skipped
    assert len(set(index["weight_map"].values())) > 1
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (layers, hidden, vocab)
    from shoprld.daemon.foundation.storage import hfexport

    check = hfexport.verify(out)
    assert check.ok, check.detail
    sys.path.insert(0, str(ROOT / "run" / "demo"))
    try:
        import _common  # the val-server stand-in's own validation

        assert len(_common.validate_hf_dir(out)) == 64
    finally:
        sys.path.remove(str(ROOT / "run" / "demo"))
    from safetensors.torch import load_file

    shard = index["weight_map"]["lm_head.weight"]
    loaded = load_file(str(out / shard))["lm_head.weight"]
    assert loaded.dtype == torch.bfloat16
    assert torch.allclose(loaded.float(), state["output_layer.weight"].bfloat16().float())
    proc = subprocess.run([sys.executable, str(SMOKE / "export_dcp_to_hf.py"), "--input-dir", str(d),
                           "--output-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "exists" in proc.stderr  # like slime's converter without -f


def test_engine_accepts_megatron_core_0_19_checkpoints(tmp_path: Path) -> None:
    """megatron-core 0.19 writes no common.pt; the engine's completeness rule accepts its layout."""
    from shoprld.daemon.foundation.storage.checkpoints import is_complete

    d = tmp_path / "iter_0000005"
    d.mkdir()
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
        (d / name).write_bytes(b"x")
    (d / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5")
    assert is_complete(tmp_path, 5)


@pytest.mark.skipif(not (_has("torch", "megatron.core") and os.environ.get("SHOPRLD_GPU_SMOKE_CPU") == "1"),
                    reason="needs torch + megatron-core and SHOPRLD_GPU_SMOKE_CPU=1 (about a minute of CPU)")
def test_trainer_saves_and_resumes_on_cpu(tmp_path: Path) -> None:
    save = tmp_path / "save"

    def run(n: int) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
             str(SMOKE / "train_mcore.py"), "--load", str(save), "--save", str(save), "--save-interval", "2",
             "--num-rollout", str(n), "--hidden-size", "64", "--num-layers", "2", "--num-attention-heads", "4",
             "--vocab-size", "256", "--seq-length", "32", "--micro-batch-size", "2", "--device", "cpu-emulate"],
            capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return proc.stdout

    first = run(3)
    assert "rollout 2/2" in first and "saved checkpoint iter 1" in first and "saved checkpoint iter 2" in first
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    files = set(os.listdir(save / "iter_0000002"))
    assert {".metadata", "metadata.json", "__0_0.distcp", "__0_1.distcp"} <= files
    second = run(5)
    assert "resume: tracker=2 start_rollout_id=3" in second and "rollout 3/4" in second
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "4"
