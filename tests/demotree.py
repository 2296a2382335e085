"""Shared helpers for tests that run real demo campaigns: make a tree, run the daemon as a
real process, read its journal and results."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shoprld.daemon.demo import create_tree

SHOPRLD = [sys.executable, "-m", "shoprld.daemon.cli"]
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


def kill_tree_leftovers(root: Path) -> None:
    """Teardown: stop any process a test left behind whose tag names this tree's state dir."""
    want = f"SHOPRLD_CHILD={root / 'state'}|".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if want in env:
            try:
                os.killpg(int(entry), signal.SIGKILL)
            except OSError:
                try:
                    os.kill(int(entry), signal.SIGKILL)
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
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) in self.cmdlines:
                    continue
                try:
                    env = Path(f"/proc/{entry}/environ").read_bytes()
                    if self.tag in env:
                        self.cmdlines[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().decode(
                            errors="replace").replace("\0", " ")
                except OSError:
                    continue
            time.sleep(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
