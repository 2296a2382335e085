"""Benchmark: end-to-end latency of ``shoprld status`` (SPEC §9: --json ≤ 100 ms, human ≤ 200 ms).

Run: ``.venv/bin/python tests/bench/bench_status.py [--runs 30]``. Prints ONE JSON object.

It builds a temp campaign (TOML + state dir + a realistic mid-campaign status.json) and a
live lock holder (the daemon's own ``Store.acquire_lock`` in a child), so the liveness probe
runs its full path. Then it times, as subprocesses of the installed entry point:

- ``json``: ``shoprld status --json`` with stdout on a pipe;
- ``human``: ``shoprld status`` with stdout on a pipe (the plain renderer, no rich);
- ``human_tty``: ``shoprld status`` on a pseudo-terminal (the rich renderer), read to EOF;
- ``python_floor``: ``python -c pass`` with the same interpreter (site and .pth included).

The timed runs use cached bytecode (PYTHONDONTWRITEBYTECODE is dropped; warm-up runs write
the .pyc files), as an operator's shell does.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SHOPRLD = VENV_BIN / "shoprld" if (VENV_BIN / "shoprld").exists() else ROOT / ".venv" / "bin" / "shoprld"
PYTHON = VENV_BIN / "python"

if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from tests.demotree import LOCK_HOLDER, ready_child, status_snapshot  # noqa: E402


def snapshot(now: float, pid: int) -> dict[str, object]:
    """The tests' mid-campaign snapshot for campaign bench and daemon ``pid``, with real-length
    paths and a sidecar child."""
    return status_snapshot(
        now, campaign="bench", daemon={"pid": pid, "started_at": now - 7380},
        last_checkpoint={"iteration": 59, "path": "/ephemeral/nemo-rl/ubuntu/nemo-rl-auto-research/bench/"
                         "qwen35-4b/checkpoints/megatron/iter_0000059", "complete": True,
                         "bytes": 56_800_000_000, "committed_at": now - 125},
        children=[
            {"role": "shopsim", "pid": 4300, "started_at": now - 7300, "log": "/ephemeral/.../logs/shopsim.log"},
            {"role": "sidecar", "pid": 5002, "started_at": now - 4300, "log": "/ephemeral/.../logs/r002-sidecar.log"},
            {"role": "trainer", "pid": 5001, "started_at": now - 4320, "log": "/ephemeral/.../logs/r002-train.log"},
        ])


def run_pipe(argv: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{argv}: exit {res.returncode}: {res.stderr.decode()}")
    return dt


def run_pty(argv: list[str], env: dict[str, str]) -> float:
    leader, follower = pty.openpty()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    sel = selectors.DefaultSelector()
    sel.register(leader, selectors.EVENT_READ)
    try:
        while True:
            if not sel.select(timeout=10):
                raise SystemExit(f"{argv}: no output for 10 s")
            try:
                if not os.read(leader, 65536):
                    break
            except OSError:  # EIO: the child side is closed
                break
        rc = proc.wait(timeout=10)
    finally:
        os.close(leader)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{argv}: exit {rc}")
    return dt


def summarize(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return {"p50_ms": round(statistics.median(ms), 1), "p95_ms": round(p95, 1), "min_ms": round(ms[0], 1),
            "runs": len(ms)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoprld-bench-") as tmp:
        state = Path(tmp) / "state"
        cfg = Path(tmp) / "bench.toml"
        cfg.write_text('[campaign]\nname = "bench"\nexperiment = "qwen35-4b"\nrounds = 5\nsteps_per_round = 20\n'
                       f'[storage]\nstate_dir = "{state}"\n[train]\ncommand = ["python", "train.py"]\n')
        with ready_child(LOCK_HOLDER, str(state), stdin=subprocess.PIPE, python=str(PYTHON)) as holder:
            (state / "status.json").write_text(json.dumps(snapshot(time.time(), holder.pid), indent=2))
            env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
            env.pop("NO_COLOR", None)
            # An operator's shell writes .pyc files; a PYTHONDONTWRITEBYTECODE=1 left in the
            # environment (some CI images) would recompile every module on every run.
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
            cases = {
                "json": lambda: run_pipe([str(SHOPRLD), "status", "--json", "-c", str(cfg)]),
                "human": lambda: run_pipe([str(SHOPRLD), "status", "-c", str(cfg)]),
                "human_tty": lambda: run_pty([str(SHOPRLD), "status", "-c", str(cfg)], env),
                "python_floor": lambda: run_pipe([str(PYTHON), "-c", "pass"]),
            }
            for fn in cases.values():  # warm the page cache and .pyc files
                fn()
            samples: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(args.runs):  # interleaved, so drift hits every case alike
                for name, fn in cases.items():
                    samples[name].append(fn())
    out = {"bench": "status_latency", "budget_ms": {"json": 100, "human": 200}, "cpus": os.cpu_count(),
           "loadavg_1m": round(os.getloadavg()[0], 2),
           **{k: summarize(v) for k, v in samples.items()}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
