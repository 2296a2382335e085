"""CheckpointWatcher on a real tmpfs, in inotify and in poll mode (shoprld.daemon.foundation.storage.checkpoints)."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from shoprld.daemon.foundation.storage.checkpoints import TRACKER_NAME, iter_dir
from shoprld.daemon.foundation.storage.ckptwatch import CheckpointWatcher, ObserverLike

pytestmark = pytest.mark.root

WAIT_S = 10.0  # generous bound on a noisy 2-core box; every wait returns as soon as it can


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 MiB tmpfs, always unmounted afterwards, even when the test fails."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def write_files(save: Path, n: int, *, metadata_json: bool = True) -> None:
    """iter_N's files in Megatron's order: shards, .metadata, common.pt, then metadata.json."""
    d = iter_dir(save, n)
    d.mkdir(parents=True, exist_ok=True)
    for name in ("__0_0.distcp", "__1_0.distcp", ".metadata", "common.pt"):
        (d / name).write_bytes(b"x" * 4096)
    if metadata_json:
        (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))


def write_tracker(save: Path, text: str) -> None:
    """Rank 0's plain open('w') write of the tracker, last."""
    with open(save / TRACKER_NAME, "w") as f:
        f.write(text)


def save(save_dir: Path, n: int) -> None:
    write_files(save_dir, n)
    write_tracker(save_dir, str(n))


