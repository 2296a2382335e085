"""The engine: startup -> reconcile -> main loop -> shutdown, in one anyio task group.

Every trigger goes through ONE queue of typed events (events.py): stage outcomes, signals,
control-socket requests, disk-guard level changes and checkpoint commits (their sources
are in sources.py). The main loop takes one event at a time, asks the machine what it
leads to (``machine.decide``: the next state and one action), and carries that out:
persist the transition (journal line, then state.json, then status.json), tell systemd,
spawn the next stage as a task, retry after the backoff, or end through the one ordered
:meth:`Engine.shutdown`. Stages never call the engine; they return an Outcome. Signal
receivers only enqueue; the loop acts (a second SIGINT while stopping is the one
exception: it escalates to SIGKILL at once, since the loop is busy stopping).

Start-up order: lock the state dir (one daemon per campaign), load the state (rebuilt
from the journal, then the disk, when corrupt), find children left by a crashed daemon
(recorded pids, plus any process carrying this campaign's SHOPRLD_CHILD tag), then
PREFLIGHT_DISK and START_SHOPSIM, then the first round without a ledger row, skipping
each round state whose output is already on disk.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from dataclasses import replace
from functools import partial
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx
import structlog

from shoprld.states import (
    base,
    export_hf,
    gate,
    inject,
    next_round,
    preflight_disk,
    start_shopsim,
    train,
    val,
)

from shoprld.daemon.foundation import causes
from shoprld.daemon.foundation import checkpoints as ckpt
from shoprld.daemon.foundation import disk as diskmod
from shoprld.daemon.round import saves
from shoprld.daemon.services import hygiene
from shoprld.daemon.core import sources
from shoprld.daemon.core.alerts import Alerts
from shoprld.daemon.core.attempts import Attempts
from shoprld.daemon.core.children import Children
from shoprld.daemon.foundation.console import Campaign, terminal_mode
from shoprld.daemon.core.crashpoints import maybe_die
from shoprld.daemon.core.diskwatch import DiskWatch
from shoprld.daemon.foundation.config import Config, ProcessSpec, load_config, resolve_deadline
from shoprld.daemon.foundation.errors import EXIT_DISK, EXIT_OK, ConfigError, ShoprldError
from shoprld.daemon.foundation.identity import ensure, expected
from shoprld.daemon.foundation.layout import Layout
from shoprld.daemon.core.events import (
    CheckpointSeen,
    DiskLevel,
    Event,
    HygieneFound,
    RetryDue,
    SignalReceived,
    StageOutcome,
    StopRequested,
)
from shoprld.daemon.foundation.logs import add_file_handler, configure
from shoprld.daemon.round.machine import (
    RETRY,
    ROUND_STATES,
    WORKING_STATES,
    Counters,
    Deadline,
    Decision,
    Ending,
    Enter,
    Exit,
    Fail,
    Finish,
    Machine,
    Park,
    Retry,
    RetryPolicy,
    State,
    Stop,
    decide,
)
from shoprld.daemon.core.metrics import TextfileMetrics, extras_problem
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.planning import make_plan
from shoprld.daemon.foundation.preflight import forecast_for
from shoprld.daemon.foundation.roles import ChildRole
from shoprld.daemon.services.processes import CHILD_TAG, Child, ChildRecord, Launcher
from shoprld.daemon.services.ray import build_launcher
from shoprld.daemon.round.plan import RoundPlan, RoundValues, demo_dir
from shoprld.daemon.foundation.secrets import Secrets, load_secrets
from shoprld.daemon.services.shopsim import ShopsimService
from shoprld.daemon.services.validate import validate
from shoprld.daemon.services.valserver import ValServerService
from shoprld.daemon.foundation.roundlog import STATUS_RECENT_ROUNDS
from shoprld.daemon.foundation.store import ROUND_DONE_EVENT, SOCKET_FILE, Store, atomic_write_json

MODULES: dict[State, ModuleType] = {
    State.PREFLIGHT_DISK: preflight_disk,
    State.START_SHOPSIM: start_shopsim,
    State.TRAIN: train,
    State.EXPORT_HF: export_hf,
    State.VAL: val,
    State.GATE: gate,
    State.INJECT: inject,
    State.NEXT_ROUND: next_round,
}
log = structlog.get_logger("shoprld.engine")
# How long the daemon waits at exit for queued notifications (the final "done"/"failed").
ALERT_DRAIN_S = 30.0


class _Stop:
    """The stop flags stages can read (StopFlags protocol)."""

    def __init__(self) -> None:
        self.mode: str | None = None  # "now" | "checkpoint" | "round"
        self.reason: str = "requested"

    @property
    def at_checkpoint(self) -> bool:
        return self.mode == "checkpoint"


class _TaggingLauncher:
    """Wraps a launcher so every child carries this campaign's tag in its environment."""

    def __init__(self, inner: Launcher, tag: str) -> None:
        self._inner, self._tag = inner, tag

    async def start(self, role: ChildRole, argv: Any, *, env: Any, cwd: Path | None, log: Path, redacted_argv: Any,
                    round: RoundValues | None = None) -> Child:
        tag = f"{self._tag}|{role}"
        child = await self._inner.start(role, argv, env={**env, CHILD_TAG: tag}, cwd=cwd, log=log,
                                        redacted_argv=redacted_argv, round=round)
        child.record.tag = tag
        return child

    def adopt(self, record: ChildRecord) -> Child | None:
        return self._inner.adopt(record)


