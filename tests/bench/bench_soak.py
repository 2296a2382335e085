"""Soak: a long demo campaign of very short rounds, sampling the daemon (issue 10, item 5).

    .venv/bin/python tests/bench/bench_soak.py [--quick] [--rounds N] [--interval S] [--keep DIR]

A script, not a test (pytest collects test_*.py only). Prints ONE JSON object on stdout;
progress goes to stderr.

The campaign is the demo recipe cut to the bone, so that the daemon does a full round's
worth of work (every state, ~8 child processes, ~20 journal records, the ledger row,
retention) as often as possible: 1 slime step per round, DEMO_STEP_SECONDS 0, 1 val task,
4 KiB checkpoints, no val-server load time, a 20 ms analyst poll. Full mode: 1,000 rounds
(issue 10 asks for >= 1,000 rounds or >= 30 min; ~40 min here); ``--quick``: 80 rounds (~3 min).

Every ``--interval`` seconds it samples the daemon's VmRSS, open fds (/proc/<pid>/fd),
threads and CPU (utime+stime), plus the rounds done (ledger rows) and the sizes of the
journal, state.json and status.json (all samples go to ``samples.jsonl`` with ``--keep``). At
the end it times ``Store.load()`` on the state dir: what a daemon restart would pay then. It reports least-squares slopes against the round
count after a warm-up (the first 10 % of rounds): RSS KiB/round, fds/round, threads/round,
and the round duration's own trend (s/round per round: a per-round cost that grows).

Expected growth: the ledger (one row per round), the journal and ``rounds.jsonl`` grow
linearly with the rounds, by design; state.json and status.json stay the same size (issue 16,
step 5: a round's facts are written once, the snapshots carry a cursor). RSS and fds must stay
flat; ``rounds_done`` (one small dict per round, kept in memory) is the one in-memory structure
that grows with the round count, so a small RSS slope from it is reported, not hidden.

``--replay N`` measures the persistence alone, in seconds rather than hours: the real engine's
own code (``Engine._transition`` for the six transitions of each round, ``Progress.round_finished``
at its end) writes what an N-round campaign's transitions and rounds write, with no children;
it reports the journal, state.json and status.json bytes, the total bytes written per round
and ``Store.load()``'s time at the end. The stages' own journal lines (spawns, checkpoints) are
not replayed: a few hundred bytes per round, the same for every version.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    cleanup_tree,
    emit_json,
    linreg,
    log,
    machine,
    make_tree,
    proc_sample,
)

from tests.demotree import SHOPRLD  # noqa: E402


def ledger_rows(root: Path) -> int:
    """Rounds recorded in the ledger. Past 1 MiB the ledger overflows (daemon/foundation/records/ledger.py): the
    repo file keeps a pointer and the last 20 rows, the full TSV moves under the campaign root,
    so the count is the last row's index + 1 there."""
    full = next((root / "ephemeral").glob("nemo-rl/*/nemo-rl-auto-research/*/ledger/*.tsv"), None)
    try:
        if full is not None:
            with open(full, "rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - 8192))
                last = [ln for ln in fh.read().splitlines() if ln and not ln.startswith(b"#")][-1]
            return int(last.split(b"\t", 1)[0]) + 1
        with open(root / "repo" / "reports" / "shoprld" / "demo.tsv", "rb") as fh:
            lines = [ln for ln in fh.read().splitlines() if ln and not ln.startswith(b"#")]
        return max(0, len(lines) - 1)  # minus the header
    except (OSError, ValueError, IndexError):
        return 0


def size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


class _NoTasks:
    """The replay's stand-in for the engine's task group: the hygiene scan after each round is not
    persistence, and nothing else is started."""

    def start_soon(self, *args: Any) -> None:
        pass


def replay(work: Path, rounds: int) -> dict[str, Any]:
    """What ``--replay`` reports (see the module docstring)."""
    # Imported here, as main() imports Store: the soak itself samples a daemon in another process
    # and loads nothing of shoprld until its end.
    import logging

    import structlog

    from shoprld.daemon.foundation.config.config import load_config
    from shoprld.daemon.core.engine import Engine
    from shoprld.daemon.foundation.records.layout import Layout
    from shoprld.daemon.round.machine import ADVANCE, ROUND_STATES, State
    from shoprld.daemon.foundation.config.secrets import Secrets
    from shoprld.daemon.foundation.records.store import Store

    campaign = make_tree(work, rounds=rounds + 1)
    cfg = load_config(campaign)
    layout = Layout.from_config(cfg)
    layout.logs.mkdir(parents=True, exist_ok=True)
    engine = Engine(cfg, layout, Secrets())
    engine._check_identity()
    engine._load()
    engine.tg = _NoTasks()
    engine.http = None  # no stage runs, so nothing speaks HTTP
    # The replay measures the writes, not the console renderer of the transitions' log lines.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    state_dir = layout.state_dir
    files = ("journal.jsonl", "state.json", "status.json", "rounds.jsonl")
    written = 0
    engine._transition(None, State.PREFLIGHT_DISK, "start")
    engine._transition(State.PREFLIGHT_DISK, State.START_SHOPSIM, ADVANCE[State.PREFLIGHT_DISK])
    src = State.START_SHOPSIM
    t0 = time.perf_counter()
    for r in range(rounds):
        before = {f: size(state_dir / f) for f in files}
        engine._transition(src, State.TRAIN, ADVANCE.get(src, "next_round"))
        for a, b in zip(ROUND_STATES, ROUND_STATES[1:]):
            engine._transition(a, b, ADVANCE[a])
        engine.progress.round_finished(engine._ctx(), None)
        # Bytes written this round: the appends' growth plus every rewrite of the whole files.
        written += sum(size(state_dir / f) - before[f] for f in ("journal.jsonl", "rounds.jsonl"))
        written += 7 * (size(state_dir / "state.json") + size(state_dir / "status.json"))
        engine.round += 1
        src = State.NEXT_ROUND
        if (r + 1) % 100 == 0:
            log(f"replay: {r + 1} rounds, journal {size(state_dir / 'journal.jsonl') >> 10} KiB")
    took = time.perf_counter() - t0
    engine.store.release_lock()
    t, c = time.perf_counter(), time.process_time()
    Store(state_dir).load()
    return {"bench": "soak-replay", "rounds": rounds, "machine": machine(),
            "persist_s_per_round": round(took / rounds, 5),
            "bytes_written_per_round": round(written / rounds),
            "restart_state_load": {"wall_s": round(time.perf_counter() - t, 3),
                                   "cpu_s": round(time.process_time() - c, 3)},
            **{f.replace(".", "_") + "_bytes": size(state_dir / f) for f in files}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="80 rounds (~3 min)")
    ap.add_argument("--rounds", type=int, help="override the round count (default 1000, quick 100)")
    ap.add_argument("--interval", type=float, default=2.0, help="sampling interval, seconds")
    ap.add_argument("--timeout", type=float, default=4 * 3600.0)
    ap.add_argument("--keep", type=Path, help="work in this dir and keep it")
    ap.add_argument("--replay", type=int, metavar="N", help="replay N rounds of persistence only (seconds)")
    a = ap.parse_args()
    if a.replay:
        work = Path(tempfile.mkdtemp(prefix="shoprld-bench-replay-"))
        try:
            emit_json(replay(work, a.replay))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    rounds = a.rounds or (80 if a.quick else 1000)
    work = a.keep or Path(tempfile.mkdtemp(prefix="shoprld-bench-soak-"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    campaign = make_tree(work, rounds=rounds, edits={
        r"^steps_per_round = 20$": "steps_per_round = 1",
        r'^step_seconds = ".*"$': 'step_seconds = "0"',
        r'DEMO_CKPT_BYTES = "1048576"': 'DEMO_CKPT_BYTES = "4096"',
        r"^tasks = 40$": "tasks = 1",
        r"^concurrency = 8$": "concurrency = 1",
    })
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEMO_", "BENCH_", "SHOPRLD_"))}
    env.update({"DEMO_VAL_LOAD_SECONDS": "0", "DEMO_ANALYST_POLL": "0.02", "DEMO_ANALYST_SECONDS": "0",
                "DEMO_HF_BYTES": "4096"})
    state = work / "state"
    samples: list[dict[str, Any]] = []
    report: dict[str, Any] = {"bench": "soak", "mode": "quick" if a.quick else "full", "rounds_planned": rounds,
                              "interval_s": a.interval, "machine": machine()}
    t0 = time.monotonic()
    with open(work / "daemon.log", "wb") as out:
        proc = subprocess.Popen([*SHOPRLD, "run", "-c", str(campaign)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    stop = threading.Event()

    def sample() -> None:
        last_log = 0.0
        while not stop.is_set():
            s = proc_sample(proc.pid)
            if s is None:
                return
            s.update({"rounds": ledger_rows(work), "journal_bytes": size(state / "journal.jsonl"),
                      "state_bytes": size(state / "state.json"), "status_bytes": size(state / "status.json"),
                      "wall": s["t"] - t0})
            samples.append(s)
            if s["t"] - last_log > 30:
                last_log = s["t"]
                log(f"{s['wall']:.0f}s rounds={s['rounds']} rss={s['rss_kib']}KiB fds={s['fds']} "
                    f"threads={s['threads']} journal={s['journal_bytes'] >> 10}KiB")
            stop.wait(a.interval)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        code = proc.wait(timeout=a.timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        stop.set()
        th.join(timeout=10)
        cleanup_tree(work)
    wall = time.monotonic() - t0
    done = ledger_rows(work)
    # What a restart would pay now: Store.load() reads state.json, the journal's tail for a newer
    # snapshot and rounds.jsonl (daemon/foundation/records/store.py).
    from shoprld.daemon.foundation.records.store import Store

    t, c = time.perf_counter(), time.process_time()
    Store(state).load()
    report["restart_state_load"] = {"wall_s": round(time.perf_counter() - t, 3), "cpu_s": round(time.process_time() - c, 3),
                                    "journal_bytes": size(state / "journal.jsonl")}
    if a.keep:
        with open(work / "samples.jsonl", "w") as fh:
            for smp in samples:
                fh.write(json.dumps(smp) + "\n")
    report.update({"exit": code, "rounds_done": done, "wall_s": round(wall, 1),
                   "rounds_per_min": round(done / wall * 60, 1) if wall else None, "samples": len(samples)})
    warm = [s for s in samples if s["rounds"] >= max(1, done // 10)]
    if len(warm) >= 3:
        xs = [float(s["rounds"]) for s in warm]

        def slope(key: str) -> dict[str, float]:
            b, _, r2 = linreg(xs, [float(s[key]) for s in warm])
            return {"per_round": round(b, 4), "r2": round(r2, 3)}

        def per_round(key: str) -> list[tuple[float, Any]]:
            """(``key``'s increase per round, the round it starts at) between successive warm samples."""
            return [((q[key] - p[key]) / (q["rounds"] - p["rounds"]), p["rounds"])
                    for p, q in zip(warm, warm[1:]) if q["rounds"] > p["rounds"]]

        def trend(rates: list[tuple[float, Any]]) -> tuple[float, float]:
            """Slope and r^2 of per-round rates against the round (zeros for fewer than two)."""
            b, _, r2 = linreg([r for _, r in rates], [v for v, _ in rates]) if len(rates) >= 2 else (0.0, 0.0, 0.0)
            return b, r2

        per_round_cpu = per_round("cpu_s")
        cpu_b, cpu_r2 = trend(per_round_cpu)
        durations = per_round("t")
        dur_b, dur_r2 = trend(durations)
        rss = [s["rss_kib"] for s in warm]
        report.update({
            "warmup_rounds": done // 10,
            "rss_kib": {"first": samples[0]["rss_kib"], "after_warmup": rss[0], "end": rss[-1],
                        "min": min(rss), "max": max(rss), "peak_hwm": max(s["hwm_kib"] for s in samples),
                        "slope": slope("rss_kib")},
            "fds": {"min": min(s["fds"] for s in warm), "max": max(s["fds"] for s in warm), "slope": slope("fds")},
            "threads": {"min": min(s["threads"] for s in warm), "max": max(s["threads"] for s in warm),
                        "slope": slope("threads")},
            "daemon_cpu_s_per_round": {"p50": round(statistics.median(c for c, _ in per_round_cpu), 4)
                                       if per_round_cpu else None,
                                       "slope_per_round": round(cpu_b, 6), "r2": round(cpu_r2, 3)},
            "round_duration_s": {"p50": round(statistics.median(d for d, _ in durations), 3) if durations else None,
                                 "slope_per_round": round(dur_b, 6), "r2": round(dur_r2, 3)},
            "journal_bytes": {"end": samples[-1]["journal_bytes"], "slope": slope("journal_bytes")},
            "state_json_bytes": {"end": samples[-1]["state_bytes"], "slope": slope("state_bytes")},
            "status_json_bytes": {"end": samples[-1]["status_bytes"], "slope": slope("status_bytes")},
        })
        # Flat = the fitted trend adds less than the bound over the whole soak. Single samples
        # vary (a stage's child spawn holds a few pipes and a thread for a moment): the trend
        # is what would exhaust the process over a long campaign, not the spread.
        rss_total = report["rss_kib"]["slope"]["per_round"] * done
        fds_total = report["fds"]["slope"]["per_round"] * done
        thr_total = report["threads"]["slope"]["per_round"] * done
        report["verdict"] = {
            "rss_growth_over_soak_kib": round(rss_total, 1),
            "rss_flat": abs(rss_total) < 2048,   # < 2 MiB over the whole soak
            "fds_growth_over_soak": round(fds_total, 2), "fds_flat": abs(fds_total) < 1.0,
            "threads_growth_over_soak": round(thr_total, 2), "threads_flat": abs(thr_total) < 1.0,
        }
        step = max(1, len(warm) // 40)
        report["series"] = [{"rounds": s["rounds"], "wall_s": round(s["wall"], 1), "rss_kib": s["rss_kib"],
                             "fds": s["fds"], "threads": s["threads"], "journal_kib": s["journal_bytes"] >> 10}
                            for s in samples[::step]]
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    emit_json(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
