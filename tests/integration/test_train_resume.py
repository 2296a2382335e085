"""TRAIN's relaunches, on real demo campaigns (issue 17, items 2-4).

- A launch that loads the save dir must resume at tracker + 1 (slime's rule); one that restarts
  its rollout count (slime#1558, the stand-in's DEMO_FAULT_RESUME_AT_ZERO) is stopped at its
  first progress line and the campaign FAILS with one line, before it saves anything.
- A stall with mid-round saves: the evidence is captured while the trainer hangs, and the
  relaunch resumes from the newest mid-round save, re-running less than one save interval.
- A trainer that crashes holding every ShopSim slot while the round's sidecar runs: the next
  attempt recovers the leases before it relaunches, not after stall timeouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon, status

ROUNDS = 2
SAVE_INTERVAL = 3


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _events(recs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["event"] == name]


def _index(recs: list[dict[str, Any]], pred: Any, start: int = 0) -> int:
    """The position of the first record from ``start`` on that satisfies ``pred``."""
    return next(i for i in range(start, len(recs)) if pred(recs[i]))


def _save_dir(root: Path) -> Path:
    return next((root / "ephemeral").rglob("latest_checkpointed_iteration.txt")).parent


def _trainer_spawns(recs: list[dict[str, Any]]) -> list[int]:
    return [i for i, r in enumerate(recs) if r["event"] == "stage.spawn" and r.get("role") == "trainer"]


def test_a_wrong_resume_is_stopped_at_its_first_rollout_and_the_campaign_fails(tmp_path: Path) -> None:
    """Round 1's trainer loads iter_0000020 but starts at rollout 0 (slime#1558): the daemon
    stops it at its first progress line and FAILS (exit 6) with one line naming rollout 21
    expected, 0 seen and the checkpoint. With a save every rollout, the wrong run may save
    iter_0000000 before it is stopped: the tracker is pointed back at iter_0000020."""
    # Small, quick saves: the wrong run's first one is most likely committed before the stop.
    campaign = make_tree(tmp_path, rounds=ROUNDS, edits={r"^save_interval = 10000$": "save_interval = 1",
                                                         r'DEMO_CKPT_BYTES = "1048576"': 'DEMO_CKPT_BYTES = "4096"'})
    env = {"DEMO_FAULT_RESUME_AT_ZERO": "1", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "faults"), "DEMO_HF_BYTES": "4096"}
    proc = run_daemon(campaign, env=env)
    assert proc.returncode == 6, proc.stderr[-3000:]
    recs = journal(tmp_path)
    checks = _events(recs, "train.resume_check")
    assert [(c["round"], c["ok"], c["expected"], c["seen"]) for c in checks] == [(1, False, 21, 0)], checks
    assert checks[0]["checkpoint"].endswith("iter_0000020")
    message = status(tmp_path)["last_error"]
    assert "\n" not in message
    assert "first rollout was 0, not 21" in message and "iter_0000020" in message and "slime#1558" in message
    assert [r for r in recs if r["event"] == "transition" and r.get("dst") == "FAILED"]
    save = _save_dir(tmp_path)
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "20"
    assert (save / "iter_0000020").is_dir()
    assert not [p.name for p in save.glob("iter_*") if int(p.name[5:]) > 20]


def test_a_correct_resume_passes_the_check(tmp_path: Path) -> None:
    """A crash at rollout 12 with saves every 3: the relaunch loads iter_0000011 and its first
    rollout is 12; round 1 starts at 21 after iter_0000020. Both checks pass, the campaign is DONE."""
    campaign = make_tree(tmp_path, rounds=ROUNDS,
                         edits={r"^save_interval = 10000$": f"save_interval = {SAVE_INTERVAL}"})
    env = {"DEMO_CRASH_AT": "12", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "faults")}
    proc = run_daemon(campaign, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = _events(journal(tmp_path), "train.resume_check")
    assert [(c["round"], c["ok"], c["expected"], c["seen"]) for c in checks] == [(0, True, 12, 12), (1, True, 21, 21)]
    assert checks[0]["checkpoint"].endswith("iter_0000011") and checks[1]["checkpoint"].endswith("iter_0000020")
    assert checks[0]["rerun"] == 0  # the crash came at the start of 12: 11 was saved
    assert status(tmp_path)["state"] == "DONE"


def test_a_stall_resumes_from_the_newest_mid_round_save_after_the_evidence(tmp_path: Path) -> None:
    """The trainer hangs at rollout 10 with saves every 3 (the newest is iter_0000008): its
    stacks are dumped while it hangs, then it is stopped, and the relaunch resumes at 9 from
    iter_0000008, not at the round's start, re-running less than one save interval."""
    campaign = make_tree(tmp_path, rounds=1,
                         edits={r"^save_interval = 10000$": f"save_interval = {SAVE_INTERVAL}"})
    env = {"DEMO_STALL_AT": "10", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "faults")}
    proc = run_daemon(campaign, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = journal(tmp_path)
    stall = _index(recs, lambda r: r["event"] == "train.stall")
    assert recs[stall]["last_rollout"] == 9
    dumped = _index(recs, lambda r: r["event"] == "train.stacks_dumped", stall)
    assert Path(recs[dumped]["path"]).is_file()
    relaunch = next(i for i in _trainer_spawns(recs) if i > dumped)
    checks = _events(recs[relaunch:], "train.resume_check")
    assert checks and checks[0]["ok"] and checks[0]["expected"] == 9 and checks[0]["seen"] == 9, checks
    assert checks[0]["checkpoint"].endswith("iter_0000008")
    assert checks[0]["rerun"] == 1 < SAVE_INTERVAL  # rollout 9 printed, not yet saved: trained again
    assert status(tmp_path)["state"] == "DONE"


def test_leases_leaked_by_a_crash_while_the_sidecar_runs_are_recovered_before_the_relaunch(tmp_path: Path) -> None:
    """ShopSim has exactly one rollout's slots; the trainer crashes at rollout 5 holding all of
    them while the round's sidecar runs. The next attempt stops that sidecar, sees the leak and
    recovers it before the trainer is relaunched: no stall timeout, the campaign is DONE."""
    campaign = make_tree(tmp_path, rounds=1, edits={r"^slots = 8$": "slots = 4"})
    env = {"DEMO_CRASH_AT": "5", "DEMO_LEAK_LEASES": "1", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "faults")}
    proc = run_daemon(campaign, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = journal(tmp_path)
    spawns = _trainer_spawns(recs)
    assert len(spawns) == 2, spawns
    between = recs[spawns[0]:spawns[1]]
    stopped = _index(between, lambda r: r["event"] == "shopsim.client_stopped_for_recovery")
    assert between[stopped]["role"] == "sidecar"
    leak = _index(between, lambda r: r["event"] == "shopsim.lease_leak", stopped)
    assert between[leak]["free_slots"] == 0 and between[leak]["state"] == "TRAIN"
    assert _index(between, lambda r: r["event"] == "shopsim.leaks_recovered", leak)
    assert not _events(recs, "train.stall")
    assert status(tmp_path)["state"] == "DONE"
