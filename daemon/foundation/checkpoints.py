"""Megatron checkpoints: what is on disk, what is complete, what may go, and when it changed.

Theory of operation
===================

slime saves through Megatron's ``torch_dist`` backend. One save of iteration N writes, in order::

    <save>/iter_{N:07d}/__{rank}_{k}.distcp   torch DCP shards
    <save>/iter_{N:07d}/.metadata             torch DCP metadata (names every shard)
    <save>/iter_{N:07d}/common.pt             the non-sharded state (megatron-core < 0.19 only)
    <save>/iter_{N:07d}/metadata.json         Megatron's backend config, written last in the dir
    --- barrier ---
    <save>/latest_checkpointed_iteration.txt  rank 0, plain open('w'): "N" (or "release")

The tracker is written LAST and NOT atomically, so a reader can see it empty, torn (``"4"`` while
``"40"`` is being written), or holding garbage; :func:`read_tracker` gives each case a defined
:class:`Tracker` and never raises. A torn value cannot be told from a real one by its content, so
it is taken at face value: what protects us is that *committed* also needs the iter dir to be
complete, and that a smaller tracker can only make things look older, never delete anything
(retention never touches what lies beyond the tracker).

Classification of ``iter_N`` dirs (SPEC §3), relative to one tracker read:

- **files complete** (:attr:`Checkpoint.complete`): ``metadata.json`` parses as a JSON object,
  ``.metadata`` exists and at least one ``*.distcp`` shard exists. SPEC §3 also asks for
  ``common.pt``, but megatron-core 0.19 no longer writes it (its common state moved into the
  DCP files; seen on the GPU smoke run, run/gpu-smoke/README.md). ``metadata.json`` is still
  written last, so a torn save is still caught;
- **committed**: files complete and ``N <= tracker`` (the tracker holds an iteration);
  :attr:`Scan.latest_complete` is the newest committed one: the resume point;
- **ahead**: files complete but ``N > tracker`` (or the tracker holds no iteration). This is what
  ``--async-save`` looks like, where the tracker trails the data by a save interval, and what a
  crash between the barrier and the tracker write leaves. It is NOT a regression and NOT committed;
- **partial**: files incomplete, whatever N: a save in progress or an abandoned one.

The watcher (:class:`CheckpointWatcher`) watches the save dir non-recursively (recursive watches
race with brand-new dirs) with watchdog's inotify observer, or polls. Either way an event is only
a hint that makes it rescan the whole save dir; the rescan is the truth, so a lost event (queue
overflow, a filesystem that delivers none) costs latency, never correctness. It also rescans on a
timer and after an overflow. Both modes feed the same rescan-and-diff code, so they emit the same
events in the same order.

Retention. This module alone decides what is kept and deletes checkpoints (issue 16, step 3):
:func:`keep_set` is the one keep-set rule (the finals the rounds need, the newest save of the
round in progress, what an export read), :func:`retention_plan` only ever proposes committed
checkpoints outside that set and not the resume point, plus partials while no trainer runs;
:func:`retain` carries a plan out; :func:`delete_checkpoints` refuses anything that does not
resolve to a direct child of the save dir. The ShopSim-outage rollback lives here too
(:func:`roll_back_to`): the ShopSim service only reports the last checkpoint it saw served.
Megatron's tracker is rewritten by :func:`point_tracker` only.

The round <-> iteration arithmetic lives in :class:`IterationMapping`.

Only this module decides what is complete (ARCHITECTURE.md). structlog and watchdog are imported
lazily: ``shoprld status`` reads checkpoints and must stay fast.
"""

from __future__ import annotations

import asyncio
import errno
import importlib
import inspect
import json
import logging
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.lowlevel
import anyio.from_thread
import anyio.to_thread
from anyio.abc import TaskStatus

from shoprld.daemon.foundation.store import atomic_write

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

__all__ = [
    "TRACKER_NAME",
    "Checkpoint",
    "CheckpointWatcher",
    "DeepVerify",
    "IterationMapping",
    "ObserverLike",
    "Scan",
    "Tracker",
    "TrackerKind",
    "WatchMode",
    "deep_verify",
    "delete_checkpoints",
    "delete_iter_dir",
    "detect_watch_mode",
    "is_complete",
    "iter_dir",
    "keep_set",
    "outage_suspects",
    "point_tracker",
    "iter_name",
    "read_tracker",
    "retain",
    "retention_plan",
    "roll_back_to",
    "scan",
]

TRACKER_NAME = "latest_checkpointed_iteration.txt"
"""Megatron's tracker file, directly in the save dir."""

TrackerKind = Literal["missing", "empty", "garbage", "release", "ok"]
WatchMode = Literal["inotify", "poll"]

# Megatron names dirs with f"iter_{N:07d}" and loads exactly that name, so only the canonical
# spelling counts (``iter_40`` or ``iter_00000040`` would never be loaded by Megatron either).
_ITER_RE = re.compile(r"iter_(\d{7,})")
# The tracker is a few bytes; anything much larger is garbage, and we never read a huge file.
_TRACKER_MAX_BYTES = 4096
_TRACKER_RE = re.compile(r"(?:iter_)?([0-9]+)")
# metadata.json is a small JSON object; cap the read so a corrupt giant file cannot stall a scan.
_METADATA_JSON_MAX_BYTES = 1 << 20
# delete_checkpoints() renames an iter dir to this prefix first, so a crash mid-delete never leaves
# a half-deleted dir that still looks complete (rmtree's order is arbitrary: it could remove one
# shard and keep metadata.json). The name matches neither _ITER_RE nor anything Megatron loads.
_TRASH_PREFIX = ".deleting."


