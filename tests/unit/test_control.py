"""The control socket: a real unix socket server, real clients, real signals and real uids."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from shoprld.daemon.core import control
from shoprld.daemon.core.control import ControlRefused, ControlServer, query, request_stop
from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, ConfigError, LockError
from shoprld.daemon.foundation.records.store import SOCKET_FILE
from tests.demotree import ready_child

pytestmark = pytest.mark.anyio
NOBODY = 65534
as_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as another uid")

# A child that takes the campaign lock like the daemon, then waits for SIGTERM and exits 0.
TERMABLE = """
import signal, sys
from pathlib import Path
from shoprld.daemon.foundation.records.store import Store
Store(Path(sys.argv[1])).acquire_lock()
signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(0)))
print("ready", flush=True)
signal.pause()
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A short, world-traversable dir (pytest's tmp dirs are 0700, closed to other uids)."""
    d = Path(tempfile.mkdtemp(prefix="shoprld-ctl-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def campaign(public_dir: Path) -> tuple[Path, Path]:
    """(campaign file, state dir) for campaign demo."""
    state_dir = public_dir / "state"
    state_dir.mkdir()
    cfg = public_dir / "demo.toml"
    cfg.write_text(f'[campaign]\nname = "demo"\nrounds = 2\nsteps_per_round = 3\n'
                   f'[storage]\nstate_dir = "{state_dir}"\n')
    return cfg, state_dir


@asynccontextmanager
async def serving(path: Path, handler: Any, **kw: Any) -> AsyncIterator[ControlServer]:
    server = ControlServer(path, handler, **kw)
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        yield server
        tg.cancel_scope.cancel()


def exchange(path: Path, data: bytes, timeout: float = 5.0) -> dict[str, Any]:
    """Send raw bytes, read one reply line (blocking; run in a thread)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        if data:
            s.sendall(data)
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


def ok_handler(calls: list[dict[str, Any]]) -> Any:
    def handler(req: dict[str, Any]) -> dict[str, Any]:
        calls.append(req)
        return {"ok": True, "status": {"state": "TRAIN"}} if req["cmd"] == "status" else {"ok": True}
    return handler


# -- the server -----------------------------------------------------------------------------


async def test_status_roundtrip_on_a_0600_socket_removed_on_exit(campaign: tuple[Path, Path]) -> None:
    """A status request gets the handler's reply; the socket is 0600 while served and gone after."""
    _, state_dir = campaign
    path = state_dir / SOCKET_FILE
    calls: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        async with serving(path, ok_handler(calls)):
            st = os.stat(path)
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            reply = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
    assert reply == {"ok": True, "status": {"state": "TRAIN"}}
    assert calls == [{"cmd": "status"}]
    assert not path.exists()


async def test_async_handler_gets_the_stop_request(campaign: tuple[Path, Path]) -> None:
    """An async handler is awaited and sees the stop mode."""
    _, state_dir = campaign
    seen: list[dict[str, Any]] = []

    async def handler(req: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep(0)
        seen.append(req)
        return {"ok": True, "message": "stopping after the checkpoint"}

    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, handler):
            reply = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "stop", "mode": "checkpoint"})
    assert reply == {"ok": True, "message": "stopping after the checkpoint"}
    assert seen == [{"cmd": "stop", "mode": "checkpoint"}]


@pytest.mark.parametrize(("data", "error"), [
    (b"not json\n", "bad request: not JSON"),
    (b"[1, 2]\n", "bad request: expected one JSON object per line"),
    (b'{"cmd": "reboot"}\n', "bad request: unknown cmd 'reboot'; known: status, stop"),
    (b'{"cmd": "stop", "mode": "later"}\n', "bad request: stop mode 'later'; known: now, checkpoint, round"),
])
async def test_bad_requests_get_one_line_errors(campaign: tuple[Path, Path], data: bytes, error: str) -> None:
    """Malformed requests are answered with one line and never reach the handler."""
    _, state_dir = campaign
    calls: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, ok_handler(calls)):
            reply = await anyio.to_thread.run_sync(exchange, state_dir / SOCKET_FILE, data)
    assert reply == {"ok": False, "error": error}
    assert calls == []


async def test_oversized_request_is_cut_off(campaign: tuple[Path, Path]) -> None:
    """A request longer than the bound is refused without reading it all."""
    _, state_dir = campaign
    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, ok_handler([]), max_request_bytes=1024):
            reply = await anyio.to_thread.run_sync(exchange, state_dir / SOCKET_FILE, b"x" * 5000)
    assert reply == {"ok": False, "error": "bad request: longer than 1024 bytes"}


