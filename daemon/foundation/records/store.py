"""The state dir: ``state.json`` (atomic), ``journal.jsonl`` (append-only, fsynced), the lock.

The state dir lives OFF the volume (SPEC §5), so a full ``/ephemeral`` cannot stop the
daemon from recording why it stopped. ``state.json`` is a cache of intent, not an oracle:
the engine reconciles it with the disk on every start. When it is corrupt or truncated it
is rebuilt from the journal (the last record that carries a full snapshot), with a
warning event; when both are gone, the disk alone decides (``Store.load`` returns None).

Write order for a transition: journal line (fsync; it carries the whole snapshot), then
state.json (temp, replace; not fsynced, since that line already holds it durably). A crash
between the two, or a host crash that loses or tears state.json, leaves a journal that is
ahead of state.json, and the rebuild prefers the newer of the two. Every other state.json
write (temp, fsync, replace, fsync dir) is durable on its own.

Persistence grows linearly with the rounds (issue 16): a finished round's facts are
written once, as a journal record (``round.done``) and a line of ``rounds.jsonl``
(:mod:`.roundlog`), never again in a snapshot. state.json and the journal's snapshots carry a
cursor instead (``rounds_recorded``). :meth:`Store.load` reads the last snapshot (from the
journal's tail) and ``rounds.jsonl``; only when that file holds fewer rounds than the cursor
says (lost or truncated) does it scan the whole journal for the ``round.done`` records. A state
dir written before this file existed (``rounds_done`` inside state.json) loads as before, and its
rounds are handed back in :attr:`Loaded.unrecorded` for the engine to record once.

Every write here (journal, state.json, status.json) passes through the store's
:class:`~.secrets.Redactor`, whatever built the text: a failure message quoting a child's
"401 invalid key <key>" is masked on its way to disk, not by each caller (issue 15). The
state dir is 0700 and its files 0600; :meth:`Store.acquire_lock` tightens a dir that an
older version, ``shoprld demo`` or systemd's StateDirectory= left more open.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.records import roundlog
from shoprld.daemon.foundation.system.errors import LockError
from shoprld.daemon.foundation.records.roundlog import ROUNDS_FILE
from shoprld.daemon.foundation.config.secrets import NO_REDACTION, Redactor

SCHEMA_VERSION = 1
STATE_FILE = "state.json"
JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"
PID_FILE = "daemon.pid"
STATUS_FILE = "status.json"
ROUND_DONE_EVENT = "round.done"  # the journal record that carries a round's facts, once
SOCKET_FILE = "control.sock"
# Only the daemon's user reads the state (it holds failure messages, paths, pids); the
# ledger in the repo is the one record meant for others.
STATE_DIR_MODE = 0o700
STATE_FILE_MODE = 0o600


def _no_looser(fd: int, mode: int) -> None:
    """A stale temp file keeps its old mode through O_CREAT: drop any bit ``mode`` lacks
    (only drop: the umask may have asked for less than ``mode``)."""
    have = os.fstat(fd).st_mode & 0o777
    if have & ~mode:
        os.fchmod(fd, have & mode)
DAEMON_RECORD = "daemon.json"


def proc_identity(pid: int) -> tuple[int | None, list[str] | None]:
    """(start time in clock ticks since boot, argv) of a live pid, from /proc; Nones when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None, None
    rest = stat[stat.rfind(")") + 2:].split()  # comm may hold spaces and parentheses
    try:
        ticks = int(rest[19]) if rest and rest[0] != "Z" else None
    except (IndexError, ValueError):
        ticks = None
    return ticks, [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def daemon_record(pid: int) -> dict[str, Any]:
    """What ``daemon.json`` holds: enough to tell this daemon from a process that reuses its pid."""
    ticks, argv = proc_identity(pid)
    return {"pid": pid, "start_ticks": ticks, "cmdline": argv, "role": "daemon"}


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Temp file in the same dir, fsync, os.replace, fsync the dir.

    A failed fsync is not retried (PostgreSQL's fsyncgate): the error propagates.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            _no_looser(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:  # a full disk mid-write too: no temp file is left behind
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def atomic_write_json(path: Path, obj: Any, *, mode: int = 0o644) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), mode=mode)


