"""The ledger is derived data (issue 26): git takes it away between runs, the campaign goes on.

The ledger lives in the user's checkout, where `git stash`, a checkout or `git clean` rolls it
back, deletes it or leaves it cut. The state dir's record (rounds.jsonl, the journal) holds every
round's row, so the next `shoprld run` rebuilds the ledger from it, journals one warning, keeps
the damaged copy aside and resumes at the round the record says (it used to reconcile to round 0,
rewrite round 0's row and fail TRAIN of round 1 four times).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon

LEDGER = Path("reports/shoprld/demo.tsv")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                   check=True, capture_output=True)


def set_rounds(campaign: Path, n: int) -> None:
    campaign.write_text(re.sub(r"^rounds = \d+$", f"rounds = {n}", campaign.read_text(), flags=re.M))


def since(root: Path, mark: int) -> list[dict[str, object]]:
    return journal(root)[mark:]


@pytest.mark.smoke
def test_git_rolls_back_deletes_and_cuts_the_ledger_and_the_campaign_goes_on(tmp_path: Path) -> None:
    """The ledger committed after round 0, rolled back by `git stash` after round 1, deleted after
    round 2, cut mid-row after round 3. Each rerun (one more round each time) rebuilds it byte for
    byte from the record (one ledger.rebuilt warning), keeps the damaged copy aside, resumes at
    the record's round and trains only the new one."""
    campaign = make_tree(tmp_path, rounds=1)
    repo = tmp_path / "repo"
    ledger = repo / LEDGER
    try:
        assert run_daemon(campaign).returncode == 0
        git(repo, "add", str(LEDGER))
        git(repo, "commit", "-qm", "ledger after round 0")
        set_rounds(campaign, 2)
        assert run_daemon(campaign).returncode == 0

        def damage_then_run(n: int, damage: str, kept_before: int) -> None:
            good = ledger.read_bytes()
            if damage == "stash":
                git(repo, "stash")  # back to the committed version: round 0's row only
            elif damage == "delete":
                ledger.unlink()
            else:
                ledger.write_bytes(good[: len(good) - 25])
            assert (not ledger.exists()) if damage == "delete" else ledger.read_bytes() != good
            mark = len(journal(tmp_path))
            set_rounds(campaign, n)
            proc = run_daemon(campaign)
            assert proc.returncode == 0, proc.stderr[-2000:]
            new = since(tmp_path, mark)
            rebuilt = [r for r in new if r.get("event") == "ledger.rebuilt"]
            assert len(rebuilt) == 1, rebuilt
            assert [r["round"] for r in new if r.get("event") == "reconcile"] == [n - 1]
            trained = {r.get("round") for r in new if r.get("event") == "transition" and r.get("to") == "TRAIN"}
            assert trained <= {n - 1}, trained  # never a finished round again
            text = ledger.read_bytes()
            assert text.startswith(good), "the rows of the recorded rounds are the originals"
            assert len([ln for ln in text.decode().splitlines()[1:] if ln]) == n
            kept = sorted(ledger.parent.glob("demo.tsv.damaged-*"))
            assert len(kept) == kept_before + (damage != "delete")
            if damage != "delete":
                assert any(str(k) in str(rebuilt[0]["warning"]) for k in kept)

        damage_then_run(3, "stash", 0)
        damage_then_run(4, "delete", 1)
        damage_then_run(5, "cut", 1)
        assert not [p for p in ledger.parent.iterdir() if p.name.startswith(".")], "no temp files left"
    finally:
        kill_tree_leftovers(tmp_path)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_ledger_path_that_is_not_a_file_stops_the_run_in_one_line(tmp_path: Path, kind: str) -> None:
    """Exit 3, one line naming the path, no traceback, and the directory or FIFO left as it was."""
    campaign = make_tree(tmp_path, rounds=1)
    try:
        assert run_daemon(campaign).returncode == 0
        ledger = tmp_path / "repo" / LEDGER
        ledger.unlink()
        if kind == "fifo":
            os.mkfifo(ledger)
        else:
            ledger.mkdir()
        set_rounds(campaign, 2)
        proc = run_daemon(campaign, timeout=60)
        assert proc.returncode == 3, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(ledger) in lines[0] and "Traceback" not in proc.stderr, proc.stderr
        assert ledger.is_fifo() if kind == "fifo" else ledger.is_dir()
    finally:
        kill_tree_leftovers(tmp_path)


# -- a checkpoint tracker that is not a file (issue 26, item 9; the state dir's names: statefiles.py) --
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_checkpoint_tracker_that_is_not_a_file_is_one_line_exit_3(tmp_path: Path, kind: str) -> None:
    """It used to fail TRAIN four times (exit 6) with the trainer's own error."""
    campaign = make_tree(tmp_path, rounds=1)
    try:
        assert run_daemon(campaign).returncode == 0
        tracker = next(p for p in (tmp_path / "ephemeral").rglob("latest_checkpointed_iteration.txt"))
        tracker.unlink()
        tracker.mkdir() if kind == "directory" else os.mkfifo(tracker)
        set_rounds(campaign, 2)
        mark = len(journal(tmp_path))
        proc = run_daemon(campaign, timeout=120)
        assert proc.returncode == 3, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(tracker) in lines[0] and "checkpoint tracker" in lines[0], proc.stderr
        assert not [r for r in since(tmp_path, mark) if r.get("trigger") == "retry"]
        assert tracker.is_dir() if kind == "directory" else tracker.is_fifo()
    finally:
        kill_tree_leftovers(tmp_path)
