"""Issue 28, item 1 end to end: a gate tool that crashes is a failure with a bundle and a page
that carries the exception's line, even though gate.policy = "continue" lets the round go on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon
from tests.receiver import Receiver

CRASHING_GATE = """import sys
print("loading pool", flush=True)
print("Traceback (most recent call last):", flush=True)
print('  File "shopsimrl/training/online_gate.py", line 88, in main', flush=True)
print("KeyError: 'rho'", flush=True)
sys.exit(1)
"""


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def test_a_crashing_gate_tool_is_bundled_and_paged_with_its_exception(tmp_path: Path) -> None:
    gate = tmp_path / "crash_gate.py"
    gate.write_text(CRASHING_GATE)
    with Receiver() as r:
        campaign = make_tree(tmp_path, rounds=1, edits={
            r'"\{demo_dir\}/shopsimrl\.py", "training", "online-gate"': f'"{gate}", "online-gate"'})
        campaign.write_text(campaign.read_text() + '\n[notify]\nendpoints = [{ kind = "webhook", '
                            'url_env = "SHOPRLD_WEBHOOK_URL" }]\nbackoff = 0.05\n')
        env = tmp_path / "repo" / ".env"
        env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={r.url}\n")
        proc = run_daemon(campaign, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]  # gate.policy = continue: the round goes on
    failed = [j for j in journal(tmp_path) if j["event"] == "attempt.failed"]
    assert [(j["state"], j["cause"]["name"], j["cause"]["detail"]) for j in failed] == \
        [("GATE", "python_exception", "KeyError: 'rho'")]
    bundle = Path(failed[0]["bundle"])
    assert bundle.name == "round-000-GATE-1" and json.loads((bundle / "bundle.json").read_text())["state"] == "GATE"
    pages = [q.json() for q in r.requests if q.json()["event"] == "failed"]
    assert len(pages) == 1 and pages[0]["detail"] == "KeyError: 'rho'" and pages[0]["bundle"] == str(bundle)
    assert "the stage goes on" in pages[0]["message"] and r.events()[-1] == "done"
