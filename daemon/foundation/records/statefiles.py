"""What may stand at each of the state dir's names, judged before anything is opened.

Each file the daemon keeps in ``<state_dir>`` has a parser that rebuilds it when its content
is of the wrong shape (state.json from the journal, alerts.json empty, identity.json from the
config, status.json at the next write). None of them can rebuild a *directory*, a FIFO, a
device, a socket or a symlink standing at that name: opening a FIFO hangs the reader, a
directory makes every rename fail, a symlink points our writes at someone else's file. So
:func:`state_dir_problems` looks at every name first (``lstat``, nothing followed, nothing
opened) and returns one line per entry that is not a regular file (``control.sock``: not a
socket or a regular file). ``run`` refuses them (exit 3) before the lock is taken, and
``check`` lists them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# name -> (what it is, the fix when something else stands there)
_REBUILT = "remove it (shoprld rebuilds it)"
_RECORD = ("move it out of the state dir; if it was the campaign's record, put the regular file back "
           "(the journal and rounds.jsonl are what the campaign resumes from)")
STATE_NAMES: dict[str, tuple[str, str]] = {
    "state.json": ("the state snapshot", "remove it (shoprld rebuilds it from the journal)"),
    "status.json": ("the status document", _REBUILT),
    "identity.json": ("the state dir's identity", _REBUILT),
    "alerts.json": ("the notification record", _REBUILT),
    "shopsim.witness": ("ShopSim's witness", _REBUILT),
    "stall.learned": ("the stall verdict's learned phase bounds", _REBUILT),
    "daemon.pid": ("the daemon's pid file", _REBUILT),
    "lock": ("the lock file", _REBUILT),
    "journal.jsonl": ("the journal", _RECORD),
    "rounds.jsonl": ("the rounds record", _RECORD),
}
SOCKET_NAME = "control.sock"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def state_dir_problems(state_dir: Path) -> list[str]:
    """One line per name in ``state_dir`` where something other than our kind of file stands:
    ``<path>: is a FIFO, not the journal shoprld keeps there; fix: ...``. Empty when the dir
    does not exist yet."""
    out: list[str] = []
    for name, (what, fix) in STATE_NAMES.items():
        path = state_dir / name
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            return [f"{state_dir}: is not a directory; fix: point storage.state_dir at a directory"]
        except OSError as exc:
            out.append(f"{path}: cannot be examined ({exc.strerror}); fix: make the state dir readable")
            continue
        if not stat.S_ISREG(mode):
            out.append(f"{path}: is {_kind(mode)}, not {what} shoprld keeps there; fix: {fix}")
    sock = state_dir / SOCKET_NAME
    try:
        mode = os.lstat(sock).st_mode
    except OSError:
        return out
    if not (stat.S_ISSOCK(mode) or stat.S_ISREG(mode)):
        out.append(f"{sock}: is {_kind(mode)}, not the control socket shoprld keeps there; fix: {_REBUILT}")
    return out
