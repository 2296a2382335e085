"""The crash tests' fault-injection seam (documented in tests/README.md).

``SHOPRLD_TEST_KILL`` is a list of ``STATE:POINT:ROUND`` entries; at the first matching point
not yet fired (a marker file in ``SHOPRLD_TEST_KILL_DIR``), the daemon SIGKILLs itself. POINT
is ``enter`` (transition persisted), ``mid`` (the stage's first child spawned),
``spawn-<role>`` (that child spawned and recorded) or ``done`` (the stage's output is on disk,
its outcome not yet persisted). Read once at import: the daemon is started with it.

``SHOPRLD_TEST_RAISE`` is ``TASK`` or ``TASK#N``: the N-th start (default the first) of the
daemon's own task named TASK (engine.py ``_background``: "notify", "hygiene scan", ...) raises
RuntimeError, so a test can show that a crashing task stops the campaign and its children in
one line.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from shoprld.daemon.round.machine import State

_KILL_SPEC = os.environ.get("SHOPRLD_TEST_KILL", "")
_KILL_DIR = os.environ.get("SHOPRLD_TEST_KILL_DIR", "")
_RAISE_SPEC = os.environ.get("SHOPRLD_TEST_RAISE", "")
_raised: dict[str, int] = {}


def maybe_raise(task: str) -> None:
    """Raise RuntimeError at the start of ``task`` if ``SHOPRLD_TEST_RAISE`` names this start."""
    if not _RAISE_SPEC:
        return
    name, _, nth = _RAISE_SPEC.partition("#")
    if name != task:
        return
    _raised[task] = _raised.get(task, 0) + 1
    if _raised[task] == int(nth or 1):
        raise RuntimeError(f"injected failure of the {task} task (SHOPRLD_TEST_RAISE)")


def maybe_die(state: State, point: str, round_index: int) -> None:
    """SIGKILL this process if ``state:point:round`` is armed and has not fired yet."""
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
