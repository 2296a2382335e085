"""The phase-aware stall verdict on each real hang shape, at the seed timeline's 1/1000 scale
(issue 30, "Show": the verdict on each hang shape and on the false positive, in real minutes).

    .venv/bin/python tests/bench/bench_hangs.py [--keep DIR] [--timeout S]

A script, not a test. Prints ONE JSON object on stdout: ``{"bench": "hangs", "scale": 1000,
"shapes": {name: {...}}, ...}``; progress goes to stderr.

Each shape runs shoprld alone on bench_timeline's tree (the same scaled campaign: 20 steps of
~0.85 s, ShopSim's request log and the engine stand-in's ``/metrics`` watched, the recipe's
``stall_quiet_min`` of 5 min scaled, ``train.follow_interval`` 0.05 s). Round-000 runs clean, so
the verdict has learned each phase's bound from it; the shape strikes in round-001, and the run is
stopped (SIGTERM to the daemon, which stops its children) once the verdict and its relaunch are in
the journal, or, for the false positive, once the slow step and two more are done:

- ``slime#1484``: round-001's launch prints its engines' ready line, then nothing
  (DEMO_HANG_AFTER_ENGINES_AT): a LOADING verdict;
- ``slime#1487``: a rollout completes, ``Timer actor_train start``, then no trainer line, while
  the engines' health-check access lines go on (DEMO_HANG_IN_TRAIN_AT, DEMO_ENGINE_PING_S): a
  TRAINING verdict;
- ``stall``: the bench_timeline's own fault, a trainer that stops at a rollout's start
  (DEMO_STALL_AT): a ROLLOUT verdict;
- ``slow x3``: a step three times slower than usual, its ShopSim requests and tokens moving
  (DEMO_SLOW_AT): no verdict.

Each row: the phase, the still time and the bound (bench seconds and real minutes), the bound's
basis, and what the older rule (no progress line for max(stall_factor x median step, stall_min))
would have waited, in real minutes.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_timeline import SCALE, STEP_SLEEP, build_tree, campaign_env, daemon_env, GEN_S  # noqa: E402
from common import cleanup_tree, emit_json, journal, log, machine, stop_daemon  # noqa: E402

from tests.demotree import SHOPRLD  # noqa: E402

STEPS = 20
ROUND1_START = STEPS + 1   # round-001's launch resumes at round-000's end + 1
AT = ROUND1_START + 8      # mid-round
OLD_RULE_S = max(1800 / SCALE, 3 * 0.85)  # the older rule: max(stall_min, 3 x median step)
PING_S = 0.15  # slime#1487's log: the engines' health checks every 15 s; 10x sparser here (CPU)
SHAPES: dict[str, dict[str, str]] = {
    "slime#1484": {"DEMO_HANG_AFTER_ENGINES_AT": str(ROUND1_START)},
    "slime#1487": {"DEMO_HANG_IN_TRAIN_AT": str(AT), "DEMO_ENGINE_PING_S": str(PING_S)},
    "stall": {"DEMO_STALL_AT": str(AT)},
    "slow x3": {"DEMO_SLOW_AT": f"{AT}:3"},
}


def records(root: Path) -> list[dict[str, Any]]:
    """The campaign's journal so far (none before the daemon writes its first line)."""
    try:
        return journal(root)
    except OSError:
        return []


def real_min(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * SCALE / 60, 1)


def run_shape(root: Path, name: str, extra: dict[str, str], timeout: float) -> dict[str, Any]:
    tree = build_tree(root, STEPS, STEP_SLEEP, saves="adaptive")
    env = {**campaign_env(root, None), **extra, "DEMO_FAULT_ONCE_DIR": str(root / "fault-marks"),
           "DEMO_GEN_SECONDS": str(GEN_S), "DEMO_ENGINE_METRICS_PORT": tree["engine_port"]}
    t0 = time.monotonic()
    with open(root / "daemon.log", "wb") as out:
        proc = subprocess.Popen([*SHOPRLD, "run", "-c", str(tree["campaign"])], env=daemon_env(env),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    done_at: float | None = None
    try:
        while time.monotonic() - t0 < timeout and proc.poll() is None:
            recs = records(root)
            stalls = [r for r in recs if r["event"] == "train.stall"]
            relaunched = stalls and any(r["event"] == "stage.spawn" and r.get("role") == "trainer"
                                        and r["t"] > stalls[0]["t"] for r in recs)
            progressed = any(r["event"] == "checkpoint.committed" and int(r.get("iteration") or 0) >= AT + 2
                             for r in recs)
            if relaunched or (name.startswith("slow") and progressed):
                done_at = time.monotonic() - t0
                break
            time.sleep(0.1)
    finally:
        stop_daemon(proc)
        cleanup_tree(root)
    recs = records(root)
    verdicts = [{"round": r.get("round"), "phase": r.get("phase"), "idle_s": r.get("idle_s"),
                 "idle_real_min": real_min(r.get("idle_s")), "limit_s": r.get("limit_s"),
                 "limit_real_min": real_min(r.get("limit_s")), "basis": r.get("basis"),
                 "last_moved_s": r.get("signals")} for r in recs if r["event"] == "train.stall"]
    return {"env": extra, "verdicts": verdicts, "finished": done_at is not None,
            "wall_s": round(done_at if done_at is not None else time.monotonic() - t0, 2),
            "old_rule_real_min": real_min(OLD_RULE_S)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="work in this dir and keep it (default: a temp dir, removed)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per shape, seconds")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="shoprld-bench-hangs-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"bench": "hangs", "scale": SCALE, "steps_per_round": STEPS, "machine": machine(),
                              "shapes": {}}
    try:
        for name, extra in SHAPES.items():
            root = work / name.replace("#", "").replace(" ", "-")
            if root.exists():
                shutil.rmtree(root)
            root.mkdir(parents=True)
            log(f"{name}: {extra} ...")
            report["shapes"][name] = row = run_shape(root, name, extra, a.timeout)
            log(f"{name}: {row['verdicts'] or 'no verdict'}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    emit_json(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
