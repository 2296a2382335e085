"""deep_verify against a checkpoint written by real torch DCP on CPU, read by megatron-core.

Needs the optional test env (torch 2.13 CPU + megatron-core 0.16.1); skipped cleanly without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
pytest.importorskip("megatron.core.dist_checkpointing", reason="megatron-core (the `megatron` extra) is not installed")

from shoprld.daemon.foundation.storage.checkpoints import TRACKER_NAME, is_complete, iter_dir, scan  # noqa: E402
from shoprld.daemon.foundation.storage.deepverify import deep_verify  # noqa: E402

# dcp.save(no_dist=True) warns that it assumes a single process: that is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def write_megatron_checkpoint(save_dir: Path, iteration: int) -> Path:
    """A torch_dist checkpoint in Megatron's layout: DCP shards + .metadata, common.pt, metadata.json."""
    d = iter_dir(save_dir, iteration)
    d.mkdir(parents=True)
    state: dict[str, Any] = {
        "embedding.word_embeddings.weight": torch.randn(64, 16),
        "decoder.layers.self_attention.linear_qkv.weight": torch.randn(2, 48, 16),
        "decoder.final_layernorm.weight": torch.ones(16),
    }
    # One process, no process group (no_dist); two writer threads give two shard files,
    # named as Megatron's are: __{rank}_{k}.distcp.
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(d), thread_count=2), no_dist=True)
    torch.save({"iteration": iteration, "checkpoint_version": 3.0}, d / "common.pt")
    (d / "metadata.json").write_text(json.dumps(
        {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
         "common_backend": "torch", "common_backend_version": 1}))  # fmt: skip
    (save_dir / TRACKER_NAME).write_text(str(iteration))
    return d


def test_real_dcp_checkpoint_is_complete_and_verifies(tmp_path: Path) -> None:
    """A real DCP checkpoint is complete by the reader's rules and passes megatron-core's deep check."""
    d = write_megatron_checkpoint(tmp_path, 20)
    shards = sorted(p.name for p in d.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__0_1.distcp"]
    assert is_complete(tmp_path, 20)
    latest = scan(tmp_path).latest_complete
    assert latest is not None and latest.iteration == 20
    v = deep_verify(d)
    assert v.ok and v.method == "megatron", v.detail
    assert "3 tensors" in v.detail


def test_missing_shard_fails_deep_verify(tmp_path: Path) -> None:
    """Removing a shard that .metadata names fails deep_verify, though the file-level rules still pass."""
    d = write_megatron_checkpoint(tmp_path, 20)
    (d / "__0_1.distcp").unlink()
    assert is_complete(tmp_path, 20)  # still one shard and all metadata: only the deep check knows
    v = deep_verify(d)
    assert not v.ok and v.method == "megatron"
    assert "__0_1.distcp named in .metadata is missing" in v.detail


def test_truncated_shard_fails_deep_verify(tmp_path: Path) -> None:
    """A shard shorter than .metadata's byte ranges (a torn async save) fails deep_verify."""
    d = write_megatron_checkpoint(tmp_path, 20)
    shard = d / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    v = deep_verify(d)
    assert not v.ok and "__0_0.distcp is 100 bytes" in v.detail


def test_not_a_distributed_checkpoint(tmp_path: Path) -> None:
    """Without metadata.json megatron-core does not recognise the dir: deep_verify says so."""
    d = write_megatron_checkpoint(tmp_path, 20)
    (d / "metadata.json").unlink()
    v = deep_verify(d)
    assert not v.ok and "not a distributed checkpoint" in v.detail
