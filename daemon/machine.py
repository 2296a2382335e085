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

The `transitions` library holds this table, validates each trigger against it and draws
the diagram. It never runs stage work: its callbacks are not used (transitions 0.9.3 runs
callbacks concurrently and cancels them on the next trigger; see REFERENCE.md). The
engine asks :meth:`Machine.fire` whether a trigger is legal from the current state, and
runs the stage itself in its own task group.
"""

from __future__ import annotations

from enum import Enum


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
        from transitions import Machine as _TMachine

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


BEGIN_MARK = "<!-- state-diagram:begin (generated by `python -m shoprld.daemon.machine README.md`) -->"
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
