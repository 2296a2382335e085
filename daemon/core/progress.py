"""A round's progress as the engine records it: what the stages emit (the trainer's steps and
stalls, ShopSim's and the sidecar's events, the save timings), a failed attempt (its cause
and crash bundle, issue 18) and the recovery after one, the step a TRAIN resumes from, when
a round started, and the record of a finished one.

The stages report through ``RoundContext.emit`` (:meth:`Progress.emit`); nothing here decides
what happens next, it only updates the engine's view (daemon/core/snapshot.py) and journals.
On disk it writes the round's start record (``<artifacts>/round/round-NNN.json``, once) and,
through the store, the finished round's line in rounds.jsonl.
"""

from __future__ import annotations

from typing import Any

import structlog

from shoprld.states import base, next_round

from shoprld.daemon.foundation.tools import causes
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.ledger import ROW_KEY
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.foundation.records.store import ROUND_DONE_EVENT, atomic_write_json
from shoprld.daemon.round.machine import ROUND_STATES, State
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.core.attempts import Attempts
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.snapshot import Snapshot, num

log = structlog.get_logger("shoprld.engine")

# The stages' events that are journaled as they come (issue 17: the resume check; a stall's evidence).
JOURNALED = ("shopsim.died", "shopsim.lease_leak", "shopsim.restart", "run.archived", "gate.reused",
             "child.adopted", "checkpoint.rollback", "shopsim.outage_after_use", "shopsim.ready",
             "shopsim.release_all", "shopsim.leaks_recovered", "shopsim.waited",
             "shopsim.restart_failed", "sidecar.drain_timeout", "shopsim.client_stopped_for_recovery",
             "train.resume_check", "train.stacks_dumped", "export.save_hf_invalid", "disk.budget",
             "saves.no_room", "sidecar.stopped", "ledger.rebuilt", "shopsim.launcher", "analysis.stale",
             "train.tool_reused")


