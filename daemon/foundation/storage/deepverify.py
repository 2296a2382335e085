"""The deep check of one Megatron checkpoint: beyond file presence, every shard really there.

:func:`deep_verify` reads one ``iter_N`` dir (never writes it) with megatron-core's own readers
when the ``megatron`` extra is installed, else file by file; either way every shard the torch
DCP ``.metadata`` names must exist and be long enough. What counts as *complete* for a scan is
decided in :mod:`.checkpoints`; this is the slower, stronger check a report or a smoke run asks
for. megatron-core and torch are optional and looked up lazily by name.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from shoprld.daemon.foundation.storage.checkpoints import _metadata_json_mtime

__all__ = ["DeepVerify", "deep_verify"]


@dataclass(frozen=True)
class DeepVerify:
    """The verdict of :func:`deep_verify`: ``method`` says which check ran."""

    ok: bool
    method: Literal["megatron", "files"]
    detail: str


def _dcp_storage_problems(ckpt_dir: Path, metadata: Any) -> list[str]:
    """Check every shard that torch DCP ``.metadata`` names is present and long enough."""
    need: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        rel = str(getattr(info, "relative_path", ""))
        end = int(getattr(info, "offset", 0)) + int(getattr(info, "length", 0))
        need[rel] = max(need.get(rel, 0), end)
    problems: list[str] = []
    for rel, end in sorted(need.items()):
        try:
            size = (ckpt_dir / rel).stat().st_size
        except OSError:
            problems.append(f"shard {rel} named in .metadata is missing")
            continue
        if size < end:
            problems.append(f"shard {rel} is {size} bytes, .metadata needs {end}")
    if not need:
        problems.append(".metadata names no shard")
    return problems


def _file_level_problems(ckpt_dir: Path) -> list[str]:
    problems: list[str] = []
    try:
        entries = {e.name: e for e in os.scandir(ckpt_dir)}
    except OSError as exc:
        return [f"{ckpt_dir}: {exc.strerror or exc}"]
    for required in (".metadata", "metadata.json"):
        if required not in entries:
            problems.append(f"{required} is missing")
    if not any(name.endswith(".distcp") for name in entries):
        problems.append("no *.distcp shard")
    for name, entry in sorted(entries.items()):
        try:
            if entry.is_file() and entry.stat().st_size == 0:
                problems.append(f"{name} is empty")
        except OSError:
            problems.append(f"{name} is unreadable")
    if "metadata.json" in entries and _metadata_json_mtime(str(ckpt_dir / "metadata.json")) is None:
        problems.append("metadata.json does not parse as a JSON object")
    return problems


def deep_verify(ckpt_dir: Path) -> DeepVerify:
    """Check one ``iter_N`` dir beyond file presence. Blocking (seconds): run it in a thread.

    With megatron-core importable (the ``megatron`` extra): ``check_is_distributed_checkpoint``
    and ``load_tensors_metadata`` (megatron-core's own readers), then every shard that the DCP
    ``.metadata`` names must exist and be long enough. Without it: a file-level check (required
    files present and non-empty, ``metadata.json`` parses), plus the same shard check when torch
    alone can read ``.metadata``. Never raises.
    """
    ckpt_dir = Path(ckpt_dir)
    try:
        # Lazy and optional: megatron-core (and torch) are an extra, never a dependency, so they
        # are looked up by name (untyped) rather than imported at the top.
        dist_checkpointing = importlib.import_module("megatron.core.dist_checkpointing")
        fs_reader = importlib.import_module("torch.distributed.checkpoint").FileSystemReader
    except Exception:  # ImportError, or a broken install raising anything at import
        return _deep_verify_files(ckpt_dir)
    try:
        if not dist_checkpointing.check_is_distributed_checkpoint(str(ckpt_dir)):
            return DeepVerify(False, "megatron", f"{ckpt_dir}: not a distributed checkpoint (metadata.json)")
        tensors = dist_checkpointing.load_tensors_metadata(str(ckpt_dir))
        problems = _file_level_problems(ckpt_dir)
        problems += _dcp_storage_problems(ckpt_dir, fs_reader(str(ckpt_dir)).read_metadata())
    except Exception as exc:  # megatron's readers raise many types on a damaged checkpoint
        return DeepVerify(False, "megatron", f"{ckpt_dir}: {type(exc).__name__}: {exc}")
    if problems:
        return DeepVerify(False, "megatron", f"{ckpt_dir}: " + "; ".join(problems))
    return DeepVerify(True, "megatron", f"{ckpt_dir}: {len(tensors)} tensors, all shards present")


def _deep_verify_files(ckpt_dir: Path) -> DeepVerify:
    problems = _file_level_problems(ckpt_dir)
    how = "file-level (megatron-core not installed)"
    try:
        fs_reader = importlib.import_module("torch.distributed.checkpoint").FileSystemReader
    except Exception:
        how += "; .metadata not read (torch not installed)"
    else:
        if (ckpt_dir / ".metadata").is_file():
            try:
                problems += _dcp_storage_problems(ckpt_dir, fs_reader(str(ckpt_dir)).read_metadata())
                how += "; shards checked against .metadata"
            except Exception as exc:
                problems.append(f".metadata unreadable: {type(exc).__name__}: {exc}")
    if problems:
        return DeepVerify(False, "files", f"{ckpt_dir}: " + "; ".join(problems) + f" [{how}]")
    return DeepVerify(True, "files", f"{ckpt_dir}: ok [{how}]")
