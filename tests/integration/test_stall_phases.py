"""The phase-aware stall verdict on real campaigns (issue 30): the stand-in trainer makes the
signals a real slime job makes (its timer and step lines, ShopSim requests in the service's
request log, generated tokens on its engine's /metrics) and each hang shape stops exactly the
ones the real hang stopped:

- slime#1484: the engines report ready, then nothing: no line, no ShopSim request, no token
  (the engine's /metrics still answers);
- slime#1487: the rollout completes, ``Timer actor_train start``, then no trainer line; the
  engine's access lines go on (noise, as in the thread's log);
- the false positive that must never fire: a step 60x slower whose requests and tokens keep
  moving. Without those signals the same step is called a hang at every relaunch (so the test
  can fail).

Each verdict's time is the journal's ``idle_s``: seconds in the demo's time, real minutes at the
bench's 1/1000 scale would be these x 1000 / 60.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, reference_run, results, run_daemon

ROUNDS = 2
ROUND1_START = 21  # round-001's launch resumes at round-000's end (iteration 20) + 1


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_run(tmp_path_factory.mktemp("ref-stall"), ROUNDS)


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _campaign(tmp_path: Path, *, watched: bool = True) -> tuple[Path, dict[str, str]]:
    """A 2-round demo campaign whose ShopSim logs each request (as the real service does, in its
    cwd) and whose trainer serves its engine's /metrics; ``watched=False`` gives the daemon
    neither (only the trainer's lines)."""
    cwd = tmp_path / "shopsim-cwd"
    cwd.mkdir()
    port = _free_port()
    edits = {r'^stall_min = "4s"$': 'stall_min = "4s"'
             + (f'\nengine_metrics_url = "http://127.0.0.1:{port}/metrics"' if watched else "")}
    if watched:
        edits[r'^command = \["\{python\}", "\{demo_dir\}/shopsim.py"\]$'] = (
            'command = ["{python}", "{demo_dir}/shopsim.py", "--agent-log", "shop_agent.log"]\n'
            f'cwd = "{cwd}"')
    env = {"DEMO_ENGINE_METRICS_PORT": str(port), "DEMO_GEN_SECONDS": "0.01", "DEMO_FAULT_ONCE_DIR": str(tmp_path)}
    return make_tree(tmp_path, rounds=ROUNDS, edits=edits), env


def _stalls(root: Path) -> list[dict[str, object]]:
    return [r for r in journal(root) if r["event"] == "train.stall"]


def test_1484_hang_after_the_engines_start(reference: Path, tmp_path: Path) -> None:
    """Round-001's launch hangs after its engines' ready line: a LOADING verdict, from the bound
    round-000's launch taught, then a relaunch and the reference results."""
    campaign, env = _campaign(tmp_path)
    env["DEMO_HANG_AFTER_ENGINES_AT"] = str(ROUND1_START)
    proc = run_daemon(campaign, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stalls = _stalls(tmp_path)
    assert len(stalls) == 1, stalls
    s = stalls[0]
    assert s["round"] == 1 and s["phase"] == "loading" and str(s["basis"]).startswith("learned from")
    # every signal of LOADING was still (the trainer's lines, ShopSim's requests, the tokens)
    assert all(age is None or float(age) >= float(s["limit_s"]) for age in dict(s["signals"]).values()), s
    assert float(s["limit_s"]) < 3 * 4.0  # under the old rule's stall_factor x stall_min
    assert results(tmp_path) == results(reference)


def test_1487_hang_in_training_with_the_engines_still_talking(reference: Path, tmp_path: Path) -> None:
    """Rollout 25 completes, training starts and hangs; the engine prints a health-check access
    line every 50 ms, which matches slime's line format nowhere and is ignored: a TRAINING
    verdict."""
    campaign, env = _campaign(tmp_path)
    env.update({"DEMO_HANG_IN_TRAIN_AT": "25", "DEMO_ENGINE_PING_S": "0.05"})
    proc = run_daemon(campaign, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stalls = _stalls(tmp_path)
    assert len(stalls) == 1, stalls
    s = stalls[0]
    assert s["round"] == 1 and s["phase"] == "training" and str(s["basis"]).startswith("learned from")
    log = next((tmp_path / "ephemeral").rglob("r001-train.log")).read_text()
    assert '"GET /health HTTP/1.1" 200 OK' in log  # the noise was there
    assert results(tmp_path) == results(reference)


@pytest.mark.parametrize("watched", [True, False], ids=["signals-watched", "signals-unwatched"])
def test_slow_step_with_moving_signals_is_no_hang(reference: Path, tmp_path: Path, watched: bool) -> None:
    """Rollout 25's generations run 60x slower (its step many times the usual), ShopSim requests
    and tokens moving all along: no verdict. With neither signal watched, the same step is one."""
    campaign, env = _campaign(tmp_path, watched=watched)
    env["DEMO_SLOW_AT"] = "25:60"
    proc = run_daemon(campaign, env=env)
    stalls = _stalls(tmp_path)
    if watched:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert stalls == []
        assert results(tmp_path) == results(reference)
    else:  # killed as hung at every relaunch (the slow rollout is slow every time)
        assert stalls and all(s["phase"] == "rollout" for s in stalls)