def _log() -> FilteringBoundLogger:
    # Lazy: importing structlog costs ~0.2 s, and `shoprld status` imports this module.
    import structlog

    logger: FilteringBoundLogger = structlog.get_logger("shoprld.checkpoints")
    return logger


def iter_name(iteration: int) -> str:
    """Megatron's name for the checkpoint of ``iteration`` (``iter_{N:07d}``): the one place it
    is spelled; a round's ``weight_version`` is this name too."""
    return f"iter_{iteration:07d}"


def iter_dir(save_dir: Path, iteration: int) -> Path:
    """The path Megatron uses for ``iteration`` under ``save_dir`` (:func:`iter_name`)."""
    return Path(save_dir) / iter_name(iteration)


def _iteration_of(name: str) -> int | None:
    m = _ITER_RE.fullmatch(name)
    if m is None:
        return None
    digits = m.group(1)
    # Canonical f"{N:07d}": exactly 7 digits, or more without a leading zero.
    if len(digits) > 7 and digits[0] == "0":
        return None
    return int(digits)


# --------------------------------------------------------------------------------------------
# The tracker


@dataclass(frozen=True)
class Tracker:
    """One read of ``latest_checkpointed_iteration.txt``.

    ``kind`` is one of:

    - ``missing``: no tracker (no save committed yet, or the save dir does not exist);
    - ``empty``: present but blank: the instant between Megatron's ``open('w')`` and its write;
    - ``garbage``: present but unusable (not an integer, unreadable, not a regular file);
    - ``release``: Megatron's ``release`` marker: no iteration;
    - ``ok``: an iteration, written as ``N`` or ``iter_N`` with optional whitespace.

    ``iteration`` is set only for ``ok``. A torn write (``"4"`` of ``"40"``) reads as ``ok 4``: no
    reader can tell, which is why *committed* also requires the iter dir to be complete.
    ``raw`` is the text read (at most 4 KiB); ``mtime`` the file's wall-clock mtime, or None.
    """

    kind: TrackerKind
    iteration: int | None
    raw: str
    mtime: float | None = None


def _parse_tracker(raw: str) -> tuple[TrackerKind, int | None]:
    text = raw.strip()
    if not text:
        return "empty", None
    if text == "release":
        return "release", None
    # ASCII digits only: int() would also take "+4", "4_0" and non-ASCII digits, which no writer
    # of this file produces; anything odd is garbage, not a guess.
    m = _TRACKER_RE.fullmatch(text)
    if m is None or not m.group(1).isascii():
        return "garbage", None
    return "ok", int(m.group(1))


def read_tracker(save_dir: Path) -> Tracker:
    """Read and classify the tracker in ``save_dir``. Never raises."""
    path = Path(save_dir) / TRACKER_NAME
    try:
        # O_NONBLOCK: a FIFO planted at this name must not hang the scan.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return Tracker("missing", None, "")
    except OSError as exc:
        return Tracker("garbage", None, f"<unreadable: {exc.strerror}>")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Tracker("garbage", None, "<not a regular file>", st.st_mtime)
        data = os.read(fd, _TRACKER_MAX_BYTES + 1)
    except OSError as exc:
        return Tracker("garbage", None, f"<unreadable: {exc.strerror}>")
    finally:
        os.close(fd)
    raw = data[:_TRACKER_MAX_BYTES].decode("utf-8", errors="replace")
    if len(data) > _TRACKER_MAX_BYTES:
        return Tracker("garbage", None, raw, st.st_mtime)
    kind, iteration = _parse_tracker(raw)
    return Tracker(kind, iteration, raw, st.st_mtime)


# --------------------------------------------------------------------------------------------
# Checkpoints and scans


@dataclass(frozen=True)
class Checkpoint:
    """One ``iter_N`` directory as found on disk.

    ``complete`` says the *files* are complete (``metadata.json`` parses, ``.metadata``,
    ``common.pt`` and a ``*.distcp`` shard exist). Whether it is *committed* also depends on the
    tracker, so that is a property of a :class:`Scan` (:attr:`Scan.committed`), and
    :func:`is_complete` answers the SPEC's question for one iteration. ``bytes`` is the size of
    the files in the dir; ``committed_at`` is ``metadata.json``'s mtime (wall clock), None when
    the files are incomplete.
    """

    iteration: int
    path: Path
    complete: bool
    bytes: int
    committed_at: float | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, as ``status --json`` shows ``last_checkpoint``."""
        return {
            "iteration": self.iteration,
            "path": str(self.path),
            "complete": self.complete,
            "bytes": self.bytes,
            "committed_at": self.committed_at,
        }


def _tree_bytes(path: str) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        total += _tree_bytes(entry.path)
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue  # vanished while we looked: it no longer takes space
    except OSError:
        pass
    return total


def _metadata_json_mtime(path: str) -> float | None:
    """mtime of ``metadata.json`` if it holds a JSON object, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _METADATA_JSON_MAX_BYTES:
            return None
        data = os.read(fd, st.st_size + 1)  # sized read: no megabyte buffer per scan
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both derive from it
        return None
    # Megatron writes an object ({"sharded_backend": "torch_dist", ...}); a bare scalar or list
    # is not a metadata file, however it parses.
    return st.st_mtime if isinstance(doc, dict) else None


def _inspect(path: str, iteration: int) -> Checkpoint | None:
    """Look at one iter dir. None when it is not there (any more)."""
    names: set[str] = set()
    has_shard = False
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        total += _tree_bytes(entry.path)
                        continue
                    # Follow symlinks for files: Megatron's loader would.
                    if not entry.is_file():
                        continue
                    total += entry.stat().st_size
                except OSError:
                    continue
                names.add(entry.name)
                if entry.name.endswith(".distcp"):
                    has_shard = True
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        # Present but unreadable (EACCES, EIO): never complete, never a crash.
        return Checkpoint(iteration, Path(path), False, 0, None)
    committed_at: float | None = None
    if has_shard and {".metadata", "metadata.json"} <= names:
        committed_at = _metadata_json_mtime(os.path.join(path, "metadata.json"))
    return Checkpoint(iteration, Path(path), committed_at is not None, total, committed_at)


