"""A demo campaign with adaptive saves (issue 17, item 1): real daemon, real stand-in trainer."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, ledger_rows, make_tree, run_daemon, status

# At the first launch sqrt(2 x 0.5 s x (2 s + the seconds TRAIN took before it)) / 1 s: a save every
# few steps (fewer than 16 unless that took minutes), so the crash at rollout 16 comes after a
# mid-round save; each save takes 0.2 s more (a slow disk).
ADAPTIVE = {r"^\[sidecar\]$": '[saves]\nmode = "adaptive"\ncost_guess = "0.5s"\nstep_guess = "1s"\n'
                              'prior_faults = 1\nprior_window = "2s"\n\n[sidecar]'}


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def test_adaptive_saves_learn_resume_mid_round_and_keep_only_the_finals(tmp_path: Path) -> None:
    """Each launch journals its interval with its inputs: guesses first; after the crash, the
    measured save cost and one learned fault. The crash resumes from a mid-round save, each new
    save replaces the round's older one, and the campaign ends on the rounds' finals only."""
    campaign = make_tree(tmp_path, rounds=2, edits=ADAPTIVE)
    env = {"DEMO_CRASH_AT": "16", "DEMO_FAULT_ONCE_DIR": str(tmp_path), "DEMO_SAVE_SECONDS": "0.2"}
    assert run_daemon(campaign, env=env).returncode == 0
    records = journal(tmp_path)
    chosen = [r for r in records if r["event"] == "save.interval"]
    assert [r["round"] for r in chosen][:2] == [0, 0] and chosen[-1]["round"] == 1
    first, relaunch = chosen[0], chosen[1]
    assert first["save_cost_source"].startswith("guess") and first["step_source"].startswith("guess")
    assert "0 fault(s)" in first["mtbf_source"] and first["mid_round"] and 1 <= first["interval"] < 16
    assert first["disk_room"] is True and first["summary"].startswith("adaptive: a save every")
    # The crash came after a mid-round save, so the relaunch has fewer steps left, a measured
    # save (the stand-in's slime timer line, >= the 0.2 s of DEMO_SAVE_SECONDS) and one fault.
    assert [r for r in records if r["event"] == "attempt.failed" and r["round"] == 0]
    assert relaunch["steps_left"] < 20
    assert relaunch["save_cost_source"].startswith("measured") and relaunch["save_cost_s"] >= 0.2
    assert "1 fault(s)" in relaunch["mtbf_source"] and relaunch["step_source"].startswith("measured")
    timed = [r for r in records if r["event"] == "save.timed"]
    assert timed and len({(r["log"], r["at"]) for r in timed}) == len(timed)
    # The trainer got what was chosen: the launch record and the argv agree.
    log = next((tmp_path / "ephemeral").rglob("r000-train.log")).read_text()
    assert re.search(rf"--save-interval {first['interval']}\b", log)
    mid = [r["iteration"] for r in records if r["event"] == "checkpoint.committed" and r["iteration"] not in (20, 40)]
    assert mid, "no mid-round save was committed"
    pruned = [r for r in records if r["event"] == "retention.applied" and r.get("rule") == "newest save of the round"]
    assert pruned and all(set(r["deleted"]) <= set(mid) for r in pruned)
    save_dir = next(p for p in (tmp_path / "ephemeral").rglob("megatron") if p.is_dir())
    assert sorted(p.name for p in save_dir.glob("iter_*")) == ["iter_0000020", "iter_0000040"]
    assert len(ledger_rows(tmp_path)) == 2
    assert status(tmp_path)["saves"]["summary"] == chosen[-1]["summary"]
    record = json.loads(next((tmp_path / "ephemeral").rglob("saves/round-001.json")).read_text())
    assert record["interval"] == chosen[-1]["interval"]
