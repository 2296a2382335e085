"""The engine: startup -> reconcile -> main loop -> shutdown, in one anyio task group.

Every trigger goes through ONE queue: stage outcomes, signals, control-socket requests,
disk-guard level changes and checkpoint commits. The main loop takes one event at a
time, asks the transition table (machine.py) whether the move is legal, persists it
(journal line, then state.json, then status.json), tells systemd, and spawns the next
stage as a task. Stages never call the engine; they return an Outcome. Signal receivers
only enqueue; the loop acts (a second SIGINT while stopping is the one exception: it
escalates to SIGKILL at once, since the loop is busy stopping).

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
import statistics
import sys
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

from . import bundles
from . import causes
from . import checkpoints as ckpt
from . import disk as diskmod
from . import saves
from .alerts import Alerts
from .config import Config, ProcessSpec, load_config, resolve_deadline
from .errors import EXIT_DISK, EXIT_GATE, EXIT_OK, EXIT_STAGE, ConfigError, ShoprldError
from .layout import Layout
from .machine import ADVANCE, ROUND_STATES, WORKING_STATES, Machine, State
from .notify import Notifier
from .processes import CHILD_TAG, Child, ChildRecord, Launcher, pid_alive, proc_start_ticks
from .roundplan import RoundPlan, RoundValues, demo_dir
from .secrets import Secrets, load_secrets
from .services import ShopsimService, ValServerService
from .roundlog import STATUS_RECENT_ROUNDS
from .store import ROUND_DONE_EVENT, SOCKET_FILE, Store, atomic_write_json

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
# Fault-injection seam for the crash tests (documented in tests/README.md): a list of
# STATE:POINT:ROUND entries; at the first matching point not yet fired (a marker file in
# SHOPRLD_TEST_KILL_DIR), the daemon SIGKILLs itself. POINT is `enter` (transition
# persisted), `mid` (the stage's first child spawned), `spawn-<role>` (that child spawned
# and recorded) or `done` (the stage's output is on disk, its outcome not yet persisted).
_KILL_SPEC = os.environ.get("SHOPRLD_TEST_KILL", "")
_KILL_DIR = os.environ.get("SHOPRLD_TEST_KILL_DIR", "")


def _maybe_die(state: State, point: str, round_index: int) -> None:
    if not _KILL_SPEC or not _KILL_DIR:
        return
    key = f"{state.value}:{point}:{round_index}"
    if key not in _KILL_SPEC.split(","):
        return
    marker = Path(_KILL_DIR) / key.replace(":", "_")
    if marker.exists():
        return
    marker.touch()
    os.kill(os.getpid(), signal.SIGKILL)
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

    async def start(self, role: str, argv: Any, *, env: Any, cwd: Path | None, log: Path, redacted_argv: Any,
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
        from .raylauncher import build_launcher

        self._raw_launcher = launcher or build_launcher(cfg, layout)
        self.launcher: Launcher = _TaggingLauncher(self._raw_launcher, str(layout.state_dir))
        self.wait_for_space = wait_for_space
        self.adopt_state = adopt_state  # `shoprld run --adopt-state`: take over another campaign's state dir
        self._transport = transport
        # The one Redactor every persisted or sent text passes through, whoever built it.
        self.redactor = secrets.redactor
        self.store = Store(layout.state_dir, redactor=self.redactor, status_in_background=True)
        self.machine = Machine()
        self.send, self.recv = anyio.create_memory_object_stream[tuple[Any, ...]](256)
        self.children: dict[str, Child] = {}
        self.adoptable: dict[str, ChildRecord] = {}
        self.shopsim = ShopsimService(witness=layout.state_dir / "shopsim.witness")
        self.val_server = ValServerService()
        self.stop = _Stop()
        self.round = 0
        self.attempt = 1
        self.failures: dict[str, int] = {}
        self.seq = 0
        self.stage_scope: anyio.CancelScope | None = None
        self.hygiene_warnings: list[str] = []  # the repo hygiene guard's current findings
        self.park_pending: str | None = None
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
            from .metrics import TextfileMetrics

            self.metrics = TextfileMetrics(cfg.metrics.textfile, cfg.campaign.name)
        # Per failed attempt (issue 18): the cause of each state's last failure (the policy),
        # and what the running attempt started with (its log offset, its argv and exit).
        self.last_cause: dict[str, str] = {}
        self.attempt_info: dict[str, Any] = {}
        self.recovering: str | None = None  # set by a failure or an unclean restart; "recovered" on success
        self.http: httpx.AsyncClient
        self._guard: diskmod.Guard | None = None
        self.final_message: str | None = None  # the one line `shoprld run` prints on a non-zero exit
        self._round_step_s: tuple[int, float] | None = None  # (round, its median step time)
        self._round_started_at: float | None = None
        self._plan_warned: set[tuple[int, str]] = set()  # (round, reason) already journaled

    # -- lifecycle ---------------------------------------------------------------------
    async def main(self) -> int:
        self.store.acquire_lock(role="daemon")
        try:
            self._check_identity()
            self._load()
            async with httpx.AsyncClient(transport=self._transport, trust_env=False) as http:
                self.http = http
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._signals)
                    tg.start_soon(self._control)
                    tg.start_soon(self._watchdog)
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
        from .identity import ensure, expected

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
            self.recovering = f"the daemon restarted after dying in {prev_state}"
        if self.state_data["deadline"] is None:
            self.state_data["deadline"] = resolve_deadline(self.cfg.campaign.deadline, self.state_data["first_start"])
        self.seq = self.state_data["seq"]
        self.round = int(data.get("round") or 0)
        for role, raw in (data.get("children") or {}).items():
            try:
                rec = ChildRecord.from_json(raw)
            except (TypeError, KeyError):
                continue
            if rec.job_id or pid_alive(rec.pid, rec.start_ticks):  # a Ray job: its launcher re-attaches
                self.adoptable[role] = rec
        for role, rec in self._tagged_strays().items():
            self.adoptable.setdefault(role, rec)
        if self.adoptable:
            log.info("children.found", roles={r: c.pid for r, c in self.adoptable.items()})
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

    def _tagged_strays(self) -> dict[str, ChildRecord]:
        """Session leaders carrying this campaign's tag: children whose record a crash lost."""
        want = f"{CHILD_TAG}={self.layout.state_dir}|".encode()
        found: dict[str, ChildRecord] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                if os.getsid(pid) != pid:
                    continue
                env = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            for item in env.split(b"\0"):
                if item.startswith(want):
                    role = item[len(want):].decode(errors="replace")
                    found[role] = ChildRecord(role, pid, pid, proc_start_ticks(pid), time.time(), "", [],
                                              tag=item[len(CHILD_TAG) + 1:].decode(errors="replace"))
        return found

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

    async def _handle(self, event: tuple[Any, ...]) -> int | None:
        kind = event[0]
        if kind == "outcome":
            _, state, attempt, outcome = event
            if state is not self.machine.state or self.stopping:
                return None  # a stage that finished after we moved on (cancelled)
            return await self._on_outcome(state, attempt, outcome)
        if kind == "signal":
            return await self._on_signal(event[1])
        if kind == "stop":
            return await self._on_stop(event[1])
        if kind == "disk":
            return await self._on_disk(event[1])
        if kind == "checkpoint":
            return await self._on_checkpoint(event[1])
        if kind == "spawn":  # a delayed retry
            self._spawn(event[1])
            return None
        if kind == "hygiene":
            self._on_hygiene(event[1], event[2])
            return None
        return None

    async def _on_outcome(self, state: State, attempt: int, outcome: base.Outcome | ShoprldError) -> int | None:
        if isinstance(outcome, ShoprldError):
            await self._attempt_failed(state, attempt, base.Outcome("fail", str(outcome)))
            self._alert("failed", str(outcome))
            self.snap["last_error"] = str(outcome)
            self._journal("stage.error", state=state.value, error=str(outcome), exit_code=outcome.exit_code)
            log.error("stage.error", state=state.value, error=str(outcome))
            self.final_message = str(outcome)
            return outcome.exit_code
        if outcome.kind == "done":
            _maybe_die(state, "done", self.round)
        # Every outcome is followed at once by a transition, a park or a stop, whose fsync
        # covers this line too: one fsync per hand-off instead of two.
        extra = {"step_seconds": self._round_step_s[1]} if state is State.TRAIN and self._round_step_s \
            and self._round_step_s[0] == self.round else {}  # this round's median, for `shoprld report`
        self._journal("stage.outcome", sync=False, state=state.value, attempt=attempt, kind=outcome.kind,
                      message=outcome.message, **extra)  # the store redacts
        log.info("stage.outcome", state=state.value, attempt=attempt, outcome=outcome.kind, message=outcome.message)
        if outcome.kind == "done":
            self.failures.pop(state.value, None)
            self.last_cause.pop(state.value, None)
            self.attempt = 1
            self._notify_recovered(state)
            if state is State.NEXT_ROUND:
                self._round_finished()
            if self.park_pending:
                return await self._park(self.park_pending)
            if self.stop.mode == "checkpoint" and state is not State.TRAIN or \
                    self.stop.mode == "round" and state is State.NEXT_ROUND:
                return await self._stop_now(EXIT_OK, "requested")
            return await self._advance(state)
        cause = await self._attempt_failed(state, attempt, outcome) \
            if outcome.kind in ("retry", "fail", "disk") else None
        if outcome.kind == "retry":
            assert cause is not None
            if outcome.data.get("stall"):
                self._alert("stalled", outcome.message)
            if cause.name in causes.NO_THIRD_TRY and self.last_cause.get(state.value) == cause.name:
                return await self._fail(f"{state.value} failed twice in a row with {cause.name} ({cause.detail}); "
                                        f"not retried a third time; fix: {cause.advice}", EXIT_STAGE, "failed")
            self.last_cause[state.value] = cause.name
            self.state_data["counters"]["restarts"] += 1
            n = 0 if outcome.data.get("progressed") else self.failures.get(state.value, 0) + 1
            self.failures[state.value] = n
            spec = self._spec(state)
            self.snap["last_error"] = outcome.message
            if outcome.data.get("stall"):
                self.snap["warnings"] = [f"stall: {outcome.message}"]
            if n > spec.retries:
                return await self._fail(f"{state.value} failed after {spec.retries + 1} attempts: {outcome.message}",
                                        EXIT_STAGE, "failed")
            delay = 0.0 if n == 0 else min(300.0, spec.backoff * 2 ** (n - 1))
            self.attempt += 1
            self._transition(state, state, "retry", message=outcome.message, delay=delay)
            self._spawn(state, delay=delay)
            return None
        if outcome.kind == "disk":
            reason = f"ENOSPC during {state.value}: {outcome.message}"
            # A stage can meet a full volume before the monitor's next sample (a sudden fill under
            # load). The ENOSPC is a hard-limit crossing in its own right: the guard agrees, and the
            # journal records the crossing, as it does for one the monitor saw.
            if self._guard is not None and self._guard.force_hard(reason) is not None:
                s = diskmod.sample(self.layout.ephemeral_root)
                self._journal("disk.hard_limit", reason=reason, free_bytes=s.avail_bytes, **self._limits_dict())
            return await self._park(reason)
        if outcome.kind == "gate_stop":
            return await self._fail(outcome.message, EXIT_GATE, "gate")
        return await self._fail(outcome.message, EXIT_STAGE, "failed")

    # -- failure causes, crash bundles, notifications (issue 18) -------------------------------
    def _attempt_started(self, state: State) -> None:
        """Remember where this attempt's part of the stage log begins, and when it began."""
        log_path = self.layout.stage_log(self.round, state.value)
        try:
            offset = log_path.stat().st_size
        except OSError:
            offset = 0
        self.attempt_info = {"state": state.value, "log": log_path, "offset": offset,
                             "monotonic": time.monotonic(), "argv": [], "returncode": None}

    async def _attempt_failed(self, state: State, attempt: int, outcome: base.Outcome) -> causes.Cause:
        """Classify a failed attempt, write its crash bundle, journal it, show it in status."""
        info = self.attempt_info if self.attempt_info.get("state") == state.value else {}
        log_path: Path = info.get("log") or self.layout.stage_log(self.round, state.value)
        tail = bundles.read_tail(log_path)
        try:  # only this attempt's part of the log: an earlier attempt's OOM is not this one's cause
            size = log_path.stat().st_size
            tail = tail[max(0, len(tail) - (size - int(info.get("offset", 0)))):]
        except OSError:
            pass
        exit_status = outcome.data.get("returncode", info.get("returncode"))
        stalled = bool(outcome.data.get("stall"))
        cause = causes.classify(exit_status=exit_status, log_tail=tail, stalled=stalled,
                                kernel_log=causes.kernel_log_since(float(info.get("monotonic", 0.0))))
        rid = base.round_id(self.round)
        dest = bundles.free_attempt_dir(self.layout.logs, rid, state.value, attempt)
        problem = await bundles.write_bundle(
            dest, round_id=rid, state=state.value, attempt=attempt, exit_status=exit_status,
            cause=cause.to_json(), argv=info.get("argv") or [], message=outcome.message, log_path=log_path,
            stalled=stalled, redactor=self.redactor, nvidia_smi=self.cfg.gpus.nvidia_smi)
        if problem:
            log.warning("bundle.write_failed", error=problem)
        self.snap["last_failure"] = {"round": self.round, "round_id": rid, "state": state.value, "attempt": attempt,
                                     "cause": cause.name, "detail": cause.detail, "advice": cause.advice,
                                     "bundle": str(dest), "at": time.time()}
        self._journal("attempt.failed", attempt=attempt, cause=cause.to_json(), exit_status=exit_status,
                      stalled=stalled, bundle=str(dest), message=outcome.message)
        log.warning("attempt.failed", state=state.value, attempt=attempt, cause=cause.name, bundle=str(dest))
        self.recovering = f"{state.value} failed ({cause.name})"
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
        if self.recovering and state in ROUND_STATES:
            self._alert("recovered", f"{state.value} completed after {self.recovering}")
            self.recovering = None

    async def _advance(self, state: State) -> int | None:
        """Leave ``state`` (done or skipped) and enter the next one, skipping what is on disk."""
        while True:
            if state is State.START_SHOPSIM or state is State.NEXT_ROUND:
                if state is State.NEXT_ROUND:
                    self.round += 1
                else:
                    self._reconcile()
                if self.round >= self.cfg.campaign.rounds:
                    self.round = self.cfg.campaign.rounds - 1  # the last round's index, for status
                    self._transition(state, State.DONE, "finish")
                    return await self._finish(EXIT_OK, "done")
                why = self._deadline_says_stop()
                if why:
                    self._transition(state, State.DONE, "deadline", message=why)
                    return await self._finish(EXIT_OK, "deadline")
                nxt = State.TRAIN
                self._transition(state, nxt, "next_round" if state is State.NEXT_ROUND else ADVANCE[state])
                self._mark_round_started()
            else:
                nxt = self._next_of(state)
                self._transition(state, nxt, ADVANCE[state])
            state = nxt
            ctx = self._ctx()
            if MODULES[state].completed(ctx):
                self._journal("stage.skipped", state=state.value, reason="output already on disk")
                log.info("stage.skipped", state=state.value, round=self.round)
                if state is State.NEXT_ROUND:
                    self._round_finished()
                continue
            self._spawn(state)
            return None

    @staticmethod
    def _next_of(state: State) -> State:
        order = list(ROUND_STATES)
        if state is State.PREFLIGHT_DISK:
            return State.START_SHOPSIM
        return order[order.index(state) + 1]

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
        await self.send.send(("spawn", state))

    async def _stage_task(self, state: State, attempt: int) -> None:
        ctx = self._ctx(attempt=attempt)
        spec = self._spec(state)
        structlog.contextvars.bind_contextvars(round=self.round, state=state.value, attempt=attempt)
        self._attempt_started(state)
        with anyio.CancelScope() as scope:
            self.stage_scope = scope
            outcome: base.Outcome | ShoprldError
            try:
                await self._stop_strays(state)
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
            await self.send.send(("outcome", state, attempt, outcome))

    async def _stop_strays(self, state: State) -> None:
        """Children a crashed daemon left that this round state will not adopt are stopped now.

        Only round states decide: during PREFLIGHT_DISK and START_SHOPSIM the round to resume
        is not known yet, and a running trainer must survive until TRAIN adopts it.
        """
        if state not in ROUND_STATES:
            return
        for role in list(self.adoptable):
            if role == "shopsim" or role in MODULES[state].ADOPTS:
                continue
            rec = self.adoptable.pop(role)
            child = self.launcher.adopt(rec)
            if child is not None:
                log.info("child.stray_stopped", role=role, pid=rec.pid)
                await child.stop(10.0)

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
            val_server=self.val_server, emit=self._emit, register_child=self._register,
            unregister_child=self._unregister, find_child=self._find_child, stop=self.stop,
            attempt=self.attempt if attempt is None else attempt,
        )

    # -- children ---------------------------------------------------------------------------
    def _register(self, child: Child) -> None:
        self.children[child.record.role] = child
        self._persist()
        _maybe_die(self.machine.state, "mid", self.round)
        _maybe_die(self.machine.state, f"spawn-{child.record.role}", self.round)

    def _unregister(self, child: Child) -> None:
        if self.children.get(child.record.role) is child:
            del self.children[child.record.role]
            # Not persisted here: the next transition or spawn writes state.json anyway, and a
            # stale record of an exited child is harmless (adoption checks pid + start time).
            self._write_status(force=True)

    def _find_child(self, role: str) -> Child | None:
        child = self.children.get(role)
        if child is not None and child.alive():
            return child
        rec = self.adoptable.pop(role, None)
        if rec is not None:
            adopted = self.launcher.adopt(rec)
            if adopted is not None:
                log.info("child.adopted", role=role, pid=rec.pid)
                self._journal("child.adopted", role=role, pid=rec.pid)
                self._register(adopted)
                return adopted
        return None

    async def _stop_children(self, *, force: bool = False) -> None:
        """Stop every child (trainer first: it holds the GPUs and writes the volume)."""
        self.shopsim.closing = True
        order = sorted(self.children.values(), key=lambda c: (c.record.role != "trainer", c.record.role))
        for child in order:
            if child.record.role == "shopsim":
                self.shopsim.vouch(self.layout.save_dir)  # the trainer is stopped: all it saved ran against this ShopSim
                if self.shopsim.external:
                    continue
            if force:
                child.signal_group(signal.SIGKILL)
            await child.stop(0.0 if force else self._grace(child.record.role))
        self.children.clear()
        for role, rec in list(self.adoptable.items()):
            adopted = self.launcher.adopt(rec)
            if adopted is not None:
                await adopted.stop(0.0 if force else 10.0)
        self.adoptable.clear()

    def _grace(self, role: str) -> float:
        c = self.cfg
        return {"trainer": c.train.grace, "shopsim": c.shopsim.grace, "val_server": c.val.server_grace,
                "sidecar": c.sidecar.grace}.get(role, 10.0)

    # -- stopping, parking, failing -----------------------------------------------------------
    async def _cancel_stage(self) -> None:
        self.stopping = True
        if self.stage_scope is not None:
            self.stage_scope.cancel()

    async def _stop_now(self, code: int, reason: str) -> int:
        self.notifier.stopping()
        await self._cancel_stage()
        await self._stop_children()
        resume = {"round": self.round, "state": self.machine.state.value}
        self._transition(self.machine.state, State.STOPPED, "stop", message=reason, resume_from=resume)
        self.snap["stop_reason"] = reason
        self._write_status(force=True)
        self._alert("stopped", f"stopped ({reason}); resumes from {resume['state']}", failure=False)
        log.info("daemon.stopped", reason=reason, resume_from=resume)
        return code

    async def _fail(self, message: str, code: int, reason: str) -> int:
        self.snap["last_error"] = message
        self.snap["stop_reason"] = reason
        await self._cancel_stage()
        await self._stop_children()
        self._transition(self.machine.state, State.FAILED, "fail", message=message, exit_code=code)
        log.error("campaign.failed", message=message, exit_code=code)
        self._alert("gate_stop" if reason == "gate" else "failed", message, failure=reason != "gate")
        self.final_message = message
        return code

    async def _finish(self, code: int, reason: str) -> int:
        self.snap["stop_reason"] = reason
        self.snap["last_error"] = None  # recovered from; the journal keeps the history
        await self._stop_children()
        self._persist()
        log.info("campaign.done", reason=reason, rounds=self.cfg.campaign.rounds)
        self._alert("done", f"done ({reason}): {len(self.snap.get('rounds_done', []))} of "
                    f"{self.cfg.campaign.rounds} rounds", failure=False)
        return code

    async def _park(self, reason: str) -> int | None:
        """PAUSED_DISK: reclaim first; if still short, release the ballast, stop, persist, exit 4."""
        self.park_pending = None
        await self._cancel_stage()
        diskmod.Ballast(self.layout.ballast, self.cfg.disk.ballast).release()
        await self._stop_children()
        freed = self._reclaim(trainer_running=False)
        sample = diskmod.sample(self.layout.ephemeral_root)
        numbers = {"free_bytes": sample.avail_bytes, "inodes_free": sample.inodes_free, "reclaimed_bytes": freed,
                   **self._limits_dict()}
        self.snap["stop_reason"] = "disk"
        self.snap["last_error"] = reason
        self._transition(self.machine.state, State.PAUSED_DISK, "park_disk", message=reason, **numbers)
        log.warning("disk.parked", reason=reason, **numbers)
        self._alert("parked", f"parked in PAUSED_DISK: {reason}", failure=False)
        if not self.wait_for_space:
            self.final_message = (f"parked in PAUSED_DISK: {reason}; fix: free space on "
                                  f"{self.layout.ephemeral_root}, then run again (or use --wait-for-space)")
            return EXIT_DISK
        await self._wait_for_space()
        self.stopping = False
        self._transition(State.PAUSED_DISK, State.PREFLIGHT_DISK, "resume", message="space is back")
        self._spawn(State.PREFLIGHT_DISK)
        return None

    async def _wait_for_space(self) -> None:
        limits = self._limits()
        settled_since: float | None = None
        while True:
            s = diskmod.sample(self.layout.ephemeral_root)
            if s.avail_bytes > limits.soft_bytes:
                settled_since = settled_since or self.clock.monotonic()
                if self.clock.monotonic() - settled_since >= self.cfg.disk.settle:
                    return
            else:
                settled_since = None
            await anyio.sleep(min(self.cfg.disk.interval, 1.0))

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
    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGINT and self.stopping:
                    log.warning("daemon.force_stop")
                    for child in list(self.children.values()):
                        child.signal_group(signal.SIGKILL)
                    continue
                await self.send.send(("signal", signum))

    async def _on_signal(self, signum: int) -> int | None:
        if signum == signal.SIGHUP:
            self._reload()
            return None
        log.info("daemon.signal", signal=signal.Signals(signum).name)
        return await self._stop_now(EXIT_OK, "requested")

    # Sections whose change would move files or change what a round is: not reloadable.
    STRUCTURAL = ("campaign", "storage", "gpus")

    def _reload(self) -> None:
        """SIGHUP: re-read the campaign file; apply it when only non-structural sections changed
        (limits, intervals, timeouts, retries, stall and gate policy, commands). Stages started
        from now on see it; the running one keeps what it started with."""
        try:
            new = load_config(self.cfg.source)
        except ShoprldError as exc:
            log.warning("config.reload_rejected", error=str(exc))
            return
        changed = [k for k in self.STRUCTURAL if getattr(new, k) != getattr(self.cfg, k)]
        if changed:
            log.warning("config.reload_rejected", error=f"structural sections changed: {', '.join(changed)}; "
                        "restart the daemon to apply them")
            return
        self.cfg = new
        self.base_env = self.layout.child_env(new)
        self._journal("config.reloaded")
        log.info("config.reload", source=str(new.source))

    async def _on_stop(self, mode: str) -> int | None:
        self._journal("stop.requested", mode=mode)
        if mode == "now":
            return await self._stop_now(EXIT_OK, "requested")
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
        if self._guard is not None:  # limits follow the measured checkpoint size
            self._guard.limits = self._limits()
        if self.machine.state is State.TRAIN:  # issue 17: a save supersedes the round's older ones
            deleted, freed = saves.prune_superseded(self.cfg, self.layout, self.round)
            if deleted:
                self._journal("retention.applied", deleted=deleted, bytes=freed, rule="newest save of the round")
        if self.machine.state is State.TRAIN:
            if self.park_pending:
                return await self._park(self.park_pending)
            if self.stop.mode == "checkpoint":
                return await self._stop_now(EXIT_OK, "requested")
        return None

    async def _watch_checkpoints(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        watcher = ckpt.CheckpointWatcher(self.layout.save_dir, mode=self.cfg.train.watch,
                                         poll_interval=self.cfg.train.poll_interval,
                                         rescan_interval=self.cfg.train.rescan_interval)

        async def emit(ev: dict[str, Any]) -> None:
            log.info(ev["event"], **{k: v for k, v in ev.items() if k != "event"})
            await self.send.send(("checkpoint", ev))

        await watcher.run(emit, task_status=task_status)

    def _limits(self) -> diskmod.Limits:
        last = self.snap.get("last_checkpoint") or {}
        size = int(last.get("bytes") or self.cfg.disk.checkpoint_estimate)
        total = diskmod.sample(self.layout.ephemeral_root).total_bytes
        return diskmod.limits(total, size, soft_override=self.cfg.disk.soft_limit,
                              hard_override=self.cfg.disk.hard_limit)

    def _limits_dict(self) -> dict[str, int]:
        lim = self._limits()
        return {"soft_limit_bytes": lim.soft_bytes, "hard_limit_bytes": lim.hard_bytes}

    async def _disk_monitor(self) -> None:
        guard = self._guard = diskmod.Guard(self._limits(), hysteresis_bytes=self.cfg.disk.hysteresis)

        async def emit(ev: dict[str, Any]) -> None:
            if ev["event"] == "disk.sample":
                lim = guard.limits
                self.snap["disk"] = {"path": str(self.layout.ephemeral_root), "total_bytes": ev.get("total_bytes"),
                                     "free_bytes": ev.get("free_bytes"), "inodes_free": ev.get("inodes_free"),
                                     "soft_limit_bytes": lim.soft_bytes, "hard_limit_bytes": lim.hard_bytes,
                                     "level": guard.level.name.lower(), "sampled_at": time.time()}
                return
            await self.send.send(("disk", ev))

        await diskmod.monitor(self.layout.ephemeral_root, guard, emit, interval=self.cfg.disk.interval)

    async def _on_disk(self, ev: dict[str, Any]) -> int | None:
        name = ev["event"]  # the monitor already logged it
        self._journal(name, **{k: v for k, v in ev.items() if k != "event"})
        if self.machine.state not in MODULES or self.stopping:
            return None
        if name == "disk.ok":
            self.park_pending = None
            return None
        limits = self._limits()
        self._reclaim(trainer_running=self.machine.state is State.TRAIN)
        free = diskmod.sample(self.layout.ephemeral_root).avail_bytes
        if name == "disk.hard_limit":
            if free > limits.hard_bytes + self.cfg.disk.hysteresis:
                log.info("disk.recovered_by_reclaim", free_bytes=free)
                return None
            return await self._park(f"free {diskmod.human_bytes(free)} < hard limit {diskmod.human_bytes(limits.hard_bytes)} on "
                                    f"{self.layout.ephemeral_root}")
        if free > limits.soft_bytes + self.cfg.disk.hysteresis:
            return None
        reason = f"free {diskmod.human_bytes(free)} < soft limit {diskmod.human_bytes(limits.soft_bytes)} on {self.layout.ephemeral_root}"
        last = self.snap.get("last_checkpoint") or {}
        next_save = int(last.get("bytes") or self.cfg.disk.checkpoint_estimate)
        if self.machine.state is State.TRAIN and free - limits.hard_bytes < next_save:
            return await self._park(reason + "; the next save cannot fit")
        # Let the in-flight save (TRAIN) or the current stage finish, then park.
        self.park_pending = reason
        if self.machine.state is State.TRAIN:
            self.notifier.extend_timeout(self.cfg.train.stall_min)
        return None

    async def _control(self) -> None:
        from .control import ControlServer

        async def handler(request: dict[str, Any]) -> dict[str, Any]:
            cmd = request.get("cmd")
            if cmd == "status":
                return {"ok": True, "status": self.redactor.obj(self._status_doc())}
            if cmd == "stop":
                mode = request.get("mode", "now")
                if mode not in ("now", "checkpoint", "round"):
                    return {"ok": False, "error": f"unknown stop mode {mode!r}"}
                await self.send.send(("stop", mode))
                return {"ok": True, "mode": mode}
            return {"ok": False, "error": f"unknown command {cmd!r}"}

        try:
            await ControlServer(self.layout.state_dir / SOCKET_FILE, handler).serve()
        except Exception as exc:  # e.g. a state dir path too long for AF_UNIX: status still works from files
            log.warning("control.unavailable", error=f"{type(exc).__name__}: {exc}")

    async def _watchdog(self) -> None:
        interval = self.notifier.watchdog_interval()
        if not interval:
            return
        while True:
            self.notifier.watchdog()
            await anyio.sleep(interval)

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
        _maybe_die(dst, "enter", self.round)
        self.notifier.status_of(self.snap)
        if dst is State.START_SHOPSIM and src is State.PREFLIGHT_DISK:
            self._after_preflight()
        if dst is State.TRAIN and src is State.START_SHOPSIM or dst is State.DONE and src is State.START_SHOPSIM:
            self.notifier.ready()

    def _after_preflight(self) -> None:
        """The volume exists now: the log file, the watcher and the disk guard can start."""
        from .logs import add_file_handler

        add_file_handler(self.layout.logs / "shoprld.log")
        if not getattr(self, "_sources_started", False):
            self._sources_started = True
            self.tg.start_soon(self._watch_checkpoints)
            self.tg.start_soon(self._disk_monitor)
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
            # round from rounds.jsonl (daemon/roundlog.py).
            self.store.write_status({**doc, "rounds_done": doc["rounds_done"][-STATUS_RECENT_ROUNDS:]})
        except OSError as exc:
            log.warning("status.write_failed", error=str(exc))
        if self.metrics is not None:
            self.metrics.write(self.redactor.obj(doc), self.state_data["counters"])

    def _plan(self) -> Any:
        """The rest of the campaign (daemon/planning.py), from what the engine already knows."""
        from .planning import make_plan
        from .preflight import forecast_for

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
        elif event.startswith("gpu."):  # GPU hygiene (daemon/gpus.py): what held the GPUs, what was stopped, the wait
            self._journal(event, **fields)
        elif event.startswith("save."):  # issue 17 (daemon/saves.py): save timings, each launch's interval
            self._journal(event, **fields)
            if event == "save.interval":
                self.snap["saves"] = fields
        elif event == "stage.exit":
            self.attempt_info["returncode"] = fields.get("returncode")
        elif event == "stage.spawn":  # informational: the child's record is in state.json already
            self.attempt_info["argv"] = fields.get("argv") or []  # already redacted by the stage
            self._journal(event, sync=False, role=fields.get("role"), pid=fields.get("pid"))
            if fields.get("role") == "shopsim":
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

    def _round_finished(self) -> None:
        ctx = self._ctx()
        started = ctx.read_record("round") or {}
        summary = base.read_json(ctx.plan.bare_val_dir / "summary.json") or {}
        primary = summary.get("primary") if isinstance(summary.get("primary"), dict) else {}
        gate_rec = ctx.read_record("gate") or {}
        inject_rec = ctx.read_record("inject") or {}
        duration = self.clock.time() - float(started["started_at"]) if started.get("started_at") else None
        done = [r for r in self.snap.get("rounds_done", []) if r.get("round") != self.round]
        done.append({"round": self.round, "val": primary.get("success_rate") if primary else None,
                     "metric_name": "success_rate", "gate": gate_rec.get("decision"),
                     "analysis": gate_rec.get("analysis_status"),
                     "branch": inject_rec.get("branch"), "duration_seconds": duration})
        self.snap["rounds_done"] = sorted(done, key=lambda r: r["round"])
        log.info("round.done", **done[-1])  # the terminal's one line per round result
        if duration is not None:
            self.state_data["round_durations"][str(self.round)] = duration
        # The round's facts, written once (store.py: journal, then rounds.jsonl, then the cursor).
        self._journal(ROUND_DONE_EVENT, sync=False, **done[-1])
        self.store.append_round(done[-1])
        self._persist()
        val = f"{primary.get('success_rate')}" if primary else "n/a"
        self._alert("round_done", f"{ctx.round_id} done: success_rate {val}, gate {gate_rec.get('decision', '?')}",
                    failure=False)
        self._check_hygiene(f"after {ctx.round_id}")

    # -- repo hygiene (issue 9): before the first stage and after each round; never deletes ----------
    def _check_hygiene(self, when: str) -> None:
        self.tg.start_soon(self._hygiene_task, when)

    async def _hygiene_task(self, when: str) -> None:
        import anyio.to_thread

        from .hygiene import lines, scan_repo

        roots = {self.layout.repo, self.layout.project_root}  # project_root: the tools' default output
        limit = self.cfg.storage.repo_hygiene_max
        # Abandoned on cancel: a scan in flight must not delay shutdown.
        found = await anyio.to_thread.run_sync(
            lambda: list(dict.fromkeys(w for r in sorted(roots) for w in lines(scan_repo(r, limit)))),
            abandon_on_cancel=True)
        await self.send.send(("hygiene", when, found))

    def _on_hygiene(self, when: str, found: list[str]) -> None:
        """Journal each new finding once; status shows the current ones."""
        for w in found:
            if w not in self.hygiene_warnings:
                log.warning("repo.hygiene", when=when, warning=w)
                self._journal("repo.hygiene", when=when, warning=w)
        self.hygiene_warnings = found
        self._write_status(force=True)

    def _deadline_says_stop(self) -> str | None:
        deadline = self.state_data.get("deadline")
        if not deadline:
            return None
        durations = list(self.state_data["round_durations"].values())
        need = statistics.median(durations) if durations else 0.0
        now = self.clock.time()
        if now + need > deadline:
            return (f"deadline: {base.round_id(self.round)} needs ~{need:.0f}s but only "
                    f"{max(0.0, deadline - now):.0f}s are left")
        return None




def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def run_campaign(config: Path, *, debug: bool = False, wait_for_space: bool = False,
                 launcher: Launcher | None = None, adopt_state: bool = False, verbose: bool = False) -> int:
    """``shoprld run``: load, check secrets, configure logging, run the engine.

    The console gets JSON lines when piped or under systemd, the compact view on a
    terminal, and every event with ``verbose`` or ``debug`` (daemon/console.py).
    """
    from .console import Campaign, terminal_mode
    from .logs import configure, set_secrets

    cfg = load_config(config)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    # What `shoprld check` refuses, run refuses here, before the state dir is touched or any
    # child starts (the same function: issue 15).
    from .validate import validate

    validate(cfg, layout)
    set_secrets(secrets)
    mode = terminal_mode(sys.stdout, verbose=verbose or debug)
    configure(level="DEBUG" if debug else "INFO", json_stdout=mode == "json",
              compact=Campaign(cfg.campaign.rounds, cfg.campaign.steps_per_round) if mode == "compact" else None)
    secrets.require(cfg.required_secrets())  # notify.endpoints' url_env/token_env among them
    from .metrics import extras_problem

    missing = extras_problem(cfg.metrics.textfile)
    if missing:
        raise ConfigError(missing)
    engine = Engine(cfg, layout, secrets, launcher=launcher, wait_for_space=wait_for_space, adopt_state=adopt_state)
    code = anyio.run(engine.main)
    if code and engine.final_message:
        print(f"shoprld: {secrets.redact(engine.final_message)}", file=sys.stderr)
    return code

