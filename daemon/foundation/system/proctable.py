"""The process table as ``/proc`` shows it: the one scanner every caller uses.

Who is alive in a session or a process group (a Ray head's workers, a child's descendants,
a straggler's group), and which processes carry a tag in their environment. ``/proc`` is
read directly: ``ps``/``pgrep`` may be missing in a container, and never kill by name. Each
reader tolerates a process that exits while it is read (it is simply not listed).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def pids(proc: Path = PROC) -> list[int]:
    """Every pid visible here, ascending (none when ``proc`` cannot be listed)."""
    try:
        return sorted(int(e) for e in os.listdir(proc) if e.isdigit())
    except OSError:
        return []


def session_pids(sid: int) -> list[int]:
    """Every live pid of session ``sid``, ascending (a child runs as its own session leader;
    Ray's workers keep the head's session)."""
    out: list[int] = []
    for pid in pids():
        try:
            if os.getsid(pid) == sid:
                out.append(pid)
        except OSError:
            continue
    return out


def group_pids(pgid: int) -> list[int]:
    """Every live pid of process group ``pgid``, ascending."""
    out: list[int] = []
    for pid in pids():
        try:
            if os.getpgid(pid) == pgid:
                out.append(pid)
        except OSError:
            continue
    return out


def environ(pid: int, proc: Path = PROC) -> list[bytes]:
    """``pid``'s environment as ``NAME=value`` items; empty when gone or not ours to read."""
    try:
        return (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []
