"""What a relaunch of the trainer may skip: the emit and check tools, when nothing they read
changed since their last successful run in this round (issue 30, item 3).

A TRAIN attempt after a stall or a crash runs, before the trainer, ``train.emit_command``
(writes the round's YAMLs), ``train.check_command`` (``training check``: validates them against
the task data) and then launches the trainer. The tools are deterministic in their inputs:
their argv (every placeholder expanded), the recipe's ``train.env``, and the files the argv names
(the SkillBank, the curriculum, the history ledger, the emitted ``slime.yaml``, the task data,
the tool's own script). After a successful run, a record holds a SHA-256 over those inputs
(:func:`fingerprint`; file CONTENTS, not mtimes) and, for emit, over what it wrote (the files of
the round's loop dir). A relaunch reuses the run only when the fingerprint is the same AND the
outputs still hash the same; anything else (a changed curriculum, an edited recipe, a YAML
touched by hand, no record, an unreadable file) runs the tool again. So the check's
verifications still hold for exactly the bytes the trainer reads: they were checked, and no byte
changed since. Records live in ``<artifacts>/relaunch/<round_id>-<role>.json``: only hashes and
seconds, never values (an argv may hold a secret's placeholder value).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.records.store import atomic_write_json, read_json

CHUNK = 1 << 20


# Digests by the file's identity and change stamps: a tool's argv names the interpreter
# (megabytes, hashed anew before every TRAIN's emit: ~10 ms on the hand-off) and scripts that
# do not change between rounds. A write changes mtime and ctime (ctime cannot be set back) and
# a replaced file has another inode, so a hit is the same bytes. As git's "racy clean" rule: a
# file changed in the last RACY_S seconds is hashed but not remembered (a write within the
# same timestamp tick would keep its stamps).
_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}
_DIGESTS_MAX = 256
RACY_S = 2.0


def file_digest(path: Path) -> str | None:
    """SHA-256 of a regular file's bytes; None when it is not a readable regular file."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if (known := _DIGESTS.get(key)) is not None:
            return known
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                h.update(chunk)
            after = os.fstat(fh.fileno())
        digest = h.hexdigest()
    except OSError:
        return None
    settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_S * 1e9
    if settled and (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns) == key[1:]:
        if len(_DIGESTS) >= _DIGESTS_MAX:
            _DIGESTS.clear()
        _DIGESTS[key] = digest
    return digest


def named_files(argv: Sequence[str]) -> list[Path]:
    """The regular files an argv names (absolute paths only: a relative one depends on the cwd)."""
    out = []
    for arg in argv:
        if arg.startswith("/") and "\0" not in arg:
            p = Path(arg)
            try:
                if p.is_file():
                    out.append(p)
            except OSError:
                continue
    return out


def fingerprint(argv: Sequence[str], env: Mapping[str, str], files: Iterable[Path]) -> str | None:
    """One hash over the argv, the env and the bytes of each file; None when a file cannot be read."""
    h = hashlib.sha256()
    h.update(json.dumps([list(argv), sorted(env.items())]).encode())
    for path in sorted(set(files)):
        digest = file_digest(path)
        if digest is None:
            return None
        h.update(f"\0{path}\0{digest}".encode())
    return h.hexdigest()


def outputs_digest(paths: Iterable[Path]) -> dict[str, str]:
    """``{path: sha256}`` of the regular files given (unreadable ones are left out)."""
    out = {}
    for p in sorted(paths):
        d = file_digest(p)
        if d is not None:
            out[str(p)] = d
    return out


def record_path(artifacts: Path, round_id: str, role: str) -> Path:
    return artifacts / "relaunch" / f"{round_id}-{role}.json"


def remember(path: Path, *, fp: str, seconds: float, outputs: Mapping[str, str] | None = None) -> None:
    """After a successful run: what it read (the fingerprint), how long it took, what it wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"fingerprint": fp, "seconds": round(seconds, 3), "outputs": dict(outputs or {})})


def reusable(path: Path, fp: str | None) -> dict[str, Any] | None:
    """The record when the last successful run read exactly these inputs and every file it
    wrote is still there with the same bytes; else None (run the tool)."""
    if fp is None:
        return None
    rec = read_json(path)
    if not isinstance(rec, dict) or rec.get("fingerprint") != fp:
        return None
    outputs = rec.get("outputs")
    if not isinstance(outputs, dict):
        return None
    for name, digest in outputs.items():
        if file_digest(Path(name)) != digest:
            return None
    return rec


def forget(path: Path) -> None:
    """A failed or stopped run: the next launch runs the tool."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
