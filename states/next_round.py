"""NEXT_ROUND: the round's ledger row is written, and checkpoint retention applied.

The ledger row (one per round, never duplicated across crashes) is the durable "this
round is done" mark: on start, the current round is the first without one. Retention
keeps the final checkpoints of the last ``disk.keep_finals`` rounds (default 1, as upstream:
this round's final, which the next round's ``--load`` resumes from); older complete ones in
this campaign's save dir are deleted, each logged with its size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shoprld.daemon.foundation.storage import retention
from shoprld.daemon.foundation.records.bundles import causes_of_round
from shoprld.daemon.foundation.records import roundlog
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.ledger import Ledger, git_info, make_row, rebuild_from_record
from shoprld.daemon.round import resume
from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.config.roles import ChildRole

from .base import Outcome, RoundContext, read_json

STATE = State.NEXT_ROUND
ADOPTS: tuple[ChildRole, ...] = ()


def ledger(ctx: RoundContext) -> Ledger:
    return open_ledger(ctx.layout, ctx.secrets.redact)


def open_ledger(layout: Layout, redact: Callable[[str], str]) -> Ledger:
    """The campaign's ledger (in the repo; its overflow under the campaign root)."""
    return Ledger(layout.ledger, overflow_dir=layout.campaign_root / "ledger", redact=redact)


def repair(layout: Layout, redact: Callable[[str], str]) -> str | None:
    """Make the ledger agree with the state dir's record (rounds.jsonl), rebuilding it when it is
    missing, cut, garbled or rolled back; the one line to journal, or None when it agreed."""
    return rebuild_from_record(open_ledger(layout, redact), roundlog.read(layout.state_dir, with_rows=True) or [],
                               state_dir=layout.state_dir)


def completed(ctx: RoundContext) -> bool:
    """The ledger has this round's row."""
    return ledger(ctx).has_round(ctx.round)


@dataclass(frozen=True)
class RoundRecords:
    """The round's records, read once: the bare val's summary, the gate, INJECT, the start."""

    summary: dict[str, Any]
    primary: dict[str, Any]
    gate: dict[str, Any]
    inject: dict[str, Any]
    started: dict[str, Any]

    def result(self) -> dict[str, Any]:
        """The round's line in status's ``rounds_done`` (the engine adds the duration). It keeps
        the val tool's own N (``counts.completed``) and s.e. (``primary.reward_sem``): the
        report's error bars; with 30 episodes one s.e. of a success rate is about 0.09."""
        counts = self.summary.get("counts") if isinstance(self.summary.get("counts"), dict) else {}
        return {"val": self.primary.get("success_rate") if self.primary else None,
                "metric_name": "success_rate", "gate": self.gate.get("decision"),
                "analysis": self.gate.get("analysis_status"), "branch": self.inject.get("branch"),
                "val_n": _count(counts.get("completed")), "val_requested": _count(counts.get("requested")),
                "reward_mean": _number(self.primary.get("reward_mean")),
                "reward_sem": _number(self.primary.get("reward_sem"))}


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def records(ctx: RoundContext) -> RoundRecords:
    """Read the round's records (the stage's inputs; the engine gets them in the Outcome, or
    from here when the stage was skipped, and never reads the files itself)."""
    summary = read_json(ctx.plan.bare_val_dir / "summary.json") or {}
    primary: dict[str, Any] = summary["primary"] if isinstance(summary.get("primary"), dict) else {}
    return RoundRecords(summary, primary, ctx.read_record("gate") or {}, ctx.read_record("inject") or {},
                        ctx.read_record("round") or {})


async def run(ctx: RoundContext) -> Outcome:
    lay = ctx.layout
    read = records(ctx)
    summary, primary, gate, inject, started = read.summary, read.primary, read.gate, read.inject, read.started
    elapsed = (ctx.clock.time() - float(started["started_at"])) / 60 if started.get("started_at") else ""
    git = git_info(lay.repo)
    checkpoint = ctx.plan.checkpoint_dir
    row = make_row(
        index=ctx.round, branch=git["branch"], parent_commit=git["parent_commit"], commit=git["commit"],
        recipe=str(ctx.cfg.source), metric_name="success_rate",
        metric_value=primary.get("success_rate", "") if primary else "",
        memory_gb="", elapsed_min=f"{elapsed:.1f}" if elapsed != "" else "",
        launcher=ctx.cfg.train.launcher, job_id=str(started.get("job_id", "")),
        command=" ".join(ctx.argv(ctx.cfg.train.command)), log_path=str(ctx.log_path(State.TRAIN)),
        status="keep" if inject.get("branch") == "selected" else "discard",
        description=_description(ctx.round_id, gate, inject, primary, summary),
        exp_dir=str(lay.exp_dir), checkpoint_path=str(checkpoint), artifacts_path=str(lay.artifacts),
        cache_root=str(lay.cache_root), causes=causes_of_round(lay.logs, ctx.round_id),
    )
    # A ledger that `git stash` or a checkout took away since the last round is rebuilt from the
    # record first: appending to it as it is would drop every earlier row.
    note = repair(lay, ctx.secrets.redact)
    if note:
        ctx.emit("ledger.rebuilt", warning=note)
    ledger(ctx).append(row)
    _retention(ctx)
    return Outcome.done("round recorded", records=read)


def _description(rid: str, gate: dict, inject: dict, primary: dict, summary: dict) -> str:  # type: ignore[type-arg]
    """The ledger's description: gate, branch, reward, the bare val's coverage, and what went
    wrong with the analysis (a fallback, which loses the proposal ledger, or a silent empty one)."""
    counts = summary.get("counts") if isinstance(summary.get("counts"), dict) else {}
    coverage = counts.get("coverage")
    parts = [f"{rid}: gate {gate.get('decision', '?')}", f"skillbank {inject.get('branch', '?')}",
             f"reward_mean {primary.get('reward_mean', '?') if primary else '?'}",
             f"coverage {coverage:.4g}" if isinstance(coverage, (int, float)) else "coverage ?"]
    if gate.get("dropped_pairs"):
        parts.append(f"{gate['dropped_pairs']} gate pairs dropped")
    if gate.get("analysis_status") in ("failed", "silent_empty"):
        parts.append(str(gate.get("analysis_note") or gate["analysis_status"]))
    if gate.get("gate_error"):
        parts.append(f"gate error: {gate['gate_error']}")
    return ", ".join(parts)


def _retention(ctx: RoundContext) -> None:
    """Keep the finals of the last ``disk.keep_finals`` rounds (this one's included; upstream
    keeps one), delete the older complete checkpoints of this campaign (round/resume.py decides)."""
    decided = resume.retention(ctx.plan.save_dir_facts(), resume.Moment.ROUND_END, keep_finals=ctx.cfg.disk.keep_finals)
    if decided.doomed:
        freed = retention.delete_checkpoints(decided.doomed, save_dir=ctx.layout.save_dir)
        ctx.emit("retention.applied", deleted=[c.iteration for c in decided.doomed], bytes=freed)


