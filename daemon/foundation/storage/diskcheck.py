"""The disk's start-up checks: every reason the volume cannot take the next round, and ``df``.

* **Preflight** (:func:`preflight`) runs at every (re)start. It returns *every* problem it
  finds as a :class:`PreflightProblem`, each printable as one operator line; the engine prints
  the first and exits 3. It checks the volume and the heavy output paths: there, a mount
  point, off the repo's filesystem, writable, room for the forecast (bytes and inodes), and
  every heavy path really on it (symlinks followed).
* **df** (:func:`df_summary`) is the ``df``-like table printed beside it, read from
  ``statvfs`` and ``/proc/self/mountinfo``.

On disk it creates and deletes one probe file in the volume's root; nothing else.

Like :mod:`.disk`, whose sampler and free-space rule it uses, it takes plain values and knows
nothing of config objects: :mod:`.preflight` turns the config and layout into its arguments
and adds the checks that are not the volume's (the real stack's files, TMPDIR lengths).
"""

from __future__ import annotations

import errno
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from shoprld.daemon.foundation.storage.disk import DISK_FULL_ERRNOS, sample
from shoprld.daemon.foundation.system.units import human_bytes

__all__ = ["PreflightProblem", "df_summary", "check_volume"]


# --------------------------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreflightProblem:
    """One reason not to start: what is wrong, where, and the fix."""

    what: str
    where: str
    fix: str

    def line(self) -> str:
        """One line: ``<what>: <where> (<fix>)``; newlines in paths are escaped."""
        text = f"{self.what}: {self.where} ({self.fix})"
        return text.replace("\r", "\\r").replace("\n", "\\n")


def check_volume(
    *,
    ephemeral_root: Path,
    repo: Path,
    heavy_paths: Mapping[str, Path],
    need_bytes: int,
    need_inodes: int,
    require_mount: bool = True,
    forbid_same_fs: bool = True,
) -> list[PreflightProblem]:
    """Check the volume and the heavy output paths; return every problem found, in this order.

    1. the root is missing (then nothing else can be checked); 2. it is not a mount point while
    ``require_mount``; 3. the repo is on the same filesystem while ``forbid_same_fs``; 4. it is
    read-only (``ST_RDONLY``, or a probe file fails with EROFS; EACCES is reported as not
    writable); 5. free bytes < ``need_bytes``; 6. free inodes < ``need_inodes``; 7. each heavy
    path whose ``realpath`` (symlinks followed; for a path not created yet, its nearest existing
    ancestor) is on another device than the root, e.g. the memo's AutoDL data-disk dirs that are
    symlinks into the nearly full system disk. The root itself is used through its ``realpath``.
    Performs no side effects beyond creating and deleting one probe file.
    """
    problems: list[PreflightProblem] = []
    root = Path(os.path.realpath(ephemeral_root))
    shown = str(ephemeral_root) if root == Path(ephemeral_root) else f"{ephemeral_root} -> {root}"
    if not root.is_dir():
        problems.append(
            PreflightProblem(
                "ephemeral root is missing" if not root.exists() else "ephemeral root is not a directory",
                shown,
                "mount the volume there, or point the storage root at the mounted volume",
            )
        )
        return problems
    root_dev = root.stat().st_dev

    if require_mount and not os.path.ismount(root):
        problems.append(
            PreflightProblem(
                "ephemeral root is not a mount point",
                f"{shown} is a plain directory on {_mount_point(root)}",
                "mount the volume there, or set require_mount = false",
            )
        )

    if forbid_same_fs:
        repo_real = _existing_ancestor(Path(os.path.realpath(repo)))
        if repo_real.stat().st_dev == root_dev:
            problems.append(
                PreflightProblem(
                    "repo and ephemeral root are on the same filesystem",
                    f"{repo} and {shown} are both on {_mount_point(root)}",
                    "put heavy outputs on a separate volume, or set forbid_same_fs = false",
                )
            )

    s = sample(root)
    ro = _read_only_problem(root, shown, s.read_only)
    if ro is not None:
        problems.append(ro)

    if s.free_bytes < need_bytes:
        problems.append(
            PreflightProblem(
                "not enough free space on the volume",
                f"{shown} has {human_bytes(s.free_bytes)} free, the next round needs {human_bytes(need_bytes)}",
                "free space on the volume (old campaigns, caches) or lower the checkpoint estimate",
            )
        )
    if s.inodes_free < need_inodes:
        problems.append(
            PreflightProblem(
                "not enough free inodes on the volume",
                f"{shown} has {s.inodes_free} inodes free, the next round needs {need_inodes}",
                "delete small files on the volume (old logs, caches) or remake it with more inodes",
            )
        )

    for label, p in heavy_paths.items():
        real = Path(os.path.realpath(p))
        anchor = _existing_ancestor(real)
        if anchor.stat().st_dev != root_dev:
            via = "" if real == Path(p) else f" -> {real}"
            problems.append(
                PreflightProblem(
                    f"{label} is not on the volume",
                    f"{p}{via} is on {_mount_point(anchor)}, not on {shown}",
                    f"make {label} a real directory under {root} (remove the symlink that leads off the volume)",
                )
            )
    return problems


