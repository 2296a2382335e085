"""Megatron checkpoints: what is on disk, and what is complete.

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

The round <-> iteration arithmetic lives in :class:`IterationMapping`.

Only this module decides what is complete (ARCHITECTURE.md). It reads the save dir and never
writes it. Its neighbours build on it: :mod:`.retention` (the keep-set, every checkpoint
deletion, the outage rollback, the tracker rewrite), :mod:`.ckptwatch` (the watcher: inotify or
poll, rescan and diff) and :mod:`.deepverify` (the check beyond file presence). They share a few
private helpers defined here (``_ITER_RE``, ``_tree_bytes``, ``_metadata_json_mtime``, ``_scan``
and ``_ScanCache``), package-private on purpose: they are not a public surface. Stdlib only:
``shoprld status`` reads checkpoints and must stay fast.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "TRACKER_NAME",
    "Checkpoint",
    "IterationMapping",
    "Scan",
    "Tracker",
    "TrackerKind",
    "is_complete",
    "iter_dir",
    "iter_name",
    "read_tracker",
    "scan",
]

TRACKER_NAME = "latest_checkpointed_iteration.txt"
"""Megatron's tracker file, directly in the save dir."""

TrackerKind = Literal["missing", "empty", "garbage", "release", "ok"]

# Megatron names dirs with f"iter_{N:07d}" and loads exactly that name, so only the canonical
# spelling counts (``iter_40`` or ``iter_00000040`` would never be loaded by Megatron either).
_ITER_RE = re.compile(r"iter_(\d{7,})")
# The tracker is a few bytes; anything much larger is garbage, and we never read a huge file.
_TRACKER_MAX_BYTES = 4096
_TRACKER_RE = re.compile(r"(?:iter_)?([0-9]+)")
# metadata.json is a small JSON object; cap the read so a corrupt giant file cannot stall a scan.
_METADATA_JSON_MAX_BYTES = 1 << 20


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


def tracker_not_a_file(save_dir: Path) -> str | None:
    """One line when the tracker in ``save_dir`` exists but is not a regular file (a directory, a
    FIFO...): slime cannot read it and Megatron cannot write it, so every attempt of TRAIN would
    fail the same way. Nothing is moved: it is not ours. None otherwise."""
    path = Path(save_dir) / TRACKER_NAME
    try:
        st = os.stat(path)
    except OSError:
        return None  # absent (or unreadable: read_tracker says "garbage" and the resume repairs it)
    if stat.S_ISREG(st.st_mode):
        return None
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
        "not a regular file"
    return (f"{path}: the checkpoint tracker is {kind}, not a file; fix: move it away (a tracker file "
            "names the newest complete iter_N by its number N), then run again")


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
