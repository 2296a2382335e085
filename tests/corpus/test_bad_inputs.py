"""The bad-input corpus: every case gets ONE line saying what and where, a documented exit code,
no traceback, and nothing lost. Cases run the real CLI as a child process."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.demotree import kill_tree_leftovers, make_tree

CLI = [sys.executable, "-m", "shoprld.daemon.ops.cli"]


@dataclass
class Case:
    setup: Callable[[Path], list[str]]  # returns the CLI argv (after `shoprld`)
    code: int
    needle: str  # must appear in the one stderr line
    stream: str = "stderr"


def _tree(root: Path, **edits: str) -> Path:
    return make_tree(root, rounds=1, edits=edits or None)


def _edit(campaign: Path, old: str, new: str) -> Path:
    text = campaign.read_text()
    assert old in text, old
    campaign.write_text(text.replace(old, new, 1))
    return campaign


def _save_dir(root: Path) -> Path:
    return root / "ephemeral" / "nemo-rl" / os.environ.get("USER", "ubuntu") / "nemo-rl-auto-research" / "demo" / \
        "qwen35-4b-train-100" / "checkpoints" / "megatron"


class _BadHandler(socketserver.BaseRequestHandler):
    mode = "garbage"

    def handle(self) -> None:
        self.request.settimeout(5)
        try:
            self.request.recv(4096)
        except OSError:
            return
        if self.mode == "garbage":
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{not json")
        elif self.mode == "500":
            self.request.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}")
        elif self.mode == "hang":
            threading.Event().wait(8)
        elif self.mode == "reset":
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        elif self.mode == "notready":
            body = json.dumps({"result": {"ready": False, "free_slots": 0}}).encode()
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@contextmanager
def bad_server(mode: str) -> Iterator[int]:
    handler = type("H", (_BadHandler,), {"mode": mode})
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def _shopsim_is(mode: str) -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        c = _tree(root)
        port = _SERVERS[mode]
        text = c.read_text()
        import re

        text = re.sub(r'^url = "http://127.0.0.1:\d+"$', f'url = "http://127.0.0.1:{port}"', text, count=1, flags=re.M)
        text = text.replace("start_timeout = 30", "start_timeout = 3\nmanage = false\nretries = 0")
        c.write_text(text)
        return ["run", "-c", str(c)]
    return setup


_SERVERS: dict[str, int] = {}


def _cfg(text_edit: tuple[str, str], cmd: str = "check") -> Callable[[Path], list[str]]:
    return lambda root: [cmd, "-c", str(_edit(_tree(root), *text_edit))]


def _env(content: bytes | None, cmd: str = "check") -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        c = _tree(root)
        env = root / "repo" / ".env"
        if content is None:
            env.unlink()
        else:
            env.write_bytes(content)
        return [cmd, "-c", str(c)]
    return setup


def _state(writer: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        c = _tree(root)
        (root / "state").mkdir(exist_ok=True)
        writer(root / "state")
        return ["run", "-c", str(c)]
    return setup


def _ckpt(writer: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    def setup(root: Path) -> list[str]:
        c = _tree(root)
        save = _save_dir(root)
        save.mkdir(parents=True)
        writer(save)
        return ["run", "-c", str(c)]
    return setup


def _partial(save: Path) -> None:
    d = save / "iter_0000020"
    d.mkdir()
    (d / "common.pt").write_bytes(b"x")
    (save / "latest_checkpointed_iteration.txt").write_text("20")


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes(data)


def _status_garbage(root: Path) -> list[str]:
    c = _tree(root)
    (root / "state").mkdir(exist_ok=True)
    (root / "state" / "status.json").write_bytes(b"\x00{garbage")
    return ["status", "--json", "-c", str(c)]


def _real_runs_dir(root: Path) -> list[str]:
    c = _tree(root)
    (root / "repo" / "runs").mkdir()
    return ["run", "-c", str(c)]


def _missing_volume(root: Path) -> list[str]:
    c = _tree(root)
    return ["run", "-c", str(_edit(c, 'ephemeral_root = "ephemeral"', 'ephemeral_root = "no-such-volume"'))]


def _not_a_mount(root: Path) -> list[str]:
    c = _tree(root)
    return ["run", "-c", str(_edit(c, "require_mount = false", "require_mount = true"))]


def _init_exists(root: Path) -> list[str]:
    (root / "c.toml").write_text("x")
    return ["init", str(root / "c.toml")]


CASES: dict[str, Case] = {
    # config files
    "cfg-unknown-key": Case(_cfg(("rounds = 1", "rounds = 1\nroundz = 2")), 3, "campaign.roundz: unknown key"),
    "cfg-wrong-type": Case(_cfg(("rounds = 1", 'rounds = "one"')), 3, "campaign.rounds"),
    "cfg-negative": Case(_cfg(("slots = 8", "slots = -8")), 3, "shopsim.slots"),
    "cfg-tp": Case(_cfg(("tp_size = 2", "tp_size = 3")), 3, "not divisible by tp_size=3"),
    "cfg-placeholder": Case(_cfg(('"{save_dir}"', '"{save_dri}"')), 3, "unknown placeholder {save_dri}"),
    "cfg-soft-hard": Case(_cfg(('soft_limit = "128MiB"', 'soft_limit = "32MiB"')), 3, "soft_limit"),
    "cfg-not-toml": Case(_cfg(("[campaign]", "[campaign")), 3, "not valid TOML"),
    "cfg-run-bad": Case(_cfg(("rounds = 1", "rounds = 0"), "run"), 3, "campaign.rounds"),
    "cfg-missing-file": Case(lambda r: ["check", "-c", str(r / "nope.toml")], 3, "no such campaign file"),
    "cfg-directory": Case(lambda r: ["run", "-c", str(r)], 3, "is a directory"),
    "cfg-not-utf8": Case(lambda r: (r / "c.toml").write_bytes(b"\xff\xfe[campaign]") and ["check", "-c", str(r / "c.toml")],
                         3, "not UTF-8"),
    "cfg-bad-deadline": Case(_cfg(("seed = 1234", 'seed = 1234\ndeadline = "someday"')), 3, "campaign.deadline"),
    # .env
    "env-missing": Case(_env(None, "run"), 3, "missing .env file"),
    "env-empty": Case(_env(b"", "run"), 3, "WANDB_API_KEY is not set"),
    "env-key-without-value": Case(_env(b"WANDB_API_KEY=\nBAILIAN_API_KEY=abcdefgh\n", "run"), 3,
                                  "WANDB_API_KEY is not set"),
    "env-crlf": Case(_env(b"WANDB_API_KEY=abcdefgh1\r\nBAILIAN_API_KEY=abcdefgh2\r\n"), 0, "ready", "stdout"),
    "env-export-prefix": Case(_env(b"export WANDB_API_KEY=abcdefgh1\nexport BAILIAN_API_KEY=x2345678\n"), 0,
                              "ready", "stdout"),
    "env-is-a-directory": Case(lambda r: (_tree(r), (r / "repo" / ".env").unlink(), (r / "repo" / ".env").mkdir())
                               and ["run", "-c", str(r / "campaign.toml")], 3, "is a directory"),
    # state and journal corruption: rebuilt, the campaign completes
    "state-garbage": Case(_state(_write("state.json", b"\x00\xffgarbage")), 0, ""),
    "state-truncated": Case(_state(_write("state.json", b'{"schema": 1, "round": 0, "sta')), 0, ""),
    "state-wrong-schema": Case(_state(_write("state.json", b'{"schema": 42}')), 0, ""),
    "journal-torn": Case(_state(_write("journal.jsonl", b'{"event": "transition", "snap')), 0, ""),
    "state-wrong-type-round": Case(_state(_write("state.json", b'{"schema": 1, "round": "abc"}')), 0, ""),
    "state-children-a-list": Case(_state(_write("state.json", b'{"schema": 1, "round": 0, "children": ["trainer"]}')), 0, ""),
    "state-of-another-campaign": Case(_state(_write("identity.json", json.dumps(
        {"campaign": "demo", "experiment": "x", "repo": "/elsewhere/repo", "ephemeral_root": "/elsewhere/vol",
         "creation_id": "0" * 32}).encode())), 3, "this state dir belongs to another campaign"),
    "status-garbage": Case(_status_garbage, 0, '"state"', "stdout"),
    # checkpoints
    "tracker-garbage": Case(_ckpt(_write("latest_checkpointed_iteration.txt", b"not-a-number\x00")), 0, ""),
    "tracker-empty": Case(_ckpt(_write("latest_checkpointed_iteration.txt", b"")), 0, ""),
    "ckpt-missing-files": Case(_ckpt(_partial), 0, ""),
    # the volume and the repo
    "volume-missing": Case(_missing_volume, 3, "ephemeral root is missing"),
    "volume-not-a-mount": Case(_not_a_mount, 3, "not a mount point"),
    "repo-real-runs-dir": Case(_real_runs_dir, 3, "is a real directory"),
    # HTTP servers that misbehave (ShopSim's /healthz)
    "shopsim-garbage": Case(_shopsim_is("garbage"), 6, "START_SHOPSIM failed"),
    "shopsim-500": Case(_shopsim_is("500"), 6, "START_SHOPSIM failed"),
    "shopsim-hang": Case(_shopsim_is("hang"), 6, "START_SHOPSIM failed"),
    "shopsim-reset": Case(_shopsim_is("reset"), 6, "START_SHOPSIM failed"),
    "shopsim-never-ready": Case(_shopsim_is("notready"), 6, "START_SHOPSIM failed"),
    # CLI arguments
    "cli-unknown-command": Case(lambda r: ["frobnicate"], 2, "invalid choice"),
    "cli-unknown-flag": Case(lambda r: ["run", "--frob"], 2, "unrecognized arguments"),
    "cli-both-stop-modes": Case(lambda r: ["stop", "--at-checkpoint", "--after-round"], 2, "not allowed with"),
    "cli-init-exists": Case(_init_exists, 3, "already exists"),
    "cli-status-missing-config": Case(lambda r: ["status", "-c", str(r / "nope.toml")], 3, "no such campaign file"),
}


@pytest.fixture(scope="module", autouse=True)
def servers() -> Iterator[None]:
    with bad_server("garbage") as a, bad_server("500") as b, bad_server("hang") as c, bad_server("reset") as d, \
            bad_server("notready") as e:
        _SERVERS.update(garbage=a, **{"500": b}, hang=c, reset=d, notready=e)
        yield


def test_the_corpus_has_at_least_30_cases() -> None:
    """The corpus covers ≥ 30 distinct bad inputs."""
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input(name: str, tmp_path: Path) -> None:
    """Each bad input: its documented exit code, one line naming what and where, no traceback."""
    case = CASES[name]
    argv = case.setup(tmp_path)
    try:
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    finally:
        kill_tree_leftovers(tmp_path)
    assert proc.returncode == case.code, (proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr + proc.stdout
    if case.stream == "stderr" and case.code != 0:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert case.needle in lines[0], lines[0]
    elif case.needle:
        assert case.needle in proc.stdout
    if case.code == 0 and argv[0] == "run":
        assert json.loads((tmp_path / "state" / "status.json").read_text())["state"] == "DONE"