async def test_silent_client_times_out(campaign: tuple[Path, Path]) -> None:
    """A client that connects and says nothing is answered and dropped after the read timeout."""
    _, state_dir = campaign
    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, ok_handler([]), read_timeout=0.2):
            reply = await anyio.to_thread.run_sync(exchange, state_dir / SOCKET_FILE, b"")
    assert reply == {"ok": False, "error": "bad request: no complete line within 0.2s"}


async def test_slow_handler_is_bounded(campaign: tuple[Path, Path]) -> None:
    """A handler that hangs gets a timeout reply instead of a hung client."""
    _, state_dir = campaign

    async def hang(req: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, hang, handler_timeout=0.2):
            reply = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
    assert reply == {"ok": False, "error": "the daemon did not answer within 0.2s"}


async def test_handler_error_does_not_take_the_server_down(campaign: tuple[Path, Path]) -> None:
    """A handler exception becomes an error reply and the next request still works."""
    _, state_dir = campaign
    calls = 0

    def flaky(req: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return {"ok": True}

    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, flaky):
            first = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
            second = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
    assert first == {"ok": False, "error": "internal error: RuntimeError: boom"}
    assert second == {"ok": True}


async def test_stale_socket_from_a_dead_daemon_is_replaced(campaign: tuple[Path, Path]) -> None:
    """A socket file nobody listens on (the daemon died) is removed and the server binds."""
    _, state_dir = campaign
    path = state_dir / SOCKET_FILE
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays behind, as after a SIGKILL
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    with anyio.fail_after(10), capture_logs() as logs:
        async with serving(path, ok_handler([])):
            reply = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
    assert reply is not None and reply["ok"] is True
    assert {"event": "control.stale_socket_removed", "path": str(path), "log_level": "info"} in logs


async def test_live_socket_is_never_stolen(campaign: tuple[Path, Path]) -> None:
    """A second server on a live socket fails with LockError; the first keeps serving."""
    _, state_dir = campaign
    path = state_dir / SOCKET_FILE
    with anyio.fail_after(10):
        async with serving(path, ok_handler([])):
            with pytest.raises(LockError, match="another process serves this control socket"):
                await ControlServer(path, ok_handler([])).serve()
            reply = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
            assert reply is not None and reply["ok"] is True


async def test_a_regular_file_in_the_way_is_left_alone(campaign: tuple[Path, Path]) -> None:
    """A non-socket file at the socket path is an error, and is not deleted."""
    _, state_dir = campaign
    path = state_dir / SOCKET_FILE
    path.write_text("precious")
    with pytest.raises(LockError, match="is not a socket"):
        await ControlServer(path, ok_handler([])).serve()
    assert path.read_text() == "precious"


async def test_too_long_a_socket_path_is_a_config_error(tmp_path: Path) -> None:
    """A state dir too deep for sun_path fails with a one-line fix, not a bare OSError."""
    deep = tmp_path / ("d" * 120)
    with pytest.raises(ConfigError, match="too long for a unix socket .*fix: set a shorter storage.state_dir"):
        await ControlServer(deep / SOCKET_FILE, ok_handler([])).serve()


async def test_exit_removes_only_its_own_socket(campaign: tuple[Path, Path]) -> None:
    """If a successor re-bound the path meanwhile, the old server leaves that file alone."""
    _, state_dir = campaign
    path = state_dir / SOCKET_FILE
    successor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with anyio.fail_after(10):
            async with serving(path, ok_handler([])):
                path.unlink()
                successor.bind(str(path))
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        successor.close()


@pytest.mark.skipif(os.getuid() != 0, reason="root peers are always allowed; meaningful as root only")
async def test_root_peer_is_allowed_whoever_owns_the_daemon(campaign: tuple[Path, Path]) -> None:
    """Root may talk to a daemon owned by another uid."""
    _, state_dir = campaign
    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, ok_handler([]), owner_uid=12345):
            reply = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
    assert reply is not None and reply["ok"] is True


@pytest.mark.skipif(os.getuid() == 0, reason="as root the peer is always allowed")
async def test_peer_that_is_not_the_owner_is_refused(campaign: tuple[Path, Path]) -> None:
    """A non-root peer whose uid is not the owner's gets a one-line refusal."""
    _, state_dir = campaign
    owner = os.getuid() + 1
    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, ok_handler([]), owner_uid=owner):
            reply = await anyio.to_thread.run_sync(query, state_dir, {"cmd": "status"})
    assert reply == {"ok": False, "error": f"refused: uid {os.getuid()} is not the daemon's owner (uid {owner})"}


