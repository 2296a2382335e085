"""VAL: the val server serves this round's HF dir, and the bare val covers every task.

Step 8-9 of the seed's round. The server (SGLang, TP=1/DP=4 on the HF dir) is ready when
``/health`` answers 200 AND its process is alive (never ``/v1/models``, which answers
before warm-up), and it must report this round's ``weight_version``. The compile step
(``analyze``: LLM API and CPU) is started here, alongside, when ``gate.overlap_analyze``
is on, because the gate needs both results.

``run`` exits 0 even when episodes failed, so the stage reads ``summary.json`` by the real
tool's rules (``daemon/foundation/tools/files.py``): coverage at least ``val.min_coverage`` (default 0.95:
a few episodes that exhaust their 3 attempts do not rerun the whole split, the gate drops
them as the real loop does; the coverage goes to the journal and the ledger), made with
this round's weights (the real summary has no ``weight_version``: then newer than the
export). A torn summary or one of the wrong shape is one line, and the stage retries. A run dir left by an
interrupted or incomplete attempt is archived and the next attempt starts fresh (the tool's
3-attempts-per-episode budget would otherwise make the summary depend on the history). A bare
val that a crashed daemon left running is waited for, and its summary used when it covers.

Failed episodes are trusted only when a daemon watched the services while they failed: a
bare val during which the val server or ShopSim died is rerun unless every episode completed
(``ServiceWatch``), and a partial summary that no daemon watched being made (its daemon died:
the summary has no ``artifacts/val/<round>.json`` record naming it) is rerun too. A whole one
(no failed episode) is used whoever watched it.
"""

from __future__ import annotations

from pathlib import Path

from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.foundation.records.store import atomic_write_json
from shoprld.daemon.foundation.tools.files import BareSummary, read_bare_summary
from shoprld.daemon.foundation.tools.payload import ToolOutputError

from .base import Outcome, RoundContext, ServiceWatch

STATE = State.VAL
ADOPTS: tuple[ChildRole, ...] = (ChildRole.VAL_SERVER, ChildRole.ANALYZE, ChildRole.VAL)


def _run_dir(ctx: RoundContext) -> Path:
    return ctx.plan.bare_val_dir


def _judge(ctx: RoundContext) -> tuple[BareSummary | None, str | None]:
    """The bare summary and why it does not do for this round (None when it does).

    Read by the real tool's rules (``daemon/foundation/tools/files.py``): ``counts.coverage`` at least
    ``val.min_coverage`` (the real loop never checks it and the gate drops unpaired episodes,
    so a few exhausted episodes pass), for this round's weights.
    """
    path = _run_dir(ctx) / "summary.json"
    try:
        summary = read_bare_summary(path)
    except ToolOutputError as exc:
        return None, str(exc)
    if summary is None:
        return None, f"{path}: not written by val.command"
    if summary.coverage < ctx.cfg.val.min_coverage:
        return summary, (f"bare val coverage {summary.coverage:.4g} is below val.min_coverage "
                         f"{ctx.cfg.val.min_coverage:g} ({summary.failed} of {summary.requested} episodes failed)")
    # The real run_shopsimrl.py does not record the served weights: then the summary must be
    # newer than this round's export (older ones belong to a previous round's weights).
    try:
        fresh = path.stat().st_mtime >= ctx.record_path("export").stat().st_mtime
    except FileNotFoundError:
        fresh = False
    return summary, None if fresh else f"{path}: older than this round's export (another round's weights)"


def _whole(summary: BareSummary) -> bool:
    return summary.failed == 0 and summary.coverage >= 1.0


def _summary_stamp(ctx: RoundContext) -> int | None:
    try:
        return (_run_dir(ctx) / "summary.json").stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _watched(ctx: RoundContext, summary: BareSummary) -> bool:
    """Whole, or judged by the daemon that watched the services while it was made (its record
    names this very summary file)."""
    if _whole(summary):
        return True
    rec = ctx.read_record("val")
    return bool(rec) and rec.get("summary_mtime_ns") == _summary_stamp(ctx)


