"""A crash of one of the daemon's own tasks (here the hygiene scan after round 0, with ShopSim
and the round's children up) is one stderr line, exit 1, no traceback, and every child the
daemon started is stopped: nothing carrying the campaign's tag is left running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, proc_environ, proc_pids, run_daemon


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _tagged(root: Path) -> list[int]:
    want = f"SHOPRLD_CHILD={root / 'state'}|".encode()
    return [pid for pid in proc_pids() if pid != os.getpid() and want in (proc_environ(pid) or b"")]


@pytest.mark.parametrize("task", ["hygiene scan#2", "notify", "ShopSim supervisor"])
def test_a_crashing_task_stops_the_campaign_and_its_children_in_one_line(tmp_path: Path, task: str) -> None:
    campaign = make_tree(tmp_path, rounds=2)
    proc = run_daemon(campaign, env={"SHOPRLD_TEST_RAISE": task}, timeout=240)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    name = task.partition("#")[0]
    assert len(err) == 1 and err[0].startswith(f"shoprld: internal error: the daemon's {name} task failed "
                                               f"(RuntimeError: injected failure"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert _tagged(tmp_path) == []
    assert any(j["event"] == "stage.error" and "internal error" in j["error"] for j in journal(tmp_path))
