"""The events that reach the engine's one queue, typed (issue 16).

Every source of change sends one of these: a stage task its outcome, the signal receiver a
signal, the control socket a stop request, the disk monitor a level change, the checkpoint
watcher a commit, a delayed retry its wake-up, the hygiene scan its findings. The engine's
main loop takes them one at a time and dispatches on the type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from shoprld.daemon.foundation.storage.disk import LEVEL_EVENTS, Level
from shoprld.daemon.foundation.system.errors import ShoprldError
from shoprld.daemon.round.machine import State, StopMode

if TYPE_CHECKING:  # states import the daemon's foundations; only the type is needed here
    from shoprld.states.base import Outcome


@dataclass(frozen=True)
class StageOutcome:
    """A stage task ended: what its ``run()`` returned, or the ShoprldError it raised."""

    state: State
    attempt: int
    outcome: Outcome | ShoprldError


@dataclass(frozen=True)
class SignalReceived:
    """SIGTERM, SIGINT (stop now) or SIGHUP (reload the campaign file)."""

    signum: int


@dataclass(frozen=True)
class StopRequested:
    """``shoprld stop`` over the control socket: ``now``, ``checkpoint`` or ``round``."""

    mode: StopMode


@dataclass(frozen=True)
class DiskLevelChanged:
    """The disk guard's level changed (disk.py's verdict on one sample): the level, why, and
    the sample and limits it was judged on, as the journal records them."""

    level: Level
    reason: str
    path: str
    free_bytes: int
    total_bytes: int
    inodes_free: int
    inodes_total: int
    read_only: bool
    soft_limit_bytes: int
    hard_limit_bytes: int
    soft_limit_inodes: int
    hard_limit_inodes: int
    at: float

    @classmethod
    def of(cls, level: Level, payload: Mapping[str, Any]) -> DiskLevelChanged:
        """From the monitor's payload (disk.py's ``Monitor``) and the guard's level."""
        return cls(level, **{f.name: payload[f.name] for f in fields(cls) if f.name != "level"})

    @property
    def event(self) -> str:
        """The journal's name for the new level (``disk.ok``, ``disk.soft_limit``, ``disk.hard_limit``)."""
        return LEVEL_EVENTS[self.level]

    def journal_fields(self) -> dict[str, Any]:
        return {**asdict(self), "level": self.level.value}


@dataclass(frozen=True)
class CheckpointCommitted:
    """The checkpoint watcher saw a save become complete (its tracker names it)."""

    iteration: int
    path: str
    bytes: int | None = None
    latency_ms: float | None = None  # from the save's last file to this event


@dataclass(frozen=True)
class RetryDue:
    """A retried stage's backoff has passed: run it again."""

    state: State


@dataclass(frozen=True)
class HygieneFound:
    """The repo hygiene scan's findings (``when``: start, or after which round)."""

    when: str
    found: list[str]


@dataclass(frozen=True)
class TaskFailed:
    """One of the daemon's own tasks (a stage's, the notify worker, a watcher) raised: the
    campaign stops, its children with it, with this one line."""

    name: str
    message: str


Event = (StageOutcome | SignalReceived | StopRequested | DiskLevelChanged | CheckpointCommitted | RetryDue | HygieneFound
         | TaskFailed)
