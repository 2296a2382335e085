"""The checkpoint watcher: when the save dir changed, as events for the event loop.

The watcher (:class:`CheckpointWatcher`) watches the save dir non-recursively (recursive watches
race with brand-new dirs) with watchdog's inotify observer, or polls. Either way an event is only
a hint that makes it rescan the whole save dir; the rescan is the truth, so a lost event (queue
overflow, a filesystem that delivers none) costs latency, never correctness. It also rescans on a
timer and after an overflow. Both modes feed the same rescan-and-diff code, so they emit the same
events in the same order. :func:`detect_watch_mode` picks the mode from ``/proc/self/mountinfo``.

It only reads: the save dir (through :mod:`.checkpoints`' scan, which alone decides what is
complete) and mountinfo. structlog and watchdog are imported lazily: only a running watcher
needs them.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.lowlevel
import anyio.from_thread
import anyio.to_thread
from anyio.abc import TaskStatus

from shoprld.daemon.foundation.storage.checkpoints import Scan, _scan, _ScanCache

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

__all__ = [
    "CheckpointWatcher",
    "ObserverLike",
    "WatchMode",
    "detect_watch_mode",
]

WatchMode = Literal["inotify", "poll"]


def _log() -> FilteringBoundLogger:
    # Lazy: importing structlog costs ~0.2 s. The logger keeps its name from before the split.
    import structlog

    logger: FilteringBoundLogger = structlog.get_logger("shoprld.checkpoints")
    return logger


# --------------------------------------------------------------------------------------------
# Watch mode detection

# Filesystems where inotify cannot see writes made by another node (or sees nothing at all).
# fuseblk (ntfs-3g, exfat on a local disk) is local and is left to inotify.
_POLL_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "lustre", "gpfs", "ceph", "glusterfs",
        "afs", "beegfs", "orangefs", "virtiofs", "davfs", "fuse", "panfs", "wekafs",
    }
)  # fmt: skip

_MOUNTINFO = Path("/proc/self/mountinfo")


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _fstype_of(path: Path, mountinfo: Path) -> str | None:
    target = os.path.realpath(path)
    try:
        text = mountinfo.read_text(errors="replace")
    except OSError:
        return None
    best: str | None = None
    best_len = -1
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount_point = _unescape_mount(fields[4])
        under = mount_point == "/" or target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        # ">=": a later line for the same mount point is a mount stacked on top; it wins.
        if under and len(mount_point) >= best_len:
            best, best_len = tail[0], len(mount_point)
    return best


def detect_watch_mode(path: Path, *, mountinfo: Path = _MOUNTINFO) -> WatchMode:
    """``poll`` when ``path`` lives on a network/FUSE/cluster filesystem, else ``inotify``.

    Finds the mount with the longest mount-point prefix of ``realpath(path)`` in ``mountinfo``
    (``/proc/self/mountinfo``; a parameter so tests can pass a fixture). Unreadable mountinfo
    means ``inotify``: the periodic rescan still guarantees correctness.
    """
    fstype = _fstype_of(path, mountinfo)
    if fstype is not None and (fstype in _POLL_FSTYPES or fstype.startswith("fuse.")):
        return "poll"
    return "inotify"


# --------------------------------------------------------------------------------------------
# The watcher


class ObserverLike(Protocol):
    """The part of watchdog's ``BaseObserver`` the watcher uses: the seam for ``observer_factory``."""

    def schedule(self, event_handler: Any, path: str, *, recursive: bool = ..., event_filter: Any = ...) -> Any: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...


Emit = Callable[[dict[str, Any]], Awaitable[None] | None]
"""What :meth:`CheckpointWatcher.run` calls with each event: a function or a coroutine function."""


def _default_observer() -> ObserverLike:
    from watchdog.observers import Observer  # inotify on Linux; lazy: only a running watcher needs watchdog

    observer: ObserverLike = Observer()
    return observer


def _event_filter() -> list[Any]:
    # Only what changes the save dir's own entries. Opens, reads and no-write closes are left
    # out on purpose: our own rescans open the tracker, and would otherwise wake us forever.
    from watchdog import events as ev  # lazy: as _default_observer

    return [
        ev.FileCreatedEvent, ev.FileModifiedEvent, ev.FileClosedEvent, ev.FileDeletedEvent,
        ev.FileMovedEvent, ev.DirCreatedEvent, ev.DirDeletedEvent, ev.DirMovedEvent,
    ]  # fmt: skip


