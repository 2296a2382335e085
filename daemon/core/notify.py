"""sd_notify, inline (no libsystemd): one datagram of ``KEY=value`` lines to $NOTIFY_SOCKET.

systemd (``Type=notify``) reads ``READY=1`` once preflight and START_SHOPSIM passed,
``STATUS=`` on every transition and on progress (``systemctl status`` shows it),
``WATCHDOG=1`` from the event loop at half of ``WATCHDOG_USEC``, ``STOPPING=1``, and
``EXTEND_TIMEOUT_USEC=`` while a graceful stop waits for a save. See sd_notify(3).

Notification is best effort: :meth:`Notifier.send` never raises, because a missing or
broken notify socket must not take a training campaign down (it logs at debug). Every
datagram passes through the Redactor the notifier was given (the engine's): a STATUS= line
quotes the last error, which may quote a child's output.

In the engine::

    notifier = Notifier(redactor=secrets.redactor)
    notifier.ready(status_line(snapshot))          # after PREFLIGHT_DISK and START_SHOPSIM
    notifier.status(status_line(snapshot))         # on every transition and on progress
    if (every := notifier.watchdog_interval()):    # a task in the daemon's task group
        while True: notifier.watchdog(); await anyio.sleep(every)
    notifier.extend_timeout(120)                   # while a graceful stop waits for a save
    notifier.stopping()
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from shoprld.daemon.foundation.config.secrets import NO_REDACTION, Redactor
from shoprld.daemon.foundation.system.units import human_bytes, round_label

# systemd shows STATUS= on one line; keep it readable in `systemctl status`.
MAX_STATUS_LEN = 200


class Notifier:
    """Talks to systemd when run under ``Type=notify``; a silent no-op otherwise."""

    def __init__(self, environ: Mapping[str, str] = os.environ, *, redactor: Redactor = NO_REDACTION) -> None:
        addr = environ.get("NOTIFY_SOCKET", "")
        # A leading "@" names a socket in the abstract namespace (a leading NUL byte).
        self.address: str | None = ("\0" + addr[1:] if addr.startswith("@") else addr) or None
        self._environ = environ
        self._redactor = redactor
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send the lines as one datagram. True if sent; never raises."""
        if self.address is None or not lines:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(self._redactor.text("\n".join(lines)).encode(), self.address)
            return True
        except OSError as exc:
            import structlog  # lazy: only on failure; the daemon has it imported anyway

            structlog.get_logger("shoprld.notify").debug("notify.failed", error=str(exc), lines=len(lines))
            return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        # Redact before cutting: a secret cut in two would no longer match.
        return self.send("STATUS=" + " ".join(self._redactor.text(text).split())[:MAX_STATUS_LEN])

    def status_of(self, snap: Mapping[str, Any]) -> bool:
        """STATUS= :func:`status_line` of ``snap``, redacted before the line is built and cut."""
        return self.status(status_line(self._redactor.obj(dict(snap))))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask systemd for ``seconds`` more before it gives up on the current start/stop."""
        return self.send(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1_000_000))}")

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None if not asked."""
        pid = self._environ.get("WATCHDOG_PID", "")
        if pid and pid != str(os.getpid()):
            return None  # the watchdog is meant for another process
        try:
            usec = int(self._environ.get("WATCHDOG_USEC", ""))
        except ValueError:
            return None
        return usec / 2 / 1_000_000 if usec > 0 else None


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def status_line(snap: Mapping[str, Any]) -> str:
    """A one-line STATUS= for ``systemctl status``: ``round-002 (3 of 5) TRAIN step 12/20 ckpt 59``.

    Parked and final states say why instead (``PAUSED_DISK: free 1.2 GiB < soft 4.0 GiB``),
    and the newest warning (a stall, say) is appended. Never raises on a malformed snapshot.
    """
    state = snap.get("state") or "?"
    rounds = _int(snap.get("rounds"))
    rnd = _int(snap.get("round"))
    shown = round_label(min(rnd, rounds - 1) if rounds > 0 else rnd, rounds)
    ck = snap.get("last_checkpoint")
    ckpt = f" ckpt {ck.get('iteration')}" if isinstance(ck, dict) and ck.get("iteration") is not None else ""
    raw_disk = snap.get("disk")
    disk: Mapping[str, Any] = raw_disk if isinstance(raw_disk, dict) else {}
    warnings = snap.get("warnings") if isinstance(snap.get("warnings"), list) else []
    err = snap.get("last_error")
    level = disk.get("level")
    if state == "PAUSED_DISK":
        if level in ("soft", "hard"):
            limit = disk.get(f"{level}_limit_bytes")
            line = f"PAUSED_DISK: free {human_bytes(disk.get('free_bytes'))} < {level} {human_bytes(limit)}"
        else:
            line = f"PAUSED_DISK: {err or 'disk pressure'}"
    elif state == "DONE":
        done = snap.get("rounds_done")
        line = f"DONE: {len(done) if isinstance(done, list) else '?'}/{rounds} rounds{ckpt}"
    elif state == "STOPPED":
        line = f"STOPPED ({snap.get('stop_reason') or 'requested'}) in {shown}{ckpt}"
    elif state == "FAILED":
        line = f"FAILED in {shown}: {err or 'see the log'}"
    else:
        line = f"{shown} {state}"
        if state == "TRAIN":
            line += f" step {snap.get('step', 0)}/{snap.get('steps_per_round', 0)}"
        line += ckpt
    if warnings:
        line += f" | ! {warnings[-1]}"
    line = " ".join(line.split())
    return line if len(line) <= MAX_STATUS_LEN else line[: MAX_STATUS_LEN - 1] + "…"