@dataclass(frozen=True)
class Scan:
    """The save dir at one instant: one tracker read, then every ``iter_N`` dir, by iteration."""

    tracker: Tracker
    checkpoints: tuple[Checkpoint, ...] = ()

    def _is_committed(self, ckpt: Checkpoint) -> bool:
        top = self.tracker.iteration
        return ckpt.complete and top is not None and ckpt.iteration <= top

    @property
    def committed(self) -> tuple[Checkpoint, ...]:
        """Complete checkpoints with ``N <= tracker``, oldest first."""
        return tuple(c for c in self.checkpoints if self._is_committed(c))

    @property
    def latest_complete(self) -> Checkpoint | None:
        """The newest committed checkpoint: where a resume starts. None when there is none."""
        committed = self.committed
        return committed[-1] if committed else None

    @property
    def partials(self) -> tuple[Checkpoint, ...]:
        """Dirs whose files are incomplete: a save in progress or an abandoned one."""
        return tuple(c for c in self.checkpoints if not c.complete)

    @property
    def ahead(self) -> tuple[Checkpoint, ...]:
        """Complete by their files but beyond the tracker (async save, or tracker not yet written).

        Not committed and not a regression. When the tracker holds no iteration (missing, empty,
        garbage, release), every complete dir is here.
        """
        return tuple(c for c in self.checkpoints if c.complete and not self._is_committed(c))

    @property
    def consistent(self) -> bool:
        """True when the tracker names an iteration whose dir is complete (what Megatron loads)."""
        latest = self.latest_complete
        return latest is not None and latest.iteration == self.tracker.iteration

    def get(self, iteration: int) -> Checkpoint | None:
        """The dir for ``iteration``, complete or not; None when there is none."""
        for c in self.checkpoints:
            if c.iteration == iteration:
                return c
        return None


# name -> (_cache_key() when last checked, the complete Checkpoint, committed when last checked)
_ScanCache = dict[str, tuple[tuple[int, int, int], Checkpoint, bool]]


def _cache_key(entry: os.DirEntry[str]) -> tuple[int, int, int]:
    """The iter dir's inode and mtime (entries added or removed) and metadata.json's mtime
    (written last: an in-place re-save rewrites it)."""
    st = entry.stat()
    try:
        meta = os.stat(f"{entry.path}/metadata.json").st_mtime_ns
    except OSError:
        meta = -1
    return (st.st_ino, st.st_mtime_ns, meta)


def scan(save_dir: Path) -> Scan:
    """Read the tracker, then every ``iter_N`` dir of ``save_dir``. Never raises.

    A missing or unreadable save dir gives an empty scan. The tracker is read FIRST on purpose:
    Megatron writes it last, so every dir with ``N <= tracker`` had finished its files before
    the value we hold was written, and reading in this order cannot see a committed-but-partial
    dir that a concurrent save is about to finish.
    """
    return _scan(Path(save_dir), None)


def _scan(save_dir: Path, cache: _ScanCache | None) -> Scan:
    """:func:`scan`, optionally reusing what an earlier scan learnt (the watcher's hint rescans).

    Only *complete* dirs are cached: a partial one changes by files being written, which does not
    always bump the dir's mtime (metadata.json is created empty, then written). A cached dir that
    was already committed when last checked, and still is, is trusted without a syscall:
    Megatron never touches a committed save again (after a tracker rollback, a re-save of N
    happens while N is above the tracker, and a scan sees that). Any other cached dir is
    re-checked by :func:`_cache_key`:
    megatron-core saves over a leftover dir in place ("Overwriting old incomplete / corrupted
    checkpoint..."), rewriting metadata.json last. The listing itself is always fresh, so a
    deleted dir is always seen. What the cache cannot see (a committed dir edited in place, or
    a change within one coarse timestamp tick) the watcher's periodic full rescan, which clears
    the cache, sees within ``rescan_interval``.
    """
    tracker = read_tracker(save_dir)
    top = tracker.iteration if tracker.iteration is not None else -1
    found: list[tuple[int, str, tuple[int, int, int] | None]] = []
    try:
        with os.scandir(save_dir) as it:
            for entry in it:
                n = _iteration_of(entry.name)
                if n is None:
                    continue
                key = None
                try:
                    if not entry.is_dir():
                        continue
                    hit = cache.get(entry.name) if cache is not None else None
                    if cache is not None and not (hit is not None and hit[2] and n <= top):
                        # stat BEFORE inspecting: a change during the inspection leaves a stale
                        # key behind, which only causes one more inspection next time.
                        key = _cache_key(entry)
                except OSError:
                    continue
                found.append((n, entry.name, key))
    except OSError:
        if cache is not None:
            cache.clear()
        return Scan(tracker)
    found.sort()
    checkpoints: list[Checkpoint] = []
    root = os.fspath(save_dir)
    for n, name, key in found:
        if cache is not None:
            hit = cache.get(name)
            if hit is not None and (key is None or hit[0] == key):
                if key is not None:
                    cache[name] = (key, hit[1], n <= top)
                checkpoints.append(hit[1])
                continue
        ckpt = _inspect(os.path.join(root, name), n)
        if ckpt is None:
            continue
        checkpoints.append(ckpt)
        if cache is not None and key is not None:
            if ckpt.complete:
                cache[name] = (key, ckpt, n <= top)
            else:
                cache.pop(name, None)
    if cache:
        seen = {name for _, name, _ in found}
        for name in [k for k in cache if k not in seen]:
            del cache[name]  # gone from the listing: a dir recreated later is inspected afresh
    return Scan(tracker, tuple(checkpoints))


