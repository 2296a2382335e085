"""The engine end to end: real daemon processes, real stand-ins, real SIGKILLs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout, short_link
from shoprld.daemon.round.machine import ROUND_STATES
from tests.demotree import journal, kill_tree_leftovers, ledger_rows, make_tree, reference_run, results, run_daemon, status

ROUNDS = 5


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted demo campaign: the golden path and the reference results."""
    return reference_run(tmp_path_factory.mktemp("reference"), ROUNDS)


@pytest.mark.smoke
def test_golden_path_runs_every_state_once_per_round_in_order(reference: Path) -> None:
    """An uninterrupted campaign completes all rounds and journals each round state once, in order."""
    assert status(reference)["state"] == "DONE"
    moves = [(r["round"], r["dst"]) for r in journal(reference) if r["event"] == "transition"]
    for rnd in range(ROUNDS):
        seen = [dst for r, dst in moves if r == rnd and dst in {s.value for s in ROUND_STATES}]
        assert seen == [s.value for s in ROUND_STATES], (rnd, seen)
    assert [int(row[0]) for row in ledger_rows(reference)] == list(range(ROUNDS))
    assert not [r for r in journal(reference) if r["event"] == "stage.skipped"]


@pytest.mark.smoke
def test_golden_path_results_are_complete(reference: Path) -> None:
    """Every round has its val summary, gate manifest and next curriculum on disk, but the last
    round: no curriculum after it, as upstream (its INJECT records it as not built)."""
    got = results(reference)
    for rnd in range(ROUNDS):
        assert f"runs/round-{rnd:03d}-bare-val/summary.json" in got
        assert f"runs/round-{rnd:03d}-online-gate/online_gate_manifest.json" in got
        assert (f"runs/round-{rnd + 1:03d}/curriculum.json" in got) == (rnd < ROUNDS - 1)



@pytest.mark.smoke
def test_a_done_campaign_removes_its_short_tmp_links(reference: Path) -> None:
    """The experiment's path is long, so its children got /tmp/shoprld-{tmp,ray}-<hash> links
    to its tmp and ray dirs; the campaign removes them when it ends (issue 27: they leaked)."""
    cfg = load_config(reference / "campaign.toml")
    layout = Layout.from_config(cfg)
    assert status(reference)["state"] == "DONE" and layout.child_tmp != layout.tmp  # links were needed
    assert layout.tmp.is_dir() and layout.ray_tmp.is_dir()
    assert not short_link(layout.tmp, "tmp").is_symlink() and not short_link(layout.ray_tmp, "ray").is_symlink()

KILL_POINTS = [f"{s.value}:{p}:{i % ROUNDS}" for i, (s, p) in enumerate(
    (s, p) for s in ROUND_STATES for p in ("enter", "mid", "done"))
    # NEXT_ROUND spawns no child, nor does EXPORT_HF on the save_hf route.
    if not (s.value in ("NEXT_ROUND", "EXPORT_HF") and p == "mid")]
KILL_POINTS += ["PREFLIGHT_DISK:enter:0", "START_SHOPSIM:enter:1", "START_SHOPSIM:mid:0", "PREFLIGHT_DISK:done:2"]


QUICK_KILL_POINTS = ["TRAIN:spawn-trainer:0", "EXPORT_HF:done:0", "VAL:mid:1", "GATE:done:2", "INJECT:enter:3",
                     "NEXT_ROUND:done:4"]


def test_crash_matrix_quick(reference: Path, tmp_path: Path) -> None:
    """A few kill points (one per state kind) in one campaign: it resumes to the reference results."""
    _crash_matrix(reference, tmp_path, QUICK_KILL_POINTS)


@pytest.mark.slow
def test_crash_matrix_sigkill_at_every_state_resumes_to_identical_results(reference: Path, tmp_path: Path) -> None:
    """SIGKILL the daemon right after entering, in the middle of, and after the output of every
    state; restarting each time, the campaign completes with the reference results, no round
    repeated or skipped, and the ledger has one row per round."""
    _crash_matrix(reference, tmp_path, KILL_POINTS)


