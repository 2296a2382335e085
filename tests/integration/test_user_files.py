"""The user's files are left as found: a campaign and a rehearsal run ShopSim from a checkout
whose ``start.sh`` has the real one's launch shape (tests/shopsimcheckout.py): the checkout is
identical after (mode, size, mtime, inode of every entry), the project root too (.git included) but for the
seed's layout's own ``runs`` link and the ledger, and the service's log grows in
``$EXP_DIR/logs/shopsim/``. A ``start.sh`` that is not under ``shopsim.cwd`` is refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.demotree import SHOPRLD, journal, kill_tree_leftovers, make_tree, run_daemon, start_daemon, status, wait_for
from tests.shopsimcheckout import differences, make_checkout, snapshot

# The campaign file lives in the tree's root: relative paths in it are taken against that dir.
SHOP_ENV = "repo/ShopSimulator/shop_env"
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _tree(root: Path, *, rounds: int = 1, script: str = "start.sh") -> tuple[Path, Path]:
    """A demo tree whose ShopSim is started as the user's: ``bash start.sh`` in ``shop_env``."""
    campaign = make_tree(root, rounds=rounds, edits={
        r'^command = \["\{python\}", "\{demo_dir\}/shopsim.py"\]':
            f'command = ["bash", "{script}"]\ncwd = "{SHOP_ENV}"',
        r'^env = \{ SHOPSIM_ENV_SLOTS = "\{slots\}"':
            f'env = {{ PATH = "{PATH}", SHOPSIM_ENV_SLOTS = "{{slots}}"',
    })
    return campaign, make_checkout(root / SHOP_ENV)


def test_campaign_leaves_the_shopsim_checkout_and_project_root_as_found(tmp_path: Path) -> None:
    campaign, shop_env = _tree(tmp_path)
    repo = tmp_path / "repo"
    checkout_before = snapshot(shop_env)
    repo_before = snapshot(repo, skip=("runs", "reports"))
    proc = run_daemon(campaign, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert differences(checkout_before, snapshot(shop_env)) == []
    repo_after = snapshot(repo, skip=("runs", "reports"))
    # The root dir's own mtime moves with the runs link (the seed's layout's) and the ledger's dir.
    repo_before.pop("."), repo_after.pop(".")
    assert differences(repo_before, repo_after) == []
    assert (shop_env / "shop_agent.log").read_text() == "an earlier session's requests\n"
    log = tmp_path / "ephemeral"
    served = list(log.rglob("logs/shopsim/shop_agent.log"))
    assert len(served) == 1, served
    assert "[Request] action='reset'" in served[0].read_text()
    launched = [r for r in journal(tmp_path) if r["event"] == "shopsim.launcher"]
    assert launched and launched[0]["copy"] == str(shop_env / "start.sh")


def test_rehearsal_leaves_the_shopsim_checkout_and_project_root_as_found(tmp_path: Path) -> None:
    campaign, shop_env = _tree(tmp_path, rounds=2)
    checkout_before = snapshot(shop_env)
    repo_before = snapshot(tmp_path / "repo")
    proc = subprocess.run([*SHOPRLD, "rehearse", "-c", str(campaign)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^  shopsim\s{2,}ok$", proc.stdout, re.M), proc.stdout
    assert differences(checkout_before, snapshot(shop_env)) == []
    # The runs link is put back after the rehearsal: the project root (its own mtime too) is as found.
    assert differences(repo_before, snapshot(tmp_path / "repo")) == []


@pytest.mark.smoke  # no campaign runs: a second each
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_start_sh_missing_under_shopsim_cwd_is_one_line_exit_3_nothing_written(tmp_path: Path,
                                                                                 command: str) -> None:
    campaign, shop_env = _tree(tmp_path, script="bin/start.sh")  # shop_env has start.sh, not bin/start.sh
    before = snapshot(tmp_path)
    proc = subprocess.run([*SHOPRLD, command, "-c", str(campaign)], capture_output=True, text=True, timeout=120,
                          cwd=shop_env / "shop_env")  # shoprld's own cwd has nothing to do with it
    assert proc.returncode == 3, proc.stdout + proc.stderr
    want = f"{shop_env / 'bin' / 'start.sh'} does not exist (a relative start.sh is taken against shopsim.cwd {shop_env})"
    # check's report lists it among the lines it prints; its error (stderr) is that one line, as run's.
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and want in lines[0] and "shopsim.command[1]" in lines[0], proc.stdout + proc.stderr
    if command == "run":
        assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    after = snapshot(tmp_path)
    if command == "check":  # check's writability probe on the volume is created and removed again
        before.pop("ephemeral"), after.pop("ephemeral")
    assert differences(before, after) == []


def test_a_stale_analysis_from_an_older_runs_dir_is_archived_and_analyze_reruns(tmp_path: Path) -> None:
    """An older campaign's round-000 analysis lands in runs/ while round 0 trains (a merged
    runs/): VAL and GATE do not take it; it is renamed aside, journaled, and analyze runs again."""
    campaign = make_tree(tmp_path, rounds=1, edits={r'^step_seconds = "(.*)"$': 'step_seconds = "1.0"'})
    daemon = start_daemon(campaign)
    try:
        wait_for(lambda: _training(tmp_path), 120, "round 0's trainer")
        analysis = tmp_path / "repo" / "runs" / "round-000-online-analysis"
        analysis.mkdir(parents=True, exist_ok=True)
        stale = analysis / "analysis_summary.json"
        old = '{"status": "failed", "from": "the previous campaign"}\n'
        stale.write_text(old)
        os.utime(stale, (time.time() - 86400, time.time() - 86400))
        out, _ = daemon.communicate(timeout=300)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert daemon.returncode == 0, out[-3000:]
    events = [r for r in journal(tmp_path) if r["event"] == "analysis.stale"]
    assert len(events) == 1, events
    archived = Path(str(events[0]["archived"]))
    assert archived.parent.resolve() == analysis.resolve() and archived.read_text() == old
    assert stale.read_text() != old  # analyze wrote this round's


def _training(root: Path) -> bool:
    try:
        doc = status(root)
    except (OSError, ValueError):
        return False
    return doc.get("state") == "TRAIN" and any(c.get("role") == "trainer" for c in doc.get("children", []))
