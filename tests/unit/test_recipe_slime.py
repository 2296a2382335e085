"""Golden tests for run/slime-4xa800.toml: the seed's train.py argv and Ray runtime env,
argument for argument (shared/SHOPSIMRL.md, scripts/run_shopsimrl_slime.sh), plus the
checks that read the same resolved values (emitted ports, printed commands, exposure)."""

from __future__ import annotations

import hashlib
import json
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoprld.daemon.services import commands
from shoprld.daemon.ops.check import run_check
from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.round import saves
from shoprld.daemon.round.plan import RoundPlan, resolve
from shoprld.daemon.foundation.config.secrets import with_pattern
from tests.roundctx import standalone_context

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "run" / "slime-4xa800.toml"
DEMO = ROOT / "run" / "demo"
PROJECT = "/root/autodl-tmp/ShopSimRL"
BASE = "/root/autodl-tmp/models/Qwen3.5-4B_torch_dist"
HF_ORIGIN = "/root/autodl-tmp/models/Qwen3.5-4B"
EXP = "/root/autodl-tmp/nemo-rl/root/nemo-rl-auto-research/qwen35-4b/qwen35-4b-train-100"
CACHE = "/root/autodl-tmp/nemo-rl/root/cache"
WANDB_KEY = "wandb-golden-key-0123456789abcdef"
BAILIAN_KEY = "bailian-golden-key-0123456789abcdef"
NVIDIA = "/root/miniconda3/envs/slime/lib/python3.12/site-packages/nvidia"
TMP_LINK = "/tmp/shoprld-tmp-" + hashlib.sha1(f"{EXP}/tmp".encode()).hexdigest()[:10]
RAY_LINK = "/tmp/shoprld-ray-" + hashlib.sha1(f"{EXP}/ray".encode()).hexdigest()[:10]

# slime/scripts/models/qwen3.5-4B.sh
MODEL_ARGS = [
    "--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec", "--disable-bias-linear", "--qk-layernorm",
    "--group-query-attention", "--num-attention-heads", "16", "--num-query-groups", "4", "--kv-channels", "256",
    "--num-layers", "32", "--hidden-size", "2560", "--ffn-hidden-size", "9216", "--use-gated-attention",
    "--normalization", "RMSNorm", "--apply-layernorm-1p", "--position-embedding-type", "rope",
    "--norm-epsilon", "1e-6", "--rotary-percent", "0.25", "--swiglu", "--vocab-size", "248320",
    "--rotary-base", "10000000", "--attention-output-gate",
]


def seed_train_argv(r: int, *, save: str, hf: str, load: str, loop: str, wandb_dir: str) -> list[str]:
    """SHOPSIMRL.md step 5, in the script's order, for round r."""
    return [
        "python3", f"{PROJECT}/slime/train.py",
        # placement
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "4", "--num-gpus-per-node", "4", "--colocate",
        *MODEL_ARGS,
        # checkpoints
        "--hf-checkpoint", HF_ORIGIN, "--load", load, "--save", save, "--save-interval", "10000", "--save-hf", hf,
        # data
        "--prompt-data", f"{PROJECT}/data/shopsim_train.jsonl", "--input-key", "prompt", "--metadata-key", "metadata",
        "--apply-chat-template", "--rollout-shuffle",
        # rollout
        "--num-rollout", str((r + 1) * 20 + 1), "--rollout-batch-size", "16", "--over-sampling-batch-size", "32",
        "--n-samples-per-prompt", "8", "--rollout-max-response-len", "4096", "--rollout-max-context-len", "24576",
        "--rollout-temperature", "0.6", "--rollout-top-p", "1.0", "--rollout-top-k", "-1", "--reward-key", "reward",
        # GRPO
        "--global-batch-size", "64", "--balance-data", "--advantage-estimator", "grpo", "--eps-clip", "0.2",
        "--eps-clip-high", "0.28", "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant",
        "--override-opt-param-scheduler", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.98",
        # memory
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-dynamic-batch-size",
        "--max-tokens-per-gpu", "16384", "--log-probs-chunk-size", "1024", "--recompute-loss-function",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        # SGLang
        "--rollout-num-gpus-per-engine", "1", "--sglang-mem-fraction-static", "0.7",
        "--router-policy", "consistent_hashing", "--sglang-tool-call-parser", "qwen3_coder",
        "--sglang-reasoning-parser", "qwen3",
        # hooks
        "--custom-config-path", f"{loop}/slime.yaml",
        "--custom-generate-function-path", "shopsimrl.slime_runtime.generate",
        "--custom-rollout-log-function-path", "shopsimrl.slime_metrics.enrich_rollout_metrics",
        "--rollout-all-samples-process-path", "shopsimrl.slime_metrics.record_generated_rollout_groups",
        "--dynamic-sampling-filter-path", "shopsimrl.slime_runtime.fully_scored_group_filter",
        "--custom-reward-post-process-path", "shopsimrl.slime_runtime.normalize_grpo_by_prompt_and_rollout",
        # numerics
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash",
        # W&B
        "--use-wandb", "--wandb-mode", "online", "--wandb-project", "shopsimrl", "--wandb-group",
        "qwen35-4b-train-100", "--wandb-dir", wandb_dir, "--disable-wandb-random-suffix",
    ]


