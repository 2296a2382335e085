"""Real small filesystems for tests: tmpfs and loop-mounted ext4, always torn down.

Two layers, so that scripts (``tests/bench/``) and tests share one implementation:

* context managers :func:`mount_tmpfs` and :func:`mount_loop_ext4` yield the mount point and,
  on exit (normal or exceptional), unmount (lazily if the mount is still busy), detach the loop
  device, delete the image and remove the mount point. They raise :class:`FsUnavailable` when the
  machine cannot provide the filesystem (not root, no ``mount``/``losetup``/``mkfs.ext4``, or the
  mount itself fails);
* pytest fixtures ``tmpfs`` and ``loop_ext4`` are factories over them, torn down after the test
  whatever its outcome, which skip the test (with the reason) on :class:`FsUnavailable`. They are
  imported as ``tmpfs_fixture`` / ``loop_ext4_fixture`` (pytest registers them by their
  ``name=``), so a test's parameter does not shadow an import::

      from tests.fsfixtures import loop_ext4_fixture, tmpfs_fixture  # noqa: F401  (fixtures)

      def test_full(tmpfs):
          root = tmpfs("20m", nr_inodes=100)

Mounts use the source name ``shoprld-test`` so that a leak is easy to spot in ``/proc/mounts``.

:class:`DiskEvents` collects what a ``disk.monitor`` under test emits, on a fake volume or a real one.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

__all__ = [
    "DiskEvents",
    "FsUnavailable",
    "MOUNT_SOURCE",
    "Mounts",
    "loop_ext4_fixture",
    "mount_loop_ext4",
    "mount_tmpfs",
    "read_only",
    "tmpfs_fixture",
]

MOUNT_SOURCE = "shoprld-test"


class FsUnavailable(RuntimeError):
    """This machine cannot provide the requested filesystem; the message says why."""


def _run(argv: list[str]) -> str:
    """Run a mount-type command; return stdout, raise ``CalledProcessError`` with stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def _require(*tools: str) -> None:
    if os.geteuid() != 0:
        raise FsUnavailable("needs root to mount test filesystems")
    for tool in tools:
        if shutil.which(tool) is None:
            raise FsUnavailable(f"`{tool}` is not installed")


def _unmount(mnt: Path) -> None:
    """Unmount ``mnt``; if it is busy (a thread still has a file open), detach it lazily."""
    if not os.path.ismount(mnt):
        return
    try:
        _run(["umount", str(mnt)])
    except subprocess.CalledProcessError:
        _run(["umount", "-l", str(mnt)])


@contextlib.contextmanager
def _mount_point(base: Path | None) -> Iterator[Path]:
    mnt = Path(tempfile.mkdtemp(prefix="shoprld-mnt-", dir=base))
    try:
        yield mnt
    finally:
        try:
            _unmount(mnt)
        finally:
            # rmdir, never rmtree: if the unmount failed, this fails too instead of
            # deleting the contents of whatever is still mounted there.
            with contextlib.suppress(OSError):
                mnt.rmdir()


@contextlib.contextmanager
def mount_tmpfs(size: str | int = "20m", nr_inodes: int | None = None, *, base: Path | None = None) -> Iterator[Path]:
    """Mount a fresh tmpfs of ``size`` (bytes, or mount syntax such as ``"20m"``); yield its path."""
    _require("mount", "umount")
    opts = f"size={size},mode=0755" + (f",nr_inodes={nr_inodes}" if nr_inodes is not None else "")
    with _mount_point(base) as mnt:
        try:
            _run(["mount", "-t", "tmpfs", "-o", opts, MOUNT_SOURCE, str(mnt)])
        except subprocess.CalledProcessError as exc:
            raise FsUnavailable(f"mount -t tmpfs failed: {exc.stderr.strip()}") from exc
        yield mnt


