"""Shared helpers for tests that run real demo campaigns: make a tree, run the daemon as a
real process, read its journal and results; stand-ins for a running daemon (a lock holder, a
status snapshot); and /proc scanning for the processes a campaign starts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shoprld.daemon.ops.demo import create_tree

SHOPRLD = [sys.executable, "-m", "shoprld.daemon.ops.cli"]
# Exact run-dir names: archived attempts (``<dir>.archived-N``) are not results.
_R = "runs/round-[0-9][0-9][0-9]"
RESULT_GLOBS = (f"{_R}-bare-val/summary.json", f"{_R}-online-gate/online_gate_manifest.json",
                f"{_R}-online-gate/selected_skillbank.json", f"{_R}/curriculum.json",
                f"{_R}/selected_skillbank.json")


def make_tree(root: Path, *, rounds: int = 5, edits: dict[str, str] | None = None) -> Path:
    """A fast demo tree; ``edits`` are regex -> replacement on the campaign file's text."""
    campaign = create_tree(root, fast=True, rounds=rounds)
    text = campaign.read_text()
    for pattern, repl in (edits or {}).items():
        text, n = re.subn(pattern, repl, text, flags=re.M)
        assert n, f"edit {pattern!r} matched nothing"
    campaign.write_text(text)
    return campaign


def run_daemon(campaign: Path, *, env: dict[str, str] | None = None, timeout: float = 180,
               args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``shoprld run -c campaign`` as a real child process, to completion."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*SHOPRLD, "run", "-c", str(campaign), *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def reference_run(root: Path, rounds: int, *, edits: dict[str, str] | None = None,
                  timeout: float = 180) -> Path:
    """A fast demo tree at ``root`` run to completion by one uninterrupted daemon (exit 0 checked),
    with whatever it left behind stopped: a finished campaign, such as the reference a faulted run
    must match. Returns ``root``."""
    campaign = make_tree(root, rounds=rounds, edits=edits)
    try:
        proc = run_daemon(campaign, timeout=timeout)
    finally:
        kill_tree_leftovers(root)
    assert proc.returncode == 0, f"reference run exited {proc.returncode}: {proc.stderr[-2000:]}"
    return root


