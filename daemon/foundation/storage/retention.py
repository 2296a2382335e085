"""The one place that deletes checkpoints and rewrites Megatron's tracker.

What is kept, and where a round resumes, is decided in ``daemon/round/resume.py`` (pure); this
module carries those decisions out: :func:`delete_checkpoints` deletes what a decision lets go,
and refuses anything that does not resolve to a direct child of the save dir;
:func:`point_tracker` is the only writer of the tracker (a repair, an outage rollback, a wrong
resume undone).

On disk it touches the save dir only: it deletes ``iter_N`` dirs (each renamed to a hidden
``.deleting.iter_N`` first, and such leftovers are swept), and it rewrites the tracker
atomically or sets it aside as ``<tracker>.<suffix>``. What is on disk and what is complete
come from :mod:`.checkpoints`. structlog is imported lazily, as there.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoprld.daemon.foundation.storage.checkpoints import (
    _ITER_RE,
    TRACKER_NAME,
    Checkpoint,
    _tree_bytes,
    iter_name,
)
from shoprld.daemon.foundation.records.store import atomic_write

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

__all__ = [
    "delete_checkpoints",
    "delete_iter_dir",
    "point_tracker",
]

# delete_checkpoints() renames an iter dir to this prefix first, so a crash mid-delete never leaves
# a half-deleted dir that still looks complete (rmtree's order is arbitrary: it could remove one
# shard and keep metadata.json). The name matches neither _ITER_RE nor anything Megatron loads.
_TRASH_PREFIX = ".deleting."


def _log() -> FilteringBoundLogger:
    # Lazy: importing structlog costs ~0.2 s. The logger keeps its name from before the split.
    import structlog

    logger: FilteringBoundLogger = structlog.get_logger("shoprld.checkpoints")
    return logger


def point_tracker(save_dir: Path, iteration: int | None, *, set_aside_as: str = "set-aside") -> None:
    """Make Megatron's tracker name ``iteration`` (atomically, durably). With None there is nothing
    to resume from: the tracker, if any, is renamed ``<tracker>.<set_aside_as>`` (kept for the
    post-mortem), and the next trainer starts from the base model."""
    tracker = save_dir / TRACKER_NAME
    if iteration is not None:
        atomic_write(tracker, f"{iteration}\n".encode())
    elif tracker.exists():
        tracker.rename(tracker.with_name(f"{tracker.name}.{set_aside_as}"))


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
    """Delete ``items`` (what a ``round/resume.py`` decision lets go); returns the bytes freed.

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