SEED_RUNTIME_ENV = {
    # run_shopsimrl_slime.sh's RUNTIME_ENV_JSON
    "PYTHONPATH": f"{PROJECT}:{PROJECT}/slime:/root/Megatron-LM",
    "SHOPSIMRL_PROJECT_ROOT": PROJECT,
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "NCCL_NVLS_ENABLE": "0",
    "LD_LIBRARY_PATH": ":".join(f"{NVIDIA}/{lib}/lib" for lib in (
        "nvjitlink", "cuda_nvrtc", "cuda_runtime", "curand", "cufft", "cusolver", "cusparse", "nvshmem", "nccl",
        "cublas", "cudnn")) + ":${LD_LIBRARY_PATH}",
    "WANDB_API_KEY": WANDB_KEY,
    "WANDB_PROJECT": "shopsimrl",
    "WANDB_GROUP": "qwen35-4b-train-100",
    "WANDB_MODE": "online",
    "WANDB_DIR": f"{EXP}/wandb",
    # Not the seed's {EXP}/tmp (85 characters: Megatron's save socket would be too long for
    # AF_UNIX): the etiquette's short /tmp links to the experiment's tmp and ray dirs.
    "TMPDIR": TMP_LINK,
    "TEMP": TMP_LINK,
    "TMP": TMP_LINK,
    "RAY_TMPDIR": RAY_LINK,
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/torch/inductor",
    "TRITON_CACHE_DIR": f"{CACHE}/triton",
    "CUDA_CACHE_PATH": f"{CACHE}/cuda",
    "XDG_CACHE_HOME": f"{CACHE}/xdg",
    # the etiquette's cache variables, and what emit and the job share
    "HF_HOME": f"{CACHE}/huggingface",
    "HF_HUB_CACHE": f"{CACHE}/huggingface/hub",
    "HF_DATASETS_CACHE": f"{CACHE}/huggingface/datasets",
    "TRANSFORMERS_CACHE": f"{CACHE}/huggingface/transformers",
    "TORCH_HOME": f"{CACHE}/torch",
    "UV_CACHE_DIR": f"{CACHE}/uv",
    "PIP_CACHE_DIR": f"{CACHE}/pip",
    "WANDB_CACHE_DIR": f"{CACHE}/wandb",
    "FLASHINFER_WORKSPACE_BASE": f"{CACHE}/flashinfer",
    "WANDB_RUN_GROUP": "qwen35-4b-train-100",
    "PYTHONUNBUFFERED": "1",
    "ROLLOUT_MAX_RESPONSE_LEN": "4096",
}


@pytest.fixture(scope="module")
def cfg() -> Config:
    return load_config(RECIPE)


@pytest.fixture(scope="module")
def layout(cfg: Config) -> Layout:
    return Layout.from_config(cfg, environ={})


def secrets():  # type: ignore[no-untyped-def]
    return with_pattern({"WANDB_API_KEY": WANDB_KEY, "BAILIAN_API_KEY": BAILIAN_KEY}, None)