def replace_json(path: Path, obj: Any, *, mode: int = STATE_FILE_MODE) -> None:
    """Atomic (readers never see a torn file) but not durable: for display caches such as
    status.json, which the next persist rewrites anyway. Saves two fsyncs per transition."""
    _replace_bytes(path, _json_bytes(obj), mode=mode)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from disk, or None when missing, torn or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _replace_bytes(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            _no_looser(fd, mode)
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:  # a full state dir mid-write: no temp file is left behind
        tmp.unlink(missing_ok=True)
        raise


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written: a short write near a full disk is not success (the
    next write then raises ENOSPC)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class LatestWriter:
    """Writes the newest bytes handed to it to one file, atomically, on its own thread.

    Why (issue 17): a rename over an existing file is not free on ext4. With
    ``auto_da_alloc`` (the default) the kernel starts writing the new file's data back at the
    rename, and on a busy disk that rename blocked the event loop as long as an fsync did
    (cProfile of a demo campaign: 5.8 ms per status.json replace, 2-3 per hand-off). status.json
    is a display cache, not a record (state.json and the journal are, and stay synchronous and
    fsynced), so its writes leave the loop: the caller renders the bytes (a consistent copy of
    the engine's state at that moment) and this thread replaces the file. Only the newest
    pending bytes are written (latest wins); :meth:`flush` waits until they are on the file.
    A write error is kept and raised by the next :meth:`put`, so the caller still hears of it.
    """

    def __init__(self, path: Path, *, mode: int) -> None:
        self.path, self.mode = path, mode
        self._cond = threading.Condition()
        self._pending: bytes | None = None
        self._busy = False
        self._error: OSError | None = None
        self._thread: threading.Thread | None = None

    def put(self, data: bytes) -> None:
        """Queue ``data`` as the file's next content; raise the previous write's error, if any."""
        with self._cond:
            error, self._error = self._error, None
            self._pending = data
            if self._thread is None:
                # A daemon thread: a process that exits without flush() loses only a display cache.
                self._thread = threading.Thread(target=self._run, name=f"write {self.path.name}", daemon=True)
                self._thread.start()
            self._cond.notify()
        if error is not None:
            raise error

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until the newest bytes are written."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout=timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                data, self._pending, self._busy = self._pending, None, True
            assert data is not None  # wait_for's predicate
            try:
                _replace_bytes(self.path, data, mode=self.mode)
            except OSError as exc:
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


@dataclass
class Loaded:
    """What :meth:`Store.load` found, and how."""

    state: dict[str, Any]
    source: str  # "state.json" | "journal"
    warning: str | None = None
    # Every finished round's facts, sorted by round (rounds.jsonl, completed as load() says).
    rounds: list[dict[str, Any]] = field(default_factory=list)
    # Rounds known from elsewhere (an older state.json, the journal) that rounds.jsonl lacks:
    # the engine records them (Store.append_round) once it holds the lock.
    unrecorded: list[dict[str, Any]] = field(default_factory=list)


class _AppendOnlyFile:
    """One JSON-lines file this process appends to: opened once, O_APPEND, 0600.

    A crash mid-append leaves a torn last line; the next record must not be fused onto it
    (it would be lost with the torn bytes). One writer (the lock holder): checked once, at open.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._torn = False

    def append(self, line: str, *, sync: bool) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, STATE_FILE_MODE)
            size = os.fstat(self._fd).st_size
            if size and os.pread(self._fd, 1, size - 1) != b"\n":
                line = "\n" + line
        elif self._torn:
            line = "\n" + line
        try:
            _write_all(self._fd, line.encode())
        except OSError:  # part of the line may be on disk (a full state dir): the next starts afresh
            self._torn = True
            raise
        self._torn = False
        if sync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Store:
    """Owns everything the daemon writes into its state dir."""

    def __init__(self, state_dir: Path, *, redactor: Redactor = NO_REDACTION,
                 status_in_background: bool = False) -> None:
        """``redactor``: what every write passes through (the daemon hands its own; a reader or a
        one-shot command has no secret to mask). ``status_in_background``: status.json is written
        by a :class:`LatestWriter` thread (the daemon's store, whose event loop must not wait for a
        display cache); else synchronously."""
        self.dir = state_dir
        self._redactor = redactor
        self._lock_fd: int | None = None
        self._journal = _AppendOnlyFile(state_dir / JOURNAL_FILE)
        self._rounds = _AppendOnlyFile(state_dir / ROUNDS_FILE)
        self._status = LatestWriter(state_dir / STATUS_FILE, mode=STATE_FILE_MODE) if status_in_background else None

    @property
    def redactor(self) -> Redactor:
        """The one this store was given."""
        return self._redactor

    def tighten(self) -> None:
        """Make the dir 0700 and its regular files 0600 (only what this user owns)."""
        me = os.geteuid()
        try:
            st = os.stat(self.dir)
            if st.st_uid == me and st.st_mode & 0o777 != STATE_DIR_MODE:
                os.chmod(self.dir, STATE_DIR_MODE)
            for entry in os.scandir(self.dir):
                est = entry.stat(follow_symlinks=False)
                if entry.is_file(follow_symlinks=False) and est.st_uid == me and est.st_mode & 0o777 != STATE_FILE_MODE:
                    os.chmod(entry.path, STATE_FILE_MODE)
        except OSError:
            pass  # another user's dir, or a read-only one: preflight says so, not this

    # -- lock ------------------------------------------------------------------
    def acquire_lock(self, *, role: str = "daemon") -> None:
        """One daemon per campaign: an exclusive flock on ``<state_dir>/lock``.

        The pid of the holder is written into the lock file, so a second daemon can say
        who holds it. The kernel drops the lock when the holder dies (even SIGKILL).
        ``role="daemon"`` also writes ``daemon.pid`` and ``daemon.json`` (pid, start time,
        cmdline): what ``shoprld stop`` checks before it signals anything. One-shot commands
        (``clean``, ``export-campaign``, ``import-campaign``) pass ``role="oneshot"`` and
        write neither, so stop can never take them, or a pid they left, for the daemon.
        """
        self.dir.mkdir(parents=True, exist_ok=True, mode=STATE_DIR_MODE)
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, STATE_FILE_MODE)
        # `shoprld status` takes a shared lock for a moment to test liveness: retry briefly,
        # so a status call at the instant a daemon starts cannot make it exit 3.
        deadline = time.monotonic() + 0.3
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                if time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                err = exc
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise LockError(
                    f"{self.dir}: another shoprld daemon (pid {holder}) runs this campaign; "
                    f"fix: `shoprld status` to see it, `shoprld stop` to stop it"
                ) from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        self.tighten()
        self._role = role
        if role == "daemon":
            atomic_write(self.dir / PID_FILE, f"{os.getpid()}\n".encode(), mode=STATE_FILE_MODE)
            atomic_write_json(self.dir / DAEMON_RECORD, daemon_record(os.getpid()), mode=STATE_FILE_MODE)

    def release_lock(self) -> None:
        self.flush_status()  # the last status.json lands before the lock is free
        if self._lock_fd is not None:
            if getattr(self, "_role", "daemon") == "daemon":
                (self.dir / PID_FILE).unlink(missing_ok=True)
                (self.dir / DAEMON_RECORD).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None
        self._journal.close()
        self._rounds.close()

    # -- journal -----------------------------------------------------------------
    def append(self, record: dict[str, Any], *, sync: bool = True) -> None:
        """Append one JSON line and fsync it. ``sync=False`` leaves the fsync to the next
        synced append (one fsync covers every line before it): for a line that another
        follows at once, or one that only informs (a daemon crash loses neither; the write
        is in the page cache)."""
        self._journal.append(self._line(record), sync=sync)

    def append_round(self, record: dict[str, Any]) -> None:
        """One finished round's facts, once: a line of ``rounds.jsonl`` (:mod:`.roundlog`),
        fsynced before the snapshot whose cursor counts it is written."""
        self._rounds.append(self._line(record), sync=True)

    def rounds(self) -> list[dict[str, Any]]:
        """Every finished round's facts as ``rounds.jsonl`` holds them, sorted by round."""
        return roundlog.read(self.dir) or []

    def _line(self, record: dict[str, Any]) -> str:
        return json.dumps({"t": time.time(), **self.redactor.obj(record)}, sort_keys=True) + "\n"

    def journal(self) -> Iterator[dict[str, Any]]:
        """Every well-formed journal record; a torn last line (crash mid-append) is skipped."""
        yield from roundlog.json_lines(self.dir / JOURNAL_FILE)

    # -- state -------------------------------------------------------------------
    def save(self, state: dict[str, Any], *, durable: bool = True) -> None:
        """state.json, redacted, atomically and (unless ``durable=False``) durably.

        ``durable=False`` is for a state the journal already holds durably: a transition's
        line carries the same snapshot and was fsynced just before, and :meth:`load` prefers
        the newer of the two, so a state.json that a host crash loses or tears costs nothing
        (a daemon crash keeps the page cache). It saves two fsyncs per hand-off (issue 17)."""
        doc = {**self.redactor.obj(state), "schema": SCHEMA_VERSION}
        if durable:
            atomic_write_json(self.dir / STATE_FILE, doc, mode=STATE_FILE_MODE)
        else:
            replace_json(self.dir / STATE_FILE, doc, mode=STATE_FILE_MODE)

    def write_status(self, doc: dict[str, Any]) -> None:
        """status.json, redacted: atomic, not durable (the next persist rewrites it); with
        ``status_in_background``, written off the caller's thread (:meth:`flush_status` waits)."""
        data = _json_bytes(self.redactor.obj(doc))
        if self._status is None:
            _replace_bytes(self.dir / STATUS_FILE, data, mode=STATE_FILE_MODE)
        else:
            self._status.put(data)

    def flush_status(self) -> None:
        """Wait (bounded) until the last :meth:`write_status` is on the file."""
        if self._status is not None:
            self._status.flush()

    def load(self) -> Loaded | None:
        """state.json, else the journal's last valid snapshot, else None (the disk decides);
        with every finished round's facts (see the module docstring).

        Never raises for what is in the files: garbage bytes, a torn file, or valid JSON with the
        wrong types (checked by :mod:`statedoc`) all mean "rebuild", with ``warning`` saying why.
        """
        loaded = self._load_state()
        recorded = self.rounds()
        if loaded is None:
            if not recorded:
                return None
            loaded = Loaded({}, "none", f"{STATE_FILE} and the journal are missing; rebuilt from the disk")
        state = loaded.state
        # An older engine kept the rounds in every snapshot (rounds_done, round_durations).
        durations = state.get("round_durations") or {}
        legacy = [{**r, "duration_seconds": r.get("duration_seconds", durations.get(str(r.get("round"))))}
                  for r in state.get("rounds_done") or []]
        cursor = state.get("rounds_recorded")
        known = {roundlog.round_of(r) for r in recorded}
        if isinstance(cursor, int) and len(known) < cursor:
            # rounds.jsonl lost rounds that the snapshot saw recorded: the journal has each one once.
            legacy += [r for r in self._journaled_rounds() if roundlog.round_of(r) not in known]
            note = f"{ROUNDS_FILE} holds {len(known)} of the {cursor} rounds recorded; rebuilt from the journal"
            loaded.warning = f"{loaded.warning}; {note}" if loaded.warning else note
        loaded.unrecorded = [r for r in roundlog.merge(legacy) if roundlog.round_of(r) not in known]
        loaded.rounds = roundlog.merge(loaded.unrecorded, recorded)
        return loaded

    def _journaled_rounds(self) -> list[dict[str, Any]]:
        """The facts of every ``round.done`` record in the journal (a full scan: repair only)."""
        return [{k: v for k, v in rec.items() if k not in ("t", "event", "seq", "state")}
                for rec in self.journal() if rec.get("event") == ROUND_DONE_EVENT]

    def _load_state(self) -> Loaded | None:
        """state.json, else the journal's last valid snapshot, else None."""
        from shoprld.daemon.foundation.records.statedoc import validate  # pydantic: not for `shoprld stop`, which imports this module

        problem: str | None = None
        try:
            raw = (self.dir / STATE_FILE).read_text(encoding="utf-8")
            doc = json.loads(raw)
            state: dict[str, Any] | None = None
            if isinstance(doc, dict) and doc.get("schema") != SCHEMA_VERSION:
                problem = f"state.json has schema {doc.get('schema')!r}, expected {SCHEMA_VERSION}"
            else:
                state, problem = validate(doc, STATE_FILE)
            if state is not None:
                newer = self._last_snapshot()
                if newer and newer.get("seq", 0) > state.get("seq", 0):
                    return Loaded(newer, "journal", "journal is ahead of state.json (crash between writes)")
                return Loaded(state, STATE_FILE)
        except FileNotFoundError:
            problem = None if not (self.dir / JOURNAL_FILE).exists() else "state.json is missing"
        except (ValueError, UnicodeDecodeError, RecursionError):  # JSONDecodeError is a ValueError
            problem = "state.json is corrupt or truncated"
        except OSError as exc:
            problem = f"state.json cannot be read ({exc.strerror})"
        snap = self._last_snapshot()
        if snap is not None:
            return Loaded(snap, "journal", f"{problem}; rebuilt from the journal and the disk" if problem else None)
        if problem:
            return Loaded({}, "none", f"{problem}, and the journal has no valid snapshot; rebuilt from the disk")
        return None

    def _last_snapshot(self) -> dict[str, Any] | None:
        """The newest valid snapshot, read from the journal's tail (a restart must not pay for
        the whole history); the full scan is the fallback when the tail holds none."""
        path = self.dir / JOURNAL_FILE
        try:
            size = path.stat().st_size
            with open(path, "rb") as fh:
                fh.seek(max(0, size - 4 * 1024 * 1024))
                tail = fh.read().decode("utf-8", errors="replace").splitlines()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            return None
        for line in reversed(tail[1:] if size > 4 * 1024 * 1024 else tail):
            snap = _snapshot_of(line)
            if snap is not None:
                return snap
        if size <= 4 * 1024 * 1024:
            return None
        last = None
        for rec in self.journal():
            snap = _snapshot_of(rec)
            if snap is not None:
                last = snap
        return last


def _snapshot_of(line_or_rec: str | dict[str, Any]) -> dict[str, Any] | None:
    """The validated snapshot a journal line carries, or None."""
    from shoprld.daemon.foundation.records.statedoc import validate  # pydantic: as _load_state

    try:
        rec = json.loads(line_or_rec) if isinstance(line_or_rec, str) else line_or_rec
    except (ValueError, RecursionError):
        return None
    snap = rec.get("snapshot") if isinstance(rec, dict) else None
    if not isinstance(snap, dict):
        return None
    return validate(snap, "journal snapshot")[0]