def is_complete(save_dir: Path, iteration: int) -> bool:
    """SPEC §3 completeness of one iteration: ``N <= tracker`` and its files are complete."""
    tracker = read_tracker(save_dir)
    if tracker.iteration is None or iteration > tracker.iteration:
        return False
    ckpt = _inspect(os.fspath(iter_dir(save_dir, iteration)), iteration)
    return ckpt is not None and ckpt.complete


# --------------------------------------------------------------------------------------------
# Deep verification


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


# --------------------------------------------------------------------------------------------
# Rounds and iterations


@dataclass(frozen=True)
class IterationMapping:
    """Round (0-based) <-> Megatron iteration, made explicit.

    Round ``r`` ends at iteration ``(r + 1) * steps_per_round + end_offset``.

    - The seed recipe (ShopSimRL's ``run_full_train.sh``): ``--num-rollout (i+1)*20+1``, one save
      at its last rollout, so round i ends at ``iter_{(i+1)*20}``: ``end_offset=0``.
    - slime's plain numbering (rollouts from 0, K per round, a save every K): round i ends at
      ``(i+1)*K - 1``: ``end_offset=-1``.
    """

    steps_per_round: int
    end_offset: int = 0

    def __post_init__(self) -> None:
        if self.steps_per_round < 1:
            raise ValueError(f"steps_per_round must be >= 1, got {self.steps_per_round}")
        if self.end_offset < -self.steps_per_round:
            raise ValueError(
                f"end_offset {self.end_offset} makes round 0 end before iteration 0 "
                f"(steps_per_round={self.steps_per_round})"
            )

    def end_iteration(self, round: int) -> int:
        """The iteration of the checkpoint that ends ``round``."""
        if round < 0:
            raise ValueError(f"round must be >= 0, got {round}")
        return (round + 1) * self.steps_per_round + self.end_offset

    def num_rollout(self, round: int) -> int:
        """slime's ``--num-rollout`` for ``round``: an absolute end id; the final save is at id-1."""
        return self.end_iteration(round) + 1

    def round_of(self, iteration: int) -> int:
        """The round whose span ``(end(r-1), end(r)]`` contains ``iteration`` (0 for anything earlier)."""
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        # ceil((iteration - end_offset) / steps) - 1, in integers.
        r = -((self.end_offset - iteration) // self.steps_per_round) - 1
        return max(r, 0)

    def first_incomplete_round(self, scan: Scan, rounds: int) -> int:
        """The first round whose training is not finished on disk; ``rounds`` when all are.

        Judged from the resume point (:attr:`Scan.latest_complete`), not from each round's own
        end checkpoint: retention deletes old rounds' checkpoints, and a committed checkpoint at
        or past ``end(r)`` proves round r trained. Checkpoints ``ahead`` of the tracker count for
        nothing: slime would not resume from them.
        """
        latest = scan.latest_complete
        for r in range(rounds):
            if latest is None or latest.iteration < self.end_iteration(r):
                return r
        return rounds


# --------------------------------------------------------------------------------------------
# Retention


def retention_plan(scan: Scan, *, keep_iterations: Iterable[int], trainer_running: bool) -> list[Checkpoint]:
    """What MAY be deleted in this save dir, oldest first.

    Never proposed: the resume point (``scan.latest_complete``), anything in ``keep_iterations``
    (the caller passes the newest complete of the current round, the previous round's final
    checkpoint and the export's iteration), and anything ``ahead`` of the tracker (it may be the
    next resume point once the tracker catches up). Partials only when ``trainer_running`` is
    False: while a trainer runs, a partial may be the save being written. A tracker that reads
    torn or empty can only shrink what is committed, so it can only make this plan smaller.
    """
    latest = scan.latest_complete
    keep = set(keep_iterations)
    if latest is not None:
        keep.add(latest.iteration)
    ahead = {c.iteration for c in scan.ahead}
    plan: list[Checkpoint] = []
    for ckpt in scan.checkpoints:
        if ckpt.iteration in keep or ckpt.iteration in ahead:
            continue
        if ckpt.complete or not trainer_running:
            plan.append(ckpt)
    return plan


def keep_set(scan: Scan, mapping: IterationMapping, *, round: int, finished: bool, keep_finals: int,
             export_iteration: int | None = None) -> set[int]:
    """The iterations retention keeps while ``round`` runs (``finished=False``) or once it is done.

    - the finals of the last ``keep_finals`` finished rounds (``round`` itself once finished);
    - while the round runs, its newest complete save: the one mid-round save worth keeping
      (a resume starts there; older mid-round saves of the round are proposed for deletion);
    - ``export_iteration``, the checkpoint the round's HF export read, when there is one.
    The resume point and anything ahead of the tracker are kept by :func:`retention_plan` anyway.
    """
    last = round if finished else round - 1
    keep = {mapping.end_iteration(last - back) for back in range(keep_finals) if last - back >= 0}
    if export_iteration is not None:
        keep.add(export_iteration)
    if not finished:
        current = [c.iteration for c in scan.checkpoints if c.complete and mapping.round_of(c.iteration) == round]
        if current:
            keep.add(max(current))
    return keep


def retain(scan: Scan, keep: Iterable[int], *, save_dir: Path, trainer_running: bool) -> tuple[list[Checkpoint], int]:
    """Delete what :func:`retention_plan` proposes outside ``keep``: (the deleted, the bytes freed)."""
    doomed = retention_plan(scan, keep_iterations=keep, trainer_running=trainer_running)
    return doomed, delete_checkpoints(doomed, save_dir=save_dir) if doomed else 0


def outage_suspects(scan: Scan, witnessed: int | None) -> list[Checkpoint]:
    """Complete checkpoints saved after the last one ShopSim was seen serving (``witnessed``; None:
    none was): their rollouts may have run against a dead ShopSim, so they may hold partial data."""
    return [c for c in scan.checkpoints if c.complete and (witnessed is None or c.iteration > witnessed)]


@dataclass(frozen=True)
class Rollback:
    """What :func:`roll_back_to` did."""

    deleted: tuple[int, ...]
    resume: int | None  # the iteration the tracker names now; None: the next start loads the base model


def roll_back_to(save_dir: Path, witnessed: int | None, *, now: float) -> Rollback:
    """The ShopSim-outage rollback: delete :func:`outage_suspects` and point the tracker at the
    newest complete checkpoint at or before ``witnessed`` (set it aside when there is none), so
    that only the steps after the witnessed checkpoint are retrained."""
    found = scan(save_dir)
    doomed = outage_suspects(found, witnessed)
    delete_checkpoints(doomed, save_dir=save_dir)
    kept = [c for c in found.checkpoints if c.complete and witnessed is not None and c.iteration <= witnessed]
    resume = kept[-1].iteration if kept else None
    point_tracker(save_dir, resume, set_aside_as=f"rolled-back-{int(now)}")
    return Rollback(tuple(c.iteration for c in doomed), resume)


def point_tracker(save_dir: Path, iteration: int | None, *, set_aside_as: str = "set-aside") -> None:
    """Make Megatron's tracker name ``iteration`` (atomically, durably). With None there is nothing
    to resume from: the tracker, if any, is renamed ``<tracker>.<set_aside_as>`` (kept for the
    post-mortem), and the next trainer starts from the base model."""
    tracker = save_dir / TRACKER_NAME
    if iteration is not None:
        atomic_write(tracker, f"{iteration}\n".encode())
    elif tracker.exists():
        tracker.rename(tracker.with_name(f"{tracker.name}.{set_aside_as}"))


def keep_while_training(scan: Scan, mapping: IterationMapping, round_index: int) -> set[int]:
    """The keep set while ``round_index`` trains (issue 17): the newest complete save of the
    round, and every complete checkpoint outside it (the finals NEXT_ROUND's retention left,
    which ``--load`` and the export need). The round's older saves are superseded: a fault
    resumes from the newest, so keeping them would only cost a checkpoint's room each."""
    complete = [c.iteration for c in scan.checkpoints if c.complete]
    mine = [i for i in complete if mapping.round_of(i) == round_index]
    return {i for i in complete if mapping.round_of(i) != round_index} | ({max(mine)} if mine else set())


def _refusal(path: str, root: str, iteration: int) -> str | None:
    if os.path.islink(path):
        return "is a symlink"
    real = os.path.realpath(path)
    if os.path.dirname(real) != root:
        return f"resolves to {real}, not directly inside {root}"
    if os.path.basename(real) != iter_name(iteration):
        return f"resolves to {real}, which is not {iter_name(iteration)}"
    if not os.path.isdir(real):
        return "is not a directory"
    return None


def _rmtree(path: str) -> list[str]:
    """Remove a tree, collecting errors instead of stopping at the first."""
    errors: list[str] = []

    def onexc(func: Callable[..., Any], p: str, exc: BaseException) -> None:
        errors.append(f"{p}: {exc}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=onexc)
    else:  # 3.11: onerror (deprecated in 3.12) gets an exc_info triple
        shutil.rmtree(path, onerror=lambda func, p, exc_info: onexc(func, p, exc_info[1]))
    return errors


def delete_checkpoints(items: Iterable[Checkpoint], *, save_dir: Path) -> int:
    """Delete ``items`` (normally a :func:`retention_plan`); returns the bytes freed.

    Refuses, with ``checkpoint.delete_refused``, any item whose path is a symlink or does not
    resolve to ``iter_{N:07d}`` directly inside ``realpath(save_dir)``. Each dir is first renamed
    to a hidden trash name in the save dir, then removed, so a crash mid-delete never leaves a
    half-deleted dir that still looks complete; leftovers of such a crash are swept here too.
    Logs ``checkpoint.deleted {iteration, path, bytes, partial}`` per item.
    """
    log = _log()
    root = os.path.realpath(save_dir)
    freed = 0
    for ckpt in items:
        path = os.fspath(ckpt.path)
        reason = _refusal(path, root, ckpt.iteration)
        if reason is not None:
            log.warning("checkpoint.delete_refused", iteration=ckpt.iteration, path=path, reason=reason)
            continue
        size = _tree_bytes(path)
        trash = os.path.join(root, f"{_TRASH_PREFIX}{os.path.basename(path)}")
        if os.path.lexists(trash):
            _rmtree(trash)
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            continue  # already gone: nothing freed, nothing to log
        except OSError as exc:
            log.warning("checkpoint.delete_failed", iteration=ckpt.iteration, path=path, error=str(exc))
            continue
        errors = _rmtree(trash)
        if errors:
            log.warning("checkpoint.delete_failed", iteration=ckpt.iteration, path=path, error=errors[0])
            size -= _tree_bytes(trash)
        freed += size
        log.info("checkpoint.deleted", iteration=ckpt.iteration, path=path, bytes=size, partial=not ckpt.complete)
    _sweep_trash(root)
    return freed


def delete_iter_dir(path: Path) -> int:
    """Delete one ``iter_N`` dir named by its path, complete or not (``shoprld clean``: every
    checkpoint of the campaign goes), as :func:`delete_checkpoints` deletes: refused unless it is a
    real ``iter_N`` dir directly in its parent, trash-renamed first. Returns the bytes freed."""
    m = _ITER_RE.fullmatch(path.name)
    if m is None:
        _log().warning("checkpoint.delete_refused", path=str(path), reason="not an iter_N dir")
        return 0
    found = Checkpoint(int(m.group(1)), path, False, 0, None)
    return delete_checkpoints([found], save_dir=path.parent)


def _sweep_trash(root: str) -> None:
    try:
        with os.scandir(root) as it:
            leftovers = [e.path for e in it if e.name.startswith(_TRASH_PREFIX) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for path in leftovers:
        size = _tree_bytes(path)
        _rmtree(path)
        _log().info("checkpoint.trash_swept", path=path, bytes=size)


# --------------------------------------------------------------------------------------------
# Watch mode detection

# Filesystems where inotify cannot see writes made by another node (or sees nothing at all).
# fuseblk (ntfs-3g, exfat on a local disk) is local and is left to inotify.
_POLL_FSTYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "lustre", "gpfs", "ceph", "glusterfs",
        "afs", "beegfs", "orangefs", "virtiofs", "davfs", "fuse", "panfs", "wekafs",
    }
)  # fmt: skip

_MOUNTINFO = Path("/proc/self/mountinfo")


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _fstype_of(path: Path, mountinfo: Path) -> str | None:
    target = os.path.realpath(path)
    try:
        text = mountinfo.read_text(errors="replace")
    except OSError:
        return None
    best: str | None = None
    best_len = -1
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount_point = _unescape_mount(fields[4])
        under = mount_point == "/" or target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        # ">=": a later line for the same mount point is a mount stacked on top; it wins.
        if under and len(mount_point) >= best_len:
            best, best_len = tail[0], len(mount_point)
    return best


def detect_watch_mode(path: Path, *, mountinfo: Path = _MOUNTINFO) -> WatchMode:
    """``poll`` when ``path`` lives on a network/FUSE/cluster filesystem, else ``inotify``.

    Finds the mount with the longest mount-point prefix of ``realpath(path)`` in ``mountinfo``
    (``/proc/self/mountinfo``; a parameter so tests can pass a fixture). Unreadable mountinfo
    means ``inotify``: the periodic rescan still guarantees correctness.
    """
    fstype = _fstype_of(path, mountinfo)
    if fstype is not None and (fstype in _POLL_FSTYPES or fstype.startswith("fuse.")):
        return "poll"
    return "inotify"


# --------------------------------------------------------------------------------------------
# The watcher


class ObserverLike(Protocol):
    """The part of watchdog's ``BaseObserver`` the watcher uses: the seam for ``observer_factory``."""

    def schedule(self, event_handler: Any, path: str, *, recursive: bool = ..., event_filter: Any = ...) -> Any: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def join(self, timeout: float | None = None) -> None: ...


Emit = Callable[[dict[str, Any]], Awaitable[None] | None]
"""What :meth:`CheckpointWatcher.run` calls with each event: a function or a coroutine function."""


def _default_observer() -> ObserverLike:
    from watchdog.observers import Observer  # inotify on Linux; lazy: only a running watcher needs watchdog

    observer: ObserverLike = Observer()
    return observer


def _event_filter() -> list[Any]:
    # Only what changes the save dir's own entries. Opens, reads and no-write closes are left
    # out on purpose: our own rescans open the tracker, and would otherwise wake us forever.
    from watchdog import events as ev  # lazy: as _default_observer

    return [
        ev.FileCreatedEvent, ev.FileModifiedEvent, ev.FileClosedEvent, ev.FileDeletedEvent,
        ev.FileMovedEvent, ev.DirCreatedEvent, ev.DirDeletedEvent, ev.DirMovedEvent,
    ]  # fmt: skip


class _Hint:
    """watchdog handler (duck-typed ``FileSystemEventHandler``): any event is only a hint."""

    def __init__(self, poke: Callable[[], None]) -> None:
        self._poke = poke

    def dispatch(self, event: Any) -> None:  # called on the observer thread
        self._poke()


class _OverflowLogHook(logging.Handler):
    """watchdog reports IN_Q_OVERFLOW only as a log line, never to handlers: turn it into a rescan."""

    def __init__(self, on_overflow: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self._on_overflow = on_overflow

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self._on_overflow()


_WATCHDOG_INOTIFY_LOGGER = "watchdog.observers.inotify_c"


class _Differ:
    """Turns successive scans into events; the same code serves both modes, hence same events."""

    def __init__(self, since_iteration: int | None) -> None:
        self._since = since_iteration
        # Keyed by (iteration, metadata.json mtime): a re-save of the same N (after a rollback of
        # the tracker) is a new commit; a torn tracker read that hides a checkpoint for an
        # instant must not make it "new" again when it reappears.
        self._emitted: set[tuple[int, float | None]] | None = None
        self._partial: set[int] = set()
        self._ahead: set[int] = set()

    def diff(self, scan: Scan, *, now_wall: float) -> list[dict[str, Any]]:
        committed = scan.committed
        if self._emitted is None:
            # First scan: what is already committed is the baseline, not news (unless the caller
            # told us what it already knew, to close the gap between its scan and ours).
            self._emitted = {
                (c.iteration, c.committed_at)
                for c in committed
                if self._since is None or c.iteration <= self._since
            }
        present = {c.iteration for c in scan.checkpoints}
        self._emitted = {k for k in self._emitted if k[0] in present}
        events: list[dict[str, Any]] = []
        mtime = scan.tracker.mtime
        for c in committed:
            key = (c.iteration, c.committed_at)
            if key in self._emitted:
                continue
            self._emitted.add(key)
            latency = max(0.0, (now_wall - mtime) * 1000.0) if mtime is not None else None
            events.append(
                {"event": "checkpoint.committed", "iteration": c.iteration, "path": str(c.path),
                 "bytes": c.bytes, "latency_ms": latency}
            )  # fmt: skip
        ahead = {c.iteration: c for c in scan.ahead}
        for n, c in ahead.items():
            if n not in self._ahead:
                events.append({"event": "checkpoint.ahead", "iteration": n, "path": str(c.path), "bytes": c.bytes})
        self._ahead = set(ahead)
        partial = {c.iteration: c for c in scan.partials}
        for n, c in partial.items():
            if n not in self._partial:
                top = scan.tracker.iteration
                events.append(
                    {"event": "checkpoint.partial", "iteration": n, "path": str(c.path),
                     "beyond_tracker": top is None or n > top}
                )  # fmt: skip
        self._partial = set(partial)
        return events


class CheckpointWatcher:
    """Watches one save dir and emits checkpoint events to the event loop.

    A watchdog observer on the save dir (inotify, non-recursive), or a polling loop. Observer
    events are hints handed to the event loop thread-safely; each triggers a rescan of the save
    dir (coalesced: events that arrive during a rescan cause exactly one more), which re-reads
    the tracker, the listing and every dir not yet committed. A full rescan, re-reading every
    dir, runs at start, every ``rescan_interval`` seconds and after an inotify overflow: the
    rescan is the truth. Poll mode runs the same rescan every ``poll_interval`` (in a worker
    thread: a hung network filesystem must not freeze the loop). ``mode="auto"`` picks
    :func:`detect_watch_mode`. If the save dir does not exist yet, it is polled for every
    ``poll_interval`` and watched once it appears (and again if it is replaced).

    Events passed to ``emit`` (dicts, each once):

    - ``{"event": "checkpoint.committed", "iteration", "path", "bytes", "latency_ms"}`` for each
      newly committed checkpoint (tracker at or past a complete dir), in iteration order.
      ``latency_ms`` is now minus the tracker's mtime (wall clock). Checkpoints already committed
      at start are the baseline and are not emitted, except those above ``since_iteration``
      when it is given;
    - ``{"event": "checkpoint.ahead", "iteration", "path", "bytes"}``: files complete, tracker
      not there yet (async save);
    - ``{"event": "checkpoint.partial", "iteration", "path", "beyond_tracker"}``: files
      incomplete. A save in progress shows up here too when a rescan catches it mid-write.

    Seams: ``observer_factory`` builds the watchdog observer (tests pass one that drops events,
    or one whose ``start`` raises ``OSError(ENOSPC)``); ``clock`` paces the rescans;
    ``wall_clock`` is compared with the tracker's mtime. inotify's ``ENOSPC``/``EMFILE`` mean its
    watch/instance limit, never a full disk: they are logged as ``checkpoint.watch_limit`` and
    the watcher polls instead.
    """

    def __init__(
        self,
        save_dir: Path,
        *,
        mode: Literal["auto", "inotify", "poll"] = "auto",
        poll_interval: float = 1.0,
        rescan_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        observer_factory: Callable[[], ObserverLike] | None = None,
        since_iteration: int | None = None,
    ) -> None:
        if mode not in ("auto", "inotify", "poll"):
            raise ValueError(f"mode must be auto, inotify or poll, got {mode!r}")
        if poll_interval <= 0 or rescan_interval <= 0:
            raise ValueError("poll_interval and rescan_interval must be > 0")
        self.save_dir = Path(save_dir)
        self._requested: Literal["auto", "inotify", "poll"] = mode
        self._mode: WatchMode | None = None
        self._poll_interval = poll_interval
        self._rescan_interval = rescan_interval
        self._clock = clock
        self._wall = wall_clock
        self._observer_factory = observer_factory or _default_observer
        self._differ = _Differ(since_iteration)
        self._observer: ObserverLike | None = None
        self._watched: tuple[int, int] | None = None  # (st_dev, st_ino) of the watched save dir
        self._wake: anyio.Event | None = None
        self._loop_thread: int | None = None
        self._call_soon: Callable[[Callable[[], None]], None] | None = None
        self._poke_pending = False
        self._overflow = False
        self._last_scan: Scan | None = None
        self._cache: _ScanCache = {}
        self._running = False

    @property
    def mode(self) -> WatchMode | None:
        """The mode in effect (None before :meth:`run`); ``poll`` after a watch-limit fallback."""
        return self._mode

    @property
    def last_scan(self) -> Scan | None:
        """The most recent scan (None before the first)."""
        return self._last_scan

    def notify_overflow(self) -> None:
        """Force an immediate full rescan, as after an inotify queue overflow. Thread-safe.

        watchdog rebuilds its watches after ``IN_Q_OVERFLOW`` but tells no handler; the watcher
        hooks watchdog's log line to call this, and tests call it to simulate one.
        """
        self._overflow = True
        if self._loop_thread == threading.get_ident():
            self._set_wake()
        else:
            self._poke_threadsafe()

    # -- thread hand-off ------------------------------------------------------------------

    def _set_wake(self) -> None:  # loop thread only
        self._poke_pending = False
        if self._wake is not None:
            self._wake.set()

    def _poke_threadsafe(self) -> None:  # any thread
        call = self._call_soon
        if call is None or self._poke_pending:
            return  # not running yet (the initial scan covers it), or a wake is already queued
        self._poke_pending = True
        try:
            call(self._set_wake)
        except RuntimeError:
            pass  # the loop is closing: nothing left to wake

    @staticmethod
    def _threadsafe_caller() -> Callable[[Callable[[], None]], None]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Not asyncio (trio): anyio's portal call. It blocks the observer thread until the
            # loop runs it, which only delays watchdog's own queue.
            token = anyio.lowlevel.current_token()

            def via_token(cb: Callable[[], None]) -> None:
                anyio.from_thread.run_sync(cb, token=token)

            return via_token

        def via_loop(cb: Callable[[], None]) -> None:
            # Non-blocking: the observer thread never waits for the loop.
            loop.call_soon_threadsafe(cb)

        return via_loop

    # -- observer lifecycle ---------------------------------------------------------------

    def _arm(self) -> None:
        """Start the observer if inotify is wanted and the save dir exists; fall back on limits."""
        if self._mode != "inotify" or self._observer is not None:
            return
        try:
            st = os.stat(self.save_dir)
        except OSError:
            return  # not there yet: the loop polls for it
        if not stat.S_ISDIR(st.st_mode):
            return
        observer: ObserverLike | None = None
        try:
            observer = self._observer_factory()
            observer.schedule(
                _Hint(self._poke_threadsafe), str(self.save_dir), recursive=False, event_filter=_event_filter()
            )
            observer.start()
        except OSError as exc:
            if observer is not None:
                try:
                    observer.stop()
                except Exception:
                    pass
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # the dir went away between stat and watch: the loop polls for it again
            self._mode = "poll"
            if exc.errno in (errno.ENOSPC, errno.EMFILE):
                # inotify's ENOSPC is fs.inotify.max_user_watches (EMFILE: max_user_instances).
                # It says nothing about free space: never report it as a full disk.
                _log().warning(
                    "checkpoint.watch_limit", path=str(self.save_dir), errno=exc.errno, error=str(exc),
                    fallback="poll", poll_interval=self._poll_interval,
                    hint="inotify watch/instance limit reached (sysctl fs.inotify.max_user_watches); not a full disk",
                )  # fmt: skip
            else:
                _log().warning(
                    "checkpoint.watch_failed", path=str(self.save_dir), error=str(exc), fallback="poll"
                )
            return
        self._observer = observer
        self._watched = (st.st_dev, st.st_ino)

    async def _disarm(self) -> None:
        observer, self._observer, self._watched = self._observer, None, None
        if observer is None:
            return

        def stop_and_join() -> None:
            # Off the loop: InotifyObserver.stop() joins its emitter threads (milliseconds),
            # and watchdog's own pending hand-offs must still be able to reach the loop.
            observer.stop()
            try:
                observer.join(5.0)
            except RuntimeError:
                pass  # never started

        await anyio.to_thread.run_sync(stop_and_join)

    async def _check_watch(self) -> None:
        """Re-arm when the save dir appeared, vanished or was replaced (new inode)."""
        if self._mode != "inotify":
            return
        try:
            st = os.stat(self.save_dir)
            ident: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            ident = None
        if self._observer is not None and ident != self._watched:
            await self._disarm()
        if self._observer is None and ident is not None:
            self._arm()

    async def _rescan(self, emit: Emit, *, full: bool) -> None:
        # A hint rescan reuses unchanged complete dirs; a full one (start, timer, overflow)
        # re-reads everything: the truth.
        if full:
            self._cache.clear()
        # Inline, not in a worker thread: on a local filesystem a scan takes microseconds and a
        # thread hop would add to the detection latency. Polled (network) filesystems scan in a
        # thread: a hung server must not freeze the event loop.
        if self._mode == "poll":
            result = await anyio.to_thread.run_sync(_scan, self.save_dir, self._cache, abandon_on_cancel=True)
        else:
            result = _scan(self.save_dir, self._cache)
        self._last_scan = result
        for event in self._differ.diff(result, now_wall=self._wall()):
            ret = emit(event)
            if inspect.isawaitable(ret):
                await ret

    async def run(self, emit: Emit, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled. ``task_status.started()`` after the initial scan, observer live.

        ``emit`` may be a plain function or a coroutine function; an exception from it ends
        the watcher (it is the caller's bug, not a filesystem condition).
        """
        if self._running:
            raise RuntimeError("CheckpointWatcher.run() is already running")
        self._running = True
        self._loop_thread = threading.get_ident()
        self._call_soon = self._threadsafe_caller()
        self._wake = anyio.Event()
        self._mode = detect_watch_mode(self.save_dir) if self._requested == "auto" else self._requested
        hook = _OverflowLogHook(self.notify_overflow)
        wd_logger = logging.getLogger(_WATCHDOG_INOTIFY_LOGGER)
        wd_logger.addHandler(hook)
        try:
            self._arm()
            self._overflow = False
            await self._rescan(emit, full=True)
            task_status.started()
            next_full = self._clock() + self._rescan_interval
            while True:
                now = self._clock()
                deadline = next_full
                if self._mode == "poll" or self._observer is None:
                    deadline = min(deadline, now + self._poll_interval)
                with anyio.move_on_after(max(0.0, deadline - now)):
                    await self._wake.wait()
                # A fresh Event before the scan: hints arriving during it wake the next round.
                self._wake = anyio.Event()
                full = self._clock() >= next_full
                if self._overflow:
                    self._overflow, full = False, True
                    _log().info("checkpoint.rescan", path=str(self.save_dir), reason="overflow")
                if full:
                    next_full = self._clock() + self._rescan_interval
                await self._check_watch()
                await self._rescan(emit, full=full)
        finally:
            wd_logger.removeHandler(hook)
            self._call_soon = None
            self._loop_thread = None
            with anyio.CancelScope(shield=True):
                await self._disarm()
            self._running = False
