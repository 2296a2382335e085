"""The events that reach the engine's one queue, typed (issue 16).

Every source of change sends one of these: a stage task its outcome, the signal receiver a
signal, the control socket a stop request, the disk monitor a level change, the checkpoint
watcher a commit, a delayed retry its wake-up, the hygiene scan its findings. The engine's
main loop takes them one at a time and dispatches on the type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shoprld.daemon.foundation.errors import ShoprldError
from shoprld.daemon.round.machine import State

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

    mode: str


@dataclass(frozen=True)
class DiskLevel:
    """The disk monitor's level change (``disk.ok``, ``disk.soft_limit``, ``disk.hard_limit``)."""

    event: dict[str, Any]


@dataclass(frozen=True)
class CheckpointSeen:
    """The checkpoint watcher's event (``checkpoint.committed`` and its companions)."""

    event: dict[str, Any]


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


Event = StageOutcome | SignalReceived | StopRequested | DiskLevel | CheckpointSeen | RetryDue | HygieneFound | TaskFailed
