"""VAL: the val server serves this round's HF dir, and the bare val covers every task.

Step 8-9 of the seed's round. The server (SGLang, TP=1/DP=4 on the HF dir) is ready when
``/health`` answers 200 AND its process is alive (never ``/v1/models``, which answers
before warm-up), and it must report this round's ``weight_version``. The compile step
(``analyze``: LLM API and CPU) is started here, alongside, when ``gate.overlap_analyze``
is on, because the gate needs both results.

``run`` exits 0 even when episodes failed, so the stage reads ``summary.json``: coverage
at least ``val.min_coverage`` and the weight version of this round. A run dir left by an
interrupted or incomplete attempt is archived and the next attempt starts fresh (the tool's
3-attempts-per-episode budget would otherwise make the summary depend on the history). A bare
val that a crashed daemon left running is waited for, and its summary used when it covers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shoprld.daemon.machine import State

from .base import Outcome, RoundContext, read_json

STATE = State.VAL
ADOPTS: tuple[str, ...] = ("val_server", "analyze", "val")


def _run_dir(ctx: RoundContext) -> Path:
    return ctx.runs / f"{ctx.round_id}-bare-val"


def _covered(ctx: RoundContext, summary: dict[str, object] | None) -> bool:
    if not summary:
        return False
    counts = summary.get("counts")
    if not isinstance(counts, dict):
        return False
    try:
        coverage = float(counts.get("coverage", 0.0))
    except (TypeError, ValueError):
        return False
    if coverage < ctx.cfg.val.min_coverage:
        return False
    if "weight_version" in summary:
        return summary.get("weight_version") == ctx.weight_version
    # The real run_shopsimrl.py does not record the served weights: then the summary must be
    # newer than this round's export (older ones belong to a previous round's weights).
    try:
        return _run_dir(ctx).joinpath("summary.json").stat().st_mtime >= ctx.record_path("export").stat().st_mtime
    except FileNotFoundError:
        return False


def completed(ctx: RoundContext) -> bool:
    """summary.json shows full coverage for this round's weights."""
    return _covered(ctx, read_json(_run_dir(ctx) / "summary.json"))


async def run(ctx: RoundContext) -> Outcome:
    if await ctx.await_child("val", ctx.cfg.val.timeout):  # a crashed daemon's, still running
        summary = read_json(_run_dir(ctx) / "summary.json")
        if _covered(ctx, summary):
            return _done(ctx, summary)
    problem = await ctx.val_server.ensure_ready(ctx)
    if problem:
        return Outcome.retry(problem)
    # A run dir left by an interrupted attempt is archived, not resumed: the summary then
    # equals an uninterrupted run's (its attempt counts would differ), and the weights are
    # the same, so only the time of the partial run is lost.
    ctx.archive(_run_dir(ctx), "left by an interrupted attempt")
    problem = await ctx.shopsim.recover_leaks(ctx, reason="before the bare val")
    if problem:
        return Outcome.retry(problem)
    gate = ctx.cfg.gate
    if gate.overlap_analyze and gate.analyze_command and not _analysis_done(ctx) \
            and ctx.find_child("analyze") is None:
        await ctx.start("analyze", gate.analyze_command, gate, state="ANALYZE",
                        secrets=gate.analyze_secrets or gate.secrets)
    problem = await ctx.shopsim.wait_ready(ctx, before="before the bare val")
    if problem:
        return Outcome.retry(problem)
    await ctx.run_tool("val", ctx.cfg.val.command, ctx.cfg.val, state=STATE)
    summary = read_json(_run_dir(ctx) / "summary.json")
    if _covered(ctx, summary):
        return _done(ctx, summary)
    counts = (summary or {}).get("counts")
    # The next attempt archives this run dir and starts fresh (see above).
    return Outcome.retry(f"bare val incomplete ({counts or 'no summary.json'}, weights "
                         f"{(summary or {}).get('weight_version')}); rerunning it fresh")


def _done(ctx: RoundContext, summary: dict[str, Any] | None) -> Outcome:
    primary = (summary or {}).get("primary", {})
    ctx.emit("val.summary", coverage=(summary or {}).get("counts", {}).get("coverage"), primary=primary)
    return Outcome.done("bare val complete", primary=primary)


def _analysis_done(ctx: RoundContext) -> bool:
    return (ctx.runs / f"{ctx.round_id}-online-analysis" / "analysis_summary.json").is_file()