class Recorder:
    """Collects emitted events; tests await a condition on them with a bound."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = anyio.Event()

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = anyio.Event()

    def of(self, kind: str) -> list[int]:
        return [e["iteration"] for e in self.events if e["event"] == f"checkpoint.{kind}"]

    async def until(self, kind: str, iteration: int, timeout: float = WAIT_S) -> None:
        """Wait, bounded, until a checkpoint.<kind> event for ``iteration`` has been emitted."""
        with anyio.fail_after(timeout):
            while iteration not in self.of(kind):
                await self._changed.wait()


class DeafObserver:
    """An observer that delivers no events: inotify after an overflow, or on NFS."""

    def __init__(self) -> None:
        self.started = False

    def schedule(self, event_handler: Any, path: str, *, recursive: bool = False, event_filter: Any = None) -> None:
        pass

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


class WatchLimitObserver(DeafObserver):
    """An observer whose start hits the inotify watch limit, as watchdog raises it."""

    def start(self) -> None:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")


def inotify_watcher(tmpfs: Path, observer: Callable[[], ObserverLike],
                    **options: Any) -> tuple[Path, CheckpointWatcher]:
    """An empty ``tmpfs/save`` and an inotify-mode watcher on it (with ``options``) whose observer is
    the stand-in ``observer``."""
    save_dir = tmpfs / "save"
    save_dir.mkdir()
    return save_dir, CheckpointWatcher(save_dir, mode="inotify", observer_factory=observer, **options)


def run_watcher(
    watcher: CheckpointWatcher, body: Callable[[Recorder], Awaitable[None]], *, emit_async: bool = False
) -> Recorder:
    """Start the watcher in a task group, run the test body, cancel; returns what was emitted."""
    rec = Recorder()

    async def emit_coro(event: dict[str, Any]) -> None:
        await anyio.lowlevel.checkpoint()
        rec(event)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(WAIT_S):
                await tg.start(watcher.run, emit_coro if emit_async else rec)
            await body(rec)
            tg.cancel_scope.cancel()

    anyio.run(main)
    return rec


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_megatron_saves_commit_once_each_in_order(tmpfs: Path, mode: str) -> None:
    """Saves written like Megatron emit one committed event each, in order; partials and ahead never commit."""
    save_dir = tmpfs / "save"
    save(save_dir, 20)  # already there at start: the baseline, not news
    watcher = CheckpointWatcher(save_dir, mode=mode, poll_interval=0.05)  # type: ignore[arg-type]

    async def body(rec: Recorder) -> None:
        assert watcher.mode == mode
        for n in (40, 60):
            save(save_dir, n)
            await rec.until("committed", n)
        write_files(save_dir, 80, metadata_json=False)  # a save still being written
        await rec.until("partial", 80)
        write_files(save_dir, 100)  # async save: files done, tracker trails at 60
        await rec.until("ahead", 100)
        write_tracker(save_dir, "1")  # a torn read of "100"...
        write_tracker(save_dir, "100")  # ...then the whole value
        await rec.until("committed", 100)
        for n in (120, 140, 160):  # a burst faster than one poll interval
            save(save_dir, n)
        await rec.until("committed", 160)

    rec = run_watcher(watcher, body)
    assert rec.of("committed") == [40, 60, 100, 120, 140, 160]
    assert rec.of("partial").count(80) == 1 and rec.of("ahead").count(100) == 1
    for e in rec.events:
        if e["event"] == "checkpoint.committed":
            assert e["bytes"] > 0 and e["latency_ms"] >= 0
            assert e["path"] == str(iter_dir(save_dir, e["iteration"]))


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_save_dir_created_after_start_and_replaced(tmpfs: Path, mode: str) -> None:
    """A save dir that appears later, or is removed and recreated, is picked up in both modes."""
    save_dir = tmpfs / "later" / "save"
    watcher = CheckpointWatcher(save_dir, mode=mode, poll_interval=0.05)  # type: ignore[arg-type]

    async def body(rec: Recorder) -> None:
        save(save_dir, 19)
        await rec.until("committed", 19)
        shutil.rmtree(save_dir)
        # Let a rescan see it gone, so the inotify watch is re-armed on the new dir.
        await anyio.sleep(0.2)
        save(save_dir, 39)
        await rec.until("committed", 39)

    rec = run_watcher(watcher, body, emit_async=True)
    assert rec.of("committed") == [19, 39]


def test_overflow_rescan_catches_up(tmpfs: Path) -> None:
    """With events lost (a deaf observer), notify_overflow() forces the rescan that emits the commit."""
    save_dir, watcher = inotify_watcher(tmpfs, DeafObserver, rescan_interval=3600)

    async def body(rec: Recorder) -> None:
        save(save_dir, 20)
        await anyio.sleep(0.3)
        assert rec.of("committed") == []  # the events really were lost
        watcher.notify_overflow()
        await rec.until("committed", 20)
        # watchdog reports a real IN_Q_OVERFLOW only as a log line, from its own thread.
        save(save_dir, 40)
        t = threading.Thread(
            target=logging.getLogger("watchdog.observers.inotify_c").warning,
            args=("Inotify queue overflowed; filesystem events were lost",),
        )
        t.start()
        t.join()
        await rec.until("committed", 40)

    rec = run_watcher(watcher, body)
    assert rec.of("committed") == [20, 40]
    assert watcher.mode == "inotify"


def test_timer_rescan_without_events(tmpfs: Path) -> None:
    """With no events at all, the periodic full rescan still finds the commit."""
    save_dir, watcher = inotify_watcher(tmpfs, DeafObserver, rescan_interval=0.2)

    async def body(rec: Recorder) -> None:
        save(save_dir, 20)
        await rec.until("committed", 20)

    assert run_watcher(watcher, body).of("committed") == [20]


def test_watch_limit_enospc_falls_back_to_polling(tmpfs: Path) -> None:
    """inotify's ENOSPC is the watch limit: logged as checkpoint.watch_limit, then polling works."""
    save_dir, watcher = inotify_watcher(tmpfs, WatchLimitObserver, poll_interval=0.05)

    async def body(rec: Recorder) -> None:
        assert watcher.mode == "poll"
        save(save_dir, 20)
        await rec.until("committed", 20)

    with capture_logs() as logs:
        rec = run_watcher(watcher, body)
    assert rec.of("committed") == [20]
    limit = [e for e in logs if e["event"] == "checkpoint.watch_limit"]
    assert len(limit) == 1 and limit[0]["errno"] == errno.ENOSPC and limit[0]["fallback"] == "poll"
    assert not any("disk" in e["event"] for e in logs)


def test_since_iteration_closes_the_start_gap(tmpfs: Path) -> None:
    """Commits newer than what the caller already knew are emitted by the initial scan."""
    save_dir = tmpfs / "save"
    for n in (20, 40, 60):
        save(save_dir, n)
    watcher = CheckpointWatcher(save_dir, mode="poll", poll_interval=0.05, since_iteration=20)

    async def body(rec: Recorder) -> None:
        pass

    assert run_watcher(watcher, body).of("committed") == [40, 60]
