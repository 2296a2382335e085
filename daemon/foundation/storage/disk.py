"""The disk guard: sampling, forecast, limits, THE ok/soft/hard rule, monitor, ENOSPC recognition.

Theory of operation (SPEC §2 PREFLIGHT_DISK, §3 sizes, §4 etiquette, §5 disk guard; issue 6)
----------------------------------------------------------------------------------------------
* **Forecast and limits** are :mod:`.diskbudget`'s: what the campaign's peak needs, and the
  soft and hard floors (scale-free, overridable) that the guard below judges by.
* **Guard** (:class:`Guard`, :func:`classify`): pure logic, samples in, level changes out, with
  hysteresis so a value that flaps around a limit does not thrash. HARD is entered at once,
  never debounced. :func:`classify` is the one soft/hard/ok rule: the monitor, the park
  (:class:`Verdict`) and :func:`wait_for_space` all judge by it.
* **Monitor** (:class:`Monitor`, :func:`monitor`): one anyio task that samples every
  ``interval`` seconds on a deadline schedule, feeds the guard and emits event dicts through an
  async callback. ``Monitor.poke()`` asks for a sample right now (after an ENOSPC, say).
  The sampler is a seam (:class:`Sampler`): tests may swap it, the real code path stays.
* **ENOSPC** (:func:`is_enospc`, :func:`log_says_enospc`): the one recogniser of a full disk,
  seen through an exception or through a child's log tail. inotify's watch-limit ENOSPC is
  *not* a full disk.

Beside it: the start-up checks and the ``df`` table are :mod:`.diskcheck`'s, the ballast
released at the hard limit is :mod:`.ballast`'s, emptying the campaign's tmp dir is
:mod:`.reclaim`'s. This module writes no file.

"Free" everywhere in this module means ``f_bavail``: what an unprivileged writer can still
allocate, which excludes the root-reserved blocks of ext4 (see :class:`DiskSample`).

Nothing here knows about config objects or the engine: every function takes plain values.
"""

from __future__ import annotations

import enum
import errno
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog
from anyio.abc import TaskStatus

from shoprld.daemon.foundation.storage.diskbudget import Limits
from shoprld.daemon.foundation.system.units import human_bytes

__all__ = [
    "DISK_FULL_ERRNOS",
    "GiB",
    "LEVEL_EVENTS",
    "DiskSample",
    "Emit",
    "Guard",
    "Level",
    "Limits",
    "Monitor",
    "Sampler",
    "Verdict",
    "classify",
    "is_enospc",
    "log_says_enospc",
    "monitor",
    "sample",
    "wait_for_space",
]

log = structlog.get_logger("shoprld.daemon.foundation.storage.disk")

GiB = 1 << 30

#: errnos that mean "this write did not fit": the filesystem is full, or the user's quota is.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiskSample:
    """One ``statvfs`` reading of a volume.

    ``free_bytes`` and ``avail_bytes`` are both ``f_bavail * f_frsize``: the bytes a non-root
    writer can still allocate. ``free_bytes`` is the name every decision, event and status field
    uses; ``avail_bytes`` is the same number under ``df``'s column name. They are deliberately
    not ``f_bfree``, which counts ext4's root-reserved blocks that the trainer cannot use.
    ``at`` is wall-clock time (``time.time()``), because it is stored and shown in status.
    """

    path: Path
    total_bytes: int
    free_bytes: int
    avail_bytes: int
    inodes_total: int
    inodes_free: int
    read_only: bool
    at: float


def sample(path: Path) -> DiskSample:
    """Read the volume holding ``path`` with ``os.statvfs`` (raises ``OSError`` as it does)."""
    st = os.statvfs(path)
    avail = st.f_bavail * st.f_frsize
    return DiskSample(
        path=Path(path),
        total_bytes=st.f_blocks * st.f_frsize,
        free_bytes=avail,
        avail_bytes=avail,
        inodes_total=st.f_files,
        inodes_free=st.f_favail,
        read_only=bool(st.f_flag & os.ST_RDONLY),
        at=time.time(),
    )