def _read_only_problem(root: Path, shown: str, flagged: bool) -> PreflightProblem | None:
    fix = "remount it read-write (mount -o remount,rw) or fix the volume"
    if flagged:
        return PreflightProblem("ephemeral root is read-only", f"{shown} is mounted read-only", fix)
    try:
        fd, name = tempfile.mkstemp(prefix=".shoprld-preflight-", dir=root)
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return PreflightProblem("ephemeral root is read-only", f"writing a probe in {shown} failed", fix)
        if exc.errno in (errno.EACCES, errno.EPERM):
            return PreflightProblem(
                "ephemeral root is not writable",
                f"{shown}: {os.strerror(exc.errno)} for uid {os.geteuid()}",
                "give the daemon's user write access to the volume",
            )
        if exc.errno in DISK_FULL_ERRNOS:
            return None  # the bytes/inodes checks report it with numbers
        raise
    try:
        os.close(fd)
    finally:
        os.unlink(name)
    return None


def _existing_ancestor(p: Path) -> Path:
    """``p`` or its nearest ancestor that exists (the root always does)."""
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _mount_point(p: Path) -> Path:
    """The mount point of the filesystem holding ``p`` (which must exist)."""
    p = Path(os.path.realpath(p))
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


# --------------------------------------------------------------------------------------------
# The df table
# --------------------------------------------------------------------------------------------


def _mount_sources() -> dict[str, tuple[str, str]]:
    """Mount point -> (source, fstype) from /proc/self/mountinfo; the top mount wins."""
    out: dict[str, tuple[str, str]] = {}
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        out[mnt] = (tail[1], tail[0])
    return out


def df_summary(paths: Mapping[str, Path]) -> str:
    """A ``df -h``-like table, one row per labelled path (e.g. repo and volume), plain text.

    Columns: label, filesystem (source and type), size, used, avail, use%, free inodes, mounted on.
    A path that does not exist gets a row that says so.
    """
    header = ("LABEL", "FILESYSTEM", "SIZE", "USED", "AVAIL", "USE%", "IFREE", "MOUNTED ON")
    rows: list[tuple[str, ...]] = [header]
    sources = _mount_sources()
    for label, p in paths.items():
        try:
            st = os.statvfs(p)
        except OSError as exc:
            rows.append((label, "-", "-", "-", "-", "-", "-", f"{p}: {exc.strerror or exc}"))
            continue
        mnt = _mount_point(Path(p))
        src, fstype = sources.get(str(mnt), ("?", "?"))
        size = st.f_blocks * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        avail = st.f_bavail * st.f_frsize
        pct = "-" if used + avail == 0 else f"{math.ceil(used * 100 / (used + avail))}%"
        rows.append(
            (label, f"{src} ({fstype})", _df_h(size), _df_h(used), _df_h(avail), pct, str(st.f_favail), str(mnt))
        )
    return _table(rows, right={2, 3, 4, 5, 6})


def _table(rows: Iterable[tuple[str, ...]], *, right: set[int]) -> str:
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    lines = []
    for r in rows:
        cells = [
            c if i == last else (c.rjust(widths[i]) if i in right else c.ljust(widths[i])) for i, c in enumerate(r)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _df_h(n: int) -> str:
    """``df -h`` style: powers of 1024, one decimal below 10, rounded up like df."""
    v, unit = float(n), ""
    for u in "KMGTPE":
        if v < 1024:
            break
        v, unit = v / 1024, u
    if not unit:
        return str(n)
    return f"{math.ceil(v * 10) / 10:.1f}{unit}" if v < 10 else f"{math.ceil(v):.0f}{unit}"
