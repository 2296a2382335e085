"""GATE: the compiled candidate pool plus the random-masked gate give a decision on disk.

Steps 7 and 10-11 of the seed's round. ``analyze`` (started by VAL when the compile is
overlapped, else here) always exits 0, so ``analysis_summary.json`` is what counts; a
``failed`` status means a fallback pool of the current skills. ``online-gate`` runs on
the same frozen val server and writes ``online_gate_manifest.json`` (``complete`` or
``incomplete``). A gate that a crashed daemon left running is waited for; a gate dir it
finished (manifest ``complete``, written last, for this round's weights) is reused, and any
other leftover is archived and the gate reruns on a healthy stack. The configured policy
says what an incomplete gate means: ``continue`` without new skills (the seed's), ``retry``
the gate, or ``stop`` the campaign (exit 5).
Then the val server's whole process group is stopped, because training needs its GPUs
(or parked, with ``val.reuse_server``). The decision is recorded in
``artifacts/gate/<round>.json``, which is what INJECT and the ledger read.
"""

from __future__ import annotations

import os
from pathlib import Path

from shoprld.daemon.machine import State
from shoprld.daemon.store import atomic_write_json

from .base import Outcome, RoundContext, read_json

STATE = State.GATE
ADOPTS: tuple[str, ...] = ("analyze", "gate", "val_server")


def completed(ctx: RoundContext) -> bool:
    """A gate decision record exists for this round."""
    rec = ctx.read_record("gate")
    return bool(rec) and rec.get("decision") in ("complete", "incomplete")


async def run(ctx: RoundContext) -> Outcome:
    cfg = ctx.cfg.gate
    analysis_dir = ctx.runs / f"{ctx.round_id}-online-analysis"
    gate_dir = ctx.runs / f"{ctx.round_id}-online-gate"
    if cfg.analyze_command:
        await ctx.await_child("analyze", cfg.timeout)  # started by VAL (overlap), or left running
        if not (analysis_dir / "analysis_summary.json").is_file():
            problem = await ctx.shopsim.recover_leaks(ctx, reason="before analyze")
            if problem:
                return Outcome.retry(problem)
            await ctx.run_tool("analyze", cfg.analyze_command, cfg, state="ANALYZE",
                               secrets=cfg.analyze_secrets or cfg.secrets)
    analysis = read_json(analysis_dir / "analysis_summary.json") if cfg.analyze_command else {"status": "skipped"}
    if analysis is None:
        return Outcome.retry(f"{analysis_dir / 'analysis_summary.json'}: not written by analyze")
    if analysis.get("status") == "failed":
        ctx.emit("analysis.failed", detail=analysis.get("error") or analysis.get("reason"),
                 note="fallback pool: current skills only")
    await ctx.await_child("gate", cfg.timeout)  # a crashed daemon's gate, still running
    if _finished(ctx, gate_dir):
        ctx.emit("gate.reused", path=str(gate_dir), note="complete before the daemon restarted")
    else:
        problem = await ctx.val_server.ensure_ready(ctx)
        if problem:
            return Outcome.retry(problem)
        ctx.archive(gate_dir, "left by an interrupted attempt")  # start fresh (frozen weights)
        # A killed val or analyze leaves its leases behind; and never start against a dead ShopSim.
        problem = await ctx.shopsim.recover_leaks(ctx, reason="before the gate") \
            or await ctx.shopsim.wait_ready(ctx, before="before the gate")
        if problem:
            return Outcome.retry(problem)
        server, restarts = ctx.val_server.child, ctx.shopsim.restarts
        await ctx.run_tool("gate", cfg.command, cfg, state=STATE)
        if ctx.val_server.child is not server or server is None or not server.alive() \
                or ctx.shopsim.restarts != restarts:
            # An "incomplete" gate must mean the skills, not a dead val server or ShopSim: rerun
            # it on a healthy stack (the served weights are unchanged, so the result is the same).
            ctx.archive(gate_dir, "the val server or ShopSim died during the gate")
            return Outcome.retry("the val server or ShopSim died during the gate; rerunning it")
    manifest = read_json(gate_dir / "online_gate_manifest.json")
    if manifest is None or manifest.get("status") not in ("complete", "incomplete"):
        return Outcome.retry(f"{gate_dir / 'online_gate_manifest.json'}: missing or without a status")
    decision = str(manifest["status"])
    selected = gate_dir / "selected_skillbank.json"
    if decision == "complete" and not selected.is_file():
        return Outcome.retry(f"gate complete but {selected} is missing")
    if decision == "incomplete" and cfg.policy == "retry" and ctx.attempt <= cfg.retries:
        ctx.archive(gate_dir, "gate incomplete; policy retry")
        return Outcome.retry("gate incomplete; policy retry")
    rec = {
        "round": ctx.round, "round_id": ctx.round_id, "decision": decision, "policy": cfg.policy,
        "selected_skillbank": str(selected) if decision == "complete" else None,
        "analysis_status": analysis.get("status"),
        "proposal_ledger": _first_existing(gate_dir / "proposal_ledger.jsonl", analysis_dir / "proposal_ledger.jsonl"),
    }
    ctx.record_path("gate").parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(ctx.record_path("gate"), rec)
    ctx.emit("gate.decision", decision=decision, policy=cfg.policy)
    await ctx.val_server.after_gate(ctx)
    if decision == "incomplete" and cfg.policy == "stop":
        return Outcome("gate_stop", f"gate incomplete for {ctx.round_id}; gate.policy = stop "
                       "(run again to continue with the current SkillBank)")
    return Outcome.done(f"gate {decision}")


def _finished(ctx: RoundContext, gate_dir: Path) -> bool:
    """A gate dir that an earlier attempt finished for this round's weights: the manifest
    (written last) says ``complete`` and the SkillBank is there. Only ``complete`` is reused:
    an ``incomplete`` one may be the work of a val server that died with the old daemon."""
    manifest = read_json(gate_dir / "online_gate_manifest.json")
    if manifest is None or manifest.get("status") != "complete" \
            or not (gate_dir / "selected_skillbank.json").is_file():
        return False
    served = (manifest.get("input") or {}).get("weight_version")
    if served is not None:
        return bool(served == ctx.weight_version)
    try:  # a manifest without the served weights must be newer than this round's export
        return (gate_dir / "online_gate_manifest.json").stat().st_mtime >= ctx.record_path("export").stat().st_mtime
    except FileNotFoundError:
        return False


def _first_existing(*paths: os.PathLike[str]) -> str | None:
    for p in paths:
        if os.path.exists(p):
            return os.fspath(p)
    return None

