"""The engine's event sources, each a task that only turns what it sees into a typed event
(daemon/core/events.py) on the engine's queue: signals, the control socket, the checkpoint
watcher. Plus the two tasks that need no queue: systemd's watchdog and SIGHUP's re-read.

Signal handlers set flags; the loop acts (STYLE.md 4). The one exception is a second SIGINT
while stopping, which SIGKILLs the children at once, since the loop is busy stopping.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import ObjectSendStream

from shoprld.daemon.foundation import ckptwatch
from shoprld.daemon.foundation.config import Config, load_config
from shoprld.daemon.core.control import ControlServer
from shoprld.daemon.foundation.errors import ShoprldError
from shoprld.daemon.core.events import CheckpointSeen, Event, SignalReceived, StopRequested
from shoprld.daemon.core.notify import Notifier

log = structlog.get_logger("shoprld.engine")

STOP_MODES = ("now", "checkpoint", "round")
# Sections whose change would move files or change what a round is: not reloadable.
STRUCTURAL = ("campaign", "storage", "gpus")


async def signals(send: ObjectSendStream[Event], *, stopping: Callable[[], bool], force: Callable[[], None]) -> None:
    """SIGTERM, SIGINT, SIGHUP -> :class:`SignalReceived`; a second SIGINT while stopping -> ``force()``."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
        async for signum in received:
            if signum == signal.SIGINT and stopping():
                log.warning("daemon.force_stop")
                force()
                continue
            await send.send(SignalReceived(signum))


async def control(socket: Path, send: ObjectSendStream[Event], status: Callable[[], dict[str, Any]]) -> None:
    """Serve ``status`` (answered here, from ``status()``) and ``stop`` (-> :class:`StopRequested`)."""

    async def handler(request: dict[str, Any]) -> dict[str, Any]:
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "status": status()}
        if cmd == "stop":
            mode = request.get("mode", "now")
            if mode not in STOP_MODES:
                return {"ok": False, "error": f"unknown stop mode {mode!r}"}
            await send.send(StopRequested(mode))
            return {"ok": True, "mode": mode}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    try:
        await ControlServer(socket, handler).serve()
    except Exception as exc:  # e.g. a state dir path too long for AF_UNIX: status still works from files
        log.warning("control.unavailable", error=f"{type(exc).__name__}: {exc}")


async def checkpoint_commits(save_dir: Path, cfg: Config, send: ObjectSendStream[Event], *,
                             task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """The checkpoint watcher's events (logged here) -> :class:`CheckpointSeen`."""
    watcher = ckptwatch.CheckpointWatcher(save_dir, mode=cfg.train.watch, poll_interval=cfg.train.poll_interval,
                                          rescan_interval=cfg.train.rescan_interval)

    async def emit(ev: dict[str, Any]) -> None:
        log.info(ev["event"], **{k: v for k, v in ev.items() if k != "event"})
        await send.send(CheckpointSeen(ev))

    await watcher.run(emit, task_status=task_status)


async def watchdog(notifier: Notifier) -> None:
    """Ping systemd's watchdog at the interval it asked for (none outside systemd)."""
    interval = notifier.watchdog_interval()
    if not interval:
        return
    while True:
        notifier.watchdog()
        await anyio.sleep(interval)


def reloaded(current: Config) -> Config | None:
    """SIGHUP: the campaign file read again, when only non-structural sections changed (limits,
    intervals, timeouts, retries, stall and gate policy, commands); else None, logged."""
    try:
        new = load_config(current.source)
    except ShoprldError as exc:
        log.warning("config.reload_rejected", error=str(exc))
        return None
    changed = [k for k in STRUCTURAL if getattr(new, k) != getattr(current, k)]
    if changed:
        log.warning("config.reload_rejected", error=f"structural sections changed: {', '.join(changed)}; "
                    "restart the daemon to apply them")
        return None
    return new