def _cli_as_nobody(*args: str) -> tuple[int, str]:
    """Run ``shoprld ARGS`` in a forked child that dropped to uid/gid nobody: (exit code, output).

    A fork, not an exec: this interpreter lives under /root (0700), which nobody cannot
    execute. The child only drops its ids, runs the already-imported CLI and _exits.
    """
    from shoprld.daemon.ops import cli

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        rc = 99
        try:
            os.close(r)
            sys.stdout = sys.stderr = os.fdopen(w, "w", buffering=1)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            rc = cli.main(list(args))
        except BaseException as exc:
            os.write(w, f"child error: {exc!r}\n".encode())
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(rc)
    os.close(w)
    with os.fdopen(r) as fh:
        out = fh.read()
    _, wstatus = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wstatus), out


@as_root
async def test_another_user_is_refused_by_so_peercred(campaign: tuple[Path, Path]) -> None:
    """With the socket mode loosened, another uid still gets refused (SO_PEERCRED), and stop exits 3."""
    cfg, state_dir = campaign
    path = state_dir / SOCKET_FILE
    calls: list[dict[str, Any]] = []
    with anyio.fail_after(30), capture_logs() as logs:
        async with serving(path, ok_handler(calls)):
            path.chmod(0o666)  # a misconfiguration the uid check must survive
            rc, out = await anyio.to_thread.run_sync(_cli_as_nobody, "stop", "--after-round", "-c", str(cfg))
    assert (rc, out) == (EXIT_CONFIG, f"shoprld: {path}: refused: uid {NOBODY} is not the daemon's owner "
                                      f"(uid {os.getuid()})\n")
    assert calls == []
    assert [e for e in logs if e["event"] == "control.refused"] == [
        {"event": "control.refused", "peer_uid": NOBODY, "owner_uid": os.getuid(), "log_level": "warning"}]


@as_root
async def test_another_user_cannot_even_connect_to_the_0600_socket(campaign: tuple[Path, Path]) -> None:
    """The 0600 mode alone keeps another uid out; stop says so in one line, exit 3."""
    cfg, state_dir = campaign
    with anyio.fail_after(30):
        async with serving(state_dir / SOCKET_FILE, ok_handler([])):
            rc, out = await anyio.to_thread.run_sync(_cli_as_nobody, "stop", "-c", str(cfg))
    assert rc == EXIT_CONFIG
    assert "permission denied; the daemon runs as another user" in out
    assert out.count("\n") == 1


# -- shoprld stop -------------------------------------------------------------------------


async def test_stop_over_the_socket(campaign: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """`shoprld stop --after-round` sends mode=round and prints one line."""
    cfg, state_dir = campaign
    calls: list[dict[str, Any]] = []
    with anyio.fail_after(10), capture_logs() as logs:
        async with serving(state_dir / SOCKET_FILE, ok_handler(calls)):
            rc = await anyio.to_thread.run_sync(request_stop, cfg, "round")
    assert rc == 0 and calls == [{"cmd": "stop", "mode": "round"}]
    assert {"event": "control.request", "cmd": "stop", "mode": "round", "peer_uid": os.getuid(),
            "log_level": "info"} in logs
    assert capsys.readouterr().out == ("shoprld: stop requested (after the current round); "
                                       "the daemon will exit when it is safe\n")


@pytest.fixture
def termable(campaign: tuple[Path, Path]) -> Iterator[subprocess.Popen[str]]:
    """A lock-holding process that exits 0 on SIGTERM, standing in for the daemon."""
    _, state_dir = campaign
    with ready_child(TERMABLE, str(state_dir)) as proc:
        yield proc


@pytest.mark.parametrize("stale_socket", [False, True])
def test_stop_falls_back_to_sigterm_when_the_socket_is_gone(
        campaign: tuple[Path, Path], termable: subprocess.Popen[str], capsys: pytest.CaptureFixture[str],
        stale_socket: bool) -> None:
    """No (or a dead) socket: stop sends SIGTERM to the lock holder and says it is an immediate stop."""
    _, state_dir = campaign
    if stale_socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(state_dir / SOCKET_FILE))
        s.close()
    assert request_stop(campaign[0], "round") == 0
    assert termable.wait(timeout=10) == 0
    assert termable.stdout is not None and termable.stdout.read().strip() == "got SIGTERM"
    out = capsys.readouterr().out
    assert out.startswith(f"shoprld: sent SIGTERM to the daemon (pid {termable.pid}")
    assert "immediate graceful stop, not after the current round" in out


