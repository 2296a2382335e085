"""Helpers shared by the campaign benchmarks (bench_timeline, bench_engine, bench_soak).

Not a test module: pytest collects ``test_*.py`` only. Every benchmark prints ONE JSON object
on stdout; everything else (progress, child output) goes to stderr or to files.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `tests` importable
    sys.path.insert(0, str(ROOT))

from tests.demotree import journal, kill_tree_leftovers, make_tree, proc_environ, proc_pids, proc_stat  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
SHIM = BENCH_DIR / "shim.py"
SEED_LOOP = BENCH_DIR / "seed_loop.sh"
PYTHON = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def log(*parts: object) -> None:
    print("[bench]", *parts, file=sys.stderr, flush=True)


def emit_json(obj: dict[str, Any]) -> None:
    """The benchmark's one stdout line."""
    sys.stdout.write(json.dumps(obj, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def machine() -> dict[str, Any]:
    """What the figures were measured on (they depend on it: 2 shared cores here)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (math.nan,) * 3
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
            "loadavg_at_start": [round(x, 2) for x in load], "python": platform.python_version(),
            "kernel": platform.release()}


def pct(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def summary(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(statistics.median(values), digits),
            "p95": round(pct(values, 95) or 0.0, digits), "max": round(max(values), digits),
            "mean": round(statistics.fmean(values), digits)}


def linreg(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x: (slope b, intercept a, r^2)."""
    n = len(xs)
    if n < 2:
        return 0.0, ys[0] if ys else 0.0, 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0:
        return 0.0, my, 0.0
    b = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy else 1.0
    return b, my - b * mx, r2


# -- /proc sampling ---------------------------------------------------------------------------
def proc_sample(pid: int) -> dict[str, Any] | None:
    """RSS (KiB), peak RSS (KiB), threads, open fds, CPU seconds (user+system) of one process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    fields: dict[str, int] = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            fields[key] = int(rest.split()[0])
    rest = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
    utime, stime = int(rest[11]), int(rest[12])
    return {"t": time.monotonic(), "rss_kib": fields.get("VmRSS", 0), "hwm_kib": fields.get("VmHWM", 0),
            "threads": fields.get("Threads", 0), "fds": fds, "cpu_s": (utime + stime) / CLK_TCK}


class Sampler:
    """Samples one pid every ``interval`` seconds in a thread, until stopped or the pid is gone."""

    def __init__(self, pid: int, interval: float, extra: Any = None) -> None:
        self.pid, self.interval, self.extra = pid, interval, extra
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            s = proc_sample(self.pid)
            if s is None:
                return
            if self.extra is not None:
                try:
                    s.update(self.extra())
                except Exception:  # a torn read of a file the daemon is writing: skip the field
                    pass
            self.samples.append(s)
            self._stop.wait(self.interval)

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.samples


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc/*/stat's ppid)."""
    children: dict[int, list[int]] = {}
    for entry in proc_pids():
        fields = proc_stat(entry)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(entry)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (a KEY=VALUE prefix)."""
    want = tag.encode()
    found = []
    for entry in proc_pids():
        env = proc_environ(entry)
        if env is not None and any(item.startswith(want) for item in env.split(b"\0")):
            found.append(entry)
    return found


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_daemon(proc: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM a daemon this benchmark started (it stops its children), SIGKILL it after ``grace``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cleanup_tree(root: Path) -> None:
    """Stop everything a benchmark started under ``root`` (the daemon's tag, or the bash
    runner's, which uses the same SHOPRLD_CHILD=<root>/state| prefix)."""
    kill_tree_leftovers(root)


# -- journals and logs -----------------------------------------------------------------------------
# slime's per-step perf line, as the trainer stand-in prints it (run/demo/slime_train.py):
# "[time] rollout_metrics.py:N - perf <id>: {"perf/step_time": S}". The older stand-in's
# "rollout N/M step_time=S" line no longer exists: matching it found no step at all, so the
# ShopSim-death fault never fired and no step counted as re-run.
ROLLOUT_RE = re.compile(rb'- perf (\d+): \{"perf/step_time": ([0-9.]+)')


def rollouts_in(paths: Iterable[Path]) -> list[tuple[int, float]]:
    """Every step's perf line in these logs, in order: (rollout id, step seconds)."""
    out = []
    for p in paths:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        out += [(int(m.group(1)), float(m.group(2))) for m in ROLLOUT_RE.finditer(data)]
    return out


def work_lost(rollouts: list[tuple[int, float]]) -> dict[str, Any]:
    """Steps run more than once, and the trainer-seconds they cost (all runs but the last)."""
    seen: dict[int, list[float]] = {}
    for rid, s in rollouts:
        seen.setdefault(rid, []).append(s)
    rerun = {rid: v[:-1] for rid, v in seen.items() if len(v) > 1}
    return {"steps_run": len(rollouts), "unique_steps": len(seen),
            "steps_rerun": sum(len(v) for v in rerun.values()),
            "trainer_s_lost": round(sum(sum(v) for v in rerun.values()), 2)}


def success_rates(repo: Path) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for p in sorted((repo / "runs").glob("round-*-bare-val/summary.json")):
        try:
            out[p.parent.name.removesuffix("-bare-val")] = json.loads(p.read_text())["primary"]["success_rate"]
        except (OSError, ValueError, KeyError, TypeError):
            out[p.parent.name.removesuffix("-bare-val")] = None
    return out


__all__ = ["ROOT", "BENCH_DIR", "SHIM", "SEED_LOOP", "PYTHON", "log", "emit_json", "machine", "pct",
           "summary", "linreg", "proc_sample", "Sampler", "descendants", "tagged_pids", "kill_pids",
           "cleanup_tree", "stop_daemon", "rollouts_in", "work_lost", "success_rates", "journal", "make_tree"]
