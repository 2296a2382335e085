"""A state dir knows which campaign it belongs to (issue 15, bug 1).

The default state dir is ``$XDG_STATE_HOME/shoprld/<name>``: two campaigns with the same name,
in different repos and on different volumes, used to share it, and the second inherited the
first's start, deadline and finished rounds (it exited DONE with 0 rounds trained).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.demotree import SHOPRLD, kill_tree_leftovers, make_tree, run_daemon

# The default state dir: no storage.state_dir, so both trees resolve to $XDG_STATE_HOME/shoprld/demo.
NO_STATE_DIR = {r'^state_dir = "state"\n': ""}


def _status(campaign: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHOPRLD, "status", "--json", "-c", str(campaign)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


def test_a_second_campaign_with_the_same_name_is_refused_the_first_ones_state(tmp_path: Path) -> None:
    """Campaign A runs; campaign B (same name, other repo and volume, same XDG_STATE_HOME) is refused
    in one line, exit 3, naming the state dir; A's state is untouched, and `status -c B` does not
    show A's results as B's."""
    xdg = tmp_path / "xdg"
    env = {"XDG_STATE_HOME": str(xdg), "STATE_DIRECTORY": ""}
    a = make_tree(tmp_path / "a", rounds=1, edits=NO_STATE_DIR)
    b = make_tree(tmp_path / "b", rounds=1, edits=NO_STATE_DIR)
    state = xdg / "shoprld" / "demo"
    try:
        first = run_daemon(a, env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        before = {p.name: p.read_bytes() for p in state.iterdir() if p.is_file() and p.name != "lock"}

        second = run_daemon(b, env=env, timeout=60)
        assert second.returncode == 3, (second.returncode, second.stderr[-2000:])
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"shoprld: {state}: this state dir belongs to another campaign")
        assert "repo" in lines[0] and "ephemeral_root" in lines[0] and "--adopt-state" in lines[0]
        after = {p.name: p.read_bytes() for p in state.iterdir() if p.is_file() and p.name != "lock"}
        assert after == before  # nothing of A's was rewritten (status.json included)
        assert not (tmp_path / "b" / "repo" / "reports" / "shoprld" / "demo.tsv").exists()

        st = _status(b, env)
        assert st.returncode == 3 and st.stdout == "", (st.returncode, st.stdout[-500:])
        assert len(st.stderr.strip().splitlines()) == 1 and "belongs to another campaign" in st.stderr
        assert _status(a, env).returncode == 0  # A's own status is still shown
        assert json.loads((state / "identity.json").read_text())["repo"] == str(tmp_path / "a" / "repo")
    finally:
        kill_tree_leftovers(tmp_path / "a")
        kill_tree_leftovers(tmp_path / "b")


def test_a_state_dir_from_before_identities_is_adopted_by_its_own_campaign_only(tmp_path: Path) -> None:
    """A finished state dir without identity.json (written by an older shoprld): campaign B is
    refused (A's recorded paths lie outside B's volume); A itself adopts it and writes the identity."""
    xdg = tmp_path / "xdg"
    env = {"XDG_STATE_HOME": str(xdg), "STATE_DIRECTORY": ""}
    a = make_tree(tmp_path / "a", rounds=1, edits=NO_STATE_DIR)
    b = make_tree(tmp_path / "b", rounds=1, edits=NO_STATE_DIR)
    state = xdg / "shoprld" / "demo"
    try:
        assert run_daemon(a, env=env).returncode == 0
        (state / "identity.json").unlink(missing_ok=True)
        second = run_daemon(b, env=env, timeout=60)
        assert second.returncode == 3 and len(second.stderr.strip().splitlines()) == 1, second.stderr
        assert "belongs to another campaign" in second.stderr and "ephemeral_root" in second.stderr
        assert not (state / "identity.json").exists()
        again = run_daemon(a, env=env)
        assert again.returncode == 0, again.stderr[-2000:]
        ident = json.loads((state / "identity.json").read_text())
        assert ident["ephemeral_root"] == str(tmp_path / "a" / "ephemeral") and ident["adopted_from"] == "legacy"
    finally:
        kill_tree_leftovers(tmp_path / "a")
        kill_tree_leftovers(tmp_path / "b")
