"""``shoprld status``'s document: where the campaign stands, whether or not the daemon runs.

Theory of operation. The engine writes ``<state_dir>/status.json`` atomically on every
transition and on progress (at most once a second). This module only READS: the campaign
file (for the state dir, and for the name when the daemon never ran), ``status.json``, the
pid file and the lock. It never talks to the daemon, so it answers the same way when the
daemon is alive, dead or never started, and it cannot wedge on a stuck event loop.

``--json`` prints the snapshot with ``daemon`` replaced by ``{alive, pid, last_seen,
started_at}`` (schema: ``status.schema.json`` beside this file; SPEC §6), and ``rounds_done``
read from ``rounds.jsonl`` (every round; status.json keeps only the newest, so that its size
does not grow with the campaign: :mod:`.roundlog`).

Speed budget (SPEC §9): ``--json`` ≤ 100 ms and the human view ≤ 200 ms end to end, on a
box where a bare interpreter costs 20-50 ms and structlog alone 230 ms. So this module
imports only the standard library at module level (``python -X importtime`` checks it in
``tests/unit/test_status.py``), as does :mod:`.statusview`, the human view and the
command itself, which read the document through :func:`collect`.

Liveness. The daemon holds an exclusive flock on ``<state_dir>/lock`` for its whole life
and the kernel drops it when the process dies, even on SIGKILL. "Alive" means that lock is
held by someone else AND the recorded pid exists. The flock probe takes a shared lock for a
few microseconds, which could make a daemon that starts at that very instant fail its
non-blocking exclusive lock; so the probe runs only when a recorded pid still exists, which
is never the case while systemd restarts a crashed or stopped daemon.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.records.statefiles import state_dir_problems
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.identity import StateMismatch, expected, status_problem
from shoprld.daemon.foundation.records.paths import QuickConfigError, identity_fields, quick_read, state_dir_from_toml
from shoprld.daemon.foundation.records.roundlog import read as read_rounds

# The names of store.py's files, copied: importing store.py pulls in dataclasses and
# inspect (~15 ms on the target box, 15 % of the --json budget). test_status checks that
# the copies match.
LOCK_FILE = "lock"
PID_FILE = "daemon.pid"
STATUS_FILE = "status.json"

SCHEMA_FILE = Path(__file__).with_name("status.schema.json")

# The engine's states, in named groups (as supervisor/states.py does).
ACTIVE_STATES = ("PREFLIGHT_DISK", "START_SHOPSIM", "TRAIN", "EXPORT_HF", "VAL", "GATE", "INJECT", "NEXT_ROUND")
PARKED_STATES = ("PAUSED_DISK",)
FINAL_STATES = ("DONE", "STOPPED", "FAILED")
NOT_STARTED = "NOT_STARTED"

STOP_REASONS = {
    "requested": "requested by the operator",
    "disk": "disk pressure (parked; free space, then start again)",
    "deadline": "the deadline was reached",
    "gate": "the gate policy stopped the campaign",
    "failed": "a stage failed after its retries",
    "done": "all rounds done",
}

# -- reading -------------------------------------------------------------------------


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def pid_exists(pid: int | None) -> bool:
    """True if a process with this pid exists (ours or someone else's)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, belongs to another user
        return True
    except OSError:
        return False
    return True


def probe_lock(path: Path) -> tuple[bool | None, int | None]:
    """(held by another process?, pid written in the lock file). None: cannot tell."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False, None
    except OSError:
        return None, None  # e.g. another user's 0600 lock file
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                text = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
                return True, (int(text) if text.isdigit() else None)
            return None, None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, None
    finally:
        os.close(fd)


def daemon_liveness(state_dir: Path, snapshot_pid: Any = None) -> tuple[bool, int | None]:
    """(alive, pid): the lock is held by another process AND the recorded pid exists.

    When the daemon is not alive, the pid is the last one recorded (or None).
    """
    candidates: list[int] = []
    for pid in (_read_pid(state_dir / PID_FILE), snapshot_pid):
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and pid not in candidates:
            candidates.append(pid)
    living = [p for p in candidates if pid_exists(p)]
    if not living:  # no probe: see the module docstring
        return False, (candidates[0] if candidates else None)
    held, holder = probe_lock(state_dir / LOCK_FILE)
    if held is None:  # cannot open the lock (another user's daemon): trust the pid
        return True, living[0]
    if held:
        return True, holder if holder is not None and pid_exists(holder) else living[0]
    return False, candidates[0]


def read_snapshot(state_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(snapshot, problem). (None, None) when there is no status.json at all."""
    path = state_dir / STATUS_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot read ({exc.strerror})"
    try:
        snap = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, f"{path}: not valid JSON (written by a broken engine?)"
    if not isinstance(snap, dict):
        return None, f"{path}: not a JSON object"
    return snap, None


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    sec = data.get(name)
    return sec if isinstance(sec, dict) else {}


def skeleton(toml: Mapping[str, Any]) -> dict[str, Any]:
    """A valid status object built from the campaign file alone (daemon never ran)."""
    camp = _section(toml, "campaign")
    shop = _section(toml, "shopsim")
    rounds = camp.get("rounds") if isinstance(camp.get("rounds"), int) else 0
    return {
        "campaign": str(camp.get("name", "")),
        "experiment": str(camp.get("experiment", "main")),
        "state": NOT_STARTED,
        "round": 0,
        "rounds": rounds,
        "step": 0,
        "steps_per_round": camp.get("steps_per_round") if isinstance(camp.get("steps_per_round"), int) else 0,
        "step_seconds": None,
        "eta_seconds": None,
        "daemon": None,
        "last_checkpoint": None,
        "disk": None,
        "shopsim": {
            "url": str(shop.get("url", "http://127.0.0.1:5700")),
            "healthy": None,
            "free_slots": None,
            "slots": shop.get("slots") if isinstance(shop.get("slots"), int) else 48,
            "checked_at": None,
        },
        "children": [],
        "rounds_done": [],
        "last_error": None,
        "stop_reason": None,
        "deadline": None,
        "stop_conditions": {"rounds_done": 0, "rounds": rounds, "deadline": None},
        "warnings": [],
        "updated_at": None,
    }


def collect(config_path: Path, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The ``status --json`` object for this campaign file (see the module docstring)."""
    try:
        toml = quick_read(config_path)
        state_dir = state_dir_from_toml(config_path, environ)
    except QuickConfigError as exc:
        raise ConfigError(str(exc)) from None
    # A FIFO at a state file's name would hang every read below (status, report): one line.
    wrong = state_dir_problems(state_dir)
    if wrong:
        raise ConfigError(wrong[0])
    snap, problem = read_snapshot(state_dir)
    # Never show another campaign's results as this one's (issue 15): a state dir shared by two
    # campaigns of the same name is refused here as `shoprld run` refuses it.
    name, experiment, repo, ephemeral_root = identity_fields(config_path, toml)
    mismatch = status_problem(state_dir, expected(name, experiment, repo, ephemeral_root), snap)
    if mismatch:
        raise StateMismatch(mismatch)
    out = skeleton(toml)
    if snap is not None:
        out["state"] = None  # a snapshot without a state is not "never started"
        out.update(snap)  # the skeleton fills any field an older engine did not write
        rounds = read_rounds(state_dir)
        if rounds is not None:  # None: an older engine, whose status.json holds every round
            out["rounds_done"] = rounds
    raw_daemon = snap.get("daemon") if snap else None
    raw_daemon = raw_daemon if isinstance(raw_daemon, dict) else {}
    alive, pid = daemon_liveness(state_dir, raw_daemon.get("pid"))
    updated = out.get("updated_at") if isinstance(out.get("updated_at"), (int, float)) else None
    out["daemon"] = {"alive": alive, "pid": pid, "last_seen": updated, "started_at": raw_daemon.get("started_at")}
    warnings = list(out["warnings"]) if isinstance(out.get("warnings"), list) else []
    if problem:
        out["state"] = None
        warnings.append(problem)
    elif snap is None and alive:
        out["state"] = None  # the daemon holds the lock but has not written a status yet
        warnings.append("the daemon is starting and has not written its first status yet")
    out["warnings"] = warnings
    out["state_dir"] = str(state_dir)
    return out


#: A plain ``shoprld stop`` in TRAIN waits for the next checkpoint when it is expected within
#: this long: a few minutes' wait that loses nothing beats throwing away the steps since the last
#: save. A second plain stop while waiting stops at once.
NEAR_SAVE_S = 600.0


def unsaved_progress(*, state: str | None, round_index: int, step: int, steps_per_round: int, end_offset: int,
                     last_iteration: int | None, step_seconds: float | None,
                     save_interval: int | None = None) -> dict[str, Any] | None:
    """What a plain ``shoprld stop`` would throw away now: TRAIN's steps since the newest
    complete checkpoint (the round starts from the previous round's final), and when the next
    save is due (the trainer saves at every multiple of ``save_interval`` and at the round's
    end). None outside TRAIN."""
    if state != "TRAIN" or steps_per_round < 1:
        return None
    round_start = (round_index + 1) * steps_per_round + end_offset - steps_per_round  # the previous final
    saved = max(0, min(step, last_iteration - round_start)) if last_iteration is not None else 0
    steps = max(0, step - saved)
    now_at, round_end = round_start + step, round_start + steps_per_round
    due = round_end if not save_interval or save_interval < 1 else \
        min(round_end, (now_at // save_interval + 1) * save_interval)
    ahead = max(1, due - now_at)
    return {"steps": steps, "since_iteration": round_start + saved,
            "seconds": steps * step_seconds if step_seconds else None,
            "next_save": {"iteration": due, "steps": ahead, "seconds": ahead * step_seconds if step_seconds else None}}


def save_is_near(unsaved: Mapping[str, Any] | None) -> bool:
    """A plain stop would lose steps, and the next save is expected within :data:`NEAR_SAVE_S`."""
    if not isinstance(unsaved, Mapping) or not isinstance(unsaved.get("steps"), int) or unsaved["steps"] <= 0:
        return False
    nxt = unsaved.get("next_save")
    secs = nxt.get("seconds") if isinstance(nxt, Mapping) else None
    return isinstance(secs, (int, float)) and 0 <= secs <= NEAR_SAVE_S


def waiting_for_save_line(unsaved: Mapping[str, Any]) -> str:
    """The reply of a plain stop that waits for a near save (see :func:`save_is_near`)."""
    nxt = unsaved["next_save"]
    return (f"the next checkpoint (iteration {nxt.get('iteration')}) is due in about "
            f"{_short_duration(float(nxt['seconds']))}, so this stop waits for it and loses nothing; "
            f"`shoprld stop` again stops now and loses the {unsaved['steps']} step"
            f"{'s' if unsaved['steps'] != 1 else ''} since iteration {unsaved.get('since_iteration')}")


def stop_cost_line(unsaved: Mapping[str, Any] | None, *, waits_when_near: bool = True) -> str | None:
    """One line on what a plain stop costs and the stop that costs nothing; None when nothing.
    ``waits_when_near=False``: the stop that stops now whatever (a second plain stop)."""
    if not isinstance(unsaved, Mapping):
        return None
    steps = unsaved.get("steps")
    if not isinstance(steps, int) or steps <= 0:
        return None
    if not waits_when_near:
        return f"this stop loses the {steps} step{'s' if steps != 1 else ''} since iteration {unsaved.get('since_iteration')}"
    if save_is_near(unsaved):
        nxt = unsaved["next_save"]
        return (f"a plain stop now waits for the next checkpoint (iteration {nxt.get('iteration')}, due in about "
                f"{_short_duration(float(nxt['seconds']))}) and loses nothing; a second plain stop stops at once, "
                f"losing the {steps} step{'s' if steps != 1 else ''} since iteration {unsaved.get('since_iteration')}")
    secs = unsaved.get("seconds")
    about = f" (about {_short_duration(secs)} of training)" if isinstance(secs, (int, float)) and secs > 0 else ""
    return (f"a plain stop in TRAIN loses the {steps} step{'s' if steps != 1 else ''} since the last checkpoint "
            f"(iteration {unsaved.get('since_iteration')}){about}; `shoprld stop --at-checkpoint` stops after "
            f"the next checkpoint instead and loses nothing")


def _short_duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