def _crash_matrix(reference: Path, tmp_path: Path, points: list[str]) -> None:
    campaign = make_tree(tmp_path, rounds=ROUNDS)
    marks = tmp_path / "kill-marks"
    marks.mkdir()
    env = {"SHOPRLD_TEST_KILL": ",".join(points), "SHOPRLD_TEST_KILL_DIR": str(marks)}
    kills = 0
    try:
        for _ in range(len(points) + 3):
            proc = run_daemon(campaign, env=env)
            if proc.returncode == 0:
                break
            assert proc.returncode == -9, proc.stderr[-2000:]
            kills += 1
    finally:
        kill_tree_leftovers(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fired = sorted(p.name for p in marks.iterdir())
    assert kills == len(fired) == len(points), (kills, fired)
    assert status(tmp_path)["state"] == "DONE"
    assert results(tmp_path) == results(reference)
    assert [int(row[0]) for row in ledger_rows(tmp_path)] == list(range(ROUNDS))
    # No round was trained twice: each round's end checkpoint was saved exactly once (read from
    # the trainers' logs: a save can land while no daemon runs, so the journal may miss it).
    from tests.chaos.chaos import _end_saves

    saves = _end_saves(tmp_path)
    assert [saves.get(20 * (i + 1)) for i in range(ROUNDS)] == [1] * ROUNDS, saves


@pytest.mark.smoke
def test_seed_resume_round_1_case_starts_after_train(reference: Path, tmp_path: Path) -> None:
    """round-001's final checkpoint (iter 40) exists but no val/gate files: the daemon resumes at
    EXPORT_HF for round-001 and never retrains it (the seed's RESUME_ROUND=1)."""
    campaign = make_tree(tmp_path, rounds=2)
    env = {"SHOPRLD_TEST_KILL": "TRAIN:done:1", "SHOPRLD_TEST_KILL_DIR": str(tmp_path)}
    try:
        first = run_daemon(campaign, env=env)
        assert first.returncode == -9
        runs = tmp_path / "repo" / "runs"
        assert not (runs / "round-001-bare-val").exists()
        (tmp_path / "state" / "state.json").unlink()  # nothing but the disk says where we are
        (tmp_path / "state" / "journal.jsonl").unlink()
        second = run_daemon(campaign)
    finally:
        kill_tree_leftovers(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    recs = journal(tmp_path)
    assert {"event": "stage.skipped", "state": "TRAIN", "round": 1}.items() <= next(
        r for r in recs if r["event"] == "stage.skipped").items()
    spawned = [r["role"] for r in recs if r["event"] == "stage.spawn"]
    assert "trainer" not in spawned
    # round-001 is this 2-round campaign's last: its SkillBank is chosen, no curriculum is built after it
    assert results(tmp_path) == {k: v for k, v in results(reference).items()
                                 if "round-000" in k or "round-001" in k or k == "runs/round-002/selected_skillbank.json"}


def test_resume_after_incomplete_gate_keeps_the_current_skillbank(tmp_path: Path) -> None:
    """A crash after an incomplete gate resumes into INJECT, which records that the current
    SkillBank was kept (the case the seed script cannot resume)."""
    campaign = make_tree(tmp_path, rounds=2)
    env = {"DEMO_GATE_INCOMPLETE_ROUNDS": "round-000", "SHOPRLD_TEST_KILL": "GATE:done:0",
           "SHOPRLD_TEST_KILL_DIR": str(tmp_path)}
    try:
        assert run_daemon(campaign, env=env).returncode == -9
        second = run_daemon(campaign, env={"DEMO_GATE_INCOMPLETE_ROUNDS": "round-000"})
    finally:
        kill_tree_leftovers(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    import json

    exp = next((tmp_path / "ephemeral").glob("nemo-rl/*/nemo-rl-auto-research/demo/*"))
    inject = json.loads((exp / "artifacts" / "inject" / "round-000.json").read_text())
    assert inject["branch"] == "kept"
    assert inject["skillbank"].endswith("cold-start/selected_skillbank.json")
    assert status(tmp_path)["rounds_done"][0]["gate"] == "incomplete"


@pytest.mark.parametrize(("state", "role", "run_dir"), [("VAL", "val", "round-001-bare-val"),
                                                        ("GATE", "gate", "round-001-online-gate")])
def test_tool_left_running_by_a_crashed_daemon_is_waited_for_not_rerun(
        reference: Path, tmp_path: Path, state: str, role: str, run_dir: str) -> None:
    """SIGKILL the daemon right after it spawned round-001's bare val (or gate): the restarted
    daemon adopts the still-running tool (or finds its finished output) and never runs it a
    second time for the round, nor archives the first run's work."""
    campaign = make_tree(tmp_path, rounds=2)
    env = {"SHOPRLD_TEST_KILL": f"{state}:spawn-{role}:1", "SHOPRLD_TEST_KILL_DIR": str(tmp_path)}
    try:
        assert run_daemon(campaign, env=env).returncode == -9
        second = run_daemon(campaign)
    finally:
        kill_tree_leftovers(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    recs = journal(tmp_path)
    assert not [r for r in recs if r["event"] == "stage.spawn" and r["role"] == role and r["round"] == 1]
    assert [r for r in recs if r["round"] == 1 and (
        r["event"] in ("gate.reused", "stage.skipped") or (r["event"] == "child.adopted" and r["role"] == role))]
    assert not list((tmp_path / "repo" / "runs").glob(f"{run_dir}.archived-*"))
    # round-001 is this 2-round campaign's last: its SkillBank is chosen, no curriculum is built after it
    assert results(tmp_path) == {k: v for k, v in results(reference).items()
                                 if "round-000" in k or "round-001" in k or k == "runs/round-002/selected_skillbank.json"}


def test_checkpoints_saved_while_shopsim_was_dead_are_retrained(reference: Path, tmp_path: Path) -> None:
    """ShopSim dies unwatched (the daemon is down) after iter 14 was witnessed: what was saved
    after it may hold partial rollouts. The restarted daemon deletes those checkpoints, points
    the tracker back and retrains them against a live ShopSim: the results equal the reference."""
    import json
    import os
    import signal

    campaign = make_tree(tmp_path, rounds=2)
    env = {"SHOPRLD_TEST_KILL": "TRAIN:done:0", "SHOPRLD_TEST_KILL_DIR": str(tmp_path)}
    try:
        assert run_daemon(campaign, env=env).returncode == -9
        state = json.loads((tmp_path / "state" / "state.json").read_text())
        os.killpg(int(state["children"]["shopsim"]["pid"]), signal.SIGKILL)
        (tmp_path / "state" / "shopsim.witness").write_text(json.dumps({"iteration": 14, "shopsim_pid": None}))
        second = run_daemon(campaign)
    finally:
        kill_tree_leftovers(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    rollbacks = [r for r in journal(tmp_path) if r["event"] == "checkpoint.rollback"]
    assert len(rollbacks) == 1 and 20 in rollbacks[0]["iterations"], rollbacks
    assert min(rollbacks[0]["iterations"]) > 14 and rollbacks[0]["witnessed"] == 14
    from tests.chaos.chaos import _end_saves

    assert _end_saves(tmp_path)[20] == 2  # saved, rolled back, saved again
    # round-001 is this 2-round campaign's last: its SkillBank is chosen, no curriculum is built after it
    assert results(tmp_path) == {k: v for k, v in results(reference).items()
                                 if "round-000" in k or "round-001" in k or k == "runs/round-002/selected_skillbank.json"}


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)
    shutil.rmtree(tmp_path / "ephemeral", ignore_errors=True)
