"""Bench: disk reaction time, hard limit crossed -> trainer signalled (SPEC §9 bar: <= 1 s).

A script, not a test (pytest does not collect ``bench_*.py``). Run as root:

    .venv/bin/python tests/bench/bench_disk.py [--trials 25] [--interval 0.2] 2>/dev/null

Each trial, on a real 20 MiB tmpfs: a real child (``sleep 1000`` in its own session) stands in
for the trainer; the disk monitor samples every ``interval`` seconds and its callback sends
SIGTERM to the child's process group on ``disk.hard_limit``; another thread waits a random
moment, then fills the volume past the hard limit in one write. The latency is from that write's
completion to the ``killpg`` call. Prints ONE JSON line on stdout; logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `shoprld` and `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio
import structlog
from shoprld.daemon.foundation.storage import disk, diskbudget

from tests.fsfixtures import mount_tmpfs

MiB = 1 << 20
LIMITS = diskbudget.Limits(soft_bytes=8 * MiB, hard_bytes=4 * MiB, soft_inodes=20, hard_inodes=10)


def fill_at_random_moment(path: Path, delay: float) -> float:
    """Sleep `delay`, then take the volume to 1 MiB free in one write; return when it completed."""
    time.sleep(delay)
    room = disk.sample(path.parent).free_bytes - MiB
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(b"\0" * room)
        while view:
            view = view[os.write(fd, view) :]
        return time.perf_counter()
    finally:
        os.close(fd)


async def trial(root: Path, interval: float, delay: float) -> float:
    """One trial; returns the reaction latency in seconds."""
    child = subprocess.Popen(
        ["sleep", "1000"], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    signalled_at: list[float] = []
    done = anyio.Event()

    async def on_event(ev: dict[str, Any]) -> None:
        if ev["event"] == "disk.hard_limit" and not signalled_at:
            signalled_at.append(time.perf_counter())
            os.killpg(child.pid, signal.SIGTERM)
            done.set()

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                guard = disk.Guard(LIMITS, hysteresis_bytes=MiB)
                await tg.start(partial(disk.monitor, interval=interval), root, guard, on_event)
                filled_at = await anyio.to_thread.run_sync(fill_at_random_moment, root / "filler", delay)
                await done.wait()
                tg.cancel_scope.cancel()
        returncode = await anyio.to_thread.run_sync(child.wait, 5)
        if returncode != -signal.SIGTERM:
            raise RuntimeError(f"trainer stand-in exited {returncode}, expected SIGTERM")
        return signalled_at[0] - filled_at
    finally:
        if child.poll() is None:  # the owner always reaps, whatever happened above
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        (root / "filler").unlink(missing_ok=True)


def nearest_rank(xs: list[float], q: float) -> float:
    """The q-quantile of `xs` by the nearest-rank method."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=25)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    if args.trials < 20:
        ap.error("use at least 20 trials")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    rng = random.Random(args.seed)
    with mount_tmpfs("20m") as root:
        lat = [await trial(root, args.interval, rng.uniform(0, 3 * args.interval)) for _ in range(args.trials)]
    ms = [x * 1000 for x in lat]
    print(
        json.dumps(
            {
                "bench": "disk_reaction",
                "n": len(ms),
                "interval_s": args.interval,
                "p50_ms": round(nearest_rank(ms, 0.5), 1),
                "p95_ms": round(nearest_rank(ms, 0.95), 1),
                "max_ms": round(max(ms), 1),
                "min_ms": round(min(ms), 1),
                "bar_ms": 1000,
            }
        )
    )


if __name__ == "__main__":
    anyio.run(main)
