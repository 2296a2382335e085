"""VAL: the val server serves this round's HF dir, and the bare val covers every task.

Step 8-9 of the seed's round. The server (SGLang, TP=1/DP=4 on the HF dir) is ready when
``/health`` answers 200 AND its process is alive (never ``/v1/models``, which answers
before warm-up), and it must report this round's ``weight_version``. The compile step
(``analyze``: LLM API and CPU) is started here, alongside, when ``gate.overlap_analyze``
is on, because the gate needs both results.

``run`` exits 0 even when episodes failed, so the stage reads ``summary.json``: coverage
at least ``val.min_coverage`` and the weight version of this round. A run dir that can
no longer heal (every failed episode spent its 3 attempts) is archived and rerun fresh.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from shoprld.daemon.machine import State

from .base import Outcome, RoundContext, read_json

STATE = State.VAL
ADOPTS: tuple[str, ...] = ("val_server", "analyze")
MAX_ATTEMPTS = 3  # run_shopsimrl.py's per-episode budget, counted over all of traces.jsonl


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
    problem = await ctx.val_server.ensure_ready(ctx)
    if problem:
        return Outcome.retry(problem)
    problem = await ctx.shopsim.recover_leaks(ctx, reason="before the bare val")
    if problem:
        return Outcome.retry(problem)
    gate = ctx.cfg.gate
    if gate.overlap_analyze and gate.analyze_command and not _analysis_done(ctx) \
            and ctx.find_child("analyze") is None:
        await ctx.start("analyze", gate.analyze_command, gate, state="ANALYZE",
                        secrets=gate.analyze_secrets or gate.secrets)
    await ctx.run_tool("val", ctx.cfg.val.command, ctx.cfg.val, state=STATE)
    summary = read_json(_run_dir(ctx) / "summary.json")
    if _covered(ctx, summary):
        primary = (summary or {}).get("primary", {})
        ctx.emit("val.summary", coverage=(summary or {}).get("counts", {}).get("coverage"), primary=primary)
        return Outcome.done("bare val complete", primary=primary)
    if summary and summary.get("weight_version") not in (None, ctx.weight_version):
        _archive(ctx, f"weights {summary.get('weight_version')} != {ctx.weight_version}")
        return Outcome.retry("bare val ran on other weights; archived and rerunning")
    if not _can_heal(_run_dir(ctx)):
        _archive(ctx, "every failed episode spent its attempts")
        return Outcome.retry("bare val cannot heal; archived the run dir and rerunning fresh")
    counts = (summary or {}).get("counts")
    return Outcome.retry(f"bare val incomplete ({counts or 'no summary.json'}); resuming it")


def _analysis_done(ctx: RoundContext) -> bool:
    return (ctx.runs / f"{ctx.round_id}-online-analysis" / "analysis_summary.json").is_file()


def _can_heal(run_dir: Path) -> bool:
    """True while some failed episode still has attempts left in traces.jsonl."""
    attempts: dict[str, int] = {}
    ok: set[str] = set()
    try:
        lines = (run_dir / "traces.jsonl").read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return True
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        ep = str(rec.get("episode_id", rec.get("task_id", "")))
        attempts[ep] = attempts.get(ep, 0) + 1
        if rec.get("status") in ("completed", "ok", "success"):
            ok.add(ep)
    failed = [ep for ep in attempts if ep not in ok]
    return not failed or any(attempts[ep] < MAX_ATTEMPTS for ep in failed)


def _archive(ctx: RoundContext, why: str) -> None:
    src = _run_dir(ctx)
    if not src.exists():
        return
    n = 1
    while (dst := src.with_name(f"{src.name}.archived-{n}")).exists():
        n += 1
    os.rename(src, dst)
    ctx.emit("val.archived", path=str(dst), reason=why)
