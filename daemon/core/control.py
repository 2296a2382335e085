"""The control channel: a unix socket in the state dir, for live status and graceful stop.

Wire protocol (one request per connection, both directions one JSON object per line):

    -> {"cmd": "status"}
    <- {"ok": true, "status": {...}}               (the handler's reply, verbatim)
    -> {"cmd": "stop", "mode": "now" | "checkpoint" | "round"}
    <- {"ok": true, "message": "..."}               ("message" is optional)
    <- {"ok": false, "error": "<one line>"}         (bad request, refused peer, handler error)

Who may talk: the socket file is created mode 0600 (under a umask guard, then chmod), in a
state dir that is itself 0700, and each connection's peer uid (SO_PEERCRED) must be the
daemon's uid or root. The uid check is defence in depth against a loosened mode: a refused
peer gets one clear line, never a silent hang-up.

Lifecycle: :class:`ControlServer` removes a STALE socket file left by a dead daemon (one
that refuses connections), never a live one, and on exit removes the file only if it is
still the one it bound.

The client side (:func:`query`, :func:`request_stop`) is blocking stdlib code: ``shoprld
stop`` is a short-lived CLI and must not pay for structlog.

In the engine, the server is one more task of the daemon's task group, started by
``core/sources.control``: its handler answers ``status`` with ``{"ok": True, "status":
snapshot}`` and turns ``stop`` into a typed ``StopRequested`` event on the engine's queue (the
loop acts on it; nothing stops inline).
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import signal
import socket
import stat
import struct
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, ConfigError, LockError, ShoprldError
from shoprld.daemon.foundation.records.paths import QuickConfigError, quick_read, state_dir_from_toml
from shoprld.daemon.foundation.records.status import probe_lock
from shoprld.daemon.foundation.records.store import DAEMON_RECORD, LOCK_FILE, PID_FILE, SOCKET_FILE, proc_identity

STOP_MODES = ("now", "checkpoint", "round")
COMMANDS = ("status", "stop")
MAX_REQUEST_BYTES = 64 * 1024
_SO_PEERCRED = getattr(socket, "SO_PEERCRED", None)  # Linux
_MAX_SUN_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux

Handler = Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]]

_MODE_TEXT = {
    "now": "now: every stage stops gracefully",
    "checkpoint": "at the next committed checkpoint",
    "round": "after the current round",
}


def _log() -> Any:
    # structlog costs ~230 ms to import; only the daemon side logs, so import it there.
    import structlog

    return structlog.get_logger("shoprld.control")


class ControlRefused(ShoprldError):
    """The daemon refused us (another user), or we may not signal it."""

    exit_code = EXIT_CONFIG


def socket_path(state_dir: Path) -> Path:
    return state_dir / SOCKET_FILE


def _socket_is_live(path: Path, timeout: float = 0.5) -> bool:
    """True if something accepts connections on ``path`` (a live daemon)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except socket.timeout:  # a full backlog of a live, busy listener
        return True
    except OSError as exc:
        # EACCES: someone else's socket; treat as live, never steal it.
        return exc.errno == errno.EACCES
    finally:
        s.close()
    return True


def peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's uid (SO_PEERCRED: pid, uid, gid), or None if unsupported."""
    if _SO_PEERCRED is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def _reply(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()


def validate_request(req: Any) -> str | None:
    """None if ``req`` is a well-formed request, else the one-line error."""
    if not isinstance(req, dict):
        return "bad request: expected one JSON object per line"
    cmd = req.get("cmd")
    if cmd not in COMMANDS:
        return f"bad request: unknown cmd {cmd!r}; known: {', '.join(COMMANDS)}"
    if cmd == "stop" and req.get("mode", "now") not in STOP_MODES:
        return f"bad request: stop mode {req.get('mode')!r}; known: {', '.join(STOP_MODES)}"
    return None


class ControlServer:
    """Serves the control socket until cancelled; ``handler`` answers valid requests.

    ``owner_uid`` is the uid allowed to connect besides root (default: ours).
    """

    def __init__(
        self,
        socket_path: Path,
        handler: Handler,
        *,
        owner_uid: int | None = None,
        read_timeout: float = 5.0,
        handler_timeout: float = 10.0,
        max_request_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self.path = Path(socket_path)
        self.handler = handler
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self.read_timeout = read_timeout
        self.handler_timeout = handler_timeout
        self.max_request_bytes = max_request_bytes

    # -- lifecycle -------------------------------------------------------------------
    def _bind(self) -> socket.socket:
        """Clear a stale socket file, then bind a 0600 socket (synchronously: no task runs
        between the umask change and its restore, so no other file gets our umask)."""
        if len(os.fsencode(self.path)) > _MAX_SUN_PATH:
            raise ConfigError(
                f"{self.path}: too long for a unix socket ({len(os.fsencode(self.path))} bytes, "
                f"the kernel allows {_MAX_SUN_PATH}); fix: set a shorter storage.state_dir"
            )
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode):
                raise LockError(
                    f"{self.path}: exists and is not a socket; fix: move it away, the daemon needs this path"
                )
            if _socket_is_live(self.path):
                raise LockError(
                    f"{self.path}: another process serves this control socket; "
                    f"fix: `shoprld status` to see it, `shoprld stop` to stop it"
                )
            self.path.unlink(missing_ok=True)  # stale: its daemon is dead
            _log().info("control.stale_socket_removed", path=str(self.path))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            old = os.umask(0o177)
            try:
                sock.bind(str(self.path))
            finally:
                os.umask(old)
            os.chmod(self.path, 0o600)
            sock.listen(64)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bind, report started, serve until cancelled; remove the socket file on exit."""
        sock = self._bind()
        st = os.stat(self.path)
        ident = (st.st_dev, st.st_ino)
        try:
            try:
                listener = await anyio.abc.SocketListener.from_socket(sock)
            except BaseException:
                sock.close()
                raise
            async with listener:
                _log().debug("control.listening", path=str(self.path))
                task_status.started()
                await listener.serve(self._connection)
        finally:
            try:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == ident:  # never remove a successor's socket
                    self.path.unlink()
            except OSError:
                pass

    # -- one connection ----------------------------------------------------------------
    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                reply = await self._answer(stream)
            except Exception as exc:  # never let one connection take the server down
                _log().warning("control.handler_error", error=f"{type(exc).__name__}: {exc}")
                reply = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
            try:
                await stream.send(_reply(reply))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass  # the client went away

    async def _answer(self, stream: anyio.abc.SocketStream) -> dict[str, Any]:
        raw_sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        uid = peer_uid(raw_sock)
        # Read the (bounded) request even from a peer we refuse: closing a unix socket with
        # unread data resets the connection, and the peer would never see why.
        line = await self._read_line(stream)
        if uid is not None and uid not in (self.owner_uid, 0):
            _log().warning("control.refused", peer_uid=uid, owner_uid=self.owner_uid)
            return {"ok": False, "error": f"refused: uid {uid} is not the daemon's owner (uid {self.owner_uid})"}
        if isinstance(line, dict):  # an error reply already
            return line
        try:
            req = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {"ok": False, "error": "bad request: not JSON"}
        problem = validate_request(req)
        if problem:
            return {"ok": False, "error": problem}
        _log().info("control.request", cmd=req["cmd"], mode=req.get("mode"), peer_uid=uid)
        try:
            with anyio.fail_after(self.handler_timeout):
                result = self.handler(req)
                if inspect.isawaitable(result):
                    result = await result
        except TimeoutError:
            return {"ok": False, "error": f"the daemon did not answer within {self.handler_timeout:g}s"}
        if not isinstance(result, dict):
            return {"ok": False, "error": f"internal error: handler returned {type(result).__name__}"}
        return result

    async def _read_line(self, stream: anyio.abc.SocketStream) -> bytes | dict[str, Any]:
        buf = b""
        with anyio.move_on_after(self.read_timeout) as scope:
            while b"\n" not in buf:
                try:
                    chunk = await stream.receive(4096)
                except anyio.EndOfStream:
                    break
                buf += chunk
                if len(buf) > self.max_request_bytes:
                    return {"ok": False, "error": f"bad request: longer than {self.max_request_bytes} bytes"}
        if scope.cancelled_caught:
            return {"ok": False, "error": f"bad request: no complete line within {self.read_timeout:g}s"}
        return buf.split(b"\n", 1)[0]


# -- client side (blocking, stdlib only) ---------------------------------------------------


def query(state_dir: Path, request: dict[str, Any], timeout: float = 1.0) -> dict[str, Any] | None:
    """Send one request to the daemon; its reply, or None if no daemon answers.

    Raises :class:`ControlRefused` when the socket exists but we may not use it (EACCES).
    """
    path = socket_path(state_dir)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        try:
            s.connect(str(path))
        except PermissionError:
            raise ControlRefused(
                f"{path}: permission denied; the daemon runs as another user; fix: run this as that user (or root)"
            ) from None
        except OSError:  # gone, stale (refused), or not a socket
            return None
        try:
            s.sendall((json.dumps(request) + "\n").encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may have answered and closed already: read what it said
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except OSError:  # timeout, reset: no usable daemon on the other end
        return None
    finally:
        s.close()
    try:
        reply = json.loads(buf.split(b"\n", 1)[0])
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return reply if isinstance(reply, dict) else None


def _campaign_name(config_path: Path) -> str:
    try:
        name = quick_read(config_path).get("campaign", {}).get("name")
    except Exception:
        return str(config_path)
    return str(name) if name else str(config_path)


def _lock_holders(lock: Path) -> list[int] | None:
    """Pids holding a flock on ``lock``, from /proc/locks; None when that cannot be told."""
    try:
        st = os.stat(lock)
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    for line in text.splitlines():
        f = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; "1: -> FLOCK ..." is a waiter
        if len(f) >= 6 and f[1] == "FLOCK" and f[5] == want and f[4].isdigit():
            out.append(int(f[4]))
    return out


def verified_daemon(state_dir: Path) -> tuple[int | None, str]:
    """(pid, "") of this campaign's live daemon, or (None, why not) -- see :func:`request_stop`.

    A pid qualifies only if ``daemon.json`` (written by the daemon alone, never by a one-shot
    command) names it, it holds the lock, and its start time and cmdline are the recorded
    ones (so a reused pid, or a process that merely wrote a pid file, never does).
    """
    lock = state_dir / LOCK_FILE
    held, holder = probe_lock(lock)
    if held is False:
        return None, "not held"
    try:
        rec = json.loads((state_dir / DAEMON_RECORD).read_bytes())
    except (OSError, ValueError):
        rec = None
    pid = rec.get("pid") if isinstance(rec, dict) else None
    who = f"pid {holder}" if holder else "a process"
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None, f"{lock} is held by {who}, and {state_dir / DAEMON_RECORD} names no daemon (a one-shot " \
                     "command such as `shoprld clean` or `export-campaign` holds it, or a daemon of an older shoprld)"
    holders = _lock_holders(lock)
    holds = pid in holders if holders else holder == pid  # no /proc/locks line: trust the lock file
    ticks, argv = proc_identity(pid)
    if ticks is None:
        return None, f"{lock} is held by {who}, not by the recorded daemon pid {pid} (it is gone)"
    if not holds:
        return None, f"{lock} is held by {who}, not by the recorded daemon pid {pid}"
    if ticks != rec.get("start_ticks") or argv != rec.get("cmdline"):
        return None, (f"pid {pid} is not the recorded daemon (its start time or command line differ from "
                      f"{state_dir / DAEMON_RECORD}: the pid was reused)")
    return pid, ""


def request_stop(config_path: Path, mode: str = "now") -> int:
    """``shoprld stop``: over the socket; else SIGTERM to the verified daemon; else nothing runs.

    Idempotent: stopping a campaign whose daemon does not run prints one line and exits 0.
    SIGTERM goes only to a pid that holds the lock AND is the daemon ``daemon.json`` records
    (same start time and cmdline); a lock held by anything else (a one-shot command, a stale
    pid file's reused pid) is refused in one line, exit 3, with nothing signalled (issue 15).
    """
    if mode not in STOP_MODES:
        raise ValueError(f"stop mode {mode!r}; known: {', '.join(STOP_MODES)}")
    try:
        state_dir = state_dir_from_toml(config_path)
    except QuickConfigError as exc:
        raise ConfigError(str(exc)) from None
    reply = query(state_dir, {"cmd": "stop", "mode": mode}, timeout=5.0)
    if reply is not None:
        if not reply.get("ok"):
            raise ControlRefused(f"{socket_path(state_dir)}: {reply.get('error') or 'the daemon refused the stop'}")
        msg = reply.get("message") or "the daemon will exit when it is safe"
        took = reply.get("mode") if reply.get("mode") in _MODE_TEXT else mode  # a near save: "checkpoint"
        print(f"shoprld: stop requested ({_MODE_TEXT[took]}); {msg}")
        return 0
    nothing = f"shoprld: no daemon runs campaign {_campaign_name(config_path)} (state dir {state_dir}); nothing to stop"
    pid, why = verified_daemon(state_dir)
    if pid is None:
        if why == "not held":
            print(nothing)
            return 0
        raise ControlRefused(f"{why}; nothing was signalled; fix: wait for that command to finish and rerun "
                             "`shoprld stop` (check the pid with `ps` before stopping it by hand)")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:  # it exited between the probe and the signal
        print(nothing)
        return 0
    except PermissionError:
        raise ControlRefused(
            f"{state_dir / PID_FILE}: pid {pid} belongs to another user; fix: run `shoprld stop` as that user (or root)"
        ) from None
    caveat = ""
    if mode != "now":
        caveat = f" (the control socket is gone, so this is an immediate graceful stop, not {_MODE_TEXT[mode]})"
    print(f"shoprld: sent SIGTERM to the daemon (pid {pid}, holder of {state_dir / LOCK_FILE}){caveat}; "
          f"it will exit when it is safe", file=sys.stdout)
    return 0
