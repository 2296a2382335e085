"""Checkpoint detection latency: tracker written -> ``checkpoint.committed`` event, inotify vs poll.

Usage::

    python tests/bench/bench_checkpoints.py [--saves 200] [--dir D] [--poll-interval 0.05] [--keep 20]

Without ``--dir`` it mounts a private tmpfs (needs root) and unmounts it at the end. A writer
child process plays Megatron: for each save it writes ``iter_N``'s shards, ``.metadata``,
``common.pt`` and ``metadata.json``, then, last, the tracker with a plain ``open('w')``. It reads
``time.monotonic_ns()`` (one clock for the whole machine) just before that open and reports it;
the daemon side records the same clock when the watcher's event reaches ``emit``. The writer
keeps the newest ``--keep`` iter dirs (a round's worth at save-interval 1: the most that
retention leaves), so every rescan reads a realistic save dir. Saves are spaced by a random gap
(up to one poll interval in poll mode) so that they do not fall in step with the poll ticks.

Prints ONE JSON object::

    {"bench": "checkpoint_detection", "inotify": {"n", "p50_ms", "p95_ms", "max_ms"},
     "poll": {...}, "poll_interval_s": ..., ...}

SPEC §9's bar: <= 5 ms p95 with inotify, <= one poll interval without it. Not a pytest test
(pytest collects test_*.py only).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"


def writer(save_dir: Path, keep: int, shard_bytes: int) -> None:
    """The Megatron stand-in: one line "N" in, one save written, "N t0_ns" out."""
    save_dir.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(shard_bytes)
    for line in sys.stdin:
        n = int(line)
        old = save_dir / f"iter_{n - keep:07d}"
        if n - keep >= 0 and old.exists():
            shutil.rmtree(old)
        d = save_dir / f"iter_{n:07d}"
        d.mkdir()
        for name in ("__0_0.distcp", "__1_0.distcp"):
            (d / name).write_bytes(payload)
        (d / ".metadata").write_bytes(payload[:512])
        (d / "common.pt").write_bytes(payload[:1024])
        (d / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
        t0 = time.monotonic_ns()
        with open(save_dir / TRACKER, "w") as f:  # Megatron: plain, non-atomic, last
            f.write(str(n))
        print(n, t0, flush=True)


async def measure(
    mode: str, save_dir: Path, saves: int, poll_interval: float, keep: int, shard_bytes: int
) -> list[float]:
    import anyio
    from anyio.streams.buffered import BufferedByteReceiveStream

    from shoprld.daemon.foundation.storage.ckptwatch import CheckpointWatcher

    got: dict[int, int] = {}
    changed = anyio.Event()

    def emit(event: dict[str, Any]) -> None:
        nonlocal changed
        if event["event"] == "checkpoint.committed":
            got[event["iteration"]] = time.monotonic_ns()
            changed.set()
            changed = anyio.Event()

    save_dir.mkdir(parents=True)
    watcher = CheckpointWatcher(save_dir, mode=mode, poll_interval=poll_interval)  # type: ignore[arg-type]
    cmd = [sys.executable, __file__, "--writer", str(save_dir), "--keep", str(keep), "--shard-bytes", str(shard_bytes)]
    latencies: list[float] = []
    async with await anyio.open_process(cmd, stderr=None) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        out = BufferedByteReceiveStream(proc.stdout)
        async with anyio.create_task_group() as tg:
            await tg.start(watcher.run, emit)
            assert watcher.mode == mode, f"wanted {mode}, watcher runs {watcher.mode}"
            jitter = poll_interval if mode == "poll" else 0.002
            for n in range(1, saves + 1):
                await anyio.sleep(random.uniform(0, jitter))
                await proc.stdin.send(f"{n}\n".encode())
                with anyio.fail_after(10):
                    n_echo, t0 = (int(x) for x in (await out.receive_until(b"\n", 100)).split())
                    assert n_echo == n
                    while n not in got:
                        await changed.wait()
                latencies.append((got[n] - t0) / 1e6)
            tg.cancel_scope.cancel()
        await proc.stdin.aclose()
    return latencies


def summary(lat: list[float]) -> dict[str, Any]:
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return {
        "n": len(lat),
        "p50_ms": round(statistics.median(lat), 3),
        "p95_ms": round(q[94], 3),
        "max_ms": round(max(lat), 3),
    }


def fstype(path: Path) -> str:
    from shoprld.daemon.foundation.storage.ckptwatch import _fstype_of

    return _fstype_of(path, Path("/proc/self/mountinfo")) or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--saves", type=int, default=200)
    ap.add_argument("--dir", type=Path, help="use this dir (ideally on a tmpfs) instead of mounting one")
    ap.add_argument("--poll-interval", type=float, default=0.05)
    ap.add_argument("--keep", type=int, default=20, help="iter dirs kept in the save dir")
    ap.add_argument("--shard-bytes", type=int, default=64 * 1024)
    ap.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer is not None:
        writer(args.writer, args.keep, args.shard_bytes)
        return 0

    import anyio

    mounted: Path | None = None
    if args.dir is None:
        if os.geteuid() != 0:
            print("bench_checkpoints: mounting a tmpfs needs root; pass --dir D instead", file=sys.stderr)
            return 2
        mounted = Path(tempfile.mkdtemp(prefix="shoprld-bench-"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mounted)], check=True)
    base = Path(tempfile.mkdtemp(prefix="ckpt-", dir=mounted or args.dir))
    try:
        result: dict[str, Any] = {"bench": "checkpoint_detection"}
        for mode in ("inotify", "poll"):
            lat = anyio.run(measure, mode, base / mode, args.saves, args.poll_interval, args.keep, args.shard_bytes)
            result[mode] = summary(lat)
        result.update(
            poll_interval_s=args.poll_interval, fs=fstype(base), kept_dirs=args.keep,
            bar="inotify p95 <= 5 ms; poll <= one poll interval",
        )  # fmt: skip
        print(json.dumps(result))
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if mounted is not None:
            if subprocess.run(["umount", str(mounted)]).returncode != 0:
                subprocess.run(["umount", "-l", str(mounted)])
            mounted.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
