"""The engine's event sources, each a task that only turns what it sees into a typed event
(daemon/core/events.py) on the engine's queue: signals, the control socket, the checkpoint
watcher. Plus the task that needs no queue (systemd's watchdog) and SIGHUP's re-read and
judgement (:func:`reloaded`), which the engine applies.

Signal handlers set flags; the loop acts (STYLE.md 4). The one exception is a second SIGINT
while stopping, which SIGKILLs the children at once, since the loop is busy stopping.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import ObjectSendStream
from pydantic import BaseModel

from shoprld.daemon.foundation.storage import ckptwatch

from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import Secrets, load_secrets
from shoprld.daemon.foundation.records.status import save_is_near, stop_cost_line, waiting_for_save_line
from shoprld.daemon.round.machine import STOP_MODES
from shoprld.daemon.services import hygiene
from shoprld.daemon.core.startcheck import start_problems
from shoprld.daemon.core.control import ControlServer
from shoprld.daemon.foundation.system.errors import ShoprldError
from shoprld.daemon.core.events import CheckpointCommitted, Event, HygieneFound, SignalReceived, StopRequested
from shoprld.daemon.core.notify import Notifier

log = structlog.get_logger("shoprld.engine")

# Sections whose change would move files or change what a round is: not reloadable.
STRUCTURAL = ("campaign", "storage", "gpus")
# Keys read once, at start, by a task or an object that lives as long as the daemon (the disk
# monitor, the checkpoint watcher, the launcher, the notify queue): a reload that changes them
# is refused, naming them, rather than journaled as applied and not in effect.
RESTART_KEYS = ("disk.interval", "disk.hysteresis", "train.launcher", "train.watch", "train.poll_interval",
                "train.rescan_interval", "notify.queue")


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

    waiting = False  # a plain stop became "at the next checkpoint": a second one stops now

    async def handler(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal waiting
        cmd = request.get("cmd")
        if cmd == "status":
            return {"ok": True, "status": status()}
        if cmd == "stop":
            asked = request.get("mode", "now")
            mode = next((m for m in STOP_MODES if m == asked), None)
            if mode is None:
                return {"ok": False, "error": f"unknown stop mode {asked!r}"}
            unsaved = status().get("unsaved") if mode == "now" else None
            if mode == "now" and not waiting and save_is_near(unsaved):
                waiting = True
                await send.send(StopRequested("checkpoint"))
                assert unsaved is not None
                return {"ok": True, "mode": "checkpoint", "message": waiting_for_save_line(unsaved)}
            cost = stop_cost_line(unsaved, waits_when_near=not waiting)
            await send.send(StopRequested(mode))
            return {"ok": True, "mode": mode, **({"message": f"the daemon will exit when it is safe; {cost}"}
                                                 if cost else {})}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    try:
        await ControlServer(socket, handler).serve()
    except Exception as exc:  # e.g. a state dir path too long for AF_UNIX: status still works from files
        log.warning("control.unavailable", error=f"{type(exc).__name__}: {exc}")


async def checkpoint_commits(save_dir: Path, cfg: Config, send: ObjectSendStream[Event], *,
                             task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """The checkpoint watcher's events (logged here); each commit -> :class:`CheckpointCommitted`."""
    watcher = ckptwatch.CheckpointWatcher(save_dir, mode=cfg.train.watch, poll_interval=cfg.train.poll_interval,
                                          rescan_interval=cfg.train.rescan_interval)

    async def emit(ev: dict[str, Any]) -> None:
        log.info(ev["event"], **{k: v for k, v in ev.items() if k != "event"})
        if ev["event"] == "checkpoint.committed":  # the others (ahead, partial) are only logged
            await send.send(CheckpointCommitted(int(ev["iteration"]), str(ev["path"]), ev.get("bytes"),
                                                ev.get("latency_ms")))

    await watcher.run(emit, task_status=task_status)


async def hygiene_scan(roots: set[Path], max_bytes: int, when: str, send: ObjectSendStream[Event]) -> None:
    """The repo hygiene scan (issue 9; it only reads, never deletes) -> :class:`HygieneFound`."""
    await send.send(HygieneFound(when, await hygiene.scan_roots(roots, max_bytes)))


async def watchdog(notifier: Notifier) -> None:
    """Ping systemd's watchdog at the interval it asked for (none outside systemd)."""
    interval = notifier.watchdog_interval()
    if not interval:
        return
    while True:
        notifier.watchdog()
        await anyio.sleep(interval)


@dataclass(frozen=True)
class Reload:
    """What a SIGHUP's re-read gives: the new config and .env to apply, or why not (one line)."""

    cfg: Config | None = None
    secrets: Secrets | None = None
    refused: str | None = None
    changed: tuple[str, ...] = ()


def changed_keys(old: Config, new: Config) -> list[str]:
    """``section.key`` for every value that differs (a whole section when it is not a table)."""
    out: list[str] = []
    for name in type(old).model_fields:
        if name == "source":
            continue
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        if isinstance(a, BaseModel) and isinstance(b, BaseModel):
            out.extend(f"{name}.{k}" for k in type(a).model_fields if getattr(a, k) != getattr(b, k))
        else:
            out.append(name)
    return out


def _needs_restart(key: str) -> bool:
    section, _, field = key.partition(".")
    return section in STRUCTURAL or key in RESTART_KEYS or (section == "train" and field.startswith("ray_"))


def reloaded(current: Config, layout: Layout) -> Reload:
    """SIGHUP: the campaign file and .env read again and judged as ``run`` judges them at its
    start (:func:`start_problems`). All or nothing: a file that does not load, a problem, or a
    key only a restart applies refuses the whole reload (``refused``, one line naming the
    file and the key, never a value); otherwise everything in it is to be applied."""
    try:
        new = load_config(current.source)
        secrets = load_secrets(layout.env_file, extra_keys=new.required_secrets())
    except ShoprldError as exc:
        return Reload(refused=str(exc))
    changed = changed_keys(current, new)
    restart = [k for k in changed if _needs_restart(k)]
    if restart:
        return Reload(refused=f"{current.source}: {', '.join(restart)} changed, which only a restart applies; "
                              f"fix: restart the daemon to apply them, or undo them and reload again")
    problems = start_problems(new, layout, secrets)
    if problems:
        more = f" (and {len(problems) - 1} more: shoprld check -c {current.source})" if len(problems) > 1 else ""
        return Reload(refused=problems[0] + more)
    return Reload(new, secrets, None, tuple(changed))