class Engine:
    """One campaign's daemon. ``await Engine(...).main()`` returns the exit code."""

    def __init__(self, cfg: Config, layout: Layout, secrets: Secrets, *, launcher: Launcher | None = None,
                 clock: base.Clock | None = None, wait_for_space: bool = False,
                 transport: httpx.AsyncBaseTransport | None = None, adopt_state: bool = False) -> None:
        self.cfg, self.layout, self.secrets = cfg, layout, secrets
        self.clock = clock or base.SystemClock()
        self._raw_launcher = launcher or build_launcher(cfg, layout)
        self.launcher: Launcher = _TaggingLauncher(self._raw_launcher, str(layout.state_dir))
        self.wait_for_space = wait_for_space
        self.adopt_state = adopt_state  # `shoprld run --adopt-state`: take over another campaign's state dir
        self._transport = transport
        # The one Redactor every persisted or sent text passes through, whoever built it.
        self.redactor = secrets.redactor
        self.store = Store(layout.state_dir, redactor=self.redactor, status_in_background=True)
        self.machine = Machine()
        self.send, self.recv = anyio.create_memory_object_stream[Event](256)
        self.kids = Children(self.launcher, on_register=self._on_register,
                             on_unregister=lambda: self._write_status(force=True), journal=self._journal)
        self.children = self.kids.running  # the same dict: state.json and status list them
        self.shopsim = ShopsimService(witness=layout.state_dir / "shopsim.witness")
        self.val_server = ValServerService()
        self.stop = _Stop()
        # The machine's memory between decisions (round, attempt, retries, a pending park).
        self.counters = Counters(round=0, rounds=cfg.campaign.rounds)
        self.seq = 0
        self.stage_scope: anyio.CancelScope | None = None
        self.hygiene_warnings: list[str] = []  # the repo hygiene guard's current findings
        self.stopping = False
        self.state_data: dict[str, Any] = {}
        self.snap: dict[str, Any] = {}
        self._last_status_write = 0.0
        self.base_env = layout.child_env(cfg)
        self.python = sys.executable
        self.demo_dir = demo_dir()
        self.notifier = Notifier(redactor=self.redactor)  # sd_notify (systemd)
        # Operator notifications (webhook/Slack/ntfy), sent by a task of their own.
        self.alerts = Alerts(cfg.notify, secrets, self.redactor, layout.state_dir, cfg.campaign.name, self._journal)
        self.metrics: Any = None
        if cfg.metrics.textfile is not None:
            self.metrics = TextfileMetrics(cfg.metrics.textfile, cfg.campaign.name)
        # Per failed attempt (issue 18): what the running attempt started with (its log offset,
        # its argv and exit). The cause of each state's last failure is in the counters.
        self.attempts = Attempts(layout, self.redactor, self._journal)
        self.http: httpx.AsyncClient
        self.disk = DiskWatch(layout.ephemeral_root)
        self.final_message: str | None = None  # the one line `shoprld run` prints on a non-zero exit
        self._round_step_s: tuple[int, float] | None = None  # (round, its median step time)
        self._round_started_at: float | None = None
        self._plan_warned: set[tuple[int, str]] = set()  # (round, reason) already journaled

    @property
    def round(self) -> int:
        """The current round's index (kept in the machine's counters)."""
        return self.counters.round

    @round.setter
    def round(self, value: int) -> None:
        self.counters = replace(self.counters, round=value)

    @property
    def attempt(self) -> int:
        return self.counters.attempt

    # -- lifecycle ---------------------------------------------------------------------
    async def main(self) -> int:
        self.store.acquire_lock(role="daemon")
        try:
            self._check_identity()
            self._load()
            async with httpx.AsyncClient(transport=self._transport, trust_env=False) as http:
                self.http = http
                async with anyio.create_task_group() as tg:
                    tg.start_soon(partial(sources.signals, self.send, stopping=lambda: self.stopping,
                                          force=self.kids.kill_all))
                    tg.start_soon(sources.control, self.layout.state_dir / SOCKET_FILE, self.send,
                                  lambda: self.redactor.obj(self._status_doc()))
                    tg.start_soon(sources.watchdog, self.notifier)
                    tg.start_soon(self.alerts.run)
                    tg.start_soon(self.alerts.digest_loop, self.store.journal)
                    code = await self._drive(tg)
                    await self.alerts.drain(ALERT_DRAIN_S)  # the final page gets out, within bounds
                    tg.cancel_scope.cancel()
            aclose = getattr(self._raw_launcher, "aclose", None)
            if aclose is not None:  # e.g. a Ray head this daemon started
                with anyio.CancelScope(shield=True):
                    await aclose()
            return code
        finally:
            if self.snap:  # never over another campaign's status (a refused identity, issue 15)
                self._write_status(force=True)
            self.store.release_lock()

    def _check_identity(self) -> None:
        """Refuse (exit 3) a state dir that belongs to another campaign, before reading it."""
        want = expected(self.cfg.campaign.name, self.cfg.campaign.experiment, self.layout.repo,
                        self.layout.ephemeral_root)
        done = ensure(self.layout.state_dir, want, adopt=self.adopt_state)
        if done is not None and done != "created":
            log.warning("state.identity", action=done, state_dir=str(self.layout.state_dir))
            self.store.append({"event": "state.identity", "action": done})

    def _load(self) -> None:
        loaded = self.store.load()
        data = loaded.state if loaded else {}
        if loaded and loaded.warning:
            log.warning("state.rebuilt", warning=loaded.warning, source=loaded.source)
            self.store.append({"event": "state.rebuilt", "warning": loaded.warning})
        for rec in loaded.unrecorded if loaded else []:  # an older state dir's rounds: recorded once
            self.store.append_round(rec)
        rounds = loaded.rounds if loaded else []
        self.state_data = {
            "campaign": self.cfg.campaign.name, "first_start": data.get("first_start") or self.clock.time(),
            "round_durations": {str(r["round"]): d for r in rounds if (d := _num(r.get("duration_seconds"))) is not None},
            "starts": int(data.get("starts", 0)) + 1, "seq": int(data.get("seq", 0)),
            "previous": {"state": data.get("state"), "round": data.get("round")},
            "deadline": data.get("deadline"),
            "counters": {"restarts": int((data.get("counters") or {}).get("restarts", 0)),
                         "stalls": int((data.get("counters") or {}).get("stalls", 0))},
        }
        prev_state = data.get("state")
        if prev_state in {s.value for s in WORKING_STATES}:  # the last daemon died mid-work
            self.state_data["counters"]["restarts"] += 1
            self.attempts.recovering = f"the daemon restarted after dying in {prev_state}"
        if self.state_data["deadline"] is None:
            self.state_data["deadline"] = resolve_deadline(self.cfg.campaign.deadline, self.state_data["first_start"])
        self.seq = self.state_data["seq"]
        self.counters = replace(self.counters, round=int(data.get("round") or 0),
                                restarts=self.state_data["counters"]["restarts"])
        self.kids.find_left(data.get("children") or {}, self.layout.state_dir)
        self.snap = {
            "campaign": self.cfg.campaign.name, "experiment": self.cfg.campaign.experiment,
            "rounds": self.cfg.campaign.rounds, "steps_per_round": self.cfg.campaign.steps_per_round,
            "step": 0, "step_seconds": None, "eta_seconds": None, "last_checkpoint": None, "disk": None,
            "rounds_done": rounds, "last_error": None, "stop_reason": None,
            "last_failure": data.get("last_failure"),
            "warnings": [], "daemon": {"pid": os.getpid(), "started_at": time.time()},
        }
        last = ckpt.scan(self.layout.save_dir).latest_complete
        if last is not None:
            self.snap["last_checkpoint"] = {"iteration": last.iteration, "path": str(last.path), "complete": True,
                                            "bytes": last.bytes, "committed_at": last.committed_at}

    # -- the main loop -------------------------------------------------------------------
    async def _drive(self, tg: anyio.abc.TaskGroup) -> int:
        self.tg = tg
        prev = self.state_data["previous"]["state"]
        self._transition(None, State.PREFLIGHT_DISK, "resume" if prev else "start")
        self._check_hygiene("start")
        self._spawn(State.PREFLIGHT_DISK)
        async for event in self.recv:
            code = await self._handle(event)
            if code is not None:
                return code
        return EXIT_OK  # pragma: no cover - the queue never closes while we run

    async def _handle(self, event: Event) -> int | None:
        match event:
            case StageOutcome(state, attempt, outcome):
                if state is not self.machine.state or self.stopping:
                    return None  # a stage that finished after we moved on (cancelled)
                return await self._on_outcome(state, attempt, outcome)
            case SignalReceived(signum):
                return await self._on_signal(signum)
            case StopRequested(mode):
                return await self._on_stop(mode)
            case DiskLevel(ev):
                return await self._on_disk(ev)
            case CheckpointSeen(ev):
                return await self._on_checkpoint(ev)
            case RetryDue(state):  # a retry's backoff has passed
                self._spawn(state)
            case HygieneFound(when, found):
                self._on_hygiene(when, found)
        return None

    async def _on_outcome(self, state: State, attempt: int, outcome: base.Outcome | ShoprldError) -> int | None:
        if isinstance(outcome, ShoprldError):
            await self._attempt_failed(state, attempt, base.Outcome("fail", str(outcome)))
            return await self._apply(state, Ending("error", str(outcome), exit_code=outcome.exit_code))
        if outcome.kind == "done":
            maybe_die(state, "done", self.round)
        # Every outcome is followed at once by a transition, a park or a stop, whose fsync
        # covers this line too: one fsync per hand-off instead of two.
        extra = {"step_seconds": self._round_step_s[1]} if state is State.TRAIN and self._round_step_s \
            and self._round_step_s[0] == self.round else {}  # this round's median, for `shoprld report`
        self._journal("stage.outcome", sync=False, state=state.value, attempt=attempt, kind=outcome.kind,
                      message=outcome.message, **extra)  # the store redacts
        log.info("stage.outcome", state=state.value, attempt=attempt, outcome=outcome.kind, message=outcome.message)
        if outcome.kind == "done":
            self._notify_recovered(state)
            if state is State.NEXT_ROUND:
                self._round_finished(outcome.data.get("records"))
            return await self._apply(state, Ending("done", outcome.message))
        cause = await self._attempt_failed(state, attempt, outcome) \
            if outcome.kind in ("retry", "fail", "disk") else None
        if outcome.kind == "retry":
            if outcome.data.get("stall"):
                self._alert("stalled", outcome.message)
                self.snap["warnings"] = [f"stall: {outcome.message}"]
            self.snap["last_error"] = outcome.message
        return await self._apply(state, Ending(outcome.kind, outcome.message, cause=cause,
                                               progressed=bool(outcome.data.get("progressed"))))

    def _decide(self, state: State, ending: Ending) -> Decision:
        """Ask the machine (machine.decide) what ``ending`` in ``state`` leads to."""
        if state is State.START_SHOPSIM and ending.kind in ("done", "skipped"):
            self._reconcile()  # the disk says which round is next; the machine decides the rest
        deadline = Deadline.of(self.state_data.get("deadline"), list(self.state_data["round_durations"].values()),
                               self.clock.time())
        spec = self._spec(state)
        return decide(state, ending, self.counters, self.stop.mode, deadline, RetryPolicy(spec.retries, spec.backoff))

    async def _apply(self, state: State, ending: Ending) -> int | None:
        """Carry out the machine's decision: enter the next state (skipping what is on disk),
        retry after the backoff, or end through :meth:`shutdown`."""
        d = self._decide(state, ending)
        self.counters = d.counters
        self.state_data["counters"]["restarts"] = d.counters.restarts
        action = d.action
        if isinstance(action, Retry):
            self._transition(state, state, RETRY, message=action.message, delay=action.delay)
            self._spawn(state, delay=action.delay)
            return None
        if isinstance(action, Enter):
            assert d.trigger is not None
            self._transition(state, action.state, d.trigger)
            if d.trigger in ("next_round", "shopsim_ready"):
                self._mark_round_started()
            if not MODULES[action.state].completed(self._ctx()):
                self._spawn(action.state)
                return None
            self._journal("stage.skipped", state=action.state.value, reason="output already on disk")
            log.info("stage.skipped", state=action.state.value, round=self.round)
            if action.state is State.NEXT_ROUND:
                self._round_finished(None)
            return await self._apply(action.state, Ending("skipped"))
        if isinstance(action, (Park, Stop, Fail, Finish, Exit)):
            return await self.shutdown(action, state, d.trigger)
        return None  # Stay

    # -- failure causes, crash bundles, notifications (issue 18) -------------------------------
    async def _attempt_failed(self, state: State, attempt: int, outcome: base.Outcome) -> causes.Cause:
        """Classify a failed attempt, write its crash bundle, journal it, show it in status."""
        cause, self.snap["last_failure"] = await self.attempts.failed(
            state.value, self.round, attempt, outcome.message, outcome.data, nvidia_smi=self.cfg.gpus.nvidia_smi)
        return cause

    def _alert(self, event: str, text: str, *, failure: bool = True) -> None:
        """Queue an operator notification about now; the last failure's cause rides along."""
        lf = self.snap.get("last_failure") or {}
        mine = failure and lf.get("round") == self.round
        self.alerts.post(event, text, round=self.round, state=self.machine.state.value if not mine else lf.get("state"),
                         cause=lf.get("cause") if mine else None, bundle=lf.get("bundle") if mine else None)

    def _notify_recovered(self, state: State) -> None:
        """A round stage completed after a failed attempt or an unclean daemon restart (not
        PREFLIGHT_DISK, which passes before the work that died is retried)."""
        if self.attempts.recovering and state in ROUND_STATES:
            self._alert("recovered", f"{state.value} completed after {self.attempts.recovering}")
            self.attempts.recovering = None

    def _reconcile(self) -> None:
        """The current round: the first one without a ledger row (the disk is the truth)."""
        r = 0
        while r < self.cfg.campaign.rounds and next_round.completed(self._ctx(r)):
            r += 1
        if r != self.round:
            log.warning("reconcile.round", persisted=self.round, disk=r)
        self.round = r
        self._journal("reconcile", round=r)

    # -- stages ---------------------------------------------------------------------------
    def _spawn(self, state: State, delay: float = 0.0) -> None:
        if delay:
            self.tg.start_soon(self._later, state, delay)
            return
        self.tg.start_soon(self._stage_task, state, self.attempt)

    async def _later(self, state: State, delay: float) -> None:
        await anyio.sleep(delay)
        await self.send.send(RetryDue(state))

    async def _stage_task(self, state: State, attempt: int) -> None:
        ctx = self._ctx(attempt=attempt)
        spec = self._spec(state)
        structlog.contextvars.bind_contextvars(round=self.round, state=state.value, attempt=attempt)
        self.attempts.started(state.value, self.round)
        with anyio.CancelScope() as scope:
            self.stage_scope = scope
            outcome: base.Outcome | ShoprldError
            try:
                if state in ROUND_STATES:  # before, the round to resume (and its trainer) is not known
                    await self.kids.stop_strays(MODULES[state].ADOPTS)
                with anyio.fail_after(spec.timeout or math.inf):
                    outcome = await MODULES[state].run(ctx)
            except ShoprldError as exc:
                outcome = exc
            except TimeoutError:
                outcome = base.Outcome.retry(f"{state.value} timed out after {spec.timeout:.0f}s")
            except OSError as exc:
                outcome = base.Outcome("disk", str(exc)) if diskmod.is_enospc(exc) else \
                    base.Outcome.retry(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # a stage bug must not kill the campaign: retry, logged
                log.exception("stage.crashed", state=state.value)
                outcome = base.Outcome.retry(f"{type(exc).__name__}: {exc}")
            await self.send.send(StageOutcome(state, attempt, outcome))

    def _spec(self, state: State) -> ProcessSpec:
        c = self.cfg
        return {
            State.START_SHOPSIM: c.shopsim, State.TRAIN: c.train, State.EXPORT_HF: c.export,
            State.VAL: c.val, State.GATE: c.gate, State.INJECT: c.inject,
        }.get(state, ProcessSpec(retries=2))

    def _ctx(self, round_index: int | None = None, attempt: int | None = None) -> base.RoundContext:
        plan = RoundPlan(self.cfg, self.layout, self.round if round_index is None else round_index, self.secrets,
                         python=self.python, demo_dir=self.demo_dir, base_env=self.base_env)
        return base.RoundContext(
            plan=plan, launcher=self.launcher, http=self.http, clock=self.clock, shopsim=self.shopsim,
            val_server=self.val_server, emit=self._emit, register_child=self.kids.register,
            unregister_child=self.kids.unregister, find_child=self.kids.find, stop=self.stop,
            attempt=self.attempt if attempt is None else attempt,
        )

    # -- children (daemon/core/children.py owns them) ---------------------------------------------
    def _on_register(self, child: Child) -> None:
        self._persist()
        maybe_die(self.machine.state, "mid", self.round)
        maybe_die(self.machine.state, f"spawn-{child.record.role}", self.round)

    async def _stop_children(self, *, force: bool = False) -> None:
        await self.kids.stop_all(self.cfg, self.shopsim, lambda: self.shopsim.vouch(self.layout.save_dir), force=force)

    # -- every ending: stop, park, fail, finish, exit ------------------------------------------
    async def shutdown(self, ending: Park | Stop | Fail | Finish | Exit, src: State | None = None,
                       trigger: str | None = None) -> int | None:
        """End the campaign (or park it) in one order, as uvicorn's ``Server.shutdown`` does:
        stop taking work, drain the children, record the end, tell the operator.

        Returns the exit code, or None when a disk park with ``--wait-for-space`` resumed.
        """
        src = src or self.machine.state
        # 1. Stop taking work: no stage may start or finish from now on.
        if isinstance(ending, Stop):
            self.notifier.stopping()
        if isinstance(ending, Park) and ending.enospc:
            crossing = self.disk.enospc(ending.reason, self.cfg.disk, self._checkpoint_bytes())
            if crossing is not None:  # journaled as the monitor's crossings are
                self._journal("disk.hard_limit", **crossing)
        self.stopping = True
        if self.stage_scope is not None:
            self.stage_scope.cancel()
        # 2. Drain: the children stop (trainer first); a park frees what it may.
        fields: dict[str, Any] = {"resume_from": {"round": self.round, "state": src.value}} \
            if isinstance(ending, Stop) else {}
        if isinstance(ending, Park):
            diskmod.Ballast(self.layout.ballast, self.cfg.disk.ballast).release()
        if not isinstance(ending, Exit):  # a stage's configuration error leaves ShopSim for the next start
            await self._stop_children()
        if isinstance(ending, Park):
            freed = self._reclaim(trainer_running=False)
            sample = diskmod.sample(self.layout.ephemeral_root)
            fields = {"free_bytes": sample.avail_bytes, "inodes_free": sample.inodes_free, "reclaimed_bytes": freed,
                      **self.disk.limit_fields(self.cfg.disk, self._checkpoint_bytes())}
        # 3. Record: the end in status, the journal and state.json.
        self._record_ending(ending, src, trigger, fields)
        # 4. Tell: the log, the operator's notification, the line `shoprld run` prints.
        return await self._tell_ending(ending, fields)

    def _record_ending(self, ending: Park | Stop | Fail | Finish | Exit, src: State, trigger: str | None,
                       fields: dict[str, Any]) -> None:
        if isinstance(ending, Stop):
            self.snap["stop_reason"] = ending.reason
            self._transition(src, State.STOPPED, "stop", message=ending.reason, **fields)
        elif isinstance(ending, Fail):
            self.snap["last_error"] = ending.message
            self.snap["stop_reason"] = ending.reason
            self._transition(src, State.FAILED, "fail", message=ending.message, exit_code=ending.code)
        elif isinstance(ending, Park):
            self.snap["stop_reason"] = "disk"
            self.snap["last_error"] = ending.reason
            self._transition(src, State.PAUSED_DISK, "park_disk", message=ending.reason, **fields)
        elif isinstance(ending, Finish):
            self.snap["stop_reason"] = ending.reason
            self.snap["last_error"] = None  # recovered from; the journal keeps the history
            extra = {"message": ending.message} if ending.message else {}
            self._transition(src, State.DONE, trigger or "finish", **extra)
        else:
            self.snap["last_error"] = ending.message
            self._journal("stage.error", state=src.value, error=ending.message, exit_code=ending.code)
        self._write_status(force=True)

    async def _tell_ending(self, ending: Park | Stop | Fail | Finish | Exit, fields: dict[str, Any]) -> int | None:
        if isinstance(ending, Stop):
            resume = fields["resume_from"]
            self._alert("stopped", f"stopped ({ending.reason}); resumes from {resume['state']}", failure=False)
            log.info("daemon.stopped", reason=ending.reason, resume_from=resume)
            return ending.code
        if isinstance(ending, Fail):
            log.error("campaign.failed", message=ending.message, exit_code=ending.code)
            self._alert("gate_stop" if ending.reason == "gate" else "failed", ending.message,
                        failure=ending.reason != "gate")
            self.final_message = ending.message
            return ending.code
        if isinstance(ending, Finish):
            log.info("campaign.done", reason=ending.reason, rounds=self.cfg.campaign.rounds)
            self._alert("done", f"done ({ending.reason}): {len(self.snap.get('rounds_done', []))} of "
                        f"{self.cfg.campaign.rounds} rounds", failure=False)
            return EXIT_OK
        if isinstance(ending, Exit):
            log.error("stage.error", state=self.machine.state.value, error=ending.message)
            self._alert("failed", ending.message)
            self.final_message = ending.message
            return ending.code
        log.warning("disk.parked", reason=ending.reason, **fields)
        self._alert("parked", f"parked in PAUSED_DISK: {ending.reason}", failure=False)
        if not self.wait_for_space:
            self.final_message = (f"parked in PAUSED_DISK: {ending.reason}; fix: free space on "
                                  f"{self.layout.ephemeral_root}, then run again (or use --wait-for-space)")
            return EXIT_DISK
        await self.disk.wait_for_space(self.cfg.disk, self._checkpoint_bytes(), self.clock.monotonic)
        self.stopping = False
        self._transition(State.PAUSED_DISK, State.PREFLIGHT_DISK, "resume", message="space is back")
        self._spawn(State.PREFLIGHT_DISK)
        return None

    def _reclaim(self, *, trainer_running: bool) -> int:
        """Delete what this campaign may: checkpoints outside retention, partials (only when no
        trainer runs), and the campaign's own tmp. Never the shared cache or other campaigns."""
        scan = ckpt.scan(self.layout.save_dir)
        m = ckpt.IterationMapping(self.cfg.campaign.steps_per_round, self.cfg.train.end_offset)
        export = base.read_json(self.layout.artifacts / "export" / f"{base.round_id(self.round)}.json") or {}
        exported = export.get("iteration") if isinstance(export.get("iteration"), int) else None
        # Under pressure: only the previous round's final (keep_finals=1), not the configured finals.
        keep = ckpt.keep_set(scan, m, round=self.round, finished=False, keep_finals=1, export_iteration=exported)
        doomed, freed = ckpt.retain(scan, keep, save_dir=self.layout.save_dir, trainer_running=trainer_running)
        if self.layout.tmp.exists():
            freed += diskmod.clear_dir_contents(self.layout.tmp, within=self.layout.exp_dir)
        if freed:
            log.info("disk.reclaimed", bytes=freed, deleted=[c.iteration for c in doomed])
        return freed

    # -- event sources ------------------------------------------------------------------------------
    async def _on_signal(self, signum: int) -> int | None:
        if signum == signal.SIGHUP:
            self._reload()
            return None
        log.info("daemon.signal", signal=signal.Signals(signum).name)
        return await self._apply(self.machine.state, Ending("stop"))

    def _reload(self) -> None:
        """SIGHUP: stages started from now on see the re-read campaign file (sources.reloaded
        says when it applies); the running one keeps what it started with."""
        new = sources.reloaded(self.cfg)
        if new is None:
            return
        self.cfg = new
        self.base_env = self.layout.child_env(new)
        self._journal("config.reloaded")
        log.info("config.reload", source=str(new.source))

    async def _on_stop(self, mode: str) -> int | None:
        self._journal("stop.requested", mode=mode)
        if mode == "now":
            return await self._apply(self.machine.state, Ending("stop"))
        self.stop.mode = mode
        if mode == "checkpoint" and self.machine.state is State.TRAIN:
            self.notifier.extend_timeout(self.cfg.train.stall_min)
        return None

    async def _on_checkpoint(self, ev: dict[str, Any]) -> int | None:
        if ev.get("event") != "checkpoint.committed":
            return None
        self.snap["last_checkpoint"] = {"iteration": ev["iteration"], "path": ev["path"], "complete": True,
                                        "bytes": ev.get("bytes", 0), "committed_at": time.time()}
        self._journal("checkpoint.committed", iteration=ev["iteration"], bytes=ev.get("bytes"),
                      latency_ms=ev.get("latency_ms"))
        self._write_status(force=True)
        self.disk.follow_checkpoint(self.cfg.disk, self._checkpoint_bytes())
        if self.machine.state is State.TRAIN:  # issue 17: a save supersedes the round's older ones
            deleted, freed = saves.prune_superseded(self.cfg, self.layout, self.round)
            if deleted:
                self._journal("retention.applied", deleted=deleted, bytes=freed, rule="newest save of the round")
        return await self._apply(self.machine.state, Ending("checkpoint"))

    def _checkpoint_bytes(self) -> int | None:
        """The last committed checkpoint's measured size (None before the first)."""
        return (self.snap.get("last_checkpoint") or {}).get("bytes") or None

    def _disk_sampled(self, line: dict[str, Any]) -> None:
        self.snap["disk"] = line

    async def _on_disk(self, ev: dict[str, Any]) -> int | None:
        """The monitor's level change (disk.py's verdict): reclaim what this campaign may, ask
        the same guard whether that lifted the volume out of the level (same rule, same
        hysteresis), and let the machine decide what the level means now."""
        name = ev["event"]  # the monitor already logged it
        self._journal(name, **{k: v for k, v in ev.items() if k != "event"})
        if self.machine.state not in MODULES or self.stopping:
            return None
        if name == "disk.ok":
            return await self._apply(self.machine.state, Ending("disk_ok"))
        level = diskmod.Level.HARD if name == "disk.hard_limit" else diskmod.Level.SOFT
        self._reclaim(trainer_running=self.machine.state is State.TRAIN)
        verdict = self.disk.judge()
        if verdict is None:  # no guard before the monitor runs: nothing sent this event
            return None
        if not verdict.holds(level):
            log.info("disk.recovered_by_reclaim", free_bytes=verdict.free_bytes)
            return None
        next_save = int(self._checkpoint_bytes() or self.cfg.disk.checkpoint_estimate)
        reason = verdict.park_reason(self.layout.ephemeral_root, level)
        ending = Ending("disk_hard", reason) if level is diskmod.Level.HARD else \
            Ending("disk_soft", reason, fits=verdict.fits(next_save))
        code = await self._apply(self.machine.state, ending)
        if self.counters.park_pending and self.machine.state is State.TRAIN:
            self.notifier.extend_timeout(self.cfg.train.stall_min)
        return code

    # -- persistence and status ----------------------------------------------------------------------
    def _transition(self, src: State | None, dst: State, trigger: str, **fields: Any) -> None:
        if src is not None and trigger not in ("start",):
            self.machine.fire(trigger)
        else:
            self.machine.set_state(dst)
        assert self.machine.state is dst, (self.machine.state, dst)
        self.snap["state"] = dst.value
        self.snap["round"] = self.round
        if dst is State.TRAIN:
            self.snap["step"] = self._step_from_disk()
        self._journal("transition", src=src.value if src else None, dst=dst.value, trigger=trigger, **fields)
        log.info("transition", src=src.value if src else None, dst=dst.value, trigger=trigger, round=self.round)
        structlog.contextvars.bind_contextvars(campaign=self.cfg.campaign.name, round=self.round, state=dst.value)
        self._persist()
        maybe_die(dst, "enter", self.round)
        self.notifier.status_of(self.snap)
        if dst is State.START_SHOPSIM and src is State.PREFLIGHT_DISK:
            self._after_preflight()
        if dst is State.TRAIN and src is State.START_SHOPSIM or dst is State.DONE and src is State.START_SHOPSIM:
            self.notifier.ready()

    def _after_preflight(self) -> None:
        """The volume exists now: the log file, the watcher and the disk guard can start."""
        add_file_handler(self.layout.logs / "shoprld.log", redactor=self.redactor)
        if not getattr(self, "_sources_started", False):
            self._sources_started = True
            self.tg.start_soon(sources.checkpoint_commits, self.layout.save_dir, self.cfg, self.send)
            self.tg.start_soon(self.disk.monitor, self.cfg.disk, self._checkpoint_bytes(), self._disk_sampled,
                               lambda ev: self.send.send(DiskLevel(ev)))
            self.tg.start_soon(self.shopsim.supervise, self._ctx)

    def _journal(self, event: str, *, sync: bool = True, **fields: Any) -> None:
        self.seq += 1
        # The state the event really happens in (the supervisor's ShopSim restart in TRAIN is
        # a TRAIN event); a stage's own events name their state explicitly.
        rec = {"event": event, "seq": self.seq, "round": self.round, "state": self.machine.state.value, **fields}
        disk = self.snap.get("disk")
        if event in ("transition", "checkpoint.committed") and isinstance(disk, dict) and "free_bytes" not in rec:
            rec["free_bytes"] = disk.get("free_bytes")  # the last sample: `shoprld report`'s free-disk series
        if event == "transition":
            rec["snapshot"] = self._state_doc()
        self.store.append(rec, sync=sync)

    def _state_doc(self) -> dict[str, Any]:
        """The snapshot (state.json, the journal's transitions): its size does not grow with the
        rounds. The per-round facts are in rounds.jsonl, written once; the cursor counts them."""
        return {
            **{k: v for k, v in self.state_data.items() if k != "round_durations"},  # per round: rounds.jsonl
            "state": self.machine.state.value, "round": self.round, "seq": self.seq,
            "children": {r: c.record.to_json() for r, c in self.children.items()},
            "rounds_recorded": len(self.snap.get("rounds_done", [])), "stop_reason": self.snap.get("stop_reason"),
            "last_error": self.snap.get("last_error"), "last_failure": self.snap.get("last_failure"),
        }

    def _persist(self) -> None:
        self.store.save(self._state_doc())
        self._write_status(force=True)

    def _status_doc(self) -> dict[str, Any]:
        shop = {"url": self.cfg.shopsim.url, "healthy": self.shopsim.healthy, "free_slots": self.shopsim.free_slots,
                "environment_slots": self.shopsim.environment_slots,
                "slots": self.cfg.shopsim.slots, "checked_at": self.shopsim.checked_at}
        children = [{"role": c.record.role, "pid": c.pid, "started_at": c.record.started_at, "log": c.record.log}
                    for c in self.children.values()]
        deadline = self.state_data.get("deadline")
        warnings = [*self.snap.get("warnings", []), *self.hygiene_warnings]
        served = self.shopsim.environment_slots
        if served is not None and served != self.cfg.shopsim.slots:
            warnings.append(f"shopsim at {self.cfg.shopsim.url} has {served} slots but shopsim.slots = "
                            f"{self.cfg.shopsim.slots}; fix: make them agree (SHOPSIM_ENV_SLOTS and shopsim.slots)")
        plan = self._plan()
        warnings += [line for _, line in plan.problems()]
        return {**self.snap, "warnings": warnings, "plan": plan.as_dict(), "shopsim": shop, "children": children, "deadline": deadline,
                "stop_conditions": {"rounds_done": len(self.snap.get("rounds_done", [])),
                                    "rounds": self.cfg.campaign.rounds, "deadline": deadline},
                "updated_at": time.time()}

    def _write_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status_write < 0.5:
            return
        self._last_status_write = now
        doc = self._status_doc()
        self._warn_plan()
        try:
            # The newest rounds only: status.json keeps its size; `shoprld status` reads every
            # round from rounds.jsonl (daemon/foundation/roundlog.py).
            self.store.write_status({**doc, "rounds_done": doc["rounds_done"][-STATUS_RECENT_ROUNDS:]})
        except OSError as exc:
            log.warning("status.write_failed", error=str(exc))
        if self.metrics is not None:
            self.metrics.write(self.redactor.obj(doc), self.state_data["counters"])

    def _plan(self) -> Any:
        """The rest of the campaign (daemon/core/planning.py), from what the engine already knows."""
        disk = self.snap.get("disk") if isinstance(self.snap.get("disk"), dict) else {}
        last = self.snap.get("last_checkpoint") or {}
        in_round = self.machine.state in ROUND_STATES
        return make_plan(
            rounds=self.cfg.campaign.rounds, current=self.round,
            durations=list(self.state_data.get("round_durations", {}).values()) if in_round else [],
            round_started_at=self._round_started_at, now=self.clock.time(),
            train_eta=self.snap.get("eta_seconds"), in_train=self.machine.state is State.TRAIN,
            deadline=self.state_data.get("deadline"), free_bytes=disk.get("free_bytes"),
            hard_limit_bytes=disk.get("hard_limit_bytes"),
            need_bytes=forecast_for(self.cfg, last.get("bytes") or None).total)

    def _warn_plan(self) -> None:
        """Journal each "the next round will not fit" once per round and reason, as soon as it is known."""
        for reason, line in self._plan().problems():
            if (self.round, reason) in self._plan_warned:
                continue
            self._plan_warned.add((self.round, reason))
            log.warning("plan.next_round_wont_fit", reason=reason, message=line)
            self._journal("plan.next_round_wont_fit", sync=False, reason=reason, message=line)

    def _emit(self, event: str, **fields: Any) -> None:
        log.info(event, **fields)
        if event == "train.progress":
            self.snap["step"] = fields.get("step", self.snap.get("step", 0))
            if fields.get("step_seconds"):
                self.snap["step_seconds"] = fields["step_seconds"]
                self._round_step_s = (self.round, float(fields["step_seconds"]))
                left = self.cfg.campaign.steps_per_round - self.snap["step"]
                self.snap["eta_seconds"] = max(0.0, left * fields["step_seconds"])
            self._write_status()
            self.notifier.status_of(self.snap)
        elif event == "train.stall":
            self.state_data["counters"]["stalls"] += 1
            if fields.get("policy") == "alert":  # "restart" alerts with the cause once the attempt ends
                self._alert("stalled", f"trainer stalled: no step for {fields.get('idle_s')}s", failure=False)
            self.snap["warnings"] = [f"trainer stalled: no step for {fields.get('idle_s')}s"]
            self._journal("train.stall", **fields)
            self._write_status(force=True)
        elif event in ("shopsim.died", "shopsim.lease_leak", "shopsim.restart", "run.archived", "gate.reused",
                       "child.adopted", "checkpoint.rollback", "shopsim.outage_after_use", "shopsim.ready",
                       "shopsim.release_all", "shopsim.leaks_recovered", "shopsim.waited",
                       "shopsim.restart_failed", "sidecar.drain_timeout", "shopsim.client_stopped_for_recovery",
                       "train.resume_check", "train.stacks_dumped"):  # issue 17: the resume check; a stall's evidence
            self._journal(event, **fields)
        elif event.startswith("gpu."):  # GPU hygiene (daemon/services/gpus.py): what held the GPUs, what was stopped, the wait
            self._journal(event, **fields)
        elif event.startswith("save."):  # issue 17 (daemon/round/saves.py): save timings, each launch's interval
            self._journal(event, **fields)
            if event == "save.interval":
                self.snap["saves"] = fields
        elif event == "stage.exit":
            self.attempts.info["returncode"] = fields.get("returncode")
        elif event == "stage.spawn":  # informational: the child's record is in state.json already
            self.attempts.info["argv"] = fields.get("argv") or []  # already redacted by the stage
            self._journal(event, sync=False, role=fields.get("role"), pid=fields.get("pid"))
            if fields.get("role") == ChildRole.SHOPSIM:
                self._write_status(force=True)

    def _step_from_disk(self) -> int:
        scan = ckpt.scan(self.layout.save_dir)
        m = ckpt.IterationMapping(self.cfg.campaign.steps_per_round, self.cfg.train.end_offset)
        start = m.end_iteration(self.round - 1) if self.round > 0 else 0
        latest = scan.latest_complete.iteration if scan.latest_complete else start
        return max(0, min(self.cfg.campaign.steps_per_round, latest - start))

    # -- rounds and the deadline -------------------------------------------------------------------------
    def _mark_round_started(self) -> None:
        path = self.layout.artifacts / "round" / f"{base.round_id(self.round)}.json"
        rec = base.read_json(path)
        if rec is None:
            rec = {"round": self.round, "started_at": self.clock.time()}
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, rec)
        self._round_started_at = _num(rec.get("started_at"))

    def _round_finished(self, records: next_round.RoundRecords | None) -> None:
        """The round is recorded: its line in ``rounds_done``, its duration, the operator's note.
        ``records``: what NEXT_ROUND read (None when it was skipped: then the stage reads them)."""
        ctx = self._ctx()
        read = records or next_round.records(ctx)
        started_at = read.started.get("started_at")
        duration = self.clock.time() - float(started_at) if started_at else None
        done = [r for r in self.snap.get("rounds_done", []) if r.get("round") != self.round]
        done.append({"round": self.round, **read.result(), "duration_seconds": duration})
        self.snap["rounds_done"] = sorted(done, key=lambda r: r["round"])
        log.info("round.done", **done[-1])  # the terminal's one line per round result
        if duration is not None:
            self.state_data["round_durations"][str(self.round)] = duration
        # The round's facts, written once (store.py: journal, then rounds.jsonl, then the cursor).
        self._journal(ROUND_DONE_EVENT, sync=False, **done[-1])
        self.store.append_round(done[-1])
        self._persist()
        val = f"{read.primary.get('success_rate')}" if read.primary else "n/a"
        self._alert("round_done", f"{ctx.round_id} done: success_rate {val}, gate {read.gate.get('decision', '?')}",
                    failure=False)
        self._check_hygiene(f"after {ctx.round_id}")

    # -- repo hygiene (issue 9): before the first stage and after each round; never deletes ----------
    def _check_hygiene(self, when: str) -> None:
        self.tg.start_soon(self._hygiene_task, when)

    async def _hygiene_task(self, when: str) -> None:
        roots = {self.layout.repo, self.layout.project_root}  # project_root: the tools' default output
        await self.send.send(HygieneFound(when, await hygiene.scan_roots(roots, self.cfg.storage.repo_hygiene_max)))

    def _on_hygiene(self, when: str, found: list[str]) -> None:
        """Journal each new finding once; status shows the current ones."""
        for w in found:
            if w not in self.hygiene_warnings:
                log.warning("repo.hygiene", when=when, warning=w)
                self._journal("repo.hygiene", when=when, warning=w)
        self.hygiene_warnings = found
        self._write_status(force=True)

