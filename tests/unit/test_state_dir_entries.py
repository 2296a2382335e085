"""Every name the daemon keeps in its state dir, with something else standing there (a
directory, a FIFO, a symlink, a socket, a device node made in the test's own dir): `run`
refuses in one line naming the file, exit 3, before anything is opened or written (a FIFO
would hang the reader), and `check` lists the same line."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from shoprld.daemon.foundation.records.statefiles import SOCKET_NAME, STATE_NAMES, state_dir_problems
from tests.demotree import SHOPRLD, make_tree


def _plant(path: Path, kind: str) -> None:
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        target = path.parent.parent / f"elsewhere-{path.name}"
        target.write_text("{}")
        path.symlink_to(target)
    elif kind == "device":
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # our own node, in the test's dir
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()


KINDS = ["dir", "fifo", "symlink", "device"]


@pytest.mark.parametrize("name", sorted(STATE_NAMES))
@pytest.mark.parametrize("kind", KINDS)
def test_a_wrong_kind_of_entry_is_one_line_naming_the_file(tmp_path: Path, name: str, kind: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _plant(state / name, kind)
    lines = state_dir_problems(state)
    assert len(lines) == 1 and lines[0].startswith(f"{state / name}: is a") and "; fix: " in lines[0]


def test_the_control_socket_may_be_a_socket_but_not_a_fifo(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _plant(state / SOCKET_NAME, "socket")
    assert state_dir_problems(state) == []
    (state / SOCKET_NAME).unlink()
    _plant(state / SOCKET_NAME, "fifo")
    assert state_dir_problems(state)[0].startswith(f"{state / SOCKET_NAME}: is a FIFO")
    assert state_dir_problems(tmp_path / "absent") == []


@pytest.mark.parametrize(("name", "kind"), [("state.json", "fifo"), ("journal.jsonl", "dir"),
                                             ("identity.json", "fifo"), ("rounds.jsonl", "fifo"),
                                             ("lock", "dir"), ("alerts.json", "symlink"),
                                             ("shopsim.witness", "fifo")])
def test_run_refuses_before_touching_anything(tmp_path: Path, name: str, kind: str) -> None:
    campaign = make_tree(tmp_path, rounds=1)
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    _plant(state / name, kind)
    before = sorted(os.listdir(state))
    proc = subprocess.run([*SHOPRLD, "run", "-c", str(campaign)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shoprld: {state / name}: is a"), proc.stderr
    assert sorted(os.listdir(state)) == before  # nothing written, not even the lock
    check = subprocess.run([*SHOPRLD, "check", "-c", str(campaign)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 3 and f"{state / name}: is a" in check.stdout


@pytest.mark.parametrize("name", ["state.json", "identity.json", "daemon.pid", "journal.jsonl"])
def test_status_and_report_refuse_a_fifo_instead_of_hanging(tmp_path: Path, name: str) -> None:
    campaign = make_tree(tmp_path, rounds=1)
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    _plant(state / name, "fifo")
    for cmd in ("status", "report"):
        proc = subprocess.run([*SHOPRLD, cmd, "-c", str(campaign)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3, (cmd, proc.stderr[-2000:])
        assert proc.stderr.strip() == f"shoprld: {state_dir_problems(state)[0]}"
