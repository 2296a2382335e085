"""Reclaim: emptying the campaign's own tmp dir, never outside the directory it is confined to.

:func:`reclaimable_tmp` says how many bytes emptying it would free, :func:`clear_dir_contents`
empties it. On disk: it deletes everything inside that one directory (links, not their
targets; never another filesystem mounted below it), and nothing else. The engine calls it
before parking for the disk (a reclaim that lifts the volume out of its level avoids the
park), ``shoprld clean`` on the operator's word.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

__all__ = ["clear_dir_contents", "reclaimable_tmp"]

# Its events are the disk's (``disk.tmp_cleared``, ``disk.reclaim_skipped``): the disk's logger.
log = structlog.get_logger("shoprld.daemon.foundation.storage.disk")


def reclaimable_tmp(exp_tmp: Path) -> int:
    """Bytes that emptying ``exp_tmp`` would free (allocated blocks; no symlinks followed,
    no other filesystems entered, hard-linked files not counted). 0 if it does not exist."""
    try:
        top = os.lstat(exp_tmp)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(top.st_mode):
        return 0
    total = 0
    for dirpath, dirnames, filenames in os.walk(exp_tmp, followlinks=False):
        keep = []
        for d in dirnames:
            try:
                st = os.lstat(os.path.join(dirpath, d))
            except FileNotFoundError:
                continue
            if st.st_dev == top.st_dev and stat.S_ISDIR(st.st_mode):
                keep.append(d)
                total += st.st_blocks * 512
        dirnames[:] = keep
        for f in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except FileNotFoundError:
                continue
            if st.st_nlink == 1:
                total += st.st_blocks * 512
    return total


def clear_dir_contents(d: Path, *, within: Path) -> int:
    """Delete everything inside ``d`` (not ``d`` itself); return the bytes freed.

    Refuses with ``ValueError`` unless ``realpath(d)`` is strictly inside ``realpath(within)``
    (the campaign root), so a misconfigured or symlinked tmp dir can never empty the shared cache
    or another campaign. Walks by directory fd without following symlinks (links are removed, not
    their targets) and never descends into another filesystem mounted below ``d``; entries it
    cannot remove are logged (``disk.reclaim_skipped``) and left. A missing ``d`` frees 0.
    """
    real = Path(os.path.realpath(d))
    base = Path(os.path.realpath(within))
    if real == base or base not in real.parents:
        raise ValueError(f"refusing to clear {d} (-> {real}): it is not inside {within} (-> {base})")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        freed = _clear_fd(fd, os.fstat(fd).st_dev, real)
    finally:
        os.close(fd)
    log.info("disk.tmp_cleared", path=str(real), freed_bytes=freed)
    return freed


def _clear_fd(dfd: int, dev: int, shown: Path) -> int:
    freed = 0
    with os.scandir(dfd) as it:
        entries = list(it)
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != dev:
                    log.warning("disk.reclaim_skipped", path=str(shown / e.name), why="another filesystem")
                    continue
                cfd = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    freed += _clear_fd(cfd, dev, shown / e.name)
                finally:
                    os.close(cfd)
                os.rmdir(e.name, dir_fd=dfd)
                freed += st.st_blocks * 512
            else:
                os.unlink(e.name, dir_fd=dfd)
                if st.st_nlink == 1:
                    freed += st.st_blocks * 512
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("disk.reclaim_skipped", path=str(shown / e.name), why=os.strerror(exc.errno or 0))
    return freed