def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def run_campaign(config: Path, *, debug: bool = False, wait_for_space: bool = False,
                 launcher: Launcher | None = None, adopt_state: bool = False, verbose: bool = False) -> int:
    """``shoprld run``: load, check secrets, configure logging, run the engine.

    The console gets JSON lines when piped or under systemd, the compact view on a
    terminal, and every event with ``verbose`` or ``debug`` (daemon/foundation/console.py).
    """
    cfg = load_config(config)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    # What `shoprld check` refuses, run refuses here, before the state dir is touched or any
    # child starts (the same function: issue 15).
    validate(cfg, layout)
    mode = terminal_mode(sys.stdout, verbose=verbose or debug)
    # The process's redactor is built here, from the loaded .env, and handed on: to the logs
    # now, and (the engine's, from the same secrets) to the store, the notifier and the alerts.
    configure(level="DEBUG" if debug else "INFO", json_stdout=mode == "json",
              compact=Campaign(cfg.campaign.rounds, cfg.campaign.steps_per_round) if mode == "compact" else None,
              redactor=secrets.redactor)
    secrets.require(cfg.required_secrets())  # notify.endpoints' url_env/token_env among them
    missing = extras_problem(cfg.metrics.textfile)
    if missing:
        raise ConfigError(missing)
    engine = Engine(cfg, layout, secrets, launcher=launcher, wait_for_space=wait_for_space, adopt_state=adopt_state)
    code = anyio.run(engine.main)
    if code and engine.final_message:
        print(f"shoprld: {secrets.redact(engine.final_message)}", file=sys.stderr)
    return code

