"""THE transition table of a shoprld campaign. Everything that affects it lives in this file.

Theory of operation
-------------------
A campaign is ``rounds`` loops of the round states, preceded once per (re)start by the
start-up states::

    PREFLIGHT_DISK -> START_SHOPSIM -> TRAIN -> EXPORT_HF -> VAL -> GATE -> INJECT -> NEXT_ROUND
                                        ^                                                |
                                        +-------------------- next round ----------------+
                                                                                         v
                                                                                       DONE

Any working state may also go to STOPPED (graceful stop on request), PAUSED_DISK (disk
pressure) or FAILED (a stage's retries are spent, or the gate policy says stop). From a
parking state the only way on is a fresh start (``resume``), which goes back through
PREFLIGHT_DISK: a restarted daemon always re-checks the disk and re-adopts ShopSim.

Reconciliation is not a special path. The current round is the first one without a ledger
row (the disk says so). Before the engine runs a round state it asks the state's
``completed()``; when the output is already on disk it journals ``stage.skipped`` and fires
the same trigger the stage would have. That is how a crash after round-001's final
checkpoint resumes at EXPORT_HF without anybody typing ``RESUME_ROUND=1``, and why no
committed state ever runs twice.

What happens next is decided here too, by :func:`decide`: a pure function of the state,
what happened there (an :class:`Occurrence`: its stage's outcome, a checkpoint, a disk level,
a stop), the :class:`Counters` kept with the state (the
round, the attempt, each state's consecutive failures: Supervisor's backoff count), the
stop mode and the :class:`Deadline`. It returns a :class:`Decision`: the next state, the
trigger that leads there (always one of the table's), and the one :data:`Action` the engine
carries out (enter a state, retry after N s, park, stop, fail with a code, finish). The
engine does I/O and applies decisions; it never works out a next state itself.

The `transitions` library holds this table, validates each trigger against it and draws
the diagram. It never runs stage work: its callbacks are not used (transitions 0.9.3 runs
callbacks concurrently and cancels them on the next trigger; see REFERENCE.md). The
engine fires the decided trigger through :meth:`Machine.fire`, which refuses one the table
does not allow, and runs the stage itself in its own task group.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Literal, TypeVar

from shoprld.daemon.foundation.tools.causes import NO_THIRD_TRY, Cause
from shoprld.daemon.foundation.system.errors import EXIT_GATE, EXIT_OK, EXIT_STAGE
from shoprld.daemon.foundation.records.paths import round_id
from shoprld.daemon.foundation.system.retry import Backoff, may_retry


class State(str, Enum):
    PREFLIGHT_DISK = "PREFLIGHT_DISK"  # check the volume; create the layout; never skipped
    START_SHOPSIM = "START_SHOPSIM"    # start or adopt ShopSim; wait for /healthz ready
    TRAIN = "TRAIN"                    # emit configs, analyst sidecar, slime to the round's end iteration
    EXPORT_HF = "EXPORT_HF"            # the one HF dir holds this round's weights, verified
    VAL = "VAL"                        # val server up (/health + live pid); bare val, full coverage
    GATE = "GATE"                      # compile (analyze) + random-masked gate; decision on disk
    INJECT = "INJECT"                  # next SkillBank (selected or kept) + next curriculum
    NEXT_ROUND = "NEXT_ROUND"          # ledger row, retention, round counter advanced
    DONE = "DONE"                      # every round recorded (or the deadline said stop)
    STOPPED = "STOPPED"                # graceful stop on request; `shoprld run` resumes
    PAUSED_DISK = "PAUSED_DISK"        # parked for disk pressure (exit 4); resumes once space is back
    FAILED = "FAILED"                  # retries spent or gate policy stop (exit 5/6)


STARTUP_STATES = (State.PREFLIGHT_DISK, State.START_SHOPSIM)
ROUND_STATES = (State.TRAIN, State.EXPORT_HF, State.VAL, State.GATE, State.INJECT, State.NEXT_ROUND)
WORKING_STATES = STARTUP_STATES + ROUND_STATES
PARKED_STATES = (State.STOPPED, State.PAUSED_DISK, State.FAILED)
TERMINAL_STATES = (State.DONE,)

# The table, as plain data: (trigger, sources, destination).
TRANSITIONS: list[tuple[str, tuple[State, ...] | State, State]] = [
    ("preflight_ok", State.PREFLIGHT_DISK, State.START_SHOPSIM),
    ("shopsim_ready", State.START_SHOPSIM, State.TRAIN),
    ("trained", State.TRAIN, State.EXPORT_HF),
    ("exported", State.EXPORT_HF, State.VAL),
    ("validated", State.VAL, State.GATE),
    ("gated", State.GATE, State.INJECT),
    ("injected", State.INJECT, State.NEXT_ROUND),
    ("next_round", State.NEXT_ROUND, State.TRAIN),
    ("finish", State.NEXT_ROUND, State.DONE),
    # Every round already recorded when the daemon starts.
    ("finish", State.START_SHOPSIM, State.DONE),
    # The deadline rule: a round that cannot finish in time is not started.
    ("deadline", (State.START_SHOPSIM, State.NEXT_ROUND), State.DONE),
    ("stop", WORKING_STATES, State.STOPPED),
    ("park_disk", WORKING_STATES, State.PAUSED_DISK),
    ("fail", WORKING_STATES, State.FAILED),
    ("resume", PARKED_STATES + TERMINAL_STATES + WORKING_STATES, State.PREFLIGHT_DISK),
]
# A stall, a crash or a retried stage re-enters its own state: `retry` is reflexive
# (X -> X) for every working state; transitions spells that with dest="=".
RETRY = "retry"


class IllegalTransition(Exception):
    """A trigger that the table does not allow from the current state (a bug, never input)."""


class Machine:
    """The table, validated by `transitions`. ``fire`` moves the state, or raises."""

    def __init__(self, initial: State = State.PREFLIGHT_DISK) -> None:
        from transitions import Machine as _TMachine  # lazy: only a running engine builds the table

        self._model = _Model()
        self._m = _TMachine(
            model=self._model,
            states=[s.value for s in State],
            initial=initial.value,
            auto_transitions=False,
            ignore_invalid_triggers=False,
        )
        for trigger, sources, dest in TRANSITIONS:
            src = [s.value for s in sources] if isinstance(sources, tuple) else sources.value
            self._m.add_transition(trigger, src, dest.value)
        self._m.add_transition(RETRY, [s.value for s in WORKING_STATES], "=")

    @property
    def state(self) -> State:
        return State(self._model.state)

    def can(self, trigger: str) -> bool:
        return trigger in self._m.get_triggers(self._model.state)

    def fire(self, trigger: str) -> State:
        """Apply ``trigger``; raise :class:`IllegalTransition` if the table forbids it."""
        if not self.can(trigger):
            raise IllegalTransition(f"{trigger!r} is not allowed from {self.state.value}")
        self._model.trigger(trigger)  # type: ignore[attr-defined]
        return self.state

    def set_state(self, state: State) -> None:
        """Restore a persisted state (no callbacks exist, so nothing is skipped)."""
        self._m.set_state(state.value, model=self._model)


class _Model:
    """The object transitions decorates with ``state`` and ``trigger()``."""

    state: str


ADVANCE: dict[State, str] = {
    State.PREFLIGHT_DISK: "preflight_ok",
    State.START_SHOPSIM: "shopsim_ready",
    State.TRAIN: "trained",
    State.EXPORT_HF: "exported",
    State.VAL: "validated",
    State.GATE: "gated",
    State.INJECT: "injected",
}
"""The trigger that leaves each state when its stage is done (or skipped); NEXT_ROUND
fires ``next_round`` or ``finish``."""


def _dest(trigger: str, src: State) -> State:
    """Where ``trigger`` leads from ``src``, looked up in the table (a bug if it is not there)."""
    for name, sources, dest in TRANSITIONS:
        if name == trigger and src in (sources if isinstance(sources, tuple) else (sources,)):
            return dest
    raise IllegalTransition(f"{trigger!r} is not allowed from {src.value}")


_V = TypeVar("_V")

# -- decide(): the next state and what to do, as a pure function -----------------------------

OccurrenceKind = Literal[
    "done",        # the stage's output is on disk
    "skipped",     # the output was already on disk: the stage did not run (no stop or park point)
    "retry",       # the attempt failed; the stage may run again
    "fail",        # the stage says the campaign cannot go on (exit 6)
    "gate_stop",   # the gate policy says stop (exit 5)
    "disk",        # ENOSPC met during the stage
    "error",       # a ShoprldError: exit with its code, no transition (the operator must act)
    "checkpoint",  # a checkpoint was committed (a safe point for a pending park or stop)
    "stop",        # stop now (a signal or `shoprld stop --now`)
    "disk_hard",   # disk.py judged the volume below the hard limit (after reclaiming)
    "disk_soft",   # ... below the soft limit: park at the next safe point, or now if no save fits
    "disk_ok",     # ... back above the soft limit: no park pending
]


@dataclass(frozen=True)
class Occurrence:
    """What happened in a state (a stage's outcome, or an event while it runs), as much as
    :func:`decide` needs of it."""

    kind: OccurrenceKind
    message: str = ""
    progressed: bool = False  # the failed attempt moved forward (a new checkpoint): no backoff
    cause: Cause | None = None  # the classified cause of a failed attempt
    exit_code: int = EXIT_STAGE  # "error" only: the ShoprldError's code
    fits: bool = True  # "disk_soft" only: one more checkpoint still lands above the hard limit


#: What ``shoprld stop`` may ask for: stop now, at the next checkpoint, or after the round.
StopMode = Literal["now", "checkpoint", "round"]
STOP_MODES: tuple[StopMode, ...] = ("now", "checkpoint", "round")


@dataclass(frozen=True)
class RetryPolicy:
    """The state's ``retries`` and ``backoff`` (its ProcessSpec)."""

    retries: int
    backoff: float


@dataclass(frozen=True)
class Deadline:
    """The deadline rule's inputs: a round that cannot finish before ``at`` is not started."""

    at: float | None
    need_s: float  # the median round duration so far (0 before the first round)
    now: float

    @classmethod
    def of(cls, at: float | None, durations: Sequence[float], now: float) -> Deadline:
        """The rule's need is the median of the measured round durations (not the mean: one
        slow round must not end the campaign), 0 before any round was measured."""
        return cls(at, statistics.median(durations) if durations else 0.0, now)

    def says_stop(self, round_index: int) -> str | None:
        if not self.at or self.now + self.need_s <= self.at:
            return None
        return (f"deadline: {round_id(round_index)} needs ~{self.need_s:.0f}s but only "
                f"{max(0.0, self.at - self.now):.0f}s are left")


@dataclass(frozen=True)
class Counters:
    """What the machine remembers between decisions, kept with the state (never on disk as
    such: a restarted daemon starts a state's retries afresh, as before)."""

    round: int
    rounds: int
    attempt: int = 1  # the attempt of the current state's stage, from 1
    restarts: int = 0  # retried attempts over the campaign (status, metrics)
    failures: Mapping[State, int] = field(default_factory=dict)  # consecutive, without progress
    last_cause: Mapping[State, str] = field(default_factory=dict)  # each state's last failure cause
    park_pending: str | None = None  # the soft limit was crossed: park at the next safe point


@dataclass(frozen=True)
class Enter:
    """Enter ``state`` and run its stage (the engine skips it when its output is on disk)."""

    state: State


@dataclass(frozen=True)
class Retry:
    """Run the same state's stage again after ``delay`` seconds."""

    delay: float
    message: str


@dataclass(frozen=True)
class Park:
    """Park in PAUSED_DISK (exit 4, or wait for space). ``enospc``: a stage met a full volume."""

    reason: str
    enospc: bool = False


@dataclass(frozen=True)
class Stop:
    """Stop gracefully (STOPPED); ``shoprld run`` resumes."""

    reason: str
    code: int = EXIT_OK


@dataclass(frozen=True)
class Fail:
    """Fail the campaign (FAILED) with ``code``; ``reason`` is ``failed`` or ``gate``."""

    message: str
    code: int
    reason: str


@dataclass(frozen=True)
class Finish:
    """The campaign is DONE: every round recorded, or the deadline said stop."""

    reason: str
    message: str | None = None


@dataclass(frozen=True)
class Exit:
    """Exit with ``code`` where the campaign stands (a configuration or usage error in a stage)."""

    message: str
    code: int


@dataclass(frozen=True)
class Stay:
    """Nothing to do now."""


Action = Enter | Retry | Park | Stop | Fail | Finish | Exit | Stay
#: The actions that end the daemon's run (or park it): daemon/core/shutdown.py carries them out.
END_ACTIONS = (Park, Stop, Fail, Finish, Exit)


@dataclass(frozen=True)
class Decision:
    """The next state, the table's trigger that leads there, the action, the new counters."""

    next: State
    trigger: str | None
    action: Action
    counters: Counters


def decide(state: State, what: Occurrence, counters: Counters, stop_mode: StopMode | None, deadline: Deadline,
           retry: RetryPolicy) -> Decision:
    """The machine's answer to ``what`` in ``state``; pure (no I/O, no clock).

    ``stop_mode`` is what the operator asked for (``now``, ``checkpoint``, ``round`` or None);
    ``retry`` is the state's retry policy.
    """
    if what.kind == "error":
        return Decision(state, None, Exit(what.message, what.exit_code), counters)
    if what.kind in ("checkpoint", "disk_ok") and state not in WORKING_STATES:
        return Decision(state, None, Stay(), counters)
    if state not in WORKING_STATES:  # no stage runs there; nothing may arrive (a bug)
        raise IllegalTransition(f"{what.kind!r} cannot happen in {state.value}")
    if what.kind == "stop":
        return _stop(state, counters)
    if what.kind == "disk_hard":
        return _park(state, counters, what.message)
    if what.kind == "disk_soft":
        if state is State.TRAIN and not what.fits:
            return _park(state, counters, what.message + "; the next save cannot fit")
        # Let the in-flight save (TRAIN) or the current stage finish, then park.
        return Decision(state, None, Stay(), replace(counters, park_pending=what.message))
    if what.kind == "disk_ok":
        return Decision(state, None, Stay(), replace(counters, park_pending=None))
    if what.kind == "checkpoint":  # TRAIN's safe point: a pending park or a stop at checkpoint
        if state is State.TRAIN and counters.park_pending:
            return _park(state, counters, counters.park_pending)
        if state is State.TRAIN and stop_mode == "checkpoint":
            return _stop(state, counters)
        return Decision(state, None, Stay(), counters)
    if what.kind == "skipped":
        return _advance(state, counters, deadline)
    if what.kind == "done":
        done = replace(counters, attempt=1, failures=_without(counters.failures, state),
                       last_cause=_without(counters.last_cause, state))
        if done.park_pending:
            return _park(state, done, done.park_pending)
        if stop_mode == "checkpoint" and state is not State.TRAIN or \
                stop_mode == "round" and state is State.NEXT_ROUND:
            return _stop(state, done)
        return _advance(state, done, deadline)
    if what.kind == "retry":
        return _retry(state, what, counters, retry)
    if what.kind == "disk":
        return _park(state, counters, f"ENOSPC during {state.value}: {what.message}", enospc=True)
    if what.kind == "gate_stop":
        return _fail(state, counters, what.message, EXIT_GATE, "gate")
    return _fail(state, counters, what.message, EXIT_STAGE, "failed")  # fail


def _advance(state: State, c: Counters, deadline: Deadline) -> Decision:
    """Leave ``state`` (done or skipped). After START_SHOPSIM (the engine has reconciled the
    round from the ledger) and after NEXT_ROUND, the campaign either finishes, meets the
    deadline, or starts the round."""
    if state is State.START_SHOPSIM or state is State.NEXT_ROUND:
        r = c.round + 1 if state is State.NEXT_ROUND else c.round
        if r >= c.rounds:  # status shows the last round's index
            return Decision(_dest("finish", state), "finish", Finish("done"), replace(c, round=c.rounds - 1))
        why = deadline.says_stop(r)
        if why:
            return Decision(_dest("deadline", state), "deadline", Finish("deadline", why), replace(c, round=r))
        trigger = "next_round" if state is State.NEXT_ROUND else ADVANCE[state]
        return Decision(_dest(trigger, state), trigger, Enter(State.TRAIN), replace(c, round=r))
    trigger = ADVANCE[state]
    nxt = _dest(trigger, state)
    return Decision(nxt, trigger, Enter(nxt), c)


def _retry(state: State, what: Occurrence, c: Counters, retry: RetryPolicy) -> Decision:
    cause = what.cause
    if cause is not None and cause.name in NO_THIRD_TRY and c.last_cause.get(state) == cause.name:
        return _fail(state, c, f"{state.value} failed twice in a row with {cause.name} ({cause.detail}); "
                     f"not retried a third time; fix: {cause.advice}", EXIT_STAGE, "failed")
    n = 0 if what.progressed else c.failures.get(state, 0) + 1
    c = replace(c, restarts=c.restarts + 1, failures={**c.failures, state: n},
                last_cause={**c.last_cause, state: cause.name} if cause is not None else c.last_cause)
    if not may_retry(n, retry.retries):
        return _fail(state, c, f"{state.value} failed after {retry.retries + 1} attempts: {what.message}"
                     + _why(cause, what.message), EXIT_STAGE, "failed")
    return Decision(state, RETRY, Retry(Backoff(retry.backoff).delay(n), what.message),
                    replace(c, attempt=c.attempt + 1))


def _why(cause: Cause | None, message: str) -> str:
    """`` (cause: NAME: DECISIVE LINE)``: the stage's symptom ("not written") is not why it
    failed; "" when unknown or when the message already says it."""
    if cause is None or f"cause: {cause.name}" in message:
        return ""
    detail = f": {cause.detail}" if cause.detail and cause.detail not in message else ""
    return f" (cause: {cause.name}{detail})"


def _park(state: State, c: Counters, reason: str, *, enospc: bool = False) -> Decision:
    return Decision(_dest("park_disk", state), "park_disk", Park(reason, enospc), replace(c, park_pending=None))


def _stop(state: State, c: Counters) -> Decision:
    return Decision(_dest("stop", state), "stop", Stop("requested"), c)


def _fail(state: State, c: Counters, message: str, code: int, reason: str) -> Decision:
    return Decision(_dest("fail", state), "fail", Fail(message, code, reason), c)


def _without(m: Mapping[State, _V], state: State) -> dict[State, _V]:
    return {k: v for k, v in m.items() if k is not state}


def mermaid() -> str:
    """The state diagram in mermaid, drawn from the table (checked in by a test)."""
    lines = ["stateDiagram-v2", f"    [*] --> {State.PREFLIGHT_DISK.value}"]
    seen: set[tuple[str, str, str]] = set()
    for trigger, sources, dest in TRANSITIONS:
        if trigger in ("stop", "park_disk", "fail", "resume"):
            continue
        for s in sources if isinstance(sources, tuple) else (sources,):
            seen.add((s.value, dest.value, trigger))
    for src, dst, trig in sorted(seen, key=lambda t: (list(State).index(State(t[0])), t[2])):
        lines.append(f"    {src} --> {dst}: {trig}")
    lines.append("    state \"any working state\" as working")
    lines.append(f"    working --> {State.STOPPED.value}: stop")
    lines.append(f"    working --> {State.PAUSED_DISK.value}: park_disk")
    lines.append(f"    working --> {State.FAILED.value}: fail")
    lines.append(f"    {State.STOPPED.value} --> {State.PREFLIGHT_DISK.value}: resume")
    lines.append(f"    {State.PAUSED_DISK.value} --> {State.PREFLIGHT_DISK.value}: resume")
    lines.append(f"    {State.FAILED.value} --> {State.PREFLIGHT_DISK.value}: resume")
    lines.append(f"    {State.DONE.value} --> [*]")
    return "\n".join(lines) + "\n"


BEGIN_MARK = "<!-- state-diagram:begin (generated by `python -m shoprld.daemon.round.machine README.md`) -->"
END_MARK = "<!-- state-diagram:end -->"


def render_into(text: str) -> str:
    """``text`` with the block between the markers replaced by the current diagram."""
    start, end = text.index(BEGIN_MARK) + len(BEGIN_MARK), text.index(END_MARK)
    return text[:start] + "\n```mermaid\n" + mermaid() + "```\n" + text[end:]


if __name__ == "__main__":  # regenerate the README's diagram from the table
    import sys
    from pathlib import Path

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    target.write_text(render_into(target.read_text()))
    print(f"wrote the state diagram into {target}")
