"""What a hand-off's transition writes on the event loop's thread (issue 30, item 6).

A transition into the next stage makes ONE durable write before that stage acts: its journal
line (fsynced, holding the snapshot). state.json and status.json wait for the next child's
registration (a durable persist) or the engine's flush a moment later; a crash in between
loses nothing, because ``Store.load`` prefers the journal's newer snapshot.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoprld.daemon.core.engine import Engine
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import Secrets
from shoprld.daemon.foundation.records.store import STATE_FILE, Store
from shoprld.daemon.round.machine import State
from tests.demotree import make_tree


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    cfg = load_config(make_tree(tmp_path, rounds=2))
    eng = Engine(cfg, Layout.from_config(cfg), Secrets())
    eng._check_identity()
    eng._load()
    eng._transition(None, State.START_SHOPSIM, "start")  # a (re)start: written at once
    eng.store.flush_status()
    try:
        yield eng
    finally:
        eng.store.release_lock()


@pytest.fixture
def loop_thread_io(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """fsyncs and renames made by this (the event loop's) thread; the status writer's are its own."""
    main = threading.get_ident()
    seen: dict[str, list[str]] = {"fsync": [], "replace": []}
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: Any) -> None:
        if threading.get_ident() == main:
            seen["fsync"].append(os.readlink(f"/proc/self/fd/{fd}") if isinstance(fd, int) else str(fd))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        if threading.get_ident() == main:
            seen["replace"].append(str(dst))
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def test_a_hand_off_transition_makes_one_fsync_and_no_rename(engine: Engine,
                                                              loop_thread_io: dict[str, list[str]]) -> None:
    engine._transition(State.START_SHOPSIM, State.TRAIN, "shopsim_ready", files_later=True)
    assert [Path(p).name for p in loop_thread_io["fsync"]] == ["journal.jsonl"]
    assert loop_thread_io["replace"] == []
    assert engine.view.files_due


def test_a_crash_before_the_deferred_write_resumes_from_the_transition(engine: Engine) -> None:
    d = engine.layout.state_dir
    before = (d / STATE_FILE).read_bytes()
    engine._transition(State.START_SHOPSIM, State.TRAIN, "shopsim_ready", files_later=True)
    assert (d / STATE_FILE).read_bytes() == before  # still the START_SHOPSIM state
    loaded = Store(d).load()  # what a daemon restarted right now (SIGKILL, host crash) reads
    assert loaded is not None and loaded.source == "journal"
    assert loaded.state["state"] == "TRAIN" and loaded.state["seq"] == engine.view.seq


def test_the_flush_writes_state_json_unless_a_persist_already_did(engine: Engine,
                                                                  loop_thread_io: dict[str, list[str]]) -> None:
    d = engine.layout.state_dir
    engine._transition(State.START_SHOPSIM, State.TRAIN, "shopsim_ready", files_later=True)
    engine.view.flush_files()
    assert not engine.view.files_due
    assert json.loads((d / STATE_FILE).read_text())["state"] == "TRAIN"
    assert Store(d).load().source == STATE_FILE  # type: ignore[union-attr]
    # A registration's persist (durable) supersedes the deferred write: the flush then does nothing.
    engine._transition(State.TRAIN, State.EXPORT_HF, "trained", files_later=True)
    engine.view.persist()
    writes = len(loop_thread_io["replace"])
    engine.view.flush_files()
    assert len(loop_thread_io["replace"]) == writes
    assert json.loads((d / STATE_FILE).read_text())["state"] == "EXPORT_HF"