def completed(ctx: RoundContext) -> bool:
    """summary.json covers enough of the split for this round's weights (and its failed
    episodes, if any, were watched)."""
    summary, problem = _judge(ctx)
    return summary is not None and problem is None and _watched(ctx, summary)


async def run(ctx: RoundContext) -> Outcome:
    if await ctx.await_child(ChildRole.VAL, ctx.cfg.val.timeout):  # a crashed daemon's, still running
        summary, problem = _judge(ctx)
        if summary is not None and problem is None and _watched(ctx, summary):
            return _done(ctx, summary)
    problem = await ctx.val_server.ensure_ready(ctx.plan, ctx)
    if problem:
        return Outcome.retry(problem)
    # A run dir left by an interrupted attempt is archived, not resumed: the summary then
    # equals an uninterrupted run's (its attempt counts would differ), and the weights are
    # the same, so only the time of the partial run is lost.
    ctx.archive(_run_dir(ctx), _leftover(ctx))
    problem = await ctx.shopsim.recover_leaks(ctx.plan, ctx, reason="before the bare val")
    if problem:
        return Outcome.retry(problem)
    gate = ctx.cfg.gate
    if gate.overlap_analyze and gate.analyze_command and not _analysis_done(ctx) \
            and ctx.find_child(ChildRole.ANALYZE) is None:
        await ctx.start(ChildRole.ANALYZE, gate.analyze_command, gate, state="ANALYZE",
                        secrets=gate.analyze_secrets or gate.secrets)
    problem = await ctx.shopsim.wait_ready(ctx.plan, ctx, before="before the bare val")
    if problem:
        return Outcome.retry(problem)
    watch = ServiceWatch.now(ctx)
    rc = await ctx.run_tool(ChildRole.VAL, ctx.cfg.val.command, ctx.cfg.val, state=STATE)
    summary, problem = _judge(ctx)
    if watch.broken(ctx) and not (summary is not None and problem is None and _whole(summary)):
        # Episodes lost to a dead service are not the policy's failures: rerun on a healthy stack.
        ctx.archive(_run_dir(ctx), "the val server or ShopSim died during the bare val")
        return Outcome.retry("the val server or ShopSim died during the bare val; rerunning it")
    if summary is not None and problem is None:
        return _done(ctx, summary)
    # The next attempt archives this run dir and starts fresh (see above).
    return Outcome.retry(f"{problem} (val.command exited {rc}); rerunning it fresh")


def _leftover(ctx: RoundContext) -> str:
    """Why the run dir an earlier attempt left is not used (the archive's reason)."""
    summary, problem = _judge(ctx)
    if summary is not None and problem is None and not _watched(ctx, summary):
        return f"{summary.failed} episode(s) failed while no daemon watched the val server and ShopSim"
    return "left by an interrupted attempt"


def _done(ctx: RoundContext, summary: BareSummary) -> Outcome:
    rec = {"round": ctx.round, "round_id": ctx.round_id, "coverage": summary.coverage, "failed": summary.failed,
           "requested": summary.requested, "summary_mtime_ns": _summary_stamp(ctx)}
    ctx.record_path("val").parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(ctx.record_path("val"), rec)
    ctx.emit("val.summary", coverage=summary.coverage, failed=summary.failed, requested=summary.requested,
             primary=summary.primary)
    if summary.coverage < 1.0:
        ctx.emit("val.partial_coverage", coverage=summary.coverage, failed=summary.failed,
                 min_coverage=ctx.cfg.val.min_coverage, note="the gate drops the unpaired episodes")
    return Outcome.done(f"bare val complete (coverage {summary.coverage:.4g})", primary=summary.primary,
                        coverage=summary.coverage)


def _analysis_done(ctx: RoundContext) -> bool:
    """A usable analysis of this round is on disk (a stale one is archived here)."""
    return ctx.analysis_summary() is not None

