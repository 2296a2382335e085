"""A relaunch after a crash skips the emit and check tools when nothing they read changed
(issue 30, item 3), and runs them again when something did."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon, status


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _spawns(recs: list[dict[str, Any]], role: str) -> list[int]:
    return [i for i, r in enumerate(recs) if r["event"] == "stage.spawn" and r.get("role") == role]


def test_a_crash_relaunch_reuses_emit_and_check_and_the_campaign_matches(tmp_path: Path) -> None:
    """Round 0's trainer crashes at rollout 12 (saves every 3): the relaunch runs neither emit nor
    check again (journaled as train.tool_reused with the seconds their first run took) and
    resumes at 12; round 1, with new inputs, runs both. The campaign ends DONE."""
    campaign = make_tree(tmp_path, rounds=2, edits={r"^save_interval = 10000$": "save_interval = 3"})
    proc = run_daemon(campaign, env={"DEMO_CRASH_AT": "12", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "faults")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = journal(tmp_path)
    trainers = _spawns(recs, "trainer")
    assert len(trainers) == 3  # round 0 twice, round 1 once
    emits, checks = _spawns(recs, "emit"), _spawns(recs, "check")
    # One emit and one check per round: none between round 0's two trainer launches.
    assert len(emits) == 2 and len(checks) == 2
    assert not [i for i in emits + checks if trainers[0] < i < trainers[1]]
    reused = [r for r in recs if r["event"] == "train.tool_reused"]
    assert [(r["round"], r["role"]) for r in reused] == [(0, "emit"), (0, "check")]
    assert all(isinstance(r["saved_s"], float) and r["saved_s"] > 0 for r in reused)
    resume = [r for r in recs if r["event"] == "train.resume_check"]
    assert [(r["round"], r["ok"], r["expected"]) for r in resume] == [(0, True, 12), (1, True, 21)]
    assert status(tmp_path)["state"] == "DONE"


def test_an_emitted_yaml_touched_before_the_relaunch_is_emitted_and_checked_again(tmp_path: Path) -> None:
    """The same crash, but the emitted slime.yaml is edited while the trainer runs (by hand, or a
    tool): its bytes no longer match emit's record, so emit runs again. It writes the same bytes
    as the first time (its inputs did not change), which are exactly what check verified: check
    is reused, and only then."""
    campaign = make_tree(tmp_path, rounds=1, edits={r"^save_interval = 10000$": "save_interval = 3"})
    marker = tmp_path / "touched"  # the stand-in appends a comment to slime.yaml as it crashes
    env = {"DEMO_CRASH_AT": "12", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "faults"),
           "DEMO_TOUCH_ON_CRASH": str(marker)}
    proc = run_daemon(campaign, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = journal(tmp_path)
    assert marker.is_file()
    emits, trainers = _spawns(recs, "emit"), _spawns(recs, "trainer")
    assert len(emits) == 2 and trainers[0] < emits[1] < trainers[1]
    assert len(_spawns(recs, "check")) == 1
    reused = [i for i, r in enumerate(recs) if r["event"] == "train.tool_reused"]
    assert [recs[i]["role"] for i in reused] == ["check"] and emits[1] < reused[0] < trainers[1]
    yaml = next((tmp_path / "ephemeral").rglob("loop/round-000/slime.yaml"))
    assert b"edited before the relaunch" not in yaml.read_bytes()  # emit wrote it again
    assert status(tmp_path)["state"] == "DONE"