def test_recipe_loads_with_the_seeds_settings(cfg: Config) -> None:
    """The recipe passes load_config and carries the seed's fixed numbers."""
    assert cfg.gpus.visible == (0, 1, 2, 3) and cfg.gpus.tp_size == 2
    assert (cfg.shopsim.url, cfg.shopsim.slots, cfg.shopsim.episode_concurrency) == ("http://127.0.0.1:5700", 48, 32)
    assert (cfg.val.url, cfg.val.concurrency, cfg.val.tasks) == ("http://127.0.0.1:30000", 32, 400)
    assert (cfg.campaign.rounds, cfg.campaign.steps_per_round, cfg.train.save_interval) == (5, 20, 10000)
    assert cfg.train.launcher == "ray" and cfg.wandb.group == "qwen35-4b-train-100"
    assert cfg.disk.interval == 1.0 and str(cfg.train.base_load) == BASE
    assert set(cfg.required_secrets()) == {"WANDB_API_KEY", "BAILIAN_API_KEY"}


@pytest.mark.parametrize("r", [0, 1])
def test_train_argv_is_the_seeds_argument_for_argument(cfg: Config, layout: Layout, r: int) -> None:
    """Round 0: --num-rollout 21 --load <converted base>; round 1: --num-rollout 41 --load <save dir>."""
    job = commands.train_job(cfg, layout, secrets(), r)
    want = seed_train_argv(r, save=str(layout.save_dir), hf=str(layout.hf_dir(cfg)),
                           load=BASE if r == 0 else str(layout.save_dir),
                           loop=f"{PROJECT}/runs/loop/round-00{r}", wandb_dir=f"{EXP}/wandb")
    assert job.argv == want
    assert job.submission_id == f"shoprld-qwen35-4b-qwen35-4b-train-100-round-00{r}-1"


def test_async_saves_only_for_a_launch_that_saves_mid_round(cfg: Config, tmp_path: Path) -> None:
    """Issue 30: with one save per round (the seed's 10000) the launch's only save is the round's
    final, which slime forces synchronous, and a first async save costs more than a sync one: no
    async flags. Once the adaptive choice saves every 5 steps, the launch gets --async-save with
    the worker Megatron needs, and no --save-hf (EXPORT_HF converts once)."""
    moved = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"ephemeral_root": tmp_path})})
    lay = Layout.from_config(moved, environ={})
    once = commands.train_job(moved, lay, secrets(), 0, planned=False).argv
    assert "--async-save" not in once and "--use-persistent-ckpt-worker" not in once and "--save-hf" in once
    record = saves.record_path(lay, 0)
    assert tmp_path in record.parents
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"interval": 5}))
    mid = commands.train_job(moved, lay, secrets(), 0, planned=False).argv
    i = mid.index("--async-save")
    assert mid[i + 1] == "--use-persistent-ckpt-worker" and "--save-hf" not in mid
    assert mid[mid.index("--save-interval") + 1] == "5"


def test_upstreams_optional_flags_follow_tp_and_the_env(cfg: Config, layout: Layout) -> None:
    """As run_shopsimrl_slime.sh: --sequence-parallel only when TP > 1; --wandb-team <entity>, and
    WANDB_ENTITY / WANDB_BASE_URL in the job's runtime env, only when the .env sets them."""
    plain = commands.train_job(cfg, layout, secrets(), 0)
    assert "--sequence-parallel" in plain.argv and "--wandb-team" not in plain.argv
    assert not {"WANDB_ENTITY", "WANDB_BASE_URL"} & set(plain.env_vars)

    tp1 = cfg.model_copy(update={"gpus": cfg.gpus.model_copy(update={"tp_size": 1})})
    assert "--sequence-parallel" not in commands.train_job(tp1, layout, secrets(), 0).argv

    env = with_pattern({"WANDB_API_KEY": WANDB_KEY, "BAILIAN_API_KEY": BAILIAN_KEY,
                        "WANDB_ENTITY": "shop-team", "WANDB_BASE_URL": "https://wandb.example.org"}, None)
    job = commands.train_job(cfg, layout, env, 0)
    i = job.argv.index("--wandb-team")
    assert job.argv[i + 1] == "shop-team" and job.argv[:i] == plain.argv  # appended, nothing else moved
    assert (job.env_vars["WANDB_ENTITY"], job.env_vars["WANDB_BASE_URL"]) == ("shop-team", "https://wandb.example.org")
    assert "" not in job.argv and "" not in plain.argv


