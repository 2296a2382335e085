"""Faults in the children and in the daemon's own files: the campaign still completes, the same."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.demotree import (
    journal,
    kill_tree_leftovers,
    ledger_rows,
    make_tree,
    reference_run,
    results,
    run_daemon,
    start_daemon,
    status,
    wait_for,
)

ROUNDS = 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_run(tmp_path_factory.mktemp("ref2"), ROUNDS)


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _events(root: Path, name: str) -> list[dict[str, object]]:
    return [r for r in journal(root) if r["event"] == name]


def _retries(root: Path, state: str) -> list[dict[str, object]]:
    return [r for r in journal(root) if r["event"] == "transition" and r.get("trigger") == "retry"
            and r.get("dst") == state]


@pytest.mark.smoke
def test_trainer_crash_mid_round_is_relaunched_and_results_are_identical(reference: Path, tmp_path: Path) -> None:
    """The trainer dies at rollout 12 (with saves every 5): TRAIN relaunches it from the last
    checkpoint and the results equal an uninterrupted run."""
    campaign = make_tree(tmp_path, rounds=ROUNDS, edits={r"^save_interval = 10000$": "save_interval = 5"})
    env = {"DEMO_CRASH_AT": "12", "DEMO_FAULT_ONCE_DIR": str(tmp_path)}
    assert run_daemon(campaign, env=env).returncode == 0
    assert len(_retries(tmp_path, "TRAIN")) == 1
    assert results(tmp_path) == results(reference)
    log = next((tmp_path / "ephemeral").rglob("r000-train.log")).read_text()
    starts = log.count("=== shoprld ")
    assert starts >= 2  # emit/trainer launches; the trainer launched twice
    assert "- rollout 10: {" in log and log.count("- rollout 10: {") == 1 or \
        re.search(r"successfully saved checkpoint from iteration +9 to", log)


def test_torn_save_is_ignored_and_retried(reference: Path, tmp_path: Path) -> None:
    """The trainer dies in the middle of the final save: the partial iter dir is never taken as
    complete, TRAIN reruns, and the results are identical."""
    campaign = make_tree(tmp_path, rounds=ROUNDS)
    env = {"DEMO_DIE_MID_SAVE_AT": "20", "DEMO_FAULT_ONCE_DIR": str(tmp_path)}
    assert run_daemon(campaign, env=env).returncode == 0
    assert len(_retries(tmp_path, "TRAIN")) == 1
    assert results(tmp_path) == results(reference)


def test_stalled_trainer_is_detected_and_restarted(reference: Path, tmp_path: Path) -> None:
    """A trainer alive without step progress raises train.stall and is restarted from its checkpoint."""
    campaign = make_tree(tmp_path, rounds=ROUNDS)
    env = {"DEMO_STALL_AT": "25", "DEMO_FAULT_ONCE_DIR": str(tmp_path)}
    assert run_daemon(campaign, env=env).returncode == 0
    stalls = _events(tmp_path, "train.stall")
    assert len(stalls) == 1 and stalls[0]["round"] == 1
    assert results(tmp_path) == results(reference)


def test_leaked_leases_are_recovered_before_the_next_trainer(reference: Path, tmp_path: Path) -> None:
    """A trainer that crashes holding ShopSim leases: the daemon sees free_slots short with no
    client running and restarts ShopSim before relaunching, so reset never hangs."""
    campaign = make_tree(tmp_path, rounds=ROUNDS)
    env = {"DEMO_CRASH_AT": "5", "DEMO_LEAK_LEASES": "1", "DEMO_FAULT_ONCE_DIR": str(tmp_path)}
    assert run_daemon(campaign, env=env).returncode == 0
    assert _events(tmp_path, "shopsim.lease_leak")
    assert results(tmp_path) == results(reference)


def _child_pid(root: Path, role: str) -> int | None:
    try:
        for c in status(root).get("children", []):
            if c["role"] == role:
                return int(c["pid"])
    except (OSError, ValueError, KeyError):
        return None
    return None


@pytest.mark.parametrize("role,state", [
    pytest.param("shopsim", "TRAIN", marks=pytest.mark.slow), pytest.param("val_server", "VAL", marks=pytest.mark.slow),
    ("trainer", "TRAIN")])
def test_sigkill_of_a_child_mid_stage_is_survived(reference: Path, tmp_path: Path, role: str, state: str) -> None:
    """SIGKILL ShopSim, the val server (its whole group) or the trainer in the middle of a stage:
    the campaign completes with identical results."""
    campaign = make_tree(tmp_path, rounds=ROUNDS, edits={r'^step_seconds = ".*"$': 'step_seconds = "0.05"'})
    daemon = start_daemon(campaign)
    try:
        wait_for(lambda: (tmp_path / "state" / "status.json").exists() and status(tmp_path).get("state") == state
                 and _child_pid(tmp_path, role) is not None, 60, f"{role} in {state}")
        if role == "trainer":
            time.sleep(0.3)
        pid = _child_pid(tmp_path, role)
        assert pid is not None
        os.killpg(pid, signal.SIGKILL) if role == "val_server" else os.kill(pid, signal.SIGKILL)
        out, _ = daemon.communicate(timeout=180)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert daemon.returncode == 0, out[-3000:]
    assert status(tmp_path)["state"] == "DONE"
    assert results(tmp_path) == results(reference)
    if role == "shopsim":
        assert _events(tmp_path, "shopsim.died") or _events(tmp_path, "shopsim.restart")


@pytest.mark.smoke
def test_sigterm_is_a_graceful_stop_and_the_next_run_resumes(reference: Path, tmp_path: Path) -> None:
    """SIGTERM stops the children, persists STOPPED with where to resume, exits 0; `run` resumes."""
    campaign = make_tree(tmp_path, rounds=ROUNDS, edits={r'^step_seconds = ".*"$': 'step_seconds = "0.05"'})
    daemon = start_daemon(campaign)
    try:
        wait_for(lambda: _child_pid(tmp_path, "trainer") is not None, 60, "the trainer")
        trainer = _child_pid(tmp_path, "trainer")
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert daemon.returncode == 0, out[-2000:]
    st = status(tmp_path)
    assert st["state"] == "STOPPED" and st["stop_reason"] == "requested"
    assert trainer is not None and not Path(f"/proc/{trainer}").exists()
    stop = [r for r in journal(tmp_path) if r.get("dst") == "STOPPED"][-1]
    assert stop["resume_from"]["state"] == "TRAIN"
    assert run_daemon(campaign).returncode == 0
    assert results(tmp_path) == results(reference)
    assert [int(r[0]) for r in ledger_rows(tmp_path)] == list(range(ROUNDS))


def test_garbage_state_json_is_rebuilt_with_a_warning_and_completes(reference: Path, tmp_path: Path) -> None:
    """A daemon killed mid-campaign whose state.json is then garbage restarts from the journal and disk."""
    campaign = make_tree(tmp_path, rounds=ROUNDS)
    env = {"SHOPRLD_TEST_KILL": "VAL:mid:1", "SHOPRLD_TEST_KILL_DIR": str(tmp_path)}
    assert run_daemon(campaign, env=env).returncode == -9
    (tmp_path / "state" / "state.json").write_bytes(b'{"schema": 1, "round": 1, "sta')
    proc = run_daemon(campaign)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _events(tmp_path, "state.rebuilt")
    assert results(tmp_path) == results(reference)


def test_missing_secret_stops_before_any_work(tmp_path: Path) -> None:
    """With WANDB_API_KEY missing from .env, `run` exits 3 naming the key and the file, starting nothing."""
    campaign = make_tree(tmp_path, rounds=1)
    (tmp_path / "repo" / ".env").write_text("BAILIAN_API_KEY=abcdefgh\n")
    proc = run_daemon(campaign, timeout=60)
    assert proc.returncode == 3
    assert "WANDB_API_KEY is not set" in proc.stderr and str(tmp_path / "repo" / ".env") in proc.stderr
    assert not (tmp_path / "state" / "journal.jsonl").exists()
    assert json.dumps(proc.stderr).count("\\n") == 1


def test_daemon_crash_mid_train_adopts_the_running_trainer(reference: Path, tmp_path: Path) -> None:
    """SIGKILL the daemon while slime runs: the restarted daemon adopts the same trainer (same pid,
    no second launch), so no step is lost, and the results are identical."""
    campaign = make_tree(tmp_path, rounds=ROUNDS, edits={r'^step_seconds = ".*"$': 'step_seconds = "0.05"'})
    env = {"SHOPRLD_TEST_KILL": "TRAIN:spawn-trainer:1", "SHOPRLD_TEST_KILL_DIR": str(tmp_path)}
    assert run_daemon(campaign, env=env).returncode == -9
    trainer_pid = json.loads((tmp_path / "state" / "state.json").read_text())["children"]["trainer"]["pid"]
    assert Path(f"/proc/{trainer_pid}").exists()  # it outlived the daemon (own session)
    assert run_daemon(campaign).returncode == 0
    adopted = [r for r in journal(tmp_path) if r["event"] == "child.adopted" and r.get("role") == "trainer"]
    assert [r["pid"] for r in adopted] == [trainer_pid]
    # The first daemon died right after recording the trainer (before journaling its spawn);
    # the second launched none for round 1: it adopted.
    relaunched = [r for r in journal(tmp_path) if r["event"] == "stage.spawn" and r.get("role") == "trainer"
                  and r["round"] == 1]
    assert relaunched == []
    assert results(tmp_path) == results(reference)
