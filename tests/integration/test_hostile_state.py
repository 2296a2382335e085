"""A real daemon restarts on state files with the right syntax but the wrong types (issue 15).

``"round": "abc"`` or ``"children": []`` in state.json used to exit 1 (a ValueError in start-up)
and the campaign could not start again; after a torn journal tail, the next record was fused
onto the torn line and lost.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon


@pytest.mark.parametrize("bad", [{"round": "abc"}, {"children": []}])
def test_a_wrong_typed_state_json_and_a_torn_journal_are_rebuilt_and_the_campaign_resumes(
        tmp_path: Path, bad: dict[str, object]) -> None:
    """A finished 1-round campaign whose state.json gets a wrong-typed key and whose journal ends in
    a torn line: the next `shoprld run` rebuilds the state from the journal (saying which key was
    wrong), exits 0 as DONE, and its first journal record is a line of its own."""
    campaign = make_tree(tmp_path, rounds=1)
    try:
        assert run_daemon(campaign).returncode == 0
        state_file = tmp_path / "state" / "state.json"
        state_file.write_text(json.dumps({**json.loads(state_file.read_text()), **bad}))
        with (tmp_path / "state" / "journal.jsonl").open("a") as fh:
            fh.write('{"event": "transition", "seq": 99, "snap')  # a crash mid-append
        lines_before = len((tmp_path / "state" / "journal.jsonl").read_text().splitlines())
        again = run_daemon(campaign)
        assert again.returncode == 0, again.stderr[-2000:]
        rebuilt = [r for r in journal(tmp_path) if r.get("event") == "state.rebuilt"]
        assert rebuilt and f"state.json: {next(iter(bad))}" in rebuilt[-1]["warning"]
        lines = (tmp_path / "state" / "journal.jsonl").read_text().splitlines()
        assert lines[lines_before - 1] == '{"event": "transition", "seq": 99, "snap'
        assert json.loads(lines[lines_before])["event"] == "state.rebuilt"  # not fused onto the torn line
        assert json.loads(state_file.read_text())["state"] == "DONE"
    finally:
        kill_tree_leftovers(tmp_path)
