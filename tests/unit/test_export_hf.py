"""EXPORT_HF never serves the previous round's weights as this round's.

Found by CI (test_disk_guard): the daemon parked on a full disk just after round 1's final
Megatron save, before slime's ``--save-hf`` rewrote the HF dir. The demo's rounds take seconds,
so round 0's shards were 4.3 s older than round 1's checkpoint, inside the mtime test's 5 s
slack: EXPORT_HF took them for round 1's, and round 1's bare val scored round 0's weights. The
decisive test is now the previous export's own record (its newest shard), not the clock.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import anyio
import pytest

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.storage import hfexport
from shoprld.states import export_hf
from shoprld.states.base import RoundContext
from tests.roundctx import minimal_context
from tests.unit.test_roundplan import commit_checkpoint

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def write_hf(d: Path, payload: bytes, at: float) -> None:
    """A well-formed two-shard HF dir whose files all carry mtime ``at``."""
    d.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i, name in enumerate(SHARDS):
        header = json.dumps({f"w{i}": {"dtype": "U8", "shape": [len(payload)],
                                       "data_offsets": [0, len(payload)]}}).encode()
        (d / name).write_bytes(struct.pack("<Q", len(header)) + header + payload)
        weight_map[f"w{i}"] = name
    (d / hfexport.INDEX).write_text(json.dumps({"metadata": {"total_size": 2 * len(payload)},
                                                "weight_map": weight_map}))
    (d / "config.json").write_text("{}")
    for p in d.iterdir():
        os.utime(p, (at, at))


Events = list[tuple[str, dict[str, object]]]


@pytest.fixture
def events() -> Events:
    return []


@pytest.fixture
def round1(tmp_path: Path, events: Events) -> RoundContext:
    ctx = minimal_context(tmp_path, 1, rounds=3, events=events)
    assert ctx.cfg.export.mode == "save_hf" and not ctx.cfg.export.command  # the seed's route, no converter
    return ctx


def _export(ctx: RoundContext) -> export_hf.Outcome:
    async def go() -> export_hf.Outcome:
        return await export_hf.run(ctx)
    return anyio.run(go)


def _round0_exported_then_round1_saved(ctx: RoundContext, gap_s: float) -> float:
    """Round 0's export verified and recorded; round 1's Megatron save committed ``gap_s`` later."""
    t0 = ctx.clock.time() - 100
    write_hf(ctx.hf_dir, b"round-0", t0)
    r0 = ctx.for_round(0)
    _commit(r0, at=t0)
    out = _export(r0)
    assert out.kind == "done", out
    _commit(ctx, at=t0 + gap_s)
    return t0


def _commit(ctx: RoundContext, at: float) -> None:
    commit_checkpoint(ctx.layout.save_dir, ctx.end_iteration)
    common = ckpt.iter_dir(ctx.layout.save_dir, ctx.end_iteration) / "common.pt"
    os.utime(common, (at, at))


def test_the_previous_rounds_shards_inside_the_slack_are_refused(round1: RoundContext, events: Events) -> None:
    """Round 1's save committed 4.3 s after round 0's shards (inside the 5 s slack) and --save-hf
    never ran: refused, naming why; nothing recorded for round 1. Fails without the record test."""
    _round0_exported_then_round1_saved(round1, gap_s=4.3)
    out = _export(round1)
    assert out.kind == "retry", out
    assert "not rewritten since the previous export" in out.message
    invalid = [fields["detail"] for event, fields in events if event == "export.save_hf_invalid"]
    assert len(invalid) == 1 and "not rewritten since the previous export" in str(invalid[0])
    assert round1.read_record("export") is None and not export_hf.completed(round1)


def test_this_rounds_save_hf_after_the_previous_export_is_accepted(round1: RoundContext) -> None:
    """--save-hf rewrote every shard (newer than round 0's newest, however close): accepted, and
    the record carries the newest shard mtime for the next round's test."""
    t0 = _round0_exported_then_round1_saved(round1, gap_s=4.3)
    write_hf(round1.hf_dir, b"round-1", t0 + 4.4)
    out = _export(round1)
    assert out.kind == "done", out
    rec = round1.read_record("export")
    assert rec is not None and rec["newest_mtime"] == pytest.approx(t0 + 4.4) and export_hf.completed(round1)


def test_one_shard_left_from_the_previous_round_is_refused(round1: RoundContext) -> None:
    """A save that stopped between the shards: one new, one still round 0's."""
    t0 = _round0_exported_then_round1_saved(round1, gap_s=1.0)
    os.utime(round1.hf_dir / SHARDS[0], (t0 + 2, t0 + 2))
    assert _export(round1).kind == "retry"


def test_a_record_from_before_this_field_falls_back_to_the_slack(round1: RoundContext) -> None:
    """An export record written by an older shoprld (no newest_mtime): the mtime test alone, as before."""
    _round0_exported_then_round1_saved(round1, gap_s=60)
    path = round1.for_round(0).record_path("export")
    rec = json.loads(path.read_text())
    del rec["newest_mtime"]
    path.write_text(json.dumps(rec))
    out = _export(round1)
    assert out.kind == "retry" and "older than this round's checkpoint" in out.message
