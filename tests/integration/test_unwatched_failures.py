"""Episodes lost to a dead service are never taken for the policy's failures (found by chaos).

The real tools exit 0 and write a "complete" result whatever happened to their episodes: the
bare val's summary.json counts the failed ones (accepted down to ``val.min_coverage``), and the
gate drops the unpaired ones. Whether a failure was the policy's or a dead ShopSim's is only
known to a daemon that watched the services while the tool ran:

- watched: ShopSim died during the tool -> the result is archived and the tool reruns;
- unwatched: the daemon died during the tool, which finished alone -> the next daemon reuses
  only a whole result (no failed episode, no dropped pair), and reruns a partial one.

The seam: the campaign's val or gate command is a wrapper (below) around the real demo tool.
On its first run it lets the tool finish, then does what the fault does to the result (marks
one episode failed, or one pair dropped; the tool's own files otherwise) and either SIGKILLs
ShopSim (watched) or waits for the test to SIGKILL the daemon (unwatched). Later runs are the
plain tool, so a rerun ends in the reference's results; a reused faulted result does not.
"""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, reference_run, results, run_daemon, start_daemon
from tests.demotree import status, wait_for

ROUNDS = 1
TOOLS = {
    "VAL": r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "run", "\{loop_dir\}/val.yaml"\]$',
    "GATE": r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "training", "online-gate", '
            r'"\{loop_dir\}/gate.yaml"\]$',
}
ARGV = {"VAL": '"run", "{loop_dir}/val.yaml"', "GATE": '"training", "online-gate", "{loop_dir}/gate.yaml"'}

WRAPPER = textwrap.dedent('''\
    """The first run: the real tool, then the fault (see the test module's docstring)."""
    import json, os, signal, subprocess, sys, time
    from pathlib import Path

    stage, mode, marks, status_path, out_dir, *tool = sys.argv[1:]
    marks = Path(marks)
    rc = subprocess.run(tool).returncode
    if (marks / "faulted").exists():
        sys.exit(rc)
    out = Path(out_dir)
    if stage == "VAL":  # one episode lost: still above val.min_coverage
        summary = json.loads((out / "summary.json").read_text())
        counts = summary["counts"]
        counts["completed"] -= 1
        counts["failed"] += 1
        counts["coverage"] = round(counts["completed"] / counts["requested"], 6)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    else:  # one pair dropped: the manifest still says complete
        contrib = json.loads((out / "contributions.json").read_text())
        contrib["dropped_episode_ids"] = ["task-000001__sample-000"]
        (out / "contributions.json").write_text(json.dumps(contrib, indent=2))
    (marks / "faulted").write_text(stage)
    if mode == "watched":  # ShopSim dies while the tool runs
        shop = next(c["pid"] for c in json.loads(Path(status_path).read_text())["children"] if c["role"] == "shopsim")
        os.kill(shop, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(shop, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
    else:  # the daemon dies while the tool runs: finish only once the test has killed it
        deadline = time.monotonic() + 60
        while not (marks / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    sys.exit(rc)
''')


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_run(tmp_path_factory.mktemp("unwatched-ref"), ROUNDS)


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _tree(root: Path, stage: str, mode: str) -> Path:
    marks = root / "marks"
    marks.mkdir()
    wrapper = root / "fault_wrapper.py"
    wrapper.write_text(WRAPPER)
    out_dir = "{runs}/{round_id}-bare-val" if stage == "VAL" else "{runs}/{round_id}-online-gate"
    argv = (f'command = ["{{python}}", "{wrapper}", "{stage}", "{mode}", "{marks}", "{root / "state" / "status.json"}", '
            f'"{out_dir}", "{{python}}", "{{demo_dir}}/shopsimrl.py", {ARGV[stage]}]')
    return make_tree(root, rounds=ROUNDS, edits={TOOLS[stage]: argv.replace("\\", "\\\\")})


def _archived(root: Path) -> list[str]:
    return [str(r.get("reason")) for r in journal(root) if r["event"] == "run.archived"]


@pytest.mark.parametrize("stage", ["VAL", "GATE"])
def test_shopsim_dies_during_the_tool_and_the_result_is_rerun(reference: Path, tmp_path: Path, stage: str) -> None:
    """Watched: ShopSim is SIGKILLed while the tool runs; its result (one episode failed / one
    pair dropped, as a dead ShopSim leaves) is archived and the tool reruns: results as the reference."""
    proc = run_daemon(_tree(tmp_path, stage, "watched"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "marks" / "faulted").exists()
    died = "the val server or ShopSim died during the " + ("bare val" if stage == "VAL" else "gate")
    assert died in _archived(tmp_path), _archived(tmp_path)
    assert results(tmp_path) == results(reference)


@pytest.mark.parametrize("stage", ["VAL", "GATE"])
def test_a_partial_result_no_daemon_watched_is_rerun(reference: Path, tmp_path: Path, stage: str) -> None:
    """Unwatched: the daemon is SIGKILLed while the tool runs; the tool then finishes alone with
    one episode failed / one pair dropped. The next daemon does not take that for the policy's:
    it reruns the tool, and the results equal the reference."""
    campaign = _tree(tmp_path, stage, "unwatched")
    daemon = start_daemon(campaign)
    try:
        wait_for(lambda: (tmp_path / "marks" / "faulted").exists(), 120, f"the faulted {stage}")
        daemon.send_signal(signal.SIGKILL)
        daemon.communicate(timeout=30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
        (tmp_path / "marks" / "go").write_text("")
    proc = run_daemon(campaign)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert status(tmp_path)["state"] == "DONE"
    reasons = _archived(tmp_path)
    if stage == "GATE":
        assert any("1 pair(s) dropped while no daemon watched" in r for r in reasons), reasons
        contrib = json.loads((tmp_path / "repo" / "runs" / "round-000-online-gate" / "contributions.json").read_text())
        assert contrib["dropped_episode_ids"] == []
    else:
        assert "1 episode(s) failed while no daemon watched the val server and ShopSim" in reasons, reasons
    assert results(tmp_path) == results(reference)