@contextlib.contextmanager
def mount_loop_ext4(size_mb: int = 64, *, base: Path | None = None) -> Iterator[Path]:
    """Make an ext4 image of ``size_mb`` MiB (``mkfs.ext4 -m 0``), loop-mount it, yield its path."""
    _require("mount", "umount", "losetup", "mkfs.ext4")
    with contextlib.ExitStack() as stack:
        fd, img_name = tempfile.mkstemp(prefix="shoprld-img-", suffix=".ext4", dir=base)
        img = Path(img_name)
        stack.callback(img.unlink, missing_ok=True)
        try:
            os.ftruncate(fd, size_mb << 20)
        finally:
            os.close(fd)
        try:
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-L", MOUNT_SOURCE, str(img)])
            dev = _run(["losetup", "--find", "--show", str(img)]).strip()
        except subprocess.CalledProcessError as exc:
            raise FsUnavailable(f"{exc.cmd[0]} failed: {exc.stderr.strip()}") from exc
        # Registered before the mount point, so it runs after the unmount (LIFO).
        stack.callback(_run, ["losetup", "-d", dev])
        mnt = stack.enter_context(_mount_point(base))
        try:
            _run(["mount", "-t", "ext4", dev, str(mnt)])
        except subprocess.CalledProcessError as exc:
            raise FsUnavailable(f"mount {dev} failed: {exc.stderr.strip()}") from exc
        yield mnt


@contextlib.contextmanager
def read_only(mnt: Path) -> Iterator[Path]:
    """Remount ``mnt`` read-only for the block, and read-write again after it."""
    _run(["mount", "-o", "remount,ro", str(mnt)])
    try:
        yield mnt
    finally:
        if os.path.ismount(mnt):
            _run(["mount", "-o", "remount,rw", str(mnt)])


class Mounts:
    """Mounts made on request and all torn down by :meth:`close` (newest first)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def tmpfs(self, size: str | int = "20m", nr_inodes: int | None = None) -> Path:
        """Mount a tmpfs that lives until :meth:`close`."""
        return self._stack.enter_context(mount_tmpfs(size, nr_inodes))

    def loop_ext4(self, size_mb: int = 64) -> Path:
        """Mount a loop ext4 that lives until :meth:`close`."""
        return self._stack.enter_context(mount_loop_ext4(size_mb))

    def close(self) -> None:
        """Unmount and detach everything, even if one teardown step fails."""
        self._stack.close()

    def __enter__(self) -> Mounts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _skipping(make: Callable[..., Path]) -> Callable[..., Path]:
    def call(*args: object, **kwargs: object) -> Path:
        try:
            return make(*args, **kwargs)
        except FsUnavailable as exc:
            pytest.skip(str(exc))

    return call


class DiskEvents:
    """The ``emit`` of a ``disk.monitor`` under test: collects its events and lets a test wait
    for one by name."""

    def __init__(self) -> None:
        self.all: list[dict[str, Any]] = []
        self._send, self._recv = anyio.create_memory_object_stream[dict[str, Any]](math.inf)

    async def emit(self, ev: dict[str, Any]) -> None:
        self.all.append(ev)
        await self._send.send(ev)

    async def wait_for(self, name: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next event called ``name`` (earlier ones not awaited are passed over)."""
        with anyio.fail_after(timeout):
            async for ev in self._recv:
                if ev["event"] == name:
                    return ev
        raise AssertionError("stream closed")

    def names(self) -> list[str]:
        """Every event so far, by name."""
        return [e["event"] for e in self.all]

    def levels(self) -> list[str]:
        """The level changes so far (every event but the periodic disk.sample), by name."""
        return [e["event"] for e in self.all if e["event"] != "disk.sample"]


@pytest.fixture(name="tmpfs")
def tmpfs_fixture() -> Iterator[Callable[..., Path]]:
    """Factory ``tmpfs(size="20m", nr_inodes=None) -> Path``; unmounted after the test, pass or fail."""
    with Mounts() as mounts:
        yield _skipping(mounts.tmpfs)


@pytest.fixture(name="loop_ext4")
def loop_ext4_fixture() -> Iterator[Callable[..., Path]]:
    """Factory ``loop_ext4(size_mb=64) -> Path``; unmounted and detached after the test, pass or fail."""
    with Mounts() as mounts:
        yield _skipping(mounts.loop_ext4)
