"""sd_notify: real datagram sockets (filesystem and abstract), and the STATUS= line."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shoprld.daemon.core.notify import MAX_STATUS_LEN, Notifier, status_line


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound AF_UNIX datagram socket standing in for systemd, and its NOTIFY_SOCKET value."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    try:
        yield sock, str(path)
    finally:
        sock.close()


def recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_each_helper_sends_its_datagram(listener: tuple[socket.socket, str]) -> None:
    """ready/status/watchdog/stopping/extend_timeout each send one datagram systemd understands."""
    sock, addr = listener
    n = Notifier({"NOTIFY_SOCKET": addr})
    assert n.enabled
    assert n.ready()
    assert recv(sock) == "READY=1"
    assert n.status("round-002 (3 of 5) TRAIN step 12/20")
    assert recv(sock) == "STATUS=round-002 (3 of 5) TRAIN step 12/20"
    assert n.watchdog()
    assert recv(sock) == "WATCHDOG=1"
    assert n.extend_timeout(90)
    assert recv(sock) == "EXTEND_TIMEOUT_USEC=90000000"
    assert n.stopping("stopping: waiting for the checkpoint")
    assert recv(sock) == "STOPPING=1\nSTATUS=stopping: waiting for the checkpoint"
    n.close()


def test_several_lines_go_in_one_datagram(listener: tuple[socket.socket, str]) -> None:
    """send() joins its lines with newlines into a single datagram."""
    sock, addr = listener
    assert Notifier({"NOTIFY_SOCKET": addr}).send("READY=1", "STATUS=up", "MAINPID=1")
    assert recv(sock) == "READY=1\nSTATUS=up\nMAINPID=1"


def test_status_is_one_bounded_line(listener: tuple[socket.socket, str]) -> None:
    """A multi-line or huge status becomes one line within the bound."""
    sock, addr = listener
    Notifier({"NOTIFY_SOCKET": addr}).status("a\nb\t" + "x" * 1000)
    got = recv(sock)
    assert got.startswith("STATUS=a b x") and "\n" not in got and len(got) == len("STATUS=") + MAX_STATUS_LEN


def test_abstract_namespace_socket() -> None:
    """A NOTIFY_SOCKET starting with @ reaches a socket in the abstract namespace."""
    name = f"shoprld-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).watchdog()
        assert recv(sock) == "WATCHDOG=1"
    finally:
        sock.close()


def test_without_notify_socket_everything_is_a_no_op() -> None:
    """Outside systemd nothing is sent and nothing fails."""
    n = Notifier({})
    assert not n.enabled
    assert n.ready() is False and n.status("x") is False and n.watchdog_interval() is None


def test_a_dead_notify_socket_never_raises(tmp_path: Path) -> None:
    """A NOTIFY_SOCKET nobody listens on is logged at debug and send() returns False."""
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with capture_logs() as logs:
        assert n.send("READY=1") is False
    assert [e["event"] for e in logs] == ["notify.failed"] and logs[0]["log_level"] == "debug"


@pytest.mark.parametrize(("env", "expected"), [
    ({"WATCHDOG_USEC": "20000000"}, 10.0),
    ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}, 10.0),
    ({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, None),
    ({"WATCHDOG_USEC": "junk"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({}, None),
])
def test_watchdog_interval_is_half_of_watchdog_usec(env: dict[str, str], expected: float | None) -> None:
    """Ping at half of WATCHDOG_USEC, only when the watchdog is meant for this pid."""
    assert Notifier(env).watchdog_interval() == expected


def _snap(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"state": "TRAIN", "round": 2, "rounds": 5, "step": 12, "steps_per_round": 20,
                            "last_checkpoint": {"iteration": 59}, "warnings": [], "rounds_done": [{}, {}]}
    base.update(over)
    return base


@pytest.mark.parametrize(("over", "line"), [
    ({}, "round-002 (3 of 5) TRAIN step 12/20 ckpt 59"),
    ({"state": "VAL", "last_checkpoint": None}, "round-002 (3 of 5) VAL"),
    ({"state": "PAUSED_DISK", "disk": {"level": "soft", "free_bytes": int(1.2 * 1024**3),
                                       "soft_limit_bytes": 4 * 1024**3}},
     "PAUSED_DISK: free 1.2 GiB < soft 4.0 GiB"),
    ({"state": "PAUSED_DISK", "last_error": "no inodes left"}, "PAUSED_DISK: no inodes left"),
    ({"state": "DONE", "round": 5, "rounds_done": [{}] * 5}, "DONE: 5/5 rounds ckpt 59"),
    ({"state": "STOPPED", "stop_reason": "requested"}, "STOPPED (requested) in round-002 (3 of 5) ckpt 59"),
    ({"state": "FAILED", "last_error": "val failed 3 times"}, "FAILED in round-002 (3 of 5): val failed 3 times"),
    ({"warnings": ["trainer stalled for 42m"]}, "round-002 (3 of 5) TRAIN step 12/20 ckpt 59 | ! trainer stalled for 42m"),
])
def test_status_line(over: dict[str, Any], line: str) -> None:
    """The STATUS= text reads like `round-002 (3 of 5) TRAIN step 12/20 ckpt 59`, and explains parked states."""
    assert status_line(_snap(**over)) == line


@pytest.mark.parametrize("snap", [
    {},
    {"state": ["x"], "round": "2", "disk": 3, "warnings": "w", "last_checkpoint": []},
    {"state": "DONE", "rounds_done": 7, "rounds": True},
    {"state": "PAUSED_DISK", "disk": {"level": "hard", "free_bytes": "lots"}},
])
def test_status_line_survives_a_malformed_snapshot(snap: dict[str, Any]) -> None:
    """A malformed snapshot still gives a short line, never an exception in the daemon."""
    line = status_line(snap)
    assert isinstance(line, str) and 0 < len(line) <= MAX_STATUS_LEN
