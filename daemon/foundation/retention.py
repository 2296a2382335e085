"""Retention: what checkpoints are kept, and the one place that deletes them.

This module alone decides what is kept and deletes checkpoints (issue 16, step 3):
:func:`keep_set` is the one keep-set rule (the finals the rounds need, the newest save of the
round in progress, what an export read), :func:`keep_while_training` the one while a round
trains, :func:`retention_plan` only ever proposes committed checkpoints outside that set and not
the resume point, plus partials while no trainer runs; :func:`retain` carries a plan out;
:func:`delete_checkpoints` refuses anything that does not resolve to a direct child of the save
dir. The ShopSim-outage rollback lives here too (:func:`roll_back_to`): the ShopSim service only
reports the last checkpoint it saw served. Megatron's tracker is rewritten by
:func:`point_tracker` only.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoprld.daemon.foundation.checkpoints import (
    _ITER_RE,
    TRACKER_NAME,
    Checkpoint,
    IterationMapping,
    Scan,
    _tree_bytes,
    iter_name,
    scan,
)
from shoprld.daemon.foundation.store import atomic_write

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

__all__ = [
    "Rollback",
    "delete_checkpoints",
    "delete_iter_dir",
    "keep_set",
    "keep_while_training",
    "outage_suspects",
    "point_tracker",
    "retain",
    "retention_plan",
    "roll_back_to",
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


def keep_while_training(scan: Scan, mapping: IterationMapping, round_index: int, *, keep_finals: int = 1,
                        vouched: Callable[[int], bool] = lambda _i: False) -> set[int]:
    """The keep set while ``round_index`` trains: the newest complete save of the round, and the
    complete checkpoints outside it (the finals NEXT_ROUND's retention left, which ``--load``
    needs). The round's older saves are superseded: a fault resumes from the newest (issue 17).

    Once that newest save is ``vouched`` for (ShopSim was seen alive after it, so no outage can
    roll back past it), it counts as one of the ``keep_finals`` and the oldest final goes
    (issue 25): the disk then holds ``keep_finals`` checkpoints between saves and one more while
    a save lands, as upstream's loop does, instead of a third 53 GB checkpoint."""
    complete = [c.iteration for c in scan.checkpoints if c.complete]
    mine = [i for i in complete if mapping.round_of(i) == round_index]
    others = sorted(i for i in complete if mapping.round_of(i) != round_index)
    if not mine:
        return set(others)
    newest = max(mine)
    if vouched(newest):
        older = [i for i in others if i < newest]
        later = [i for i in others if i > newest]
        others = later + older[max(0, len(older) - (keep_finals - 1)):]
    return set(others) | {newest}


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
