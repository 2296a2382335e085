"""EXPORT_HF: the one HF dir the val server reads holds THIS round's weights, verified.

The seed's route (``export.mode = "save_hf"``): slime wrote the HF safetensors at its
final save; verify the index covers the shards, the headers parse, the sizes match, and
the files are not older than this round's checkpoint. The converter route
(``"convert"``, or the fallback when the save_hf dir is stale or torn and a converter
command is configured): convert ``iter_N`` into a temp dir on the same volume, verify,
then swap it in atomically, so a half-written export is never served.
A manifest (``artifacts/export/<round>.json``) records the iteration, the file sizes and the
newest shard's mtime: the next round's save_hf dir must be newer than that (the shards a
trainer stopped before ``--save-hf`` leaves behind are the previous round's, whatever the
clock says; see ``hfexport``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from shoprld.daemon.foundation.storage import hfexport
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.round import saves
from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.records.store import atomic_write_json

from .base import Outcome, RoundContext

STATE = State.EXPORT_HF
ADOPTS: tuple[ChildRole, ...] = ()


def _commit_time(ctx: RoundContext) -> float | None:
    """When the round's final save was committed; None when it is not (round/resume.py's rule)."""
    facts = ctx.plan.save_dir_facts()
    c = facts.scan.get(ctx.end_iteration)
    if c is None or c not in facts.committed:
        return None
    common = Path(c.path) / "common.pt"
    return common.stat().st_mtime if common.exists() else c.committed_at


def _previous_export_mtime(ctx: RoundContext) -> float | None:
    """The newest shard mtime of the previous round's export of this same dir (None: none recorded)."""
    if ctx.round == 0:
        return None
    rec = ctx.read_record("export", ctx.for_round(ctx.round - 1).round_id)
    if not rec or rec.get("hf_dir") != str(ctx.hf_dir):
        return None
    newest = rec.get("newest_mtime")
    return float(newest) if isinstance(newest, (int, float)) and not isinstance(newest, bool) else None


def completed(ctx: RoundContext) -> bool:
    """The manifest names this round's iteration and the dir still matches it."""
    rec = ctx.read_record("export")
    if not rec or rec.get("iteration") != ctx.end_iteration:
        return False
    check = hfexport.verify(ctx.hf_dir)
    return check.ok and check.files == rec.get("files")


async def run(ctx: RoundContext) -> Outcome:
    spec = ctx.cfg.export
    not_before = _commit_time(ctx)
    if not_before is None:
        return Outcome.fail(f"{ctx.layout.save_dir}: {ctx.plan.checkpoint_name} is not complete; TRAIN must rerun")
    # A launch with mid-round saves left --save-hf out (saves.hf_at_every_save): convert.
    skipped = saves.save_hf_left_out(ctx.cfg, int(saves.placeholder_value(ctx.cfg, ctx.layout, ctx.round)))
    check = (hfexport.verify(ctx.hf_dir, not_before=not_before, newer_than=_previous_export_mtime(ctx))
             if spec.mode == "save_hf" and not skipped else None)
    if check is None or not check.ok:
        if check is not None:
            ctx.emit("export.save_hf_invalid", detail=check.detail)
        if not spec.command:
            return Outcome.retry(f"HF export invalid: {check.detail if check else 'no converter'}; "
                                 "fix: configure export.command (slime's converter) or rerun TRAIN's save")
        tmp = ctx.plan.hf_tmp_dir
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        await ctx.run_tool(ChildRole.EXPORTER, spec.command, spec, state=STATE)
        converted = hfexport.verify(tmp)
        if not converted.ok:
            return Outcome.retry(f"converter output invalid: {converted.detail}")
        hfexport.swap_in(tmp, ctx.hf_dir)
        check = hfexport.verify(ctx.hf_dir)
        if not check.ok:
            return Outcome.retry(f"HF export invalid after the swap: {check.detail}")
        route = "convert"
    else:
        route = "save_hf"
    rec = {"round": ctx.round, "round_id": ctx.round_id, "iteration": ctx.end_iteration, "route": route,
           "hf_dir": str(ctx.hf_dir), "files": check.files, "newest_mtime": check.newest_mtime}
    ctx.record_path("export").parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(ctx.record_path("export"), rec)
    ctx.emit("export.verified", iteration=ctx.end_iteration, route=route, detail=check.detail)
    return Outcome.done(check.detail)