class Sampler(Protocol):
    """The disk-sampler seam: a callable that reads one :class:`DiskSample` for a path.

    The real one is :func:`sample`. It is called from a worker thread (so a hung network
    filesystem cannot freeze the event loop) and may raise ``OSError``, which the monitor logs
    as ``disk.sample_failed`` and survives.
    """

    def __call__(self, path: Path, /) -> DiskSample: ...


# --------------------------------------------------------------------------------------------
# Guard: samples in, level changes out
# --------------------------------------------------------------------------------------------


class Level(enum.Enum):
    """How much pressure the volume is under."""

    OK = "ok"  # above soft (by the hysteresis, when coming back from below)
    SOFT = "soft"  # below soft: let the in-flight save finish, then stop the trainer
    HARD = "hard"  # below hard, read-only, or ENOSPC seen: stop now, release the ballast


#: the event name emitted when the guard enters each level
LEVEL_EVENTS: Mapping[Level, str] = {
    Level.OK: "disk.ok",
    Level.SOFT: "disk.soft_limit",
    Level.HARD: "disk.hard_limit",
}


class Guard:
    """Turns samples into level changes, with hysteresis.

    Enter SOFT when free < soft; leave SOFT only when free > soft + hysteresis. Enter HARD when
    free < hard, immediately (no debounce); leave HARD only when free > hard + hysteresis, to
    SOFT or straight to OK by the same rules. Inodes work likewise with ``hysteresis_inodes``
    (default: a tenth of the hard inode limit, at least 1). A read-only volume is HARD.
    :meth:`observe` returns the new level only on a change, else ``None``; ``reason`` is a short
    line saying why the current level holds.
    """

    def __init__(self, limits: Limits, *, hysteresis_bytes: int, hysteresis_inodes: int | None = None) -> None:
        if hysteresis_bytes < 0:
            raise ValueError(f"hysteresis_bytes must be >= 0, got {hysteresis_bytes}")
        self.limits = limits
        self.hysteresis_bytes = hysteresis_bytes
        self.hysteresis_inodes = (
            hysteresis_inodes if hysteresis_inodes is not None else max(1, limits.hard_inodes // 10)
        )
        self.level: Level = Level.OK
        self.reason: str = ""

    def observe(self, s: DiskSample) -> Level | None:
        """Feed one sample; return the new level if it changed, else ``None``."""
        level, self.reason = self._classify(s)
        if level is self.level:
            return None
        self.level = level
        return level

    def force_hard(self, reason: str) -> Level | None:
        """Enter HARD without a sample (an ENOSPC was seen); return HARD if that is a change."""
        self.reason = reason
        if self.level is Level.HARD:
            return None
        self.level = Level.HARD
        return Level.HARD

    def _classify(self, s: DiskSample) -> tuple[Level, str]:
        return classify(s, self.limits, self.level, hysteresis_bytes=self.hysteresis_bytes,
                        hysteresis_inodes=self.hysteresis_inodes)

    def verdict(self, s: DiskSample, *, parked: bool = False) -> Verdict:
        """What ``s`` says by the guard's rule, from its current level, without moving it (the
        monitor's :meth:`observe` alone moves the level, so every change is emitted once).
        ``parked``: the campaign is parked for the disk, so coming back takes the way up from
        SOFT at least (above soft + hysteresis)."""
        current = Level.SOFT if parked and self.level is Level.OK else self.level
        level, reason = classify(s, self.limits, current, hysteresis_bytes=self.hysteresis_bytes,
                                 hysteresis_inodes=self.hysteresis_inodes)
        return Verdict(level, reason, s.free_bytes, self.limits)


def classify(s: DiskSample, lim: Limits, current: Level, *, hysteresis_bytes: int,
             hysteresis_inodes: int) -> tuple[Level, str]:
    """THE soft/hard/ok rule (the monitor, the park and the wait for space all use it).

    Enter SOFT below soft and HARD below hard at once; a level held (``current``) is left
    only once free is above its limit by the hysteresis. A read-only volume is HARD.
    """
    if s.read_only:
        return Level.HARD, f"volume {s.path} is read-only"
    hb, hi = hysteresis_bytes, hysteresis_inodes
    free, inodes = s.free_bytes, s.inodes_free
    for level, limit_bytes, limit_inodes, holding in (
            (Level.HARD, lim.hard_bytes, lim.hard_inodes, current is Level.HARD),
            (Level.SOFT, lim.soft_bytes, lim.soft_inodes, current is not Level.OK)):
        name = level.value
        if free < limit_bytes:
            return level, f"free {human_bytes(free)} < {name} limit {human_bytes(limit_bytes)}"
        if inodes < limit_inodes:
            return level, f"free inodes {inodes} < {name} limit {limit_inodes}"
        # Coming back up, a level is left only once free is above it by the hysteresis.
        if holding and free <= limit_bytes + hb:
            return level, (f"free {human_bytes(free)} not yet above {name} limit "
                           f"{human_bytes(limit_bytes)} + {human_bytes(hb)} hysteresis")
        if holding and inodes <= limit_inodes + hi:
            return level, f"free inodes {inodes} not yet above {name} limit {limit_inodes} + {hi} hysteresis"
    return Level.OK, ""


@dataclass(frozen=True)
class Verdict:
    """One sample judged by :func:`classify`, with what the engine's park message needs."""

    level: Level
    reason: str
    free_bytes: int
    limits: Limits

    def holds(self, level: Level) -> bool:
        """Whether the volume is still at ``level`` or below (a reclaim did not lift it out)."""
        return self.level is Level.HARD if level is Level.HARD else level is Level.OK or self.level is not Level.OK

    def park_reason(self, root: Path, level: Level) -> str:
        """The operator's line for ``level``: ``free 1.2 GiB < soft limit 3.0 GiB on /mnt/vol``."""
        limit = self.limits.hard_bytes if level is Level.HARD else self.limits.soft_bytes
        return f"free {human_bytes(self.free_bytes)} < {level.value} limit {human_bytes(limit)} on {root}"

    def fits(self, save_bytes: int) -> bool:
        """Whether one more save of ``save_bytes`` lands above the hard limit."""
        return self.free_bytes - self.limits.hard_bytes >= save_bytes


async def wait_for_space(path: Path, guard: Guard, *, settle: float, interval: float,
                         monotonic: Callable[[], float], sampler: Sampler = sample) -> None:
    """Return once the guard's rule has said OK for ``settle`` seconds in a row (PAUSED_DISK
    with ``--wait-for-space``): the same rule and hysteresis that parked the campaign."""
    settled_since: float | None = None
    while True:
        if guard.verdict(sampler(path), parked=True).level is Level.OK:
            settled_since = monotonic() if settled_since is None else settled_since
            if monotonic() - settled_since >= settle:
                return
        else:
            settled_since = None
        await anyio.sleep(min(interval, 1.0))


# --------------------------------------------------------------------------------------------
# Monitor
# --------------------------------------------------------------------------------------------

#: the monitor's output: an async callback taking one event dict
Emit = Callable[[dict[str, Any]], Awaitable[None]]


class Monitor:
    """Samples a volume on a deadline schedule and emits guard changes and periodic samples.

    Emitted dicts (all carry ``path, level, reason, free_bytes, total_bytes, inodes_free,
    inodes_total, read_only, soft_limit_bytes, hard_limit_bytes, soft_limit_inodes,
    hard_limit_inodes, at``):

    * ``disk.soft_limit`` / ``disk.hard_limit`` / ``disk.ok``: on a level change (also logged
      with the same event name, so the engine need not log them again);
    * ``disk.sample``: once per scheduled tick, at most every ``interval``, for status.

    :meth:`poke` asks for an extra sample now; :meth:`report_enospc` turns an ENOSPC seen
    elsewhere into a hard-limit event. Both must be called from the event loop's thread (from a
    worker thread, go through ``anyio.from_thread.run_sync``). :attr:`last` is the last sample.
    """

    def __init__(
        self,
        path: Path,
        guard: Guard,
        emit: Emit,
        *,
        interval: float = 5.0,
        sampler: Sampler = sample,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.path = Path(path)
        self.guard = guard
        self.interval = interval
        self.last: DiskSample | None = None
        self._emit = emit
        self._sampler = sampler
        self._wake: anyio.Event | None = None  # created in run(): an Event needs a running loop
        self._poked = False
        self._enospc: list[str] = []

    def poke(self) -> None:
        """Wake the monitor for an immediate sample (no ``disk.sample`` event: level changes only)."""
        self._poked = True
        if self._wake is not None:
            self._wake.set()

    def report_enospc(self, where: str) -> None:
        """Treat an ENOSPC seen at ``where`` as a hard-limit crossing, and sample right away.

        The guard goes HARD without waiting for ``statvfs`` to agree (quota, reserved blocks, or a
        writer that already deleted its partial file can all hide the crossing); the next
        regular sample decides when space is back, by the usual hysteresis.
        """
        self._enospc.append(where)
        self.poke()

    async def run(self, *, task_status: TaskStatus[Monitor] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run forever: first sample, then ``task_status.started(self)``, then one tick per interval."""
        self._wake = anyio.Event()
        await self._tick(scheduled=True)
        task_status.started(self)
        next_at = anyio.current_time() + self.interval
        while True:
            if not self._poked:
                with anyio.move_on_at(next_at):
                    await self._wake.wait()
            if self._wake.is_set():
                self._wake = anyio.Event()  # anyio Events cannot be cleared; take a fresh one
            self._poked = False
            now = anyio.current_time()
            scheduled = now >= next_at
            if scheduled:
                # Keep the grid: after a stall, skip the missed ticks instead of bursting.
                next_at += self.interval * (math.floor((now - next_at) / self.interval) + 1)
            await self._tick(scheduled=scheduled)

    async def _tick(self, *, scheduled: bool) -> None:
        enospc, forced = bool(self._enospc), None
        while self._enospc:
            forced = self.guard.force_hard(f"ENOSPC at {self._enospc.pop(0)}") or forced
        try:
            fresh: DiskSample | None = await anyio.to_thread.run_sync(self._sampler, self.path, abandon_on_cancel=True)
        except OSError as exc:
            log.warning("disk.sample_failed", path=str(self.path), error=str(exc), errno=exc.errno)
            fresh = None
        if fresh is not None:
            self.last = fresh
        s = self.last
        if s is None:
            return
        # An ENOSPC is a crossing in its own right: the sample taken with it must not undo it;
        # the next one decides, by the usual hysteresis.
        if enospc:
            change = forced
        else:
            change = self.guard.observe(s) if fresh is not None else None
        if change is not None:
            await self._change(change, s)
        if scheduled and fresh is not None:
            await self._emit(self._payload("disk.sample", fresh))

    async def _change(self, level: Level, s: DiskSample) -> None:
        payload = self._payload(LEVEL_EVENTS[level], s)
        fields = {k: v for k, v in payload.items() if k != "event"}
        await self._emit(payload)  # first: the engine's reaction is the latency that matters
        if level is Level.OK:
            log.info(payload["event"], **fields)
        else:
            log.warning(payload["event"], **fields)

    def _payload(self, event: str, s: DiskSample) -> dict[str, Any]:
        lim = self.guard.limits
        return {
            "event": event,
            "path": str(s.path),
            "level": self.guard.level.value,
            "reason": self.guard.reason,
            "free_bytes": s.free_bytes,
            "total_bytes": s.total_bytes,
            "inodes_free": s.inodes_free,
            "inodes_total": s.inodes_total,
            "read_only": s.read_only,
            "soft_limit_bytes": lim.soft_bytes,
            "hard_limit_bytes": lim.hard_bytes,
            "soft_limit_inodes": lim.soft_inodes,
            "hard_limit_inodes": lim.hard_inodes,
            "at": s.at,
        }


async def monitor(
    path: Path,
    guard: Guard,
    emit: Emit,
    *,
    interval: float = 5.0,
    sampler: Sampler = sample,
    task_status: TaskStatus[Monitor] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run a :class:`Monitor` on ``path`` forever (see it for the events).

    Start it with ``mon = await tg.start(monitor, path, guard, emit)``: the handshake completes
    after the first sample and hands back the :class:`Monitor`, whose ``poke()`` is the fast path
    (an anyio ``Event`` cannot be cleared, so a one-shot ``fast_path`` event would not do).
    """
    await Monitor(path, guard, emit, interval=interval, sampler=sampler).run(task_status=task_status)


# --------------------------------------------------------------------------------------------
# ENOSPC recognition
# --------------------------------------------------------------------------------------------

# inotify reports its per-user watch limit as ENOSPC (watchdog: "inotify watch limit reached";
# Node: "System limit for number of file watchers reached"). That is not a full disk.
_INOTIFY = re.compile(r"inotify|file watchers|watch(?:es)? limit|max_user_watches", re.IGNORECASE)


def is_enospc(exc: BaseException) -> bool:
    """Whether ``exc`` says a write to a file did not fit: ``OSError`` with ENOSPC or EDQUOT.

    Looks through exception groups (anyio task groups raise them) and explicit ``raise ... from``
    causes. Only pass exceptions from *file writes on the volume*: the inotify watch limit is also
    reported as ``ENOSPC`` (``inotify_add_watch``; watchdog raises ``OSError(ENOSPC, "inotify
    watch limit reached")``), and that is NOT a full disk; the checkpoint watcher handles it by
    falling back to polling. As a safety net, an ``OSError`` whose message names inotify or a
    watch limit is never counted.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        elif isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS and not _INOTIFY.search(str(e)):
            return True
        if e.__cause__ is not None:
            todo.append(e.__cause__)
    return False


_DISK_FULL_LINE = re.compile(
    r"No space left on device|Disk quota exceeded|\bENOSPC\b|\bEDQUOT\b|\[Errno (?:28|122)\]",
    re.IGNORECASE,
)
_TORCH_WRITER = re.compile(r"PytorchStreamWriter failed writing file", re.IGNORECASE)
_ERRNO_28 = re.compile(r"errno\W{0,3}28\b|error code\W{0,3}28\b|\(28\)", re.IGNORECASE)


def log_says_enospc(text: str) -> bool:
    """Whether a child's log tail shows a disk-full write failure.

    Recognises "No space left on device", "ENOSPC", "Disk quota exceeded"/"EDQUOT", "[Errno 28]",
    and torch's "PytorchStreamWriter failed writing file" together with errno 28 anywhere in the
    tail. Lines about the inotify watch limit ("inotify watch limit reached", "file watchers")
    are ignored: that ENOSPC is not a full disk.
    """
    return bool(enospc_line(text))


def enospc_line(text: str) -> str:
    """The line of a log tail that shows its disk-full write failure, the last one ("" when
    :func:`log_says_enospc` is False): the evidence a failure's cause quotes (``causes.py``)."""
    lines = [ln for ln in text.splitlines() if not _INOTIFY.search(ln)]
    for ln in reversed(lines):
        if _DISK_FULL_LINE.search(ln):
            return ln.strip()[:300]
    if _ERRNO_28.search("\n".join(lines)):
        for ln in reversed(lines):
            if _TORCH_WRITER.search(ln):
                return ln.strip()[:300]
    return ""
