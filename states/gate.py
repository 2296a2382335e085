"""GATE: the compiled candidate pool plus the random-masked gate give a decision on disk.

Steps 7 and 10-11 of the seed's round. ``analyze`` (started by VAL when the compile is
overlapped, else here) always exits 0, so ``analysis_summary.json`` is what counts, read by
the real tool's rules (``daemon/foundation/tools/files.py``), and only when it is newer than this
round's TRAIN end (an older one, e.g. from a merged ``runs/``, is archived and analyze reruns): no ``status`` on success; ``failed`` means a
fallback pool of the current skills and no proposal ledger (the round keeps the previous
history ledger, and says so); a success-shaped summary with 0 candidates and only analyst
errors is a "silent empty" analysis (journaled, recorded, ``gate.empty_analysis`` decides).
``online-gate`` runs on the same frozen val server and writes ``online_gate_manifest.json``:
``complete`` even with dropped pairs (recorded), ``incomplete`` when its regression fails; an
error before any rollout exits 1 with no manifest, which counts as incomplete. A gate that a crashed daemon left running is waited for; a gate dir it
finished (manifest ``complete``, written last, for this round's weights, no dropped pair) is
reused, and any other leftover is archived and the gate reruns on a healthy stack. The configured policy
says what an incomplete gate means: ``continue`` without new skills (the seed's), ``retry``
the gate, or ``stop`` the campaign (exit 5).
Then the val server's whole process group is stopped, because training needs its GPUs
(or parked, with ``val.reuse_server``). The decision is recorded in
``artifacts/gate/<round>.json``, which is what INJECT and the ledger read.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.system.retry import may_retry
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.foundation.records.store import atomic_write_json
from shoprld.daemon.foundation.tools.files import Analysis, GateResult, read_analysis, read_gate
from shoprld.daemon.foundation.tools.payload import ToolOutputError

from .base import Outcome, RoundContext, ServiceWatch

STATE = State.GATE
ADOPTS: tuple[ChildRole, ...] = (ChildRole.ANALYZE, ChildRole.GATE, ChildRole.VAL_SERVER)


def completed(ctx: RoundContext) -> bool:
    """A gate decision record exists for this round."""
    rec = ctx.read_record("gate")
    return bool(rec) and rec.get("decision") in ("complete", "incomplete")


async def run(ctx: RoundContext) -> Outcome:
    cfg = ctx.cfg.gate
    analysis_dir = ctx.plan.analysis_dir
    gate_dir = ctx.plan.gate_dir
    if cfg.analyze_command:
        await ctx.await_child(ChildRole.ANALYZE, cfg.timeout)  # started by VAL (overlap), or left running
        if ctx.analysis_summary() is None:  # none, or older than TRAIN's end (archived, rerun)
            problem = await ctx.shopsim.recover_leaks(ctx.plan, ctx, reason="before analyze")
            if problem:
                return Outcome.retry(problem)
            await ctx.run_tool(ChildRole.ANALYZE, cfg.analyze_command, cfg, state="ANALYZE",
                               secrets=cfg.analyze_secrets or cfg.secrets)
    analysis: Analysis | None = Analysis("ok", 0) if not cfg.analyze_command else None
    if cfg.analyze_command:
        try:
            analysis = read_analysis(analysis_dir)
        except ToolOutputError as exc:
            ctx.archive(analysis_dir / "analysis_summary.json", "unreadable")
            return Outcome.retry(f"{exc}; rerunning the analysis")
        if analysis is None:
            return Outcome.retry(f"{analysis_dir / 'analysis_summary.json'}: not written by gate.analyze_command")
    assert analysis is not None
    if analysis.kind == "failed":
        ctx.emit("analysis.failed", detail=analysis.error, note="fallback pool: current skills only")
        # The fallback writes no proposal_ledger.jsonl: one left there is an earlier compile's,
        # and the real gate would carry its rows into this round's ledger.
        stale = analysis_dir / "proposal_ledger.jsonl"
        if stale.exists():
            ctx.archive(stale, "stale: the analysis fell back and wrote no ledger")
        ctx.emit("analysis.history_lost", note="the fallback wrote no proposal ledger; the round keeps the "
                 "previous history ledger", kept=ctx.inputs().get("history_ledger") or None)
    elif analysis.kind == "silent_empty":
        ctx.emit("analysis.silent_empty", analyzed_cards=analysis.analyzed_cards,
                 analyst_errors=analysis.analyst_errors, policy=cfg.empty_analysis,
                 fix="check the analyst's key (BAILIAN_API_KEY in .env) and the ShopSim URL in "
                     "configs/trace2skill_cold_start.yaml")
        if cfg.empty_analysis == "retry" and may_retry(ctx.attempt, cfg.retries):
            ctx.archive(analysis_dir / "analysis_summary.json", "silently empty analysis; policy retry")
            return Outcome.retry(f"{analysis.note()}; gate.empty_analysis = retry")
        if cfg.empty_analysis == "stop":
            return Outcome("gate_stop", f"{analysis.note()} for {ctx.round_id}; gate.empty_analysis = stop "
                           "(fix the analyst's key or ShopSim URL, then run again)")
    await ctx.await_child(ChildRole.GATE, cfg.timeout)  # a crashed daemon's gate, still running
    gate_rc: int | None = 0
    if _finished(ctx, gate_dir):
        ctx.emit("gate.reused", path=str(gate_dir), note="complete before the daemon restarted")
    else:
        ctx.archive(gate_dir, _leftover(gate_dir))  # start fresh (frozen weights)
        problem = await _services_ready(ctx)
        if problem:
            return Outcome.retry(problem)
        watch = ServiceWatch.now(ctx)
        gate_rc = await ctx.run_tool(ChildRole.GATE, cfg.command, cfg, state=STATE)
        if watch.broken(ctx):
            # An "incomplete" gate must mean the skills, not a dead val server or ShopSim: rerun
            # it on a healthy stack (the served weights are unchanged, so the result is the same).
            ctx.archive(gate_dir, "the val server or ShopSim died during the gate")
            return Outcome.retry("the val server or ShopSim died during the gate; rerunning it")
    try:
        result = read_gate(gate_dir)
    except ToolOutputError as exc:
        ctx.archive(gate_dir, "unreadable manifest")
        return Outcome.retry(f"{exc}; rerunning the gate")
    error = None
    if result is None:
        if gate_rc != 1:
            return Outcome.retry(f"{gate_dir / 'online_gate_manifest.json'}: not written (gate exited {gate_rc}); "
                                 "rerunning the gate")
        # The real gate exits 1 with no manifest on an error before any rollout (a bad pool, a
        # rank-deficient design, a bare run it refuses): the seed's loop keeps the current
        # SkillBank, as for an incomplete gate; gate.policy says the same here.
        error = _last_line(ctx.log_path(STATE))
        ctx.emit("gate.error", detail=error, note="exit 1 before any rollout; no manifest")
        result = GateResult("incomplete")
        # The tool crashed: a failure with a bundle and a page, whatever gate.policy does next.
        crashed = {"tool_failed": f"gate.command exited 1 with no manifest: {error}"}
    else:
        crashed = {}
    decision = result.status
    selected = gate_dir / "selected_skillbank.json"
    if decision == "complete" and not selected.is_file():
        return Outcome.retry(f"gate complete but {selected} is missing")
    if result.dropped:
        ctx.emit("gate.dropped_pairs", dropped=result.dropped, observations=result.observations,
                 requested=result.requested, note="complete: the gate drops unpaired episodes")
    if decision == "incomplete" and cfg.policy == "retry" and may_retry(ctx.attempt, cfg.retries):
        ctx.archive(gate_dir, "gate incomplete; policy retry")
        return Outcome.retry("gate incomplete; policy retry" + (f" ({error})" if error else ""))
    history_lost = analysis.kind == "failed"
    rec = {
        "round": ctx.round, "round_id": ctx.round_id, "decision": decision, "policy": cfg.policy,
        "selected_skillbank": str(selected) if decision == "complete" else None,
        "analysis_status": analysis.kind, "analysis_note": analysis.note(), "candidates": analysis.candidates,
        "gate_error": error, "dropped_pairs": result.dropped,
        # After a fallback the gate's ledger is empty (its analysis wrote none): keep the chain
        # on the previous history ledger instead of losing it, and say so.
        "proposal_ledger": (ctx.inputs().get("history_ledger") or None) if history_lost else
        _first_existing(gate_dir / "proposal_ledger.jsonl", analysis_dir / "proposal_ledger.jsonl"),
        "history_lost": history_lost,
    }
    ctx.record_path("gate").parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(ctx.record_path("gate"), rec)
    ctx.emit("gate.decision", decision=decision, policy=cfg.policy)
    await ctx.val_server.after_gate(ctx.plan, ctx)
    if decision == "incomplete" and cfg.policy == "stop":
        return Outcome("gate_stop", f"gate incomplete for {ctx.round_id}; gate.policy = stop "
                       "(run again to continue with the current SkillBank)", crashed)
    return Outcome.done(f"gate {decision}", **crashed)


async def _services_ready(ctx: RoundContext) -> str | None:
    """The gate's two services, asked side by side (one HTTP round trip of wait, not two, on
    the VAL->GATE hand-off; issue 17): the val server serves this round's weights, and
    ShopSim is ready with no leaked lease (a killed val or analyze leaves its leases behind).
    None when both are; else the first problem (the val server's first). A StageFailed (an
    adopted ShopSim that stays short) propagates as itself, not inside an exception group."""
    problems: dict[str, str | None] = {}
    errors: list[BaseException] = []

    async def ask(name: str, check: Callable[[], Awaitable[str | None]]) -> None:
        try:
            problems[name] = await check()
        except Exception as exc:  # re-raised below, unwrapped
            errors.append(exc)

    async def shopsim() -> str | None:
        return await ctx.shopsim.recover_leaks(ctx.plan, ctx, reason="before the gate") \
            or await ctx.shopsim.wait_ready(ctx.plan, ctx, before="before the gate")

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, "val", lambda: ctx.val_server.ensure_ready(ctx.plan, ctx))
        tg.start_soon(ask, "shopsim", shopsim)
    if errors:
        raise errors[0]
    return problems.get("val") or problems.get("shopsim")


def _finished(ctx: RoundContext, gate_dir: Path) -> bool:
    """A gate dir that an earlier attempt finished for this round's weights, unwatched (its
    daemon died): the manifest (written last) says ``complete``, with no dropped pair, and the
    SkillBank is there. Only a whole ``complete`` is reused: an ``incomplete`` one, or one
    that dropped pairs, may be the work of a val server or ShopSim that died while no daemon
    watched (the check after a watched gate cannot be made afterwards); it is rerun, whose
    drops, if any, are then the gate's own."""
    try:
        result = read_gate(gate_dir)
    except ToolOutputError:
        return False
    if result is None or result.status != "complete" or not (gate_dir / "selected_skillbank.json").is_file():
        return False
    if result.dropped:
        return False
    try:  # the manifest does not record the served weights: it must be newer than this round's export
        return (gate_dir / "online_gate_manifest.json").stat().st_mtime >= ctx.record_path("export").stat().st_mtime
    except FileNotFoundError:
        return False


def _leftover(gate_dir: Path) -> str:
    """Why a gate dir an earlier attempt left is not reused (the archive's reason)."""
    try:
        result = read_gate(gate_dir)
    except ToolOutputError:
        result = None
    if result is not None and result.status == "complete" and result.dropped:
        return (f"complete, but {result.dropped} pair(s) dropped while no daemon watched the val server "
                "and ShopSim")
    return "left by an interrupted attempt"


def _last_line(log: Path) -> str:
    """The last non-blank line of the stage log (the gate's exception line)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return "no log"
    return lines[-1][:300] if lines else "no output"


def _first_existing(*paths: os.PathLike[str]) -> str | None:
    for p in paths:
        if os.path.exists(p):
            return os.fspath(p)
    return None