def test_stop_now_fallback_has_no_caveat(campaign: tuple[Path, Path], termable: subprocess.Popen[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """For mode now, the SIGTERM fallback is exactly what was asked, so no caveat."""
    assert request_stop(campaign[0], "now") == 0
    assert termable.wait(timeout=10) == 0
    assert "immediate" not in capsys.readouterr().out


def test_stop_without_a_daemon_is_idempotent(campaign: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing runs: one line, exit 0, and no signal to anyone (the stale pid is not signalled)."""
    cfg, state_dir = campaign
    (state_dir / "daemon.pid").write_text(f"{os.getpid()}\n")  # a live pid that does not hold the lock
    assert request_stop(cfg, "checkpoint") == 0
    assert capsys.readouterr().out == (f"shoprld: no daemon runs campaign demo (state dir {state_dir}); "
                                       "nothing to stop\n")


async def test_refusal_reply_becomes_exit_3(campaign: tuple[Path, Path]) -> None:
    """Any ok=false reply to stop is a ControlRefused (exit 3) with the daemon's words."""
    cfg, state_dir = campaign
    with anyio.fail_after(10):
        async with serving(state_dir / SOCKET_FILE, lambda req: {"ok": False, "error": "not now"}):
            with pytest.raises(ControlRefused, match="not now") as info:
                await anyio.to_thread.run_sync(request_stop, cfg, "now")
    assert info.value.exit_code == EXIT_CONFIG


def test_query_returns_none_when_nobody_listens(tmp_path: Path) -> None:
    """query() is None for a missing socket, so callers fall back to the status file."""
    assert query(tmp_path, {"cmd": "status"}, timeout=0.5) is None
    assert control.validate_request({"cmd": "stop"}) is None


# -- stop never signals a process that is not this campaign's daemon (issue 15, bug 4) ----------------
# Holds the campaign's flock the way a one-shot command does, writing no pid anywhere.
RAW_LOCK_HOLDER = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], "lock"), os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated live process (a `sleep`), reaped at the end."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _stop_cli(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "stop", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("record", ["pid file only", "record of the bystander", "record with a reused pid"])
def test_stop_never_signals_a_pid_that_is_not_the_lock_holding_daemon(
        campaign: tuple[Path, Path], bystander: subprocess.Popen[bytes], record: str) -> None:
    """The lock is held by a one-shot command (no pid in the lock file) and daemon.pid (or even a
    daemon.json) names an unrelated live process: stop signals nothing, says so in one line, exit 3."""
    cfg, state_dir = campaign
    (state_dir / "daemon.pid").write_text(f"{bystander.pid}\n")
    if record != "pid file only":
        from shoprld.daemon.foundation.records.store import daemon_record
    if record == "record of the bystander":  # right pid, start time and cmdline, but it holds no lock
        (state_dir / "daemon.json").write_text(json.dumps(daemon_record(bystander.pid)))
    elif record == "record with a reused pid":
        (state_dir / "daemon.json").write_text(json.dumps({**daemon_record(bystander.pid), "start_ticks": 1}))
    with ready_child(RAW_LOCK_HOLDER, str(state_dir), stdin=subprocess.PIPE) as holder:
        proc = _stop_cli(cfg)
        assert holder.poll() is None  # the one-shot holder was not signalled either
    assert bystander.poll() is None, "stop signalled an unrelated process"
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing was signalled" in lines[0] and str(state_dir / "lock") in lines[0], lines
    assert proc.stdout == ""


def test_one_shot_commands_write_no_daemon_pid(campaign: tuple[Path, Path]) -> None:
    """A one-shot lock holder (clean, export-campaign) leaves no daemon.pid or daemon.json behind
    for stop to mistake; the daemon's lock writes both."""
    from shoprld.daemon.foundation.records.store import Store

    _, state_dir = campaign
    s = Store(state_dir)
    s.acquire_lock(role="oneshot")
    assert not (state_dir / "daemon.pid").exists() and not (state_dir / "daemon.json").exists()
    s.release_lock()
    s.acquire_lock()
    rec = json.loads((state_dir / "daemon.json").read_text())
    assert rec["pid"] == os.getpid() and rec["cmdline"] and rec["start_ticks"]
    s.release_lock()
    assert not (state_dir / "daemon.json").exists()