def start_daemon(campaign: Path, *, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.Popen([*SHOPRLD, "run", "-c", str(campaign), *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def journal(root: Path) -> list[dict[str, Any]]:
    path = root / "state" / "journal.jsonl"
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def status(root: Path) -> dict[str, Any]:
    return json.loads((root / "state" / "status.json").read_text())


def project_runs(root: Path) -> Path:
    return root / "repo" / "runs"


def results(root: Path) -> dict[str, bytes]:
    """The per-round val, gate and SkillBank files, by relative path."""
    base = root / "repo"
    out: dict[str, bytes] = {}
    for pattern in RESULT_GLOBS:
        for p in sorted(base.glob(pattern)):
            out[str(p.relative_to(base))] = p.read_bytes()
    return out


def ledger_rows(root: Path) -> list[list[str]]:
    path = root / "repo" / "reports" / "shoprld" / "demo.tsv"
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return [line.split("\t") for line in lines[1:]]


def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- /proc scanning -----------------------------------------------------------------------------------
def proc_pids() -> list[int]:
    """The pids /proc lists right now."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def proc_environ(pid: int) -> bytes | None:
    """The raw, NUL-separated ``/proc/<pid>/environ``; None when the process is gone or unreadable."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)``: state, ppid, pgrp, ...; None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def kill_tree_leftovers(root: Path) -> None:
    """Teardown: stop any process a test left behind whose tag names this tree's state dir."""
    want = f"SHOPRLD_CHILD={root / 'state'}|".encode()
    for pid in proc_pids():
        env = proc_environ(pid)
        if env is not None and want in env:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def leak_hits(root: Path, values: list[str], extra_texts: dict[str, str] | None = None) -> list[str]:
    """Every file under the tree (but .env) and every extra text that contains a secret value."""
    hits = []
    needles = [v.encode() for v in values if v]
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and p.name != ".env":
            try:
                data = p.read_bytes()
            except OSError:
                continue
            hits += [f"{p}: {n.decode()[:6]}…" for n in needles if n in data]
    for name, text in (extra_texts or {}).items():
        hits += [f"{name}: {n.decode()[:6]}…" for n in needles if n in text.encode()]
    return hits


class CmdlineSampler(threading.Thread):
    """Snapshots /proc/<pid>/cmdline of this tree's children while a campaign runs."""

    def __init__(self, root: Path, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.tag = f"SHOPRLD_CHILD={root / 'state'}|".encode()
        self.interval = interval
        self.cmdlines: dict[int, str] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for pid in proc_pids():
                if pid in self.cmdlines:
                    continue
                env = proc_environ(pid)
                if env is None or self.tag not in env:
                    continue
                try:
                    self.cmdlines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                        errors="replace").replace("\0", " ")
                except OSError:
                    continue
            time.sleep(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


# -- a stand-in for a running daemon ------------------------------------------------------------------
# A child that takes the campaign lock exactly as the daemon does, then waits for stdin to close.
LOCK_HOLDER = """
import sys
from pathlib import Path
from shoprld.daemon.foundation.records.store import Store
Store(Path(sys.argv[1])).acquire_lock()
print("ready", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def ready_child(script: str, *args: str, stdin: int | None = None,
                python: str = sys.executable) -> Iterator[subprocess.Popen[str]]:
    """``python -c script *args``, yielded once it prints "ready"; killed if still running, and
    reaped, when the block ends (pass or fail)."""
    proc = subprocess.Popen([python, "-c", script, *args], stdin=stdin, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def status_snapshot(now: float, **over: Any) -> dict[str, Any]:
    """A realistic mid-campaign status.json: round 3/5, TRAIN step 12/20, two rounds done;
    ``over`` replaces top-level fields (in place, so the key order stays the daemon's)."""
    snap: dict[str, Any] = {
        "campaign": "demo", "experiment": "qwen35-4b", "state": "TRAIN", "round": 2, "rounds": 5,
        "step": 12, "steps_per_round": 20, "step_seconds": 41.2, "eta_seconds": 329.6,
        "daemon": {"pid": 4242, "started_at": now - 7380},
        "last_checkpoint": {"iteration": 59, "path": "/ephemeral/demo/checkpoints/megatron/iter_0000059",
                            "complete": True, "bytes": 56_800_000_000, "committed_at": now - 125},
        "disk": {"path": "/ephemeral", "total_bytes": 2 * 1024**4, "free_bytes": 612 * 1024**3,
                 "soft_limit_bytes": 64 * 1024**3, "hard_limit_bytes": 10 * 1024**3, "inodes_free": 12_300_000,
                 "level": "ok", "sampled_at": now - 3},
        "shopsim": {"url": "http://127.0.0.1:5700", "healthy": True, "free_slots": 16, "slots": 48,
                    "checked_at": now - 4},
        "children": [{"role": "shopsim", "pid": 4300, "started_at": now - 7300, "log": "/ephemeral/logs/shopsim.log"},
                     {"role": "trainer", "pid": 5001, "started_at": now - 4320,
                      "log": "/ephemeral/logs/r002-train.log"}],
        "rounds_done": [
            {"round": 0, "val": 0.412, "metric_name": "success_rate", "gate": "complete", "branch": "selected",
             "duration_seconds": 7080.0},
            {"round": 1, "val": 0.4375, "metric_name": "success_rate", "gate": "incomplete", "branch": "kept",
             "duration_seconds": 6950.0},
        ],
        "last_error": None, "stop_reason": None, "deadline": now + 22_320,
        "stop_conditions": {"rounds_done": 2, "rounds": 5, "deadline": now + 22_320},
        "warnings": [], "updated_at": now - 1,
    }
    snap.update(over)
    return snap