class Progress:
    """The stages' events, their attempts' failures and the rounds' bookkeeping. The config
    and the round are the view's (``view.live``), read at each use."""

    def __init__(self, view: Snapshot, *, layout: Layout, clock: base.Clock, notifier: Notifier,
                 attempts: Attempts) -> None:
        self.view, self.live, self.layout, self.clock = view, view.live, layout, clock
        self.notifier, self.attempts, self._alert = notifier, attempts, view.alert
        self.round_step_s: tuple[int, float] | None = None  # (round, its median step time)

    async def attempt_failed(self, state: State, attempt: int, outcome: base.Outcome) -> causes.Cause:
        """Classify a failed attempt, write its crash bundle, journal it, show it in status."""
        cause, self.view.snap["last_failure"] = await self.attempts.failed(
            state.value, self.live.round, attempt, outcome.message, outcome.data,
            nvidia_smi=self.live.cfg.gpus.nvidia_smi, keep_bundles=self.live.cfg.disk.keep_bundles)
        failures = self.view.state_data["counters"].setdefault("failures", {})
        failures[cause.name] = failures.get(cause.name, 0) + 1
        return cause

    async def tool_failed(self, state: State, attempt: int, outcome: base.Outcome) -> None:
        """A tool that crashed while its stage still completes (a gate that exits 1 with no
        manifest, then gate.policy keeps the SkillBank): classified, bundled and paged like a
        failed attempt, but no "recovered" follows, since nothing is retried."""
        before = self.attempts.recovering
        message = str(outcome.data.get("tool_failed"))
        cause = await self.attempt_failed(state, attempt, base.Outcome("fail", message, outcome.data))
        self.attempts.recovering = before
        log.warning("tool.failed", state=state.value, cause=cause.name,
                    message=f"{state.value} tool crashed ({cause.line()}); the stage goes on: {outcome.message}")
        self._alert("failed", f"{state.value}: {message}; the stage goes on ({outcome.message})")

    def recovered(self, state: State) -> None:
        """A round stage completed after a failed attempt or an unclean daemon restart (not
        PREFLIGHT_DISK, which passes before the work that died is retried)."""
        if self.attempts.recovering and state in ROUND_STATES:
            self._alert("recovered", f"{state.value} completed after {self.attempts.recovering}")
            self.attempts.recovering = None

    def emit(self, event: str, **fields: Any) -> None:
        snap = self.view.snap
        log.info(event, **fields)
        if event == "train.progress":
            snap["step"] = fields.get("step", snap.get("step", 0))
            if fields.get("step_seconds"):
                snap["step_seconds"] = fields["step_seconds"]
                self.round_step_s = (self.live.round, float(fields["step_seconds"]))
                left = self.live.cfg.campaign.steps_per_round - snap["step"]
                snap["eta_seconds"] = max(0.0, left * fields["step_seconds"])
            self.view.write_status()
            self.notifier.status_of(snap)
        elif event == "train.stall":
            self.view.state_data["counters"]["stalls"] += 1
            if fields.get("policy") == "alert":  # "restart" alerts with the cause once the attempt ends
                self._alert("stalled", f"trainer stalled: no step for {fields.get('idle_s')}s", failure=False)
            snap["warnings"] = [f"trainer stalled: no step for {fields.get('idle_s')}s"]
            self.view.journal("train.stall", **fields)
            self.view.write_status(force=True)
        elif event == "train.async_save_disabled":  # Megatron's "Disabling --async-save" (daemon/round/asyncsave.py)
            snap["warnings"] = [str(fields.get("message", "Megatron disabled --async-save"))]
            self.view.journal(event, **fields)
            self.view.write_status(force=True)
        elif event in JOURNALED:
            self.view.journal(event, **fields)
        elif event.startswith("gpu."):  # GPU hygiene (daemon/services/gpus.py): what held the GPUs, what was stopped, the wait
            self.view.journal(event, **fields)
        elif event.startswith("save."):  # issue 17 (daemon/round/saves.py): save timings, each launch's interval
            self.view.journal(event, **fields)
            if event == "save.interval":
                snap["saves"] = fields
        elif event == "stage.exit":
            self.attempts.info["returncode"] = fields.get("returncode")
        elif event == "stage.awaited":  # a child an earlier stage started (or a crashed daemon left) ended
            self.view.journal(event, sync=False, role=fields.get("role"), pid=fields.get("pid"),
                              returncode=fields.get("returncode"))
        elif event == "stage.spawn":  # informational: the child's record is in state.json already
            self.attempts.info["argv"] = fields.get("argv") or []  # already redacted by the stage
            # started_at: the moment the process existed (the launcher's clock), before its record was persisted
            self.view.journal(event, sync=False, role=fields.get("role"), pid=fields.get("pid"),
                              started_at=fields.get("started_at"))
            if fields.get("role") == ChildRole.SHOPSIM:
                self.view.write_status(force=True)

    def step_from_disk(self) -> int:
        """The current round's step its newest complete checkpoint reached (where TRAIN resumes)."""
        cfg = self.live.cfg
        plan = RoundPlan(cfg, self.layout, self.live.round)
        point = plan.resume_point()
        latest = point.iteration if point is not None else plan.start_iteration
        return max(0, min(cfg.campaign.steps_per_round, latest - plan.start_iteration))

    def mark_round_started(self) -> None:
        r = self.live.round
        path = RoundPlan(self.live.cfg, self.layout, r).round_record
        rec = base.read_json(path)
        if rec is None:
            rec = {"round": r, "started_at": self.clock.time()}
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, rec)
        self.view.round_started_at = num(rec.get("started_at"))

    def round_finished(self, ctx: base.RoundContext, records: next_round.RoundRecords | None, *,
                       persist: bool = True) -> None:
        """The round is recorded: its line in ``rounds_done``, its duration, the operator's note.
        ``records``: what NEXT_ROUND read (None when it was skipped: then the stage reads them).
        ``persist=False``: the caller's next write (a transition) records the new cursor."""
        r, snap = self.live.round, self.view.snap
        read = records or next_round.records(ctx)
        started_at = read.started.get("started_at")
        duration = self.clock.time() - float(started_at) if started_at else None
        done = [d for d in snap.get("rounds_done", []) if d.get("round") != r]
        done.append({"round": r, **read.result(), "duration_seconds": duration})
        snap["rounds_done"] = sorted(done, key=lambda d: d["round"])
        log.info("round.done", **done[-1])  # the terminal's one line per round result
        if duration is not None:
            self.view.state_data["round_durations"][str(r)] = duration
        # The round's facts, written once (store.py: journal, then rounds.jsonl, then the cursor).
        # The record holds the round's ledger row too: the ledger in the repo is rebuilt from it
        # when git takes it away (foundation/records/ledger.py). Not in the snapshot: it stays small.
        row = next_round.ledger(ctx).row(r)
        record = {**done[-1], ROW_KEY: row} if row is not None else done[-1]
        self.view.journal(ROUND_DONE_EVENT, sync=False, **record)
        self.view.store.append_round(record)
        if persist:
            self.view.persist()
        val = f"{read.primary.get('success_rate')}" if read.primary else "n/a"
        self._alert("round_done", f"{ctx.round_id} done: success_rate {val}, gate {read.gate.get('decision', '?')}",
                    failure=False)
