"""The engine: startup -> reconcile -> main loop -> shutdown, in one anyio task group.

Every trigger goes through ONE queue of typed events (events.py): stage outcomes, signals,
control-socket requests, disk-guard level changes and checkpoint commits (their sources
are in sources.py). The main loop takes one event at a time, asks the machine what it
leads to (``machine.decide``: the next state and one action), and carries that out:
persist the transition (journal line, then state.json, then status.json), tell systemd,
spawn the next stage as a task, retry after the backoff, or end through the one ordered
shutdown (shutdown.py: ``Shutdown.run(decision)``). Stages never call the engine; they
return an Outcome. Signal receivers only enqueue; the loop acts (a second SIGINT while
stopping is the one exception: it escalates to SIGKILL at once, since the loop is busy
stopping).

The engine is the composition root: it builds each collaborator once with what it needs
(none calls back into it) and keeps the loop, the decisions' carrying-out and the stages'
tasks. What changes while it runs (the config, the machine's counters, a pending stop) is
one ``Live`` object the collaborators read: snapshot.py (its view of the campaign: journal,
the transition, state.json, status.json), progress.py (the stages' events, the rounds'
bookkeeping), reactions.py (what an event means: an Occurrence), shutdown.py (every
ending), children.py.

Start-up order: lock the state dir (one daemon per campaign), load the state (rebuilt
from the journal, then the disk, when corrupt), find children left by a crashed daemon
(recorded pids, plus any process carrying this campaign's SHOPRLD_CHILD tag), then
PREFLIGHT_DISK and START_SHOPSIM, then the first round without a ledger row, skipping
each round state whose output is already on disk.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import structlog

from shoprld.states import base, next_round

from shoprld.daemon.core import sources, stages
from shoprld.daemon.core.alerts import Alerts
from shoprld.daemon.core.attempts import Attempts
from shoprld.daemon.core.children import Children, TaggingLauncher
from shoprld.daemon.core.crashpoints import maybe_die, maybe_raise
from shoprld.daemon.core.diskwatch import DiskWatch
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.storage import disk as diskmod
from shoprld.daemon.foundation.system.errors import EXIT_BUG, EXIT_DISK, EXIT_OK, NoSpace, PreflightError, ShoprldError
from shoprld.daemon.foundation.records.identity import ensure, expected
from shoprld.daemon.foundation.records.outputs import campaign_files
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.core.events import (CheckpointCommitted, DiskLevelChanged, Event, HygieneFound, RetryDue,
                                        SignalReceived, StageOutcome, StopRequested, TaskFailed)
from shoprld.daemon.foundation.system.logs import add_file_handler
from shoprld.daemon.foundation.records.paths import round_id
from shoprld.daemon.round.machine import (END_ACTIONS, RETRY, WORKING_STATES, Counters, Deadline, Decision, Enter,
                                         Exit, Machine, Occurrence, Retry, RetryPolicy, State, decide)
from shoprld.daemon.core.metrics import HEARTBEAT_S as METRICS_HEARTBEAT_S, TextfileMetrics
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.progress import Progress
from shoprld.daemon.core.reactions import Reactions
from shoprld.daemon.core.shutdown import Shutdown
from shoprld.daemon.core.snapshot import Live, Snapshot
from shoprld.daemon.services.processes import Launcher
from shoprld.daemon.services.ray import build_launcher
from shoprld.daemon.round.plan import RoundPlan, demo_dir
from shoprld.daemon.foundation.config.secrets import Secrets
from shoprld.daemon.foundation.records.statefiles import state_dir_problems
from shoprld.daemon.services.shopsim import ShopsimService
from shoprld.daemon.services.valserver import ValServerService
from shoprld.daemon.foundation.records.store import SOCKET_FILE, Store

log = structlog.get_logger("shoprld.engine")
# How long the daemon waits at exit for queued notifications (the final "done"/"failed").
ALERT_DRAIN_S = 30.0
# How long after a hand-off's transition its state.json and status.json may wait for the next
# child's registration before a task writes them anyway: past a spawn (a few ms), short
# enough that `shoprld status` does not notice.
FILES_LATER_S = 0.05


class Engine:
    """One campaign's daemon. ``await Engine(...).main()`` returns the exit code."""

    def __init__(self, cfg: Config, layout: Layout, secrets: Secrets, *, launcher: Launcher | None = None,
                 clock: base.Clock | None = None, wait_for_space: bool = False,
                 transport: httpx.AsyncBaseTransport | None = None, adopt_state: bool = False,
                 notify_marker: str = "") -> None:
        # Before any state file is opened (the alerts record and ShopSim's witness are read right
        # here): a FIFO or a directory at a state file's name hangs or breaks every reader and
        # writer; refused in one line (exit 3), nothing written.
        wrong = state_dir_problems(layout.state_dir)
        if wrong:
            raise PreflightError(wrong[0])
        self.layout, self.secrets = layout, secrets
        # The config and the machine's counters, which every collaborator reads at each use
        # (SIGHUP replaces the one, each decision the other; a stop request leaves its mode there).
        self.live = Live(cfg, Counters(round=0, rounds=cfg.campaign.rounds))
        self.clock = clock or base.SystemClock()
        self._raw_launcher = launcher or build_launcher(cfg, layout)
        self.launcher: Launcher = TaggingLauncher(self._raw_launcher, str(layout.state_dir))
        self.adopt_state = adopt_state  # `shoprld run --adopt-state`: take over another campaign's state dir
        self._transport = transport
        # The one Redactor every persisted or sent text passes through, whoever built it.
        self.redactor = secrets.redactor
        self.store = Store(layout.state_dir, redactor=self.redactor, status_in_background=True)
        self.machine = Machine()
        self.send, self.recv = anyio.create_memory_object_stream[Event](256)
        self.shopsim = ShopsimService(witness=layout.shopsim_witness)
        self.val_server = ValServerService()
        self.stage = stages.RunningStage()
        self.base_env = layout.child_env(cfg)
        self.python = sys.executable
        self.demo_dir = demo_dir()
        self.notifier = Notifier(redactor=self.redactor)  # sd_notify (systemd)
        self.http: httpx.AsyncClient
        self.disk = DiskWatch(layout.ephemeral_root)
        self.view = Snapshot(self.store, self.redactor, self.live, machine=self.machine, notifier=self.notifier,
                             shopsim=self.shopsim, clock=self.clock, metrics=_metrics(cfg, layout))
        # Operator notifications (webhook/Slack/ntfy), sent by a task of their own. They journal
        # through the view, and the view pages through them.
        self.alerts = self.view.alerts = Alerts(cfg.notify, secrets, self.redactor, layout.state_dir,
                                                cfg.campaign.name, self.view.journal, transport=transport,
                                                marker=notify_marker)
        self.kids = Children(self.launcher, self.view, shopsim=self.shopsim, save_dir=layout.save_dir)
        # Per failed attempt (issue 18): what the running attempt started with (its log offset,
        # its argv and exit). The cause of each state's last failure is in the counters.
        self.attempts = Attempts(layout, self.redactor, self.view.journal)
        self._files_flush_pending = False  # a _flush_files_later task is waiting
        self._files_due_at = 0.0  # ... until then (anyio.current_time)
        self.progress = Progress(self.view, layout=layout, clock=self.clock, notifier=self.notifier,
                                 attempts=self.attempts)
        self.reactions = Reactions(self.view, layout=layout, machine=self.machine, disk=self.disk,
                                   notifier=self.notifier, shopsim=self.shopsim)
        self.ending = Shutdown(self.view, layout=layout, disk=self.disk, notifier=self.notifier, clock=self.clock,
                               children=self.kids, stage=self.stage, wait_for_space=wait_for_space)

    @property
    def cfg(self) -> Config:
        """The running config (a SIGHUP may replace it)."""
        return self.live.cfg

    @property
    def counters(self) -> Counters:
        """The machine's memory between decisions (round, attempt, retries, restarts, a pending park)."""
        return self.live.counters

    @counters.setter
    def counters(self, value: Counters) -> None:
        self.live.counters = value

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

    @property
    def state_data(self) -> dict[str, Any]:
        """What state.json keeps besides the machine's state and round (snapshot.py)."""
        return self.view.state_data

    @property
    def final_message(self) -> str | None:
        """The one line `shoprld run` prints on a non-zero exit (shutdown.py sets it)."""
        return self.ending.final_message

    # -- lifecycle ---------------------------------------------------------------------
    async def main(self) -> int:
        try:
            return await self._main()
        except OSError as exc:
            if not diskmod.is_enospc(exc):
                raise
            # Before the loop runs (the lock's pid file, a rebuilt state, the ledger's rebuild): no
            # child of ours yet, nothing half-written (every write is temp + rename, or a torn line
            # the next start skips).
            raise NoSpace(self._no_space(exc)) from None

    async def _main(self) -> int:
        self.store.acquire_lock(role="daemon")
        try:
            self._check_identity()
            self._load()
            try:
                code = await self._run_tasks()
            except Exception as exc:  # a bug in the loop itself: no orphans, one line
                code = await self._crashed(exc)
            aclose = getattr(self._raw_launcher, "aclose", None)
            if aclose is not None:  # e.g. a Ray head this daemon started
                with anyio.CancelScope(shield=True):
                    await aclose()
            if code == EXIT_OK:  # the campaign ended, its children with it: no socket path is in use
                self.layout.remove_short_links()
            return code
        finally:
            try:
                if self.view.snap:  # never over another campaign's status (a refused identity, issue 15)
                    self.view.write_status(force=True)
            except OSError as exc:  # a full state dir: the one line already says what the exit says
                if not diskmod.is_enospc(exc):
                    raise
            self.store.release_lock()

    def _no_space(self, exc: BaseException) -> str:
        """The one line for a write of the daemon's own that did not fit (state dir, log, record)."""
        leaf: BaseException | None = exc
        todo: list[BaseException] = [exc]
        while todo:  # the OSError inside the groups and causes, for its file name
            leaf = todo.pop()
            if isinstance(leaf, OSError) and leaf.filename:
                break
            if isinstance(leaf, BaseExceptionGroup):
                todo.extend(leaf.exceptions)
            if leaf.__cause__ is not None:
                todo.append(leaf.__cause__)
        name = getattr(leaf, "filename", None)
        path = Path(str(name)) if name else self.layout.state_dir
        state = self.layout.state_dir
        where = "the state dir's filesystem" if path == state or state in path.parents else "its filesystem"
        return (f"{path}: no space left on {where}; the campaign stopped (its children too, no temp "
                f"file left); fix: free space there (df -h {path if path.is_dir() else path.parent}), then run again: it resumes "
                "where the journal ends")

    async def _run_tasks(self) -> int:
        async with httpx.AsyncClient(transport=self._transport, trust_env=False) as http:
            self.http = http
            async with anyio.create_task_group() as tg:
                self.tg = tg
                self._background("signals", partial(sources.signals, self.send, stopping=lambda: self.ending.stopping,
                                                    force=self.kids.kill_all))
                self._background("control", sources.control, self.layout.state_dir / SOCKET_FILE, self.send,
                                 self.view.redacted_status)
                self._background("watchdog", sources.watchdog, self.notifier)
                self._background("notify", self.alerts.run)
                self._background("digest", self.alerts.digest_loop, self.store.journal)
                self._background("heartbeat", self._heartbeat)
                code = await self._drive(tg)
                await self.alerts.drain(ALERT_DRAIN_S)  # the final page gets out, within bounds
                tg.cancel_scope.cancel()
        return code

    async def _heartbeat(self) -> None:
        """Rewrite the metrics textfile between status updates (a long VAL or ShopSim start
        writes none), so only a dead daemon's file goes stale."""
        while True:
            await anyio.sleep(METRICS_HEARTBEAT_S)
            self.view.write_metrics()

    def _background(self, name: str, fn: Any, *args: Any) -> None:
        """Start a task of the daemon's own; its crash becomes :class:`TaskFailed` on the queue."""
        self.tg.start_soon(self._guarded, name, fn, *args)

    async def _guarded(self, name: str, fn: Any, *args: Any) -> None:
        try:
            maybe_raise(name)
            await fn(*args)
        except Exception as exc:
            if diskmod.is_enospc(exc):
                raise  # a full state dir (alerts.json...): _crashed stops the campaign, exit 4
            log.debug("daemon.task_failed", task=name, exc_info=True)  # the traceback, with --debug
            line = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            await self.send.send(TaskFailed(name, f"internal error: the daemon's {name} task failed ({line}); "
                                                  "the campaign stopped; fix: report it with the journal, "
                                                  "then run again"))

    async def _crashed(self, exc: BaseException) -> int:
        """The engine's own task group failed: stop every child we started, record one line.
        A ShoprldError inside is re-raised as itself (its own line and exit code)."""
        leaf: BaseException = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        log.debug("daemon.crashed", exc_info=exc)
        with anyio.CancelScope(shield=True):
            try:
                await self.kids.stop_all(force=True)
            except Exception as stop_exc:  # the crash is the news; say the stop failed too
                log.error("children.stop_failed", error=f"{type(stop_exc).__name__}: {stop_exc}")
        if isinstance(leaf, ShoprldError):
            raise leaf from None
        if diskmod.is_enospc(exc):  # a write of our own did not fit: not a bug, exit 4
            self.ending.final_message = self._no_space(exc)
            return EXIT_DISK
        line = " ".join(f"{type(leaf).__name__}: {leaf}".split())[:500]
        self.ending.final_message = f"internal error: {line}; the children were stopped; fix: rerun with --debug " \
                                    f"and report it with the journal"
        try:
            self._journal("daemon.crashed", error=line)
        except Exception:  # a full or broken state dir: the line on stderr is what is left
            pass
        return EXIT_BUG

    def _check_identity(self) -> None:
        """Refuse (exit 3) a state dir that belongs to another campaign, before reading it."""
        want = expected(self.cfg.campaign.name, self.cfg.campaign.experiment, self.layout.repo,
                        self.layout.ephemeral_root)
        done = ensure(self.layout.state_dir, want, adopt=self.adopt_state)
        if done is not None and done != "created":
            log.warning("state.identity", action=done, state_dir=str(self.layout.state_dir))
            self.store.append({"event": "state.identity", "action": done})

    def _load(self) -> None:
        data = self.view.load(self.layout.save_dir)
        # The ledger is derived from the record (rounds.jsonl, completed from the journal just
        # now): the round to resume is the record's, whatever git did to the checkout meanwhile.
        note = next_round.repair(self.layout, self.redactor.text)
        if note:
            log.warning("ledger.rebuilt", warning=note)
            self.store.append({"event": "ledger.rebuilt", "warning": note})
        prev_state = data.get("state")
        if prev_state in {s.value for s in WORKING_STATES}:  # the last daemon died mid-work
            self.attempts.recovering = f"the daemon restarted after dying in {prev_state}"
        self.kids.find_left(data.get("children") or {}, self.layout.state_dir)

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
                if state is not self.machine.state or self.ending.stopping:
                    return None  # a stage that finished after we moved on (cancelled)
                return await self._on_outcome(state, attempt, outcome)
            case SignalReceived(signum):
                return await self._on_signal(signum)
            case StopRequested(mode):
                return await self._apply_if(self.reactions.stop_requested(mode))
            case DiskLevelChanged():
                code = await self._apply_if(self.reactions.disk_level(event, stopping=self.ending.stopping))
                self.reactions.park_waits()
                return code
            case CheckpointCommitted():
                return await self._apply(self.machine.state, self.reactions.checkpoint(event))
            case RetryDue(state):  # a retry's backoff has passed
                self._spawn(state)
            case HygieneFound(when, found):
                self.reactions.hygiene(when, found)
            case TaskFailed(name, message):
                log.error("daemon.task_failed", task=name, error=message)
                await self.kids.stop_all()  # Exit keeps ShopSim for a config error; a crash does not
                state = self.machine.state
                return await self._end(Decision(state, None, Exit(message, EXIT_BUG), self.counters), state)
        return None

    async def _apply_if(self, ending: Occurrence | None) -> int | None:
        return None if ending is None else await self._apply(self.machine.state, ending)

    async def _on_outcome(self, state: State, attempt: int, outcome: base.Outcome | ShoprldError) -> int | None:
        if isinstance(outcome, ShoprldError):
            await self.progress.attempt_failed(state, attempt, base.Outcome("fail", str(outcome)))
            return await self._apply(state, Occurrence("error", str(outcome), exit_code=outcome.exit_code))
        if outcome.data.get("tool_failed") and outcome.kind in ("done", "gate_stop"):
            # A tool crashed but its stage goes on (the gate's policy): still a bundle and a page.
            await self.progress.tool_failed(state, attempt, outcome)
        if outcome.kind == "done":
            maybe_die(state, "done", self.round)
        # Every outcome is followed at once by a transition, a park or a stop, whose fsync
        # covers this line too: one fsync per hand-off instead of two.
        step_s = self.progress.round_step_s
        extra = {"step_seconds": step_s[1]} if state is State.TRAIN and step_s \
            and step_s[0] == self.round else {}  # this round's median, for `shoprld report`
        self._journal("stage.outcome", sync=False, state=state.value, attempt=attempt, kind=outcome.kind,
                      message=outcome.message, **extra)  # the store redacts
        log.info("stage.outcome", state=state.value, attempt=attempt, outcome=outcome.kind, message=outcome.message)
        if outcome.kind == "done":
            self.progress.recovered(state)
            if state is State.NEXT_ROUND:
                self._round_finished(outcome.data.get("records"))
            return await self._apply(state, Occurrence("done", outcome.message))
        cause = await self.progress.attempt_failed(state, attempt, outcome) \
            if outcome.kind in ("retry", "fail", "disk") else None
        if outcome.kind == "retry":
            if outcome.data.get("stall"):
                self.view.alert("stalled", outcome.message)
                self.view.snap["warnings"] = [f"stall: {outcome.message}"]
            self.view.snap["last_error"] = outcome.message
        return await self._apply(state, Occurrence(outcome.kind, outcome.message, cause=cause,
                                               progressed=bool(outcome.data.get("progressed"))))

    def _decide(self, state: State, ending: Occurrence) -> Decision:
        """Ask the machine (machine.decide) what ``ending`` in ``state`` leads to."""
        if state is State.START_SHOPSIM and ending.kind in ("done", "skipped"):
            self._reconcile()  # the disk says which round is next; the machine decides the rest
        deadline = Deadline.of(self.state_data.get("deadline"), list(self.state_data["round_durations"].values()),
                               self.clock.time())
        spec = stages.spec_for(self.cfg, state)
        return decide(state, ending, self.counters, self.live.stop_mode, deadline, RetryPolicy(spec.retries, spec.backoff))

    async def _apply(self, state: State, ending: Occurrence) -> int | None:
        """Carry out the machine's decision: enter the next state (skipping what is on disk),
        retry after the backoff, or end through :meth:`shutdown`."""
        d = self._decide(state, ending)
        self.counters = d.counters
        action = d.action
        if isinstance(action, Retry):
            self._transition(state, state, RETRY, message=action.message, delay=action.delay)
            self._spawn(state, delay=action.delay)
            return None
        if isinstance(action, Enter):
            assert d.trigger is not None
            # The hand-off's one durable write is the transition's journal line; state.json and
            # status.json wait for the next child's registration (a durable persist) or, when
            # the stage spawns nothing soon, the flush below (snapshot.Snapshot.transition).
            self._transition(state, action.state, d.trigger, files_later=True)
            self._flush_files_soon()
            if d.trigger in ("next_round", "shopsim_ready"):
                self.progress.mark_round_started()
            if not stages.MODULES[action.state].completed(self._ctx()):
                self._spawn(action.state)
                return None
            self._journal("stage.skipped", state=action.state.value, reason="output already on disk")
            log.info("stage.skipped", state=action.state.value, round=self.round)
            if action.state is State.NEXT_ROUND:
                self._round_finished(None)
            return await self._apply(action.state, Occurrence("skipped"))
        if isinstance(action, END_ACTIONS):
            return await self._end(d, state)
        return None  # Stay

    def _reconcile(self) -> None:
        """The current round: the first one without a ledger row or, when the state dir holds a
        record, without its record (rounds.jsonl). A round with a row but no record (the daemon
        died between NEXT_ROUND's append and the record) is entered again: each of its stages
        is skipped as on disk, and its skipped NEXT_ROUND records it."""
        recorded = {r.get("round") for r in self.store.rounds()}
        r = 0
        while r < self.cfg.campaign.rounds and next_round.completed(self._ctx(r)) and (not recorded or r in recorded):
            r += 1
        if r != self.round:
            # Ahead: the round's ledger row was written just before the stop (a normal resume).
            # Behind: the ledger lacks a round the state said was done, which is worth a look.
            behind = r < self.round
            line = (f"state.json says {round_id(self.round)}, the ledger's first unfinished round is {round_id(r)}: "
                    f"continuing with {round_id(r)}" + (" (the ledger has no row for the rounds between)" if behind else ""))
            (log.warning if behind else log.info)("reconcile.round", persisted=self.round, disk=r, message=line)
        self.round = r
        self._journal("reconcile", round=r)

    # -- stages ---------------------------------------------------------------------------
    def _spawn(self, state: State, delay: float = 0.0) -> None:
        if delay:
            self._background("retry", self._later, state, delay)
            return
        self._background(f"{state.value} stage", self._stage_task, state, self.attempt)

    async def _later(self, state: State, delay: float) -> None:
        await anyio.sleep(delay)
        await self.send.send(RetryDue(state))

    async def _stage_task(self, state: State, attempt: int) -> None:
        ctx = self._ctx(attempt=attempt)
        spec = stages.spec_for(self.cfg, state)
        structlog.contextvars.bind_contextvars(round=self.round, state=state.value, attempt=attempt)
        self.attempts.started(state.value, self.round)
        with anyio.CancelScope() as scope:
            self.stage.scope = scope
            outcome = await stages.attempt(state, ctx, spec, self.kids)
            await self.send.send(StageOutcome(state, attempt, outcome))

    def _ctx(self, round_index: int | None = None, attempt: int | None = None) -> base.RoundContext:
        plan = RoundPlan(self.cfg, self.layout, self.round if round_index is None else round_index, self.secrets,
                         python=self.python, demo_dir=self.demo_dir, base_env=self.base_env)
        return base.RoundContext(
            plan=plan, launcher=self.launcher, http=self.http, clock=self.clock, shopsim=self.shopsim,
            val_server=self.val_server, emit=self.progress.emit, register_child=self.kids.register,
            unregister_child=self.kids.unregister, find_child=self.kids.find,
            attempt=self.attempt if attempt is None else attempt,
        )

    # -- every ending: stop, park, fail, finish, exit (daemon/core/shutdown.py) ------------------------
    async def _end(self, d: Decision, src: State) -> int | None:
        """End the campaign (or park it) in one order, as uvicorn's ``Server.shutdown`` does:
        stop taking work, drain the children, record the end, tell the operator.

        Returns the exit code, or None when a disk park with ``--wait-for-space`` resumed.
        """
        code = await self.ending.run(d, src)
        if code is None:  # the volume has room again: back to PREFLIGHT_DISK
            self._spawn(State.PREFLIGHT_DISK)
        return code

    # -- signals (the other events: daemon/core/reactions.py) ----------------------------------------
    async def _on_signal(self, signum: int) -> int | None:
        if signum == signal.SIGHUP:
            self._reload()
            return None
        log.info("daemon.signal", signal=signal.Signals(signum).name)
        return await self._apply(self.machine.state, Occurrence("stop"))

    def _reload(self) -> None:
        """SIGHUP: the campaign file and .env, judged as at start (sources.reloaded), applied
        whole or refused whole. Applied: the redaction first (a new secret is masked from now
        on, in every writer), then the secrets, the config every collaborator reads at each use,
        the notify endpoints and the metrics textfile. Stages started from now on see it; the
        running one keeps what it started with."""
        r = sources.reloaded(self.cfg, self.layout)
        if r.cfg is None or r.secrets is None:
            log.warning("config.reload_refused", error=r.refused)
            self._journal("config.reload_refused", reason=r.refused, kept="the running config")
            return
        new = r.cfg
        self.redactor.extend(r.secrets.redactor)
        self.secrets = replace(r.secrets, _redactor=self.redactor)
        self.live.cfg = new
        self.base_env = self.layout.child_env(new)
        self.alerts.reconfigure(new.notify, self.secrets)
        self.view.metrics = _metrics(new, self.layout)
        self._journal("config.reloaded", changed=list(r.changed))
        log.info("config.reload", source=str(new.source), changed=list(r.changed))
        self.view.write_status(force=True)  # the textfile too, at once

    def _check_hygiene(self, when: str, *, after: float = 0.0) -> None:
        """The repo hygiene scan (issue 9), before the first stage and after each round;
        ``after`` seconds from now."""
        roots = {self.layout.repo, self.layout.project_root}  # project_root: the tools' default output
        self._background("hygiene scan", self._scan_hygiene, roots, self.cfg.storage.repo_hygiene_max, when, after)

    async def _scan_hygiene(self, roots: set[Path], max_bytes: int, when: str, after: float) -> None:
        if after:
            await anyio.sleep(after)
        await sources.hygiene_scan(roots, max_bytes, when, self.send)

    def _round_finished(self, records: next_round.RoundRecords | None) -> None:
        """The round is recorded (progress.py); then the repo is looked at again."""
        ctx = self._ctx()
        # Not persisted here: the transition (or the ending) that always follows records the
        # new cursor, and a crash before it is the crash between rounds.jsonl and state.json
        # that Store.load already handles (the rounds file is the truth).
        self.progress.round_finished(ctx, records, persist=False)
        # Past the next round's first spawn: the scan's worker thread (git status, a tree walk)
        # holds the GIL and forks, and would compete with that hand-off on the loop's thread.
        self._check_hygiene(f"after {ctx.round_id}", after=FILES_LATER_S)

    # -- transitions (persisted through daemon/core/snapshot.py) ------------------------------------
    def _transition(self, src: State | None, dst: State, trigger: str, *, files_later: bool = False,
                    **fields: Any) -> None:
        if dst is State.TRAIN:  # where TRAIN resumes, in the snapshot the transition line holds
            self.view.snap["step"] = self.progress.step_from_disk()
        self.view.transition(src, dst, trigger, files_later=files_later, **fields)
        if dst is State.START_SHOPSIM and src is State.PREFLIGHT_DISK:
            self._after_preflight()

    def _flush_files_soon(self) -> None:
        """One pending task writes what a ``files_later`` transition left (if the next child's
        registration has not), FILES_LATER_S after the LATEST such transition: a flush armed
        by the one before (a stage that spawns nothing, as NEXT_ROUND) must not land in the
        middle of this hand-off."""
        self._files_due_at = anyio.current_time() + FILES_LATER_S
        if not self._files_flush_pending:
            self._files_flush_pending = True
            self._background("state files", self._flush_files_later)

    async def _flush_files_later(self) -> None:
        while (wait := self._files_due_at - anyio.current_time()) > 0:
            await anyio.sleep(wait)
        self._files_flush_pending = False
        self.view.flush_files()

    def _after_preflight(self) -> None:
        """The volume exists now: the log file, the watcher and the disk guard can start."""
        add_file_handler(self.layout.logs / "shoprld.log", redactor=self.redactor)
        if not getattr(self, "_sources_started", False):
            self._sources_started = True
            self._background("checkpoint watcher", sources.checkpoint_commits, self.layout.save_dir, self.cfg,
                             self.send)
            self._background("disk monitor", self.disk.monitor, self.cfg.disk, self.view.checkpoint_bytes(),
                             self.view.disk_sampled, self.send)
            self._background("ShopSim supervisor", self.shopsim.supervise, self._ctx)

    def _journal(self, event: str, *, sync: bool = True, **fields: Any) -> None:
        self.view.journal(event, sync=sync, **fields)


def _metrics(cfg: Config, layout: Layout) -> TextfileMetrics | None:
    """The Prometheus textfile writer, when the config asks for one."""
    if cfg.metrics.textfile is None:
        return None
    return TextfileMetrics(cfg.metrics.textfile, cfg.campaign.name, campaign_files(cfg.source, layout))
