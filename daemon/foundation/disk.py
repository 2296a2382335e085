"""The disk guard: preflight, forecast, limits, monitor, ballast and ENOSPC recognition.

Theory of operation (SPEC §2 PREFLIGHT_DISK, §3 sizes, §4 etiquette, §5 disk guard; issue 6)
----------------------------------------------------------------------------------------------
* **Preflight** (:func:`preflight`) runs at every (re)start. It returns *every* problem it
  finds as a :class:`PreflightProblem`, each printable as one operator line; the engine prints
  the first and exits 3. :func:`df_summary` is the ``df``-like table printed beside it.
* **Forecast** (:func:`forecast`): what the next round needs on the volume, from the last
  checkpoint's measured size (or the configured estimate before there is one).
* **Limits** (:func:`limits`): soft and hard free-space floors, derived from the volume size
  and the checkpoint size, both overridable.
* **Guard** (:class:`Guard`): pure logic, samples in, level changes out, with hysteresis so a
  value that flaps around a limit does not thrash. HARD is entered at once, never debounced.
* **Monitor** (:class:`Monitor`, :func:`monitor`): one anyio task that samples every
  ``interval`` seconds on a deadline schedule, feeds the guard and emits event dicts through an
  async callback. ``Monitor.poke()`` asks for a sample right now (after an ENOSPC, say).
  The sampler is a seam (:class:`Sampler`): tests may swap it, the real code path stays.
* **Ballast** (:class:`Ballast`): a preallocated file released at the hard limit so that the
  last writes (state, a final save) can land.
* **ENOSPC** (:func:`is_enospc`, :func:`log_says_enospc`): a full disk seen through an
  exception or through a child's log tail. inotify's watch-limit ENOSPC is *not* a full disk.
* **Reclaim** (:func:`reclaimable_tmp`, :func:`clear_dir_contents`): emptying the campaign's
  own tmp dir, never outside the directory it is confined to.

"Free" everywhere in this module means ``f_bavail``: what an unprivileged writer can still
allocate, which excludes the root-reserved blocks of ext4 (see :class:`DiskSample`).

Nothing here knows about config objects or the engine: every function takes plain values.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import structlog
from anyio.abc import TaskStatus

__all__ = [
    "GiB",
    "LEVEL_EVENTS",
    "Ballast",
    "DiskSample",
    "Emit",
    "Forecast",
    "Guard",
    "Level",
    "Limits",
    "Monitor",
    "PreflightProblem",
    "Sampler",
    "clear_dir_contents",
    "df_summary",
    "forecast",
    "is_enospc",
    "limits",
    "log_says_enospc",
    "monitor",
    "preflight",
    "reclaimable_tmp",
    "sample",
]

log = structlog.get_logger("shoprld.daemon.foundation.disk")

GiB = 1 << 30

#: errnos that mean "this write did not fit": the filesystem is full, or the user's quota is.
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


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
# Forecast and limits
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Forecast:
    """What the next round needs on the volume, and where the checkpoint size came from."""

    checkpoint_bytes: int
    keep: int
    hf_bytes: int
    margin_bytes: int
    measured: bool  # True: the last checkpoint's measured size; False: the configured estimate

    @property
    def total(self) -> int:
        """``checkpoint_bytes * keep + hf_bytes + margin_bytes``."""
        return self.checkpoint_bytes * self.keep + self.hf_bytes + self.margin_bytes


def forecast(
    *,
    last_checkpoint_bytes: int | None,
    estimate_bytes: int,
    keep: int = 2,
    hf_bytes: int,
    margin_bytes: int,
) -> Forecast:
    """Forecast the next round's need: the measured checkpoint size when known, else the estimate.

    A measured size of 0 (an empty or unreadable checkpoint) is not a measurement and falls back
    to the estimate. Negative inputs raise ``ValueError``.
    """
    for name, value in (
        ("estimate_bytes", estimate_bytes),
        ("keep", keep),
        ("hf_bytes", hf_bytes),
        ("margin_bytes", margin_bytes),
    ):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    measured = last_checkpoint_bytes is not None and last_checkpoint_bytes > 0
    ckpt = last_checkpoint_bytes if measured and last_checkpoint_bytes is not None else estimate_bytes
    return Forecast(checkpoint_bytes=ckpt, keep=keep, hf_bytes=hf_bytes, margin_bytes=margin_bytes, measured=measured)


@dataclass(frozen=True)
class Limits:
    """Free-space floors: below ``soft`` finish the in-flight save then stop; below ``hard`` stop now."""

    soft_bytes: int
    hard_bytes: int
    soft_inodes: int
    hard_inodes: int


def limits(
    total_bytes: int,
    checkpoint_bytes: int,
    *,
    soft_override: int | None = None,
    hard_override: int | None = None,
    hard_inodes: int = 1000,
    soft_inodes: int | None = None,
) -> Limits:
    """Derive the soft and hard limits for a volume of ``total_bytes``.

    Defaults (issue 6): hard = max(10 % of the volume, one checkpoint + 1 GiB); soft = hard + one
    checkpoint; soft_inodes = 2 x hard_inodes. Overrides win. On a small volume the defaults can
    exceed the volume itself, which is what the overrides are for. Raises ``ValueError`` when
    soft <= hard (bytes or inodes) or a value is negative.
    """
    if total_bytes < 0 or checkpoint_bytes < 0 or hard_inodes < 0:
        raise ValueError("total_bytes, checkpoint_bytes and hard_inodes must be >= 0")
    hard = hard_override if hard_override is not None else max(total_bytes // 10, checkpoint_bytes + GiB)
    soft = soft_override if soft_override is not None else hard + checkpoint_bytes
    if hard < 0:
        raise ValueError(f"hard limit must be >= 0, got {hard}")
    if soft <= hard:
        raise ValueError(f"soft limit ({soft} bytes) must be above the hard limit ({hard} bytes)")
    s_inodes = soft_inodes if soft_inodes is not None else 2 * hard_inodes
    if s_inodes <= hard_inodes:
        raise ValueError(f"soft inode limit ({s_inodes}) must be above the hard one ({hard_inodes})")
    return Limits(soft_bytes=soft, hard_bytes=hard, soft_inodes=s_inodes, hard_inodes=hard_inodes)


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
# Ballast
# --------------------------------------------------------------------------------------------


class Ballast:
    """A preallocated file on the volume, released at the hard limit so the last writes can land.

    ``ensure()`` allocates real blocks with ``posix_fallocate`` (tmpfs and ext4 both honour it)
    into ``<name>.partial`` and renames it into place, so a crash mid-allocation never leaves a
    short ballast under the real name.
    """

    def __init__(self, path: Path, size_bytes: int) -> None:
        if size_bytes <= 0:
            raise ValueError(f"ballast size must be > 0, got {size_bytes}")
        self.path = Path(path)
        self.size_bytes = size_bytes
        self._partial = self.path.with_name(self.path.name + ".partial")

    @property
    def present(self) -> bool:
        """Whether the ballast file exists (at any size)."""
        return self.path.is_file()

    def ensure(self) -> bool:
        """Make sure the ballast holds ``size_bytes`` of real blocks.

        A no-op when it already does. Returns ``False`` and logs ``disk.ballast_failed`` when the
        volume has no room (ENOSPC/EDQUOT), leaving no partial file behind; other ``OSError``
        (permissions, a read-only volume) propagate, since they are configuration errors.
        """
        try:
            st = self.path.stat()
        except FileNotFoundError:
            st = None
        if st is not None and st.st_size == self.size_bytes and st.st_blocks * 512 >= self.size_bytes:
            return True
        _unlink_quiet(self._partial)
        try:
            fd = os.open(self._partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size_bytes)
            finally:
                os.close(fd)
            os.replace(self._partial, self.path)
        except OSError as exc:
            _unlink_quiet(self._partial)
            if exc.errno not in _DISK_FULL_ERRNOS:
                raise
            log.warning(
                "disk.ballast_failed",
                path=str(self.path),
                size_bytes=self.size_bytes,
                error=os.strerror(exc.errno or 0),
            )
            return False
        log.info("disk.ballast_created", path=str(self.path), size_bytes=self.size_bytes)
        return True

    def release(self) -> int:
        """Delete the ballast; return the bytes its blocks held (0 if it was absent)."""
        freed = 0
        for p in (self.path, self._partial):
            try:
                freed += p.lstat().st_blocks * 512
                p.unlink()
            except FileNotFoundError:
                continue
        log.warning("disk.ballast_released", path=str(self.path), freed_bytes=freed)
        return freed


def _unlink_quiet(p: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        p.unlink()


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
        elif isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS and not _INOTIFY.search(str(e)):
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
    lines = [ln for ln in text.splitlines() if not _INOTIFY.search(ln)]
    if any(_DISK_FULL_LINE.search(ln) for ln in lines):
        return True
    kept = "\n".join(lines)
    return bool(_TORCH_WRITER.search(kept) and _ERRNO_28.search(kept))


# --------------------------------------------------------------------------------------------
# Preflight and df
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreflightProblem:
    """One reason not to start: what is wrong, where, and the fix."""

    what: str
    where: str
    fix: str

    def line(self) -> str:
        """One line: ``<what>: <where> (<fix>)``; newlines in paths are escaped."""
        text = f"{self.what}: {self.where} ({self.fix})"
        return text.replace("\r", "\\r").replace("\n", "\\n")


def preflight(
    *,
    ephemeral_root: Path,
    repo: Path,
    heavy_paths: Mapping[str, Path],
    need_bytes: int,
    need_inodes: int,
    require_mount: bool = True,
    forbid_same_fs: bool = True,
) -> list[PreflightProblem]:
    """Check the volume and the heavy output paths; return every problem found, in this order.

    1. the root is missing (then nothing else can be checked); 2. it is not a mount point while
    ``require_mount``; 3. the repo is on the same filesystem while ``forbid_same_fs``; 4. it is
    read-only (``ST_RDONLY``, or a probe file fails with EROFS; EACCES is reported as not
    writable); 5. free bytes < ``need_bytes``; 6. free inodes < ``need_inodes``; 7. each heavy
    path whose ``realpath`` (symlinks followed; for a path not created yet, its nearest existing
    ancestor) is on another device than the root, e.g. the memo's AutoDL data-disk dirs that are
    symlinks into the nearly full system disk. The root itself is used through its ``realpath``.
    Performs no side effects beyond creating and deleting one probe file.
    """
    problems: list[PreflightProblem] = []
    root = Path(os.path.realpath(ephemeral_root))
    shown = str(ephemeral_root) if root == Path(ephemeral_root) else f"{ephemeral_root} -> {root}"
    if not root.is_dir():
        problems.append(
            PreflightProblem(
                "ephemeral root is missing" if not root.exists() else "ephemeral root is not a directory",
                shown,
                "mount the volume there, or point the storage root at the mounted volume",
            )
        )
        return problems
    root_dev = root.stat().st_dev

    if require_mount and not os.path.ismount(root):
        problems.append(
            PreflightProblem(
                "ephemeral root is not a mount point",
                f"{shown} is a plain directory on {_mount_point(root)}",
                "mount the volume there, or set require_mount = false",
            )
        )

    if forbid_same_fs:
        repo_real = _existing_ancestor(Path(os.path.realpath(repo)))
        if repo_real.stat().st_dev == root_dev:
            problems.append(
                PreflightProblem(
                    "repo and ephemeral root are on the same filesystem",
                    f"{repo} and {shown} are both on {_mount_point(root)}",
                    "put heavy outputs on a separate volume, or set forbid_same_fs = false",
                )
            )

    s = sample(root)
    ro = _read_only_problem(root, shown, s.read_only)
    if ro is not None:
        problems.append(ro)

    if s.free_bytes < need_bytes:
        problems.append(
            PreflightProblem(
                "not enough free space on the volume",
                f"{shown} has {human_bytes(s.free_bytes)} free, the next round needs {human_bytes(need_bytes)}",
                "free space on the volume (old campaigns, caches) or lower the checkpoint estimate",
            )
        )
    if s.inodes_free < need_inodes:
        problems.append(
            PreflightProblem(
                "not enough free inodes on the volume",
                f"{shown} has {s.inodes_free} inodes free, the next round needs {need_inodes}",
                "delete small files on the volume (old logs, caches) or remake it with more inodes",
            )
        )

    for label, p in heavy_paths.items():
        real = Path(os.path.realpath(p))
        anchor = _existing_ancestor(real)
        if anchor.stat().st_dev != root_dev:
            via = "" if real == Path(p) else f" -> {real}"
            problems.append(
                PreflightProblem(
                    f"{label} is not on the volume",
                    f"{p}{via} is on {_mount_point(anchor)}, not on {shown}",
                    f"make {label} a real directory under {root} (remove the symlink that leads off the volume)",
                )
            )
    return problems


def _read_only_problem(root: Path, shown: str, flagged: bool) -> PreflightProblem | None:
    fix = "remount it read-write (mount -o remount,rw) or fix the volume"
    if flagged:
        return PreflightProblem("ephemeral root is read-only", f"{shown} is mounted read-only", fix)
    try:
        fd, name = tempfile.mkstemp(prefix=".shoprld-preflight-", dir=root)
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return PreflightProblem("ephemeral root is read-only", f"writing a probe in {shown} failed", fix)
        if exc.errno in (errno.EACCES, errno.EPERM):
            return PreflightProblem(
                "ephemeral root is not writable",
                f"{shown}: {os.strerror(exc.errno)} for uid {os.geteuid()}",
                "give the daemon's user write access to the volume",
            )
        if exc.errno in _DISK_FULL_ERRNOS:
            return None  # the bytes/inodes checks report it with numbers
        raise
    try:
        os.close(fd)
    finally:
        os.unlink(name)
    return None


def _existing_ancestor(p: Path) -> Path:
    """``p`` or its nearest ancestor that exists (the root always does)."""
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _mount_point(p: Path) -> Path:
    """The mount point of the filesystem holding ``p`` (which must exist)."""
    p = Path(os.path.realpath(p))
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def _mount_sources() -> dict[str, tuple[str, str]]:
    """Mount point -> (source, fstype) from /proc/self/mountinfo; the top mount wins."""
    out: dict[str, tuple[str, str]] = {}
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        out[mnt] = (tail[1], tail[0])
    return out


def df_summary(paths: Mapping[str, Path]) -> str:
    """A ``df -h``-like table, one row per labelled path (e.g. repo and volume), plain text.

    Columns: label, filesystem (source and type), size, used, avail, use%, free inodes, mounted on.
    A path that does not exist gets a row that says so.
    """
    header = ("LABEL", "FILESYSTEM", "SIZE", "USED", "AVAIL", "USE%", "IFREE", "MOUNTED ON")
    rows: list[tuple[str, ...]] = [header]
    sources = _mount_sources()
    for label, p in paths.items():
        try:
            st = os.statvfs(p)
        except OSError as exc:
            rows.append((label, "-", "-", "-", "-", "-", "-", f"{p}: {exc.strerror or exc}"))
            continue
        mnt = _mount_point(Path(p))
        src, fstype = sources.get(str(mnt), ("?", "?"))
        size = st.f_blocks * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        avail = st.f_bavail * st.f_frsize
        pct = "-" if used + avail == 0 else f"{math.ceil(used * 100 / (used + avail))}%"
        rows.append(
            (label, f"{src} ({fstype})", _df_h(size), _df_h(used), _df_h(avail), pct, str(st.f_favail), str(mnt))
        )
    return _table(rows, right={2, 3, 4, 5, 6})


def _table(rows: Iterable[tuple[str, ...]], *, right: set[int]) -> str:
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    lines = []
    for r in rows:
        cells = [
            c if i == last else (c.rjust(widths[i]) if i in right else c.ljust(widths[i])) for i, c in enumerate(r)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _df_h(n: int) -> str:
    """``df -h`` style: powers of 1024, one decimal below 10, rounded up like df."""
    v, unit = float(n), ""
    for u in "KMGTPE":
        if v < 1024:
            break
        v, unit = v / 1024, u
    if not unit:
        return str(n)
    return f"{math.ceil(v * 10) / 10:.1f}{unit}" if v < 10 else f"{math.ceil(v):.0f}{unit}"


def human_bytes(n: float) -> str:
    """Bytes for messages: ``512 B``, ``20.0 MiB``, ``53.1 GiB``."""
    v, unit = float(n), "B"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(v) < 1024:
            break
        v, unit = v / 1024, u
    return f"{int(n)} B" if unit == "B" else f"{v:.1f} {unit}"


# --------------------------------------------------------------------------------------------
# Reclaim: the campaign's own tmp dir
# --------------------------------------------------------------------------------------------


def reclaimable_tmp(exp_tmp: Path) -> int:
    """Bytes that emptying ``exp_tmp`` would free (allocated blocks; no symlinks followed,
    no other filesystems entered, hard-linked files not counted). 0 if it does not exist."""
    try:
        top = os.lstat(exp_tmp)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(top.st_mode):
        return 0
    total = 0
    for dirpath, dirnames, filenames in os.walk(exp_tmp, followlinks=False):
        keep = []
        for d in dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, d))
            except FileNotFoundError:
                continue
            if st.st_dev == top.st_dev and stat.S_ISDIR(st.st_mode):
                keep.append(d)
                total += st.st_blocks * 512
        dirnames[:] = keep
        for f in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except FileNotFoundError:
                continue
            if st.st_nlink == 1:
                total += st.st_blocks * 512
    return total


def clear_dir_contents(d: Path, *, within: Path) -> int:
    """Delete everything inside ``d`` (not ``d`` itself); return the bytes freed.

    Refuses with ``ValueError`` unless ``realpath(d)`` is strictly inside ``realpath(within)``
    (the campaign root), so a misconfigured or symlinked tmp dir can never empty the shared cache
    or another campaign. Walks by directory fd without following symlinks (links are removed, not
    their targets) and never descends into another filesystem mounted below ``d``; entries it
    cannot remove are logged (``disk.reclaim_skipped``) and left. A missing ``d`` frees 0.
    """
    real = Path(os.path.realpath(d))
    base = Path(os.path.realpath(within))
    if real == base or base not in real.parents:
        raise ValueError(f"refusing to clear {d} (-> {real}): it is not inside {within} (-> {base})")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        freed = _clear_fd(fd, os.fstat(fd).st_dev, real)
    finally:
        os.close(fd)
    log.info("disk.tmp_cleared", path=str(real), freed_bytes=freed)
    return freed


def _clear_fd(dfd: int, dev: int, shown: Path) -> int:
    freed = 0
    with os.scandir(dfd) as it:
        entries = list(it)
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != dev:
                    log.warning("disk.reclaim_skipped", path=str(shown / e.name), why="another filesystem")
                    continue
                cfd = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    freed += _clear_fd(cfd, dev, shown / e.name)
                finally:
                    os.close(cfd)
                os.rmdir(e.name, dir_fd=dfd)
                freed += st.st_blocks * 512
            else:
                os.unlink(e.name, dir_fd=dfd)
                if st.st_nlink == 1:
                    freed += st.st_blocks * 512
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("disk.reclaim_skipped", path=str(shown / e.name), why=os.strerror(exc.errno or 0))
    return freed