def test_round_one_loads_the_save_dir_through_the_engines_own_context(cfg: Config, tmp_path: Path) -> None:
    """RoundContext.values (what the engine uses) gives round 1 the save dir once round 0 committed."""
    moved = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"ephemeral_root": tmp_path})})
    lay = Layout.from_config(moved, environ={})
    ctx0 = standalone_context(RoundPlan(moved, lay, 0))
    assert ctx0.values()["load"] == BASE and ctx0.values()["num_rollout"] == "21"
    it = lay.save_dir / "iter_0000020"  # round 0's final save, complete in Megatron's layout
    it.mkdir(parents=True)
    for name in ("common.pt", "__0_0.distcp", ".metadata"):
        (it / name).write_bytes(b"x")
    (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (lay.save_dir / "latest_checkpointed_iteration.txt").write_text("20")
    ctx1 = standalone_context(RoundPlan(moved, lay, 1))
    values = ctx1.values()
    assert values["load"] == str(lay.save_dir) and values["num_rollout"] == "41"
    argv = ctx1.argv(moved.train.command)
    assert argv[argv.index("--load") + 1] == str(lay.save_dir)


@pytest.mark.parametrize("r", [0, 1])
def test_ray_runtime_env_is_the_seeds(cfg: Config, layout: Layout, r: int) -> None:
    """The job's env_vars are exactly the seed's runtime env plus the etiquette's caches, and the
    round's one W&B run (issue 27: a relaunch continues it)."""
    job = commands.train_job(cfg, layout, secrets(), r)
    assert job.env_vars == {**SEED_RUNTIME_ENV, "WANDB_RUN_ID": f"qwen35-4b-train-100-round-{r:03d}",
                            "WANDB_RESUME": "allow"}


@pytest.mark.parametrize("r", [0, 1])
def test_wandb_key_only_in_the_env(cfg: Config, layout: Layout, r: int) -> None:
    """WANDB_API_KEY is in runtime_env.env_vars, never in argv or the Ray entrypoint."""
    job = commands.train_job(cfg, layout, secrets(), r)
    assert job.env_vars["WANDB_API_KEY"] == WANDB_KEY
    for text in (*job.argv, *job.launched, job.entrypoint):
        assert WANDB_KEY not in text and BAILIAN_KEY not in text
    assert "BAILIAN_API_KEY" not in job.env_vars  # only the trainer's own secrets


def test_entrypoint_runs_the_argv_in_the_slime_env_from_the_project_root(cfg: Config, layout: Layout) -> None:
    """The Ray entrypoint is `cd <project> && exec <conda activation> <argv>`, each element quoted."""
    job = commands.train_job(cfg, layout, secrets(), 0)
    words = shlex.split(job.entrypoint)
    assert words[:4] == ["cd", PROJECT, "&&", "exec"]
    assert words[4:6] == ["bash", "-c"] and words[7:9] == ["shoprld-activate", "/root/miniconda3/envs/slime"]
    assert words[9:] == job.argv


def test_every_tool_command_matches_the_seed(cfg: Config, layout: Layout) -> None:
    """emit / watch-analyze / analyze / run / online-gate / build-curriculum / check and the
    val server resolve to the seed's commands, W&B flags and group included."""
    ctx = resolve(cfg, layout, 0, planned=True)
    wb = ["--wandb", "--wandb-project", "shopsimrl", "--wandb-group", "qwen35-4b-train-100",
          "--wandb-mode", "online", "--wandb-dir", f"{EXP}/wandb"]
    tool = ["python3", f"{PROJECT}/scripts/run_shopsimrl.py"]
    loop = f"{PROJECT}/runs/loop/round-000"
    cold = f"{PROJECT}/artifacts/cold-start"
    assert ctx.argv(cfg.train.emit_command) == [
        "python3", f"{PROJECT}/scripts/emit_training_loop_round.py", "--project-root", PROJECT,
        "--round-id", "round-000", "--skillbank", f"{cold}/selected_skillbank.json",
        "--curriculum", f"{cold}/curriculum.json", "--history-ledger", ""]
    assert ctx.argv(cfg.train.check_command) == [*tool, "training", "check", f"{loop}/slime.yaml",
                                                 "--task-data", f"{PROJECT}/data/shopsim_train.jsonl"]
    assert ctx.argv(cfg.sidecar.command) == [*tool, "training", "watch-analyze", f"{loop}/analysis.yaml",
                                             "--stop-file", f"{PROJECT}/runs/analyst.stop"]
    assert ctx.argv(cfg.gate.analyze_command) == [*tool, "training", "analyze", f"{loop}/analysis.yaml", *wb]
    assert ctx.argv(cfg.val.command) == [*tool, "run", f"{loop}/val.yaml"]
    assert ctx.argv(cfg.gate.command) == [*tool, "training", "online-gate", f"{loop}/gate.yaml", *wb]
    assert ctx.argv(cfg.inject.command) == [
        *tool, "training", "build-curriculum", f"{cold}/selected_skillbank.json",
        f"{PROJECT}/runs/round-001/curriculum.json", "--round-id", "round-001",
        "--skill-free-probability", "0.20", "--rho-min", "0.20", "--rho-max", "0.90"]
    assert ctx.argv(cfg.val.server_command) == [
        "python3", "-m", "sglang.launch_server", "--model-path", str(layout.hf_dir(cfg)), "--host", "127.0.0.1",
        "--port", "30000", "--served-model-name", "Qwen/Qwen3.5-4B", "--tool-call-parser", "qwen3_coder",
        "--reasoning-parser", "qwen3", "--mem-fraction-static", "0.7", "--tp", "1", "--dp-size", "4",
        "--weight-version", "iter_0000020"]
    assert ctx.argv(cfg.shopsim.command) == ["bash", f"{PROJECT}/ShopSimulator/shop_env/start.sh"]
    assert ctx.env(cfg.shopsim)["SHOPSIM_ENV_SLOTS"] == "48"
    assert ctx.env(cfg.shopsim)["SHOPSIM_PORT"] == "5700"
    assert ctx.env(cfg.shopsim)["SHOPSIM_RUNS_ROOT"] == f"{PROJECT}/runs"
    assert str(cfg.shopsim.conda_prefix) == "/root/miniconda3/envs/shopsim"
    assert ctx.env(cfg.train)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_progress_pattern_reads_slimes_rollout_lines(cfg: Config) -> None:
    """TRAIN's progress regex matches slime's per-rollout log line (Ray-prefixed or not) and
    nothing that merely mentions a rollout."""
    import re

    pat = re.compile(cfg.train.progress_pattern)
    lines = ["(RolloutManager pid=4242) [2026-11-30 10:00:00] rollout.py:88 - rollout 3: {'rollout/x': 0.5}",
             "[2026-11-30 10:09:12] actor.py:412 - rollout 4: {'train/loss': 0.1}",
             "[2026-11-30 10:00:00] rollout.py:60 - start rollout 5 with 32 groups",
             "rollout 6/20 step_time=1.0"]
    assert [int(m.group(1)) for ln in lines for m in pat.finditer(ln)] == [3, 4]


def test_preflight_names_the_real_stacks_files_and_the_conversion(cfg: Config, layout: Layout) -> None:
    """must_exist covers the torch_dist ref load, the origin HF dir, the task data and the
    custom generate function; the hint names slime's HF -> torch_dist conversion."""
    from shoprld.daemon.foundation.storage.preflight import real_stack_problems

    values = resolve(cfg, layout, 0).values
    must = {k: v.format_map(values) for k, v in cfg.preflight.must_exist.items()}
    assert must["ref_load"] == BASE and must["origin_hf_dir"] == HF_ORIGIN
    assert must["task_data"] == f"{PROJECT}/data/shopsim_train.jsonl"
    assert must["custom_generate_function"] == f"{PROJECT}/shopsimrl/slime_runtime.py"
    assert "convert_hf_to_torch_dist.py" in cfg.preflight.convert_hint
    problems = {p.what: p for p in real_stack_problems(cfg, values)} if not Path(BASE).exists() else {}
    if problems:
        assert "convert_hf_to_torch_dist.py" in problems["ref_load is missing"].fix


def test_check_on_a_machine_without_the_stack_is_not_ready(capsys: pytest.CaptureFixture[str]) -> None:
    """`shoprld check` on this recipe reports NOT READY (exit 3) here, and prints both rounds' commands."""
    if Path("/root/autodl-tmp/ShopSimRL/.env").exists():
        pytest.skip("this machine has the seed's stack")
    assert run_check(RECIPE, print_commands=True) == 3
    out = capsys.readouterr().out
    assert "NOT READY" in out and "--num-rollout 21" in out and "--num-rollout 41" in out


def test_printed_commands_mask_every_secret(cfg: Config, layout: Layout) -> None:
    """describe_commands shows every stage for rounds 0 and 1 with secret values as ***."""
    lines = commands.describe_commands(cfg, layout, secrets())
    text = "\n".join(lines)
    assert WANDB_KEY not in text and BAILIAN_KEY not in text
    assert "WANDB_API_KEY=***" in text and "BAILIAN_API_KEY=***" in text
    for stage in ("shopsim", "ray-head", "emit", "check", "sidecar", "train", "export*", "val-server", "val",
                  "analyze", "gate", "inject"):
        assert any(ln.startswith(f"  {stage} ") for ln in lines), stage
    assert text.count("round-000-1 at") == 1 and text.count("round-001-1 at") == 1
    assert "--num-rollout 21" in text and "--num-rollout 41" in text


# -- the emitted YAMLs agree with the configured ports ------------------------------------------------
SEED_SLIME_YAML = """shopsim_skillbank_path: /p/sb.json
shopsim_environment_base_url: http://127.0.0.1:{shop}
shopsim_environment_timeout: 30
shopsim_episode_concurrency: {conc}
shopsim_tool_parser: qwen3_coder
"""
SEED_VAL_YAML = """experiment:
  name: round-000-bare-val
  seed: 20260830
  concurrency: 32
  resume: true
tasks:
  split: val
  sample_size: null
environment:
  base_url: http://127.0.0.1:{shop}
  timeout: 30
model:
  id: qwen35-4b-current-checkpoint
  base_url: http://127.0.0.1:{val}/v1
  extra_body:
    enable_thinking: true
"""


def write_seed_yamls(loop: Path, shop: int = 5700, val: int = 30000, conc: int = 32) -> None:
    loop.mkdir(parents=True, exist_ok=True)
    (loop / "slime.yaml").write_text(SEED_SLIME_YAML.format(shop=shop, conc=conc))
    (loop / "val.yaml").write_text(SEED_VAL_YAML.format(shop=shop, val=val))
    (loop / "gate.yaml").write_text("online_gate:\n  name: round-000-online-gate\n  mask_seed: 20260901\n")


def test_seed_yamls_agree_with_the_recipe(cfg: Config, tmp_path: Path) -> None:
    """The seed emitter's hard-coded 5700/30000/32 agree with the recipe: no mismatch."""
    write_seed_yamls(tmp_path)
    assert commands.port_mismatches(cfg, tmp_path) == []


def test_a_moved_port_is_reported_with_file_and_key(cfg: Config, tmp_path: Path) -> None:
    """A recipe on other ports than the emitted YAMLs gets one line per disagreeing URL."""
    write_seed_yamls(tmp_path)
    moved = cfg.model_copy(update={"shopsim": cfg.shopsim.model_copy(update={"url": "http://127.0.0.1:5701"}),
                                   "val": cfg.val.model_copy(update={"url": "http://localhost:30001"})})
    lines = commands.port_mismatches(moved, tmp_path)
    assert any("slime.yaml: shopsim_environment_base_url" in ln and "5701" in ln for ln in lines)
    assert any("val.yaml: environment.base_url" in ln for ln in lines)
    assert any("val.yaml: model.base_url" in ln and "30001" in ln for ln in lines)
    assert len(lines) == 3


def test_a_concurrency_disagreement_is_reported(cfg: Config, tmp_path: Path) -> None:
    """The emitter's episode concurrency must equal shopsim.episode_concurrency."""
    write_seed_yamls(tmp_path, conc=16)
    [line] = commands.port_mismatches(cfg, tmp_path)
    assert "shopsim_episode_concurrency: 16" in line


def test_the_demo_emitters_block_yamls_are_checked_too(tmp_path: Path) -> None:
    """The demo stand-in's emit (block YAML, as the real emitter) is checked against the demo recipe."""
    from shoprld.daemon.ops.demo import create_tree

    campaign = create_tree(tmp_path / "d", fast=True, rounds=1)
    demo = load_config(campaign)
    sb, cur = tmp_path / "sb.json", tmp_path / "cur.json"
    sb.write_text("{}")
    cur.write_text("{}")
    args = ["--project-root", str(tmp_path / "proj"), "--round-id", "round-000", "--skillbank", str(sb),
            "--curriculum", str(cur), "--shopsim-url", demo.shopsim.url, "--val-url", demo.val.url,
            "--episode-concurrency", str(demo.shopsim.episode_concurrency),
            "--val-concurrency", str(demo.val.concurrency)]
    subprocess.run([sys.executable, str(DEMO / "shopsimrl.py"), "emit", *args], check=True, capture_output=True,
                   timeout=60)
    loop = tmp_path / "proj" / "runs" / "loop" / "round-000"
    assert commands.port_mismatches(demo, loop) == []
    text = (loop / "slime.yaml").read_text()
    assert f"shopsim_environment_base_url: {demo.shopsim.url}\n" in text
    (loop / "slime.yaml").write_text(text.replace(demo.shopsim.url, "http://127.0.0.1:1"))
    assert len(commands.port_mismatches(demo, loop)) == 1


SEED_ANALYST_YAML = """experiment:
  name: trace2skill-cold-start
  dotenv: ../.env
  seed: 20260831
  concurrency: {threads}
environment:
  base_url: http://127.0.0.1:{shop}
  timeout: 30
analyst_model:
  base_url: https://dashscope.aliyuncs.com/compatible-mode/v1
  api_key_env: BAILIAN_API_KEY
"""


def write_analysis_yaml(loop: Path, analyst: Path) -> None:
    """The real emitter's analysis.yaml: it names the analyst's own config."""
    (loop / "analysis.yaml").write_text(f"online_analysis:\n  name: round-000\n  max_candidates: 6\n"
                                        f"  trace2skill_config: {analyst}\n")


def test_the_analysts_own_config_is_checked_through_analysis_yaml(cfg: Config, tmp_path: Path) -> None:
    """configs/trace2skill_cold_start.yaml carries its own ShopSim URL: the seed's agrees (its
    Bailian model URLs are not ours and are not compared); a moved ShopSim port is one line
    naming that file and key (the real analysis would write 0 candidates, silently)."""
    write_seed_yamls(tmp_path / "loop")
    analyst = tmp_path / "proj" / "configs" / "trace2skill_cold_start.yaml"
    analyst.parent.mkdir(parents=True)
    analyst.write_text(SEED_ANALYST_YAML.format(threads=2, shop=5700))
    write_analysis_yaml(tmp_path / "loop", analyst)
    assert commands.port_mismatches(cfg, tmp_path / "loop") == []
    analyst.write_text(SEED_ANALYST_YAML.format(threads=2, shop=5799))
    [line] = commands.port_mismatches(cfg, tmp_path / "loop")
    assert line.startswith(f"{analyst}: environment.base_url: http://127.0.0.1:5799 does not match shopsim.url")
    assert "0 candidates" in line


def test_the_analysts_threads_must_fit_the_slots(cfg: Config, tmp_path: Path) -> None:
    """Analyst threads hold ShopSim slots next to the trainer's (TRAIN) and the bare val's (VAL)
    episodes: 32 + 2 fit the seed's 48; 32 + 17 do not (a blocked reset that times out becomes a
    ghost waiter), one line per overlap."""
    write_seed_yamls(tmp_path / "loop")
    analyst = tmp_path / "t2s.yaml"
    analyst.write_text(SEED_ANALYST_YAML.format(threads=17, shop=5700))
    write_analysis_yaml(tmp_path / "loop", analyst)
    lines = commands.port_mismatches(cfg, tmp_path / "loop")
    assert len(lines) == 2 and all(ln.startswith(f"{analyst}: experiment.concurrency: 17 analyst threads")
                                   for ln in lines)
    assert "need 49 ShopSim slots > shopsim.slots = 48" in lines[0] and "val.concurrency" in lines[1]


def test_a_missing_or_broken_analyst_config(cfg: Config, tmp_path: Path) -> None:
    """analysis.yaml naming an absent analyst config: not this check's line (the analysis fails on
    it itself; the demo's stand-ins have none); one that is not text: one line with the file and
    who names it (never a UnicodeDecodeError out of TRAIN)."""
    loop, analyst = tmp_path / "loop", tmp_path / "t2s.yaml"
    write_seed_yamls(loop)
    write_analysis_yaml(loop, analyst)
    assert commands.port_mismatches(cfg, loop) == []
    analyst.write_bytes(b"environment:\n  base_url: \xff\xfe\n")
    [line] = commands.port_mismatches(cfg, loop)
    assert line == (f"{analyst}: unreadable as YAML ({loop / 'analysis.yaml'}: online_analysis.trace2skill_config); "
                    "fix: repair the analyst's config")


def test_check_judges_the_projects_analyst_config_before_any_round(tmp_path: Path) -> None:
    """`shoprld check` reads <project_root>/configs/trace2skill_cold_start.yaml itself: a moved
    port there is NOT READY before the night starts; a project without one is not refused for it."""
    from shoprld.daemon.ops.demo import create_tree

    campaign = create_tree(tmp_path / "d", fast=True, rounds=1)
    demo = load_config(campaign)
    analyst = tmp_path / "d" / "repo" / "configs" / "trace2skill_cold_start.yaml"
    res = subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(campaign)],
                         capture_output=True, text=True, timeout=120)
    assert "trace2skill_cold_start.yaml" not in res.stdout
    analyst.parent.mkdir(parents=True, exist_ok=True)
    analyst.write_text(SEED_ANALYST_YAML.format(threads=1, shop=5700))
    res = subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(campaign)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 3
    assert f"{analyst}: environment.base_url: http://127.0.0.1:5700 does not match shopsim.url = " \
           f"{demo.shopsim.url}" in res.stdout


