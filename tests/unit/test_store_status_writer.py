"""status.json written off the daemon's event loop (store.LatestWriter, issue 17 item 5)."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest

from shoprld.daemon.foundation.records.store import STATUS_FILE, LatestWriter, Store


def test_latest_bytes_win_and_flush_waits_for_them(tmp_path: Path) -> None:
    """Many puts in a row leave the file holding the last one once flush() returns."""
    w = LatestWriter(tmp_path / "status.json", mode=0o600)
    for i in range(200):
        w.put(f"{i}\n".encode())
    w.flush()
    assert (tmp_path / "status.json").read_text() == "199\n"
    assert stat.S_IMODE((tmp_path / "status.json").stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp file left


def test_the_write_happens_on_another_thread(tmp_path: Path) -> None:
    """The caller's thread never replaces the file itself: the writer's own thread does."""
    w = LatestWriter(tmp_path / "status.json", mode=0o600)
    w.put(b"{}\n")
    w.flush()
    assert w._thread is not None and w._thread is not threading.current_thread()
    assert w._thread.name == "write status.json" and w._thread.daemon


def test_a_write_error_is_raised_by_the_next_put(tmp_path: Path) -> None:
    """A failed background write is not lost: the next put raises it (the engine logs it)."""
    w = LatestWriter(tmp_path / "missing-dir" / "status.json", mode=0o600)
    w.put(b"1\n")
    w.flush()
    with pytest.raises(FileNotFoundError):
        w.put(b"2\n")


def test_background_store_flushes_status_before_releasing_the_lock(tmp_path: Path) -> None:
    """A daemon store's last status.json is on disk, redacted as before, once release_lock returns."""
    store = Store(tmp_path / "state", status_in_background=True)
    store.acquire_lock(role="oneshot")
    try:
        for i in range(50):
            store.write_status({"state": "TRAIN", "step": i})
    finally:
        store.release_lock()
    assert json.loads((store.dir / STATUS_FILE).read_text()) == {"state": "TRAIN", "step": 49}


def test_plain_store_still_writes_status_synchronously(tmp_path: Path) -> None:
    """Without status_in_background (one-shot commands, tests) status.json is there on return."""
    store = Store(tmp_path / "state")
    store.acquire_lock(role="oneshot")
    try:
        store.write_status({"state": "VAL"})
        assert json.loads((store.dir / STATUS_FILE).read_text()) == {"state": "VAL"}
    finally:
        store.release_lock()