class _Hint:
    """watchdog handler (duck-typed ``FileSystemEventHandler``): any event is only a hint."""

    def __init__(self, poke: Callable[[], None]) -> None:
        self._poke = poke

    def dispatch(self, event: Any) -> None:  # called on the observer thread
        self._poke()


class _OverflowLogHook(logging.Handler):
    """watchdog reports IN_Q_OVERFLOW only as a log line, never to handlers: turn it into a rescan."""

    def __init__(self, on_overflow: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self._on_overflow = on_overflow

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self._on_overflow()


_WATCHDOG_INOTIFY_LOGGER = "watchdog.observers.inotify_c"


class _Differ:
    """Turns successive scans into events; the same code serves both modes, hence same events."""

    def __init__(self, since_iteration: int | None) -> None:
        self._since = since_iteration
        # Keyed by (iteration, metadata.json mtime): a re-save of the same N (after a rollback of
        # the tracker) is a new commit; a torn tracker read that hides a checkpoint for an
        # instant must not make it "new" again when it reappears.
        self._emitted: set[tuple[int, float | None]] | None = None
        self._partial: set[int] = set()
        self._ahead: set[int] = set()

    def diff(self, scan: Scan, *, now_wall: float) -> list[dict[str, Any]]:
        committed = scan.committed
        if self._emitted is None:
            # First scan: what is already committed is the baseline, not news (unless the caller
            # told us what it already knew, to close the gap between its scan and ours).
            self._emitted = {
                (c.iteration, c.committed_at)
                for c in committed
                if self._since is None or c.iteration <= self._since
            }
        present = {c.iteration for c in scan.checkpoints}
        self._emitted = {k for k in self._emitted if k[0] in present}
        events: list[dict[str, Any]] = []
        mtime = scan.tracker.mtime
        for c in committed:
            key = (c.iteration, c.committed_at)
            if key in self._emitted:
                continue
            self._emitted.add(key)
            latency = max(0.0, (now_wall - mtime) * 1000.0) if mtime is not None else None
            events.append(
                {"event": "checkpoint.committed", "iteration": c.iteration, "path": str(c.path),
                 "bytes": c.bytes, "latency_ms": latency}
            )  # fmt: skip
        ahead = {c.iteration: c for c in scan.ahead}
        for n, c in ahead.items():
            if n not in self._ahead:
                events.append({"event": "checkpoint.ahead", "iteration": n, "path": str(c.path), "bytes": c.bytes})
        self._ahead = set(ahead)
        partial = {c.iteration: c for c in scan.partials}
        for n, c in partial.items():
            if n not in self._partial:
                top = scan.tracker.iteration
                events.append(
                    {"event": "checkpoint.partial", "iteration": n, "path": str(c.path),
                     "beyond_tracker": top is None or n > top}
                )  # fmt: skip
        self._partial = set(partial)
        return events


class CheckpointWatcher:
    """Watches one save dir and emits checkpoint events to the event loop.

    A watchdog observer on the save dir (inotify, non-recursive), or a polling loop. Observer
    events are hints handed to the event loop thread-safely; each triggers a rescan of the save
    dir (coalesced: events that arrive during a rescan cause exactly one more), which re-reads
    the tracker, the listing and every dir not yet committed. A full rescan, re-reading every
    dir, runs at start, every ``rescan_interval`` seconds and after an inotify overflow: the
    rescan is the truth. Poll mode runs the same rescan every ``poll_interval`` (in a worker
    thread: a hung network filesystem must not freeze the loop). ``mode="auto"`` picks
    :func:`detect_watch_mode`. If the save dir does not exist yet, it is polled for every
    ``poll_interval`` and watched once it appears (and again if it is replaced).

    Events passed to ``emit`` (dicts, each once):

    - ``{"event": "checkpoint.committed", "iteration", "path", "bytes", "latency_ms"}`` for each
      newly committed checkpoint (tracker at or past a complete dir), in iteration order.
      ``latency_ms`` is now minus the tracker's mtime (wall clock). Checkpoints already committed
      at start are the baseline and are not emitted, except those above ``since_iteration``
      when it is given;
    - ``{"event": "checkpoint.ahead", "iteration", "path", "bytes"}``: files complete, tracker
      not there yet (async save);
    - ``{"event": "checkpoint.partial", "iteration", "path", "beyond_tracker"}``: files
      incomplete. A save in progress shows up here too when a rescan catches it mid-write.

    Seams: ``observer_factory`` builds the watchdog observer (tests pass one that drops events,
    or one whose ``start`` raises ``OSError(ENOSPC)``); ``clock`` paces the rescans;
    ``wall_clock`` is compared with the tracker's mtime. inotify's ``ENOSPC``/``EMFILE`` mean its
    watch/instance limit, never a full disk: they are logged as ``checkpoint.watch_limit`` and
    the watcher polls instead.
    """

    def __init__(
        self,
        save_dir: Path,
        *,
        mode: Literal["auto", "inotify", "poll"] = "auto",
        poll_interval: float = 1.0,
        rescan_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        observer_factory: Callable[[], ObserverLike] | None = None,
        since_iteration: int | None = None,
    ) -> None:
        if mode not in ("auto", "inotify", "poll"):
            raise ValueError(f"mode must be auto, inotify or poll, got {mode!r}")
        if poll_interval <= 0 or rescan_interval <= 0:
            raise ValueError("poll_interval and rescan_interval must be > 0")
        self.save_dir = Path(save_dir)
        self._requested: Literal["auto", "inotify", "poll"] = mode
        self._mode: WatchMode | None = None
        self._poll_interval = poll_interval
        self._rescan_interval = rescan_interval
        self._clock = clock
        self._wall = wall_clock
        self._observer_factory = observer_factory or _default_observer
        self._differ = _Differ(since_iteration)
        self._observer: ObserverLike | None = None
        self._watched: tuple[int, int] | None = None  # (st_dev, st_ino) of the watched save dir
        self._wake: anyio.Event | None = None
        self._loop_thread: int | None = None
        self._call_soon: Callable[[Callable[[], None]], None] | None = None
        self._poke_pending = False
        self._overflow = False
        self._cache: _ScanCache = {}
        self._running = False

    @property
    def mode(self) -> WatchMode | None:
        """The mode in effect (None before :meth:`run`); ``poll`` after a watch-limit fallback."""
        return self._mode

    def notify_overflow(self) -> None:
        """Force an immediate full rescan, as after an inotify queue overflow. Thread-safe.

        watchdog rebuilds its watches after ``IN_Q_OVERFLOW`` but tells no handler; the watcher
        hooks watchdog's log line to call this, and tests call it to simulate one.
        """
        self._overflow = True
        if self._loop_thread == threading.get_ident():
            self._set_wake()
        else:
            self._poke_threadsafe()

    # -- thread hand-off ------------------------------------------------------------------

    def _set_wake(self) -> None:  # loop thread only
        self._poke_pending = False
        if self._wake is not None:
            self._wake.set()

    def _poke_threadsafe(self) -> None:  # any thread
        call = self._call_soon
        if call is None or self._poke_pending:
            return  # not running yet (the initial scan covers it), or a wake is already queued
        self._poke_pending = True
        try:
            call(self._set_wake)
        except RuntimeError:
            pass  # the loop is closing: nothing left to wake

    @staticmethod
    def _threadsafe_caller() -> Callable[[Callable[[], None]], None]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Not asyncio (trio): anyio's portal call. It blocks the observer thread until the
            # loop runs it, which only delays watchdog's own queue.
            token = anyio.lowlevel.current_token()

            def via_token(cb: Callable[[], None]) -> None:
                anyio.from_thread.run_sync(cb, token=token)

            return via_token

        def via_loop(cb: Callable[[], None]) -> None:
            # Non-blocking: the observer thread never waits for the loop.
            loop.call_soon_threadsafe(cb)

        return via_loop

    # -- observer lifecycle ---------------------------------------------------------------

    def _arm(self) -> None:
        """Start the observer if inotify is wanted and the save dir exists; fall back on limits."""
        if self._mode != "inotify" or self._observer is not None:
            return
        try:
            st = os.stat(self.save_dir)
        except OSError:
            return  # not there yet: the loop polls for it
        if not stat.S_ISDIR(st.st_mode):
            return
        observer: ObserverLike | None = None
        try:
            observer = self._observer_factory()
            observer.schedule(
                _Hint(self._poke_threadsafe), str(self.save_dir), recursive=False, event_filter=_event_filter()
            )
            observer.start()
        except OSError as exc:
            if observer is not None:
                try:
                    observer.stop()
                except Exception:
                    pass
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # the dir went away between stat and watch: the loop polls for it again
            self._mode = "poll"
            if exc.errno in (errno.ENOSPC, errno.EMFILE):
                # inotify's ENOSPC is fs.inotify.max_user_watches (EMFILE: max_user_instances).
                # It says nothing about free space: never report it as a full disk.
                _log().warning(
                    "checkpoint.watch_limit", path=str(self.save_dir), errno=exc.errno, error=str(exc),
                    fallback="poll", poll_interval=self._poll_interval,
                    hint="inotify watch/instance limit reached (sysctl fs.inotify.max_user_watches); not a full disk",
                )  # fmt: skip
            else:
                _log().warning(
                    "checkpoint.watch_failed", path=str(self.save_dir), error=str(exc), fallback="poll"
                )
            return
        self._observer = observer
        self._watched = (st.st_dev, st.st_ino)

    async def _disarm(self) -> None:
        observer, self._observer, self._watched = self._observer, None, None
        if observer is None:
            return

        def stop_and_join() -> None:
            # Off the loop: InotifyObserver.stop() joins its emitter threads (milliseconds),
            # and watchdog's own pending hand-offs must still be able to reach the loop.
            observer.stop()
            try:
                observer.join(5.0)
            except RuntimeError:
                pass  # never started

        await anyio.to_thread.run_sync(stop_and_join)

    async def _check_watch(self) -> None:
        """Re-arm when the save dir appeared, vanished or was replaced (new inode)."""
        if self._mode != "inotify":
            return
        try:
            st = os.stat(self.save_dir)
            ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            ident = None
        if self._observer is not None and ident != self._watched:
            await self._disarm()
        if self._observer is None and ident is not None:
            self._arm()

    async def _rescan(self, emit: Emit, *, full: bool) -> None:
        # A hint rescan reuses unchanged complete dirs; a full one (start, timer, overflow)
        # re-reads everything: the truth.
        if full:
            self._cache.clear()
        # Inline, not in a worker thread: on a local filesystem a scan takes microseconds and a
        # thread hop would add to the detection latency. Polled (network) filesystems scan in a
        # thread: a hung server must not freeze the event loop.
        if self._mode == "poll":
            result = await anyio.to_thread.run_sync(_scan, self.save_dir, self._cache, abandon_on_cancel=True)
        else:
            result = _scan(self.save_dir, self._cache)
        for event in self._differ.diff(result, now_wall=self._wall()):
            ret = emit(event)
            if inspect.isawaitable(ret):
                await ret

    async def run(self, emit: Emit, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled. ``task_status.started()`` after the initial scan, observer live.

        ``emit`` may be a plain function or a coroutine function; an exception from it ends
        the watcher (it is the caller's bug, not a filesystem condition).
        """
        if self._running:
            raise RuntimeError("CheckpointWatcher.run() is already running")
        self._running = True
        self._loop_thread = threading.get_ident()
        self._call_soon = self._threadsafe_caller()
        self._wake = anyio.Event()
        self._mode = detect_watch_mode(self.save_dir) if self._requested == "auto" else self._requested
        hook = _OverflowLogHook(self.notify_overflow)
        wd_logger = logging.getLogger(_WATCHDOG_INOTIFY_LOGGER)
        wd_logger.addHandler(hook)
        try:
            self._arm()
            self._overflow = False
            await self._rescan(emit, full=True)
            task_status.started()
            next_full = self._clock() + self._rescan_interval
            while True:
                now = self._clock()
                deadline = next_full
                if self._mode == "poll" or self._observer is None:
                    deadline = min(deadline, now + self._poll_interval)
                with anyio.move_on_after(max(0.0, deadline - now)):
                    await self._wake.wait()
                # A fresh Event before the scan: hints arriving during it wake the next round.
                self._wake = anyio.Event()
                full = self._clock() >= next_full
                if self._overflow:
                    self._overflow, full = False, True
                    _log().info("checkpoint.rescan", path=str(self.save_dir), reason="overflow")
                if full:
                    next_full = self._clock() + self._rescan_interval
                await self._check_watch()
                await self._rescan(emit, full=full)
        finally:
            wd_logger.removeHandler(hook)
            self._call_soon = None
            self._loop_thread = None
            with anyio.CancelScope(shield=True):
                await self._disarm()
            self._running = False