# -- ShopSim's unauthenticated port ---------------------------------------------------------------
@pytest.fixture
def listener() -> Iterator[callable]:  # type: ignore[valid-type]
    socks: list[socket.socket] = []
    stop = threading.Event()

    def open_on(host: str) -> int:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        s.listen(8)
        s.settimeout(0.1)
        socks.append(s)

        def accept() -> None:
            while not stop.is_set():
                try:
                    c, _ = s.accept()
                    c.close()
                except OSError:
                    continue

        threading.Thread(target=accept, daemon=True).start()
        return int(s.getsockname()[1])

    yield open_on
    stop.set()
    for s in socks:
        s.close()


def test_exposure_warning_for_a_port_bound_beyond_loopback(listener) -> None:  # type: ignore[no-untyped-def]
    """A port bound on 0.0.0.0 answers on this host's own non-loopback address: warn; a
    loopback-only bind does not."""
    addrs = [a for a in commands.local_addresses() if ":" not in a and not a.startswith("127.")]
    if not addrs:
        pytest.skip("this host has no non-loopback IPv4 address")
    wide = listener("0.0.0.0")
    narrow = listener("127.0.0.1")
    warning = commands.shopsim_exposure_warning(f"http://127.0.0.1:{wide}", addresses=addrs)
    assert warning is not None and str(wide) in warning and "release_all" in warning
    assert commands.shopsim_exposure_warning(f"http://127.0.0.1:{narrow}", addresses=addrs) is None


def test_exposure_check_never_probes_loopback_or_other_hosts(listener) -> None:  # type: ignore[no-untyped-def]
    """Loopback addresses are never counted, and the default probe list is this host's own."""
    narrow = listener("127.0.0.1")
    assert commands.shopsim_exposure_warning(f"http://127.0.0.1:{narrow}", addresses=["127.0.0.1", "::1"]) is None
    assert commands.shopsim_exposure_warning(f"http://127.0.0.1:{narrow}") is None
    own = commands.local_addresses()
    with open("/proc/net/fib_trie") as fh:
        trie = fh.read()
    assert all(a in trie for a in own if ":" not in a)
