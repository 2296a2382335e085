"""The sidecar's drain survives a daemon crash (issue 27, item 7): TRAIN is complete only when
the job is done AND the round's sidecar has drained. A daemon SIGKILLed during the drain drains
again on its restart (the adopted sidecar finishes its analyses), instead of moving on and
stopping the analysing sidecar as a stray of a later state."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon, start_daemon, status, wait_for

pytestmark = pytest.mark.slow


def test_a_daemon_killed_during_the_drain_drains_again(tmp_path: Path) -> None:
    """Round 0's drain is interrupted by SIGKILL; the restarted daemon re-runs TRAIN's drain with
    the same (adopted) sidecar, records it, and the campaign ends DONE."""
    campaign = make_tree(tmp_path, rounds=1)
    # Slow analyses: the drain (stop file present, pending groups still analysed) takes seconds.
    env = {"DEMO_ANALYST_SECONDS": "0.6"}
    stop_files = lambda: list((tmp_path / "ephemeral").rglob("analyst.stop"))  # noqa: E731
    daemon = start_daemon(campaign, env=env)
    try:
        wait_for(stop_files, 180, "the drain (the sidecar's stop file)")
        sidecar_pid = next(r["pid"] for r in journal(tmp_path) if r.get("event") == "stage.spawn"
                           and r.get("role") == "sidecar")
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait(10)
        assert not [r for r in journal(tmp_path) if r.get("event") == "sidecar.stopped"]
        second = run_daemon(campaign, env=env)
    finally:
        kill_tree_leftovers(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert status(tmp_path)["state"] == "DONE"
    records = journal(tmp_path)
    stopped = [r for r in records if r.get("event") == "sidecar.stopped"]
    assert [r["pid"] for r in stopped] == [sidecar_pid], stopped
    assert any(r.get("event") == "stage.outcome" and "the sidecar drained" in str(r.get("message"))
               for r in records)
    assert next((tmp_path / "ephemeral").rglob("sidecar/round-000.json"))
