"""Every file of the state dir at once holding valid JSON of another shape (a list, a string,
an object of wrong types, a time stamp from the future): the daemon starts, rebuilds what it
needs, runs the campaign to the end (exit 0), and says which file it rebuilt; no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon
from tests.receiver import Receiver

SHAPES = {
    "list": [1, 2, {"state": "TRAIN"}],
    "string": "text",
    "wrong types": {"state": 5, "round": "r", "seq": "s", "sent": ["x"], "last_digest": "soon", "iteration": "i",
                    "outage": "yes", "campaign": 7, "undelivered": {"a": 1}, "rounds_recorded": -3},
}
FILES = ("state.json", "status.json", "identity.json", "alerts.json", "shopsim.witness", "rounds.jsonl",
         "journal.jsonl", "daemon.pid")


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_state_file_of_another_shape_is_rebuilt(tmp_path: Path, shape: str) -> None:
    campaign = make_tree(tmp_path, rounds=1)
    campaign.write_text(campaign.read_text() + '\n[notify]\nendpoints = [{ kind = "webhook", url_env = '
                                               '"SHOPRLD_WEBHOOK_URL", events = ["done"] }]\n')
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    for name in FILES:
        (state / name).write_text(json.dumps(SHAPES[shape]) + "\n")
    with Receiver() as r:
        env = tmp_path / "repo" / ".env"
        env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={r.url}\n")
        proc = run_daemon(campaign, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert r.events() == ["done"]  # the garbage alerts.json silenced nothing
    rebuilt = [j for j in journal(tmp_path) if isinstance(j, dict) and j.get("event") == "state.rebuilt"]
    assert any(j.get("file") == str(state / "alerts.json") for j in rebuilt), rebuilt
    assert any("state.json" in str(j.get("warning")) for j in rebuilt), rebuilt
    assert (state / "alerts.json.bad").read_text() == json.dumps(SHAPES[shape]) + "\n"
