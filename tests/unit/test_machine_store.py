"""The transition table, the persisted state, the journal and the lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.foundation.system.errors import LockError
from shoprld.daemon.round.machine import (
    ADVANCE,
    PARKED_STATES,
    ROUND_STATES,
    TRANSITIONS,
    IllegalTransition,
    Machine,
    State,
    render_into,
)
from shoprld.daemon.foundation.records.store import SCHEMA_VERSION, Store, atomic_write

ROOT = Path(__file__).resolve().parents[2]


def test_the_round_walks_in_order_and_loops() -> None:
    """The legal path of a round is TRAIN..NEXT_ROUND, then TRAIN again or DONE."""
    m = Machine()
    m.fire("preflight_ok")
    m.fire("shopsim_ready")
    for state in ROUND_STATES[:-1]:
        assert m.state is state
        m.fire(ADVANCE[state])
    assert m.state is State.NEXT_ROUND
    m.fire("next_round")
    assert m.state is State.TRAIN


def test_illegal_triggers_are_refused() -> None:
    """A trigger the table does not allow raises instead of moving."""
    m = Machine()
    with pytest.raises(IllegalTransition):
        m.fire("trained")
    assert m.state is State.PREFLIGHT_DISK


def test_every_working_state_can_stop_park_fail_and_retry() -> None:
    """stop/park_disk/fail are legal from every working state; parked states only resume."""
    for state in (State.PREFLIGHT_DISK, State.START_SHOPSIM, *ROUND_STATES):
        for trig in ("stop", "park_disk", "fail", "retry"):
            m = Machine(state)
            m.fire(trig)
    for parked in PARKED_STATES:
        m = Machine(parked)
        assert not m.can("trained") and m.can("resume")


def test_every_state_is_reachable_from_the_table() -> None:
    """Each state is a destination of some transition (no dead entries)."""
    dests = {d for _, _, d in TRANSITIONS} | {State.PREFLIGHT_DISK}
    assert dests == set(State)


def test_readme_diagram_is_current() -> None:
    """The README's mermaid block equals what the table generates (regenerate: python -m shoprld.daemon.round.machine)."""
    text = (ROOT / "README.md").read_text()
    assert render_into(text) == text


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    """atomic_write replaces the file and leaves no temp file behind."""
    p = tmp_path / "f.json"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two"
    assert [x.name for x in tmp_path.iterdir()] == ["f.json"]


@pytest.mark.parametrize("content,why", [
    (b'{"schema": 1, "round": 2, "sta', "corrupt or truncated"),
    (b"\x00\xff garbage", "corrupt or truncated"),
    (b'{"schema": 99, "round": 2}', "schema 99"),
    (b"[1, 2]", "not a JSON object"),
])
def test_bad_state_json_is_rebuilt_from_the_journal_with_a_warning(tmp_path: Path, content: bytes, why: str) -> None:
    """A corrupt, truncated or wrong-schema state.json is rebuilt from the journal's last snapshot."""
    s = Store(tmp_path)
    s.acquire_lock()
    s.append({"event": "transition", "seq": 1, "snapshot": {"round": 3, "state": "VAL", "seq": 1}})
    s.append({"event": "transition", "seq": 2, "snapshot": {"round": 3, "state": "GATE", "seq": 2}})
    (tmp_path / "journal.jsonl").open("a").write('{"event": "transition", "snap')  # a torn last line
    (tmp_path / "state.json").write_bytes(content)
    loaded = s.load()
    assert loaded is not None and loaded.source == "journal"
    assert loaded.state["state"] == "GATE" and why in (loaded.warning or "")
    s.release_lock()


def test_missing_journal_and_state_means_the_disk_decides(tmp_path: Path) -> None:
    """No state.json and no journal: load() returns None (a fresh start, reconciled from disk)."""
    assert Store(tmp_path).load() is None
    (tmp_path / "state.json").write_text("{oops")
    loaded = Store(tmp_path).load()
    assert loaded is not None and loaded.state == {} and "rebuilt from the disk" in (loaded.warning or "")


def test_journal_ahead_of_state_wins(tmp_path: Path) -> None:
    """A crash between the journal line and state.json: the newer journal snapshot is used."""
    s = Store(tmp_path)
    s.save({"round": 1, "state": "VAL", "seq": 4})
    s.append({"event": "transition", "seq": 5, "snapshot": {"round": 1, "state": "GATE", "seq": 5}})
    loaded = s.load()
    assert loaded is not None and loaded.state["state"] == "GATE"
    assert json.loads((tmp_path / "state.json").read_text())["schema"] == SCHEMA_VERSION


def test_second_holder_of_the_lock_is_refused_with_the_pid(tmp_path: Path) -> None:
    """One daemon per campaign: a second lock attempt (another process) fails naming the holder's pid."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path[:0] = [%r]\n"
        "from shoprld.daemon.foundation.records.store import Store\n"
        "s = Store(__import__('pathlib').Path(%r)); s.acquire_lock(); print('locked', flush=True); time.sleep(30)"
    ) % (str(ROOT), str(tmp_path))], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockError, match=f"pid {holder.pid}"):
            Store(tmp_path).acquire_lock()
    finally:
        holder.kill()
        holder.wait()
    Store(tmp_path).acquire_lock()  # the kernel dropped the dead holder's lock


def test_second_daemon_exits_3_naming_the_pid(tmp_path: Path) -> None:
    """`shoprld run` while another daemon holds the campaign exits 3 with a one-line message."""
    from tests.demotree import make_tree, run_daemon

    campaign = make_tree(tmp_path, rounds=1)
    s = Store(tmp_path / "state")
    s.acquire_lock()
    try:
        proc = run_daemon(campaign, timeout=60)
    finally:
        s.release_lock()
    assert proc.returncode == 3
    assert f"pid {os.getpid()}" in proc.stderr and proc.stderr.count("\n") == 1
