"""Is the HF safetensors dir complete, and whose weights does it hold?

The val server reads ONE fixed HF dir, which slime's ``--save-hf`` (or the converter)
overwrites every round. Before serving it, EXPORT_HF checks that the index
(``model.safetensors.index.json``) covers every shard, that every shard's header parses
and that each shard's size equals header + the end of its last tensor, and that the
files were written at or after this round's checkpoint (so a stale export from the
previous round is never served as this round's). The mtime test has a slack (below), so when
two rounds' saves fall closer together than it (the demo's rounds take seconds), the test
that decides is the other one: every shard is newer than the newest shard of the export that
EXPORT_HF verified last in the same dir (a trainer stopped between its Megatron save and
``--save-hf``'s rewrite leaves those very files).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

INDEX = "model.safetensors.index.json"
# The HF files may be written a moment before the Megatron files of the same save.
_MTIME_SLACK_S = 5.0


@dataclass(frozen=True)
class HfCheck:
    ok: bool
    detail: str
    files: dict[str, int] = field(default_factory=dict)  # name -> bytes
    newest_mtime: float = 0.0
    oldest_mtime: float = 0.0


def _shard_ok(path: Path) -> str | None:
    """None when the safetensors file is well-formed, else what is wrong."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{path.name}: shorter than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 * 1024**2):
                return f"{path.name}: header length {n} exceeds the file"
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        return f"{path.name}: unreadable header ({exc})"
    if not isinstance(header, dict):
        return f"{path.name}: header is not an object"
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(meta["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            return f"{path.name}: tensor {name} has no data_offsets"
    if 8 + n + end != size:
        return f"{path.name}: size {size} != header {8 + n} + data {end} (truncated or still being written)"
    return None


def verify(hf_dir: Path, *, not_before: float | None = None, newer_than: float | None = None) -> HfCheck:
    """Check the HF dir; ``not_before`` is the checkpoint's commit time (epoch seconds),
    ``newer_than`` the newest shard mtime of the export verified before this one in this dir."""
    index_path = hf_dir / INDEX
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        shards = sorted(set(weight_map.values()))
    except FileNotFoundError:
        return HfCheck(False, f"{index_path}: missing")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return HfCheck(False, f"{index_path}: unreadable ({exc})")
    if not shards:
        return HfCheck(False, f"{index_path}: weight_map is empty")
    files: dict[str, int] = {}
    mtimes: list[float] = []
    for name in shards:
        p = hf_dir / name
        if not p.is_file():
            return HfCheck(False, f"{p}: named by the index but missing")
        problem = _shard_ok(p)
        if problem:
            return HfCheck(False, f"{hf_dir}: {problem}")
        st = p.stat()
        files[name] = st.st_size
        mtimes.append(st.st_mtime)
    if not (hf_dir / "config.json").is_file():
        return HfCheck(False, f"{hf_dir / 'config.json'}: missing")
    files[INDEX] = index_path.stat().st_size
    files["config.json"] = (hf_dir / "config.json").stat().st_size
    if not_before is not None and min(mtimes) < not_before - _MTIME_SLACK_S:
        return HfCheck(False, f"{hf_dir}: shards are older than this round's checkpoint (a previous round's export)",
                       files, max(mtimes), min(mtimes))
    if newer_than is not None and min(mtimes) <= newer_than:
        return HfCheck(False, f"{hf_dir}: shards not rewritten since the previous export was verified "
                              "(the save stopped before --save-hf wrote this round's)",
                       files, max(mtimes), min(mtimes))
    return HfCheck(True, f"{len(shards)} shards, {sum(files.values())} bytes", files, max(mtimes), min(mtimes))


def swap_in(new_dir: Path, hf_dir: Path) -> None:
    """Atomically replace ``hf_dir`` with ``new_dir`` (same filesystem): a crash never
    leaves a half-written export in the served path."""
    hf_dir.parent.mkdir(parents=True, exist_ok=True)
    old = hf_dir.with_name(hf_dir.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if hf_dir.exists():
        os.rename(hf_dir, old)
    os.rename(new_dir, hf_dir)
    dfd = os.open(hf_dir.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    if old.exists():
        shutil.rmtree(old)
