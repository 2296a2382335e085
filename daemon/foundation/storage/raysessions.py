"""Ray's session dirs of a head this campaign starts: where they are, what they weigh, pruning.

A head started with ``RAY_TMPDIR=<exp>/ray`` (or the short /tmp link to it, for AF_UNIX's
107 bytes) writes ``<exp>/ray/ray/session_<date>_<pid>/`` and points ``session_latest`` at
the newest. Its ``logs/`` holds every component's log and each job's driver log: every line
the job prints (four SGLang engines' request lines) lands there once more, on the data disk.
The head lives one TRAIN (services/ray.py stops it before VAL), so each round leaves one
session; without pruning a 25-round campaign keeps 25 of them.

So: :func:`prune` keeps the newest :data:`SESSIONS_KEPT` (the live one and the one before it,
for a post-mortem of the last round) and never removes ``session_latest``'s target nor a
session whose head pid still runs; :func:`allowance` is what the disk forecast reserves for
them (:func:`shoprld.daemon.foundation.storage.preflight.budget_for`). Plain paths only: no config.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from shoprld.daemon.foundation.storage.diskbudget import floor_unit

#: Sessions kept on the volume: the live one and the previous round's.
SESSIONS_KEPT = 2
# Ray names a session session_<%Y-%m-%d_%H-%M-%S_%f>_<pid of the process that made it>; the
# name sorts by time.
_SESSION = re.compile(r"^session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+)$")


def sessions_root(ray_tmp: Path) -> Path:
    """Ray's temp dir under ``RAY_TMPDIR`` (``<RAY_TMPDIR>/ray``), here under the experiment."""
    return ray_tmp / "ray"


def sessions(ray_tmp: Path) -> list[Path]:
    """The session dirs under ``ray_tmp``, oldest first (real dirs only, never a link)."""
    root = sessions_root(ray_tmp)
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    return [root / e.name for e in sorted(entries, key=lambda e: e.name)
            if _SESSION.match(e.name) and e.is_dir(follow_symlinks=False)]


def live_session(ray_tmp: Path) -> Path | None:
    """The session ``session_latest`` points at (the running head's, or the last one's)."""
    try:
        name = os.path.basename(os.readlink(sessions_root(ray_tmp) / "session_latest"))
    except OSError:
        return None
    return sessions_root(ray_tmp) / name if _SESSION.match(name) else None


def _pid_runs(session: Path) -> bool:
    m = _SESSION.match(session.name)
    return bool(m) and Path(f"/proc/{m.group(1)}").exists()


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def prune(ray_tmp: Path, keep: int = SESSIONS_KEPT) -> list[Path]:
    """Remove all but the newest ``keep`` sessions; returns what was removed. Never the target
    of ``session_latest`` nor a session whose head pid runs (a pid reused since only keeps an
    old session longer)."""
    live = live_session(ray_tmp)
    old = sessions(ray_tmp)
    doomed = old[:max(0, len(old) - keep)]
    removed: list[Path] = []
    for s in doomed:
        if s == live or _pid_runs(s):
            continue
        shutil.rmtree(s, ignore_errors=True)
        if not s.exists():
            removed.append(s)
    return removed


@dataclass(frozen=True)
class Allowance:
    """What the forecast reserves for Ray's sessions, and how much of it is on the volume."""

    per_session_bytes: int
    kept: int
    present_bytes: int

    @property
    def total_bytes(self) -> int:
        """The kept sessions' bytes at most."""
        return self.per_session_bytes * self.kept

    @property
    def need_bytes(self) -> int:
        """What is still to come: the allowance less the kept sessions already on the volume."""
        return max(0, self.total_bytes - self.present_bytes)


def allowance(ray_tmp: Path, checkpoint_bytes: int, kept: int = SESSIONS_KEPT) -> Allowance:
    """One :func:`floor_unit` (1/64 of a checkpoint) for the ``kept`` sessions, or ``kept`` times
    the largest session measured on the volume when that is more.

    Why that size: a real head's session with an 82 MiB job log weighed 83.6 MiB (the driver log
    and Ray's own logs); slime's SGLang engines are Ray actors, so their lines land twice (their
    worker logs and the driver log): about 2 x 60 MiB + Ray's logs for a round of the recipe.
    The recipe's 53 GiB checkpoint gives 424 MiB a session, 848 MiB for two, about twice that,
    and the need still fits the 120 GiB disk (119.1 GiB); the tests' 8 MiB checkpoints give 64
    KiB a session, so the MiB tmpfs campaigns are not refused for it. A measured session
    larger than that replaces the guess."""
    present = [tree_bytes(s) for s in sessions(ray_tmp)]
    per = max([floor_unit(checkpoint_bytes) // max(1, kept), *present])
    return Allowance(per_session_bytes=per, kept=kept, present_bytes=sum(present[-kept:]) if present else 0)
