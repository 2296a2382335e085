"""The crash-injection driver: SIGKILL the daemon (and its children) at seeded random moments,
restart it as systemd would, and check the guarantees against an uninterrupted reference.

Run it by hand: ``python -m tests.chaos.chaos --kills 200 --child-kills 50 --seed 7``; it prints
one JSON report. Three starts in four wait for that start's first journaled transition before
the random delay, so the kills land in the campaign's work rather than in the daemon's start-up
(the imports, the lock and the load take most of the delay on a loaded machine); the fourth
kills from the launch, start-up included. ``daemon_kills_after_startup`` counts the kills that
landed after that start had journaled a transition. The tests in this folder run a quick mode
by default and the full mode (≥ 200 daemon kills, ≥ 50 child kills) in the slow suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoprld.daemon.ops.demo import FAKE_ENV
from tests.demotree import (
    journal,
    kill_tree_leftovers,
    leak_hits,
    ledger_rows,
    make_tree,
    reference_run,
    results,
    run_daemon,
    start_daemon,
    status,
)

FAKE_SECRETS = [line.split("=", 1)[1] for line in FAKE_ENV.splitlines() if "=" in line and not line.startswith("#")]

ROUNDS = 5
STEPS = 20


class TrainerCensus(threading.Thread):
    """Samples /proc for this campaign's trainers; records the most ever alive at once."""

    def __init__(self, state_dir: Path, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.tag = f"SHOPRLD_CHILD={state_dir}|trainer".encode()
        self.interval = interval
        self.max_alive = 0
        self.seen: set[int] = set()
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            alive = []
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    if os.getsid(int(entry)) != int(entry):
                        continue
                    env = Path(f"/proc/{entry}/environ").read_bytes()
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if self.tag in env.split(b"\0") and stat[stat.rfind(")") + 2] != "Z":
                    alive.append(int(entry))
            self.seen.update(alive)
            self.max_alive = max(self.max_alive, len(alive))
            self.samples += 1
            time.sleep(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


@dataclass
class Report:
    seed: int
    campaigns: int = 0
    daemon_kills: int = 0
    # Kills that landed after that start's first transition was journaled (past the imports, the
    # lock and the load): a kill during start-up tests less, and under load most are that.
    daemon_kills_after_startup: int = 0
    child_kills: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    max_trainers_at_once: int = 0
    trainers_seen: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


# The share of starts killed from the launch (start-up included); the others wait for the start's
# first journaled transition.
STARTUP_KILL_SHARE = 0.25


def _await_start(daemon: Any, root: Path, before: int, timeout: float = 60.0) -> None:
    """Until this start has journaled a transition (or exited, or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon.poll() is None and _transitions(root) <= before:
        time.sleep(0.02)


def _transitions(root: Path) -> int:
    """How many transitions the campaign's journal holds (counted in the bytes, not parsed)."""
    try:
        return (root / "state" / "journal.jsonl").read_bytes().count(b'"event": "transition"')
    except OSError:
        return 0


def _victims(root: Path, rng: random.Random) -> list[dict[str, Any]]:
    try:
        st = status(root)
    except (OSError, ValueError):
        return []
    return [c for c in st.get("children", []) if c["role"] != "shopsim" or rng.random() < 0.3]


def _end_saves(root: Path) -> dict[int, int]:
    """How many times each iteration was saved, over every trainer log of the campaign."""
    counts: dict[int, int] = {}
    for log in root.joinpath("ephemeral").rglob("r*-train.log"):
        # Megatron's line, as the demo trainer logs it (slime's logging prefix first).
        for m in re.finditer(r" - successfully saved checkpoint from iteration +(\d+) to ", log.read_text(errors="replace")):
            counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + 1
    return counts


def check_campaign(root: Path, reference: dict[str, bytes], rounds: int = ROUNDS) -> list[str]:
    """The guarantees, as a list of violations (empty when all hold)."""
    bad = []
    st = status(root)
    if st.get("state") != "DONE":
        bad.append(f"{root}: state {st.get('state')}, not DONE")
    got = results(root)
    if got != reference:
        differ = sorted(k for k in got.keys() | reference.keys() if got.get(k) != reference.get(k))
        bad.append(f"{root}: per-round val/gate/SkillBank files differ from the reference: {differ[:8]}")
    rows = [int(r[0]) for r in ledger_rows(root)]
    if rows != list(range(rounds)):
        bad.append(f"{root}: ledger rows {rows}")
    bad += [f"secret leaked: {hit}" for hit in leak_hits(root, FAKE_SECRETS)]
    saves = _end_saves(root)
    # A checkpoint saved while ShopSim was dead is deleted and retrained (checkpoint.rollback).
    rolled = [it for rec in journal(root) if rec["event"] == "checkpoint.rollback" for it in rec["iterations"]]
    for r in range(rounds):
        end = (r + 1) * STEPS
        if saves.get(end, 0) != 1 + rolled.count(end):
            bad.append(f"{root}: iter {end} saved {saves.get(end, 0)} times, rolled back {rolled.count(end)} "
                       "(a complete checkpoint was retrained or lost)")
    return bad


def chaos_campaign(root: Path, rng: random.Random, report: Report, *, kills: int, child_kills: int,
                   faults: dict[str, str], reference: dict[str, bytes], max_delay: float = 2.5) -> None:
    campaign = make_tree(root, rounds=ROUNDS, edits={r'^step_seconds = ".*"$': 'step_seconds = "0.03"'})
    env = {**faults, "DEMO_FAULT_ONCE_DIR": str(root)} if faults else {}
    census = TrainerCensus(root / "state")
    census.start()
    plan = ["daemon"] * kills + ["child"] * child_kills
    rng.shuffle(plan)
    try:
        for action in plan:
            before = _transitions(root)
            daemon = start_daemon(campaign, env=env)
            if rng.random() >= STARTUP_KILL_SHARE:
                _await_start(daemon, root, before)
            time.sleep(rng.uniform(0.2, max_delay))
            if daemon.poll() is not None:
                daemon.communicate()
                break  # finished before this kill landed
            if action == "daemon":
                daemon.send_signal(signal.SIGKILL)
                daemon.communicate()
                report.daemon_kills += 1
                report.daemon_kills_after_startup += _transitions(root) > before
            else:
                kids = _victims(root, rng)
                if kids:
                    victim = rng.choice(kids)
                    try:
                        os.killpg(int(victim["pid"]), signal.SIGKILL)
                        report.child_kills[victim["role"]] = report.child_kills.get(victim["role"], 0) + 1
                    except OSError:
                        pass
                time.sleep(rng.uniform(0.1, 0.5))
                daemon.send_signal(signal.SIGTERM)  # systemd-style stop, then restart
                daemon.communicate(timeout=120)
            report.restarts += 1
        final = run_daemon(campaign, env=env, timeout=600)
        if final.returncode != 0:
            report.failures.append(f"{root}: final run exited {final.returncode}: {final.stderr[-500:]}")
    finally:
        census.stop()
        kill_tree_leftovers(root)
    report.max_trainers_at_once = max(report.max_trainers_at_once, census.max_alive)
    report.trainers_seen += len(census.seen)
    report.failures += check_campaign(root, reference)
    report.campaigns += 1


def reference_results(root: Path) -> dict[str, bytes]:
    return results(reference_run(root, ROUNDS, timeout=600))


def run(base: Path, *, seed: int, kills: int, child_kills: int, per_campaign: int = 40,
        faults: bool = True) -> Report:
    rng = random.Random(seed)
    report = Report(seed=seed)
    t0 = time.monotonic()
    reference = reference_results(base / "reference")
    n = 0
    # The first campaign also stalls its trainer once and crashes it once holding leases.
    knobs = {"DEMO_STALL_AT": "33", "DEMO_CRASH_AT": "57", "DEMO_LEAK_LEASES": "1"} if faults else {}
    while report.daemon_kills < kills or sum(report.child_kills.values()) < child_kills:
        k = min(per_campaign, max(0, kills - report.daemon_kills))
        c = min(per_campaign // 4, max(0, child_kills - sum(report.child_kills.values())))
        chaos_campaign(base / f"campaign-{n}", rng, report, kills=k, child_kills=c,
                       faults=knobs if n == 0 else {}, reference=reference)
        n += 1
        if n > 4 * (kills // per_campaign + 2):
            report.failures.append("kill budget not reached (campaigns finish too fast)")
            break
    report.seconds = round(time.monotonic() - t0, 1)
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--child-kills", type=int, default=50)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dir", type=Path, default=None)
    a = p.parse_args()
    base = a.dir or Path(tempfile.mkdtemp(prefix="shoprld-chaos-"))
    rep = run(base, seed=a.seed, kills=a.kills, child_kills=a.child_kills)
    print(json.dumps(rep.__dict__, indent=2))
    return 0 if not rep.failures and rep.max_trainers_at_once <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
