"""A crash bundle for every failed attempt: what the operator needs in the morning.

Layout (one directory per failed attempt, never overwritten by a later one)::

    $EXP_DIR/logs/attempts/<round_id>-<STATE>-<attempt>/
        bundle.json     round, state, attempt, exit status, cause (name, line, advice),
                        the redacted argv, the outcome's message, when
        log-tail.txt    the last 64 KiB of the stage's log (redacted)
        nvidia-smi.txt  `nvidia-smi` output at the time, or why there is none
        py-spy.txt      stalls only: `py-spy dump` of every process of the trainer's session,
                        taken BEFORE the trainer is stopped; or why there is none

Everything written here passes through the daemon's Redactor. Writing a bundle never fails
the campaign: an error (a full volume) is returned for the journal and otherwise ignored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from shoprld.daemon.foundation.system.proctable import session_pids
from shoprld.daemon.foundation.config.secrets import Redactor

TAIL_BYTES = 64 * 1024
PY_SPY_FILE = "py-spy.txt"
PY_SPY_ABSENT = "py-spy is not installed, so no stack dump was taken; fix: pip install 'shoprld[debug]'\n"


def attempt_dir(logs: Path, round_id: str, state: str, attempt: int) -> Path:
    """``<logs>/attempts/<round_id>-<STATE>-<attempt>``."""
    return logs / "attempts" / f"{round_id}-{state}-{attempt}"


def free_attempt_dir(logs: Path, round_id: str, state: str, attempt: int) -> Path:
    """The attempt's bundle dir: ``attempt_dir``, or the next number up when a bundle is already
    there (attempts restart at 1 with each daemon start; a bundle is never overwritten). A dir
    without ``bundle.json`` is this attempt's own (its py-spy dump went in first)."""
    n = attempt
    while (attempt_dir(logs, round_id, state, n) / "bundle.json").exists():
        n += 1
    return attempt_dir(logs, round_id, state, n)


def read_tail(path: Path | None, n: int = TAIL_BYTES) -> str:
    """The last ``n`` bytes of ``path`` as text ("" when it does not exist)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - n))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def py_spy_binary() -> str | None:
    """py-spy beside this interpreter (a venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _run(argv: Sequence[str], timeout: float) -> str:
    try:
        cp = subprocess.run(list(argv), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return f"{argv[0]}: not found\n"
    except subprocess.TimeoutExpired:
        return f"{argv[0]}: no answer within {timeout:.0f}s\n"
    except OSError as exc:
        return f"{argv[0]}: {exc}\n"
    text = (cp.stdout + cp.stderr).decode(errors="replace")
    return text if cp.returncode == 0 else f"{text}\n(exit status {cp.returncode})\n"


async def dump_stacks(dest: Path, sid: int, redactor: Redactor, *, limit: int = 8, timeout: float = 20.0,
                      find_py_spy: Callable[[], str | None] = py_spy_binary) -> Path:
    """Write ``py-spy dump`` of each process of session ``sid`` into ``dest/py-spy.txt``.

    Call it while the processes still hang (before the stop): a dump of a dead process says
    nothing. When py-spy is absent, the file says so."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / PY_SPY_FILE
    binary = find_py_spy()  # a seam: tests pass one that finds nothing
    if binary is None:
        out.write_text(PY_SPY_ABSENT)
        return out
    pids = session_pids(sid)[:limit]
    parts: list[str] = []
    for pid in pids:
        text = await anyio.to_thread.run_sync(lambda p=pid: _run([binary, "dump", "--pid", str(p)], timeout),
                                              abandon_on_cancel=True)
        parts.append(f"=== py-spy dump --pid {pid}\n{text}")
    out.write_text(redactor.text("\n".join(parts) if parts else f"no process left in session {sid}\n"))
    return out


async def write_bundle(dest: Path, *, round_id: str, state: str, attempt: int, exit_status: int | None,
                       cause: dict[str, str], argv: Sequence[str], message: str, log_path: Path | None,
                       stalled: bool, redactor: Redactor, nvidia_smi: str = "nvidia-smi") -> str | None:
    """Write the bundle of one failed attempt; returns an error line, or None when written."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "round_id": round_id, "state": state, "attempt": attempt, "exit_status": exit_status,
            "cause": cause, "argv": list(argv), "message": message, "stalled": stalled,
            "log": str(log_path) if log_path else None, "written_at": time.time(),
        }
        if stalled:  # the exit status is of our stop (0 for a trainer that handles SIGTERM), not a crash
            doc["stopped_by"] = "shoprld: no training step within train.stall_timeout, so shoprld stopped it"
        (dest / "log-tail.txt").write_text(redactor.text(read_tail(log_path)))
        smi = shutil.which(nvidia_smi)
        text = await anyio.to_thread.run_sync(lambda: _run([smi], 20.0), abandon_on_cancel=True) if smi \
            else f"{nvidia_smi} not found on PATH: no GPU snapshot\n"
        (dest / "nvidia-smi.txt").write_text(redactor.text(text))
        if stalled and not (dest / PY_SPY_FILE).exists():  # e.g. an adopted Ray job: no local pids
            (dest / PY_SPY_FILE).write_text("no stack dump was taken for this stall\n")
        doc["files"] = sorted(p.name for p in dest.iterdir())
        (dest / "bundle.json").write_text(json.dumps(redactor.obj(doc), indent=2) + "\n")
        return None
    except OSError as exc:
        return f"{dest}: cannot write the crash bundle ({exc.strerror or exc})"


def causes_of_round(logs: Path, round_id: str) -> str:
    """The causes of this round's failed attempts, for the ledger: ``TRAIN:cuda_oom TRAIN:unknown``."""
    found: list[tuple[int, str]] = []
    root = logs / "attempts"
    try:
        entries = list(root.glob(f"{round_id}-*"))
    except OSError:
        return ""
    for d in entries:
        try:
            doc = json.loads((d / "bundle.json").read_text())
            found.append((int(doc.get("written_at") or 0), f"{doc['state']}:{doc['cause']['name']}"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return " ".join(c for _, c in sorted(found))


def prune(logs: Path, keep: int) -> list[Path]:
    """Keep the files of the newest ``keep`` bundles of each cause; of the older ones keep only
    ``bundle.json`` (a few hundred bytes: the ledger's causes column and the record of what
    happened), marked ``pruned_at``. A deterministic bug retried all night leaves ``keep`` full
    bundles, not one per attempt. Returns the bundles pruned now; never raises."""
    by_cause: dict[str, list[tuple[float, Path, dict[str, Any]]]] = {}
    try:
        entries = list((logs / "attempts").iterdir())
    except OSError:
        return []
    for d in entries:
        try:
            doc = json.loads((d / "bundle.json").read_text())
            name = str(doc["cause"]["name"])
            by_cause.setdefault(name, []).append((float(doc.get("written_at") or 0), d, doc))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    pruned: list[Path] = []
    for rows in by_cause.values():
        for _, d, doc in sorted(rows, key=lambda r: r[0], reverse=True)[max(0, keep):]:
            if doc.get("pruned_at"):
                continue
            try:
                for f in d.iterdir():
                    if f.name != "bundle.json" and (f.is_file() or f.is_symlink()):
                        f.unlink()
                doc["pruned_at"] = time.time()
                doc["files"] = ["bundle.json"]
                tmp = d / "bundle.json.tmp"
                tmp.write_text(json.dumps(doc, indent=2) + "\n")
                os.replace(tmp, d / "bundle.json")
                pruned.append(d)
            except OSError:
                continue
    return pruned
