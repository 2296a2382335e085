"""The one opener for files written to a path the user chose (``report -o``, the metrics
textfile, ``export-campaign OUT``, ``init``'s campaign file).

Such a path may name anything: ``/dev/null`` as a natural "metrics off", a FIFO, a socket, a
directory, a symlink to one of those, or the campaign's own campaign file, ``.env``, ledger or a
file of its state dir. Writing by temp file and rename would replace any of them with a regular
file (as root, the machine's ``/dev/null``). So every such write goes through
:func:`write_output`, which

* follows a symlink once, to the file it names, and keeps the link;
* refuses, in one line, a target that exists and is not a regular file, or that is one of the
  campaign's own files (by path and by inode, so a hard link is caught too);
* writes a temp file beside the target, through a descriptor of the target's directory, and
  re-checks the target through that same descriptor (``lstat``, same inode as first seen) just
  before the rename: a FIFO or device swapped in meanwhile is refused, not replaced.

Readers (node_exporter, a browser) never see a torn file: the rename is atomic.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from shoprld.daemon.foundation.system.errors import ConfigError

if TYPE_CHECKING:
    from shoprld.daemon.foundation.records.layout import Layout


class OutputPathError(ConfigError):
    """An output path that must not be written (exit 3, one line, nothing written)."""


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


@dataclass(frozen=True)
class Protected:
    """The campaign's own files and dirs, which no output may replace."""

    files: tuple[Path, ...] = ()
    dirs: tuple[Path, ...] = ()
    why: str = "the campaign's own file"
    _ids: frozenset[tuple[int, int]] = field(default=frozenset(), compare=False)

    @classmethod
    def of(cls, files: Iterable[Path | None] = (), dirs: Iterable[Path | None] = (),
           scan: Iterable[Path] = ()) -> Protected:
        """Resolve every path now (a later symlink swap cannot hide one) and note the inodes of
        ``files`` and of the files directly in ``scan`` (a hard link elsewhere is caught too)."""
        fs = tuple(Path(os.path.realpath(p)) for p in files if p is not None)
        ds = tuple(Path(os.path.realpath(p)) for p in dirs if p is not None)
        ids: set[tuple[int, int]] = set()
        inside: list[Path] = []
        for d in scan:
            try:
                inside.extend(e for e in Path(d).iterdir())
            except OSError:
                continue
        for p in (*fs, *inside):
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            ids.add((st.st_dev, st.st_ino))
        return cls(fs, ds, _ids=frozenset(ids))

    def owner(self, real: Path, st: os.stat_result | None) -> Path | None:
        """The protected path that ``real`` is, or is inside; None when it is none of them."""
        for p in self.files:
            if real == p:
                return p
        for d in self.dirs:
            if real == d or d in real.parents:
                return d
        if st is not None and (st.st_dev, st.st_ino) in self._ids:
            return real
        return None


def campaign_files(config_source: Path | None, layout: Layout) -> Protected:
    """The campaign's own files: its campaign file, ``.env``, ledger (and the overflow ledger
    dir), and everything under its state dir, logs, checkpoints and artifacts."""
    return Protected.of(files=(config_source, layout.env_file, layout.ledger),
                        dirs=(layout.state_dir, layout.logs, layout.save_dir, layout.artifacts,
                              layout.campaign_root / "ledger"),
                        scan=(layout.state_dir, layout.campaign_root / "ledger"))


def resolve_output(path: Path, protected: Protected = Protected(), *, what: str = "output",
                   need_parent: bool = True) -> Path:
    """The real path ``path`` writes to, or one line (exit 3) saying why it must not be written.
    ``need_parent=False``: a missing parent dir is fine (the writer makes it).

    Checks only; :func:`write_output` checks again at the moment it writes."""
    real = Path(os.path.realpath(path))
    try:
        st: os.stat_result | None = os.lstat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputPathError(f"{path}: cannot use as the {what} ({exc.strerror}); fix: pass another path") from None
    shown = f"{path}" if real == Path(path) else f"{path} (-> {real})"
    if st is not None and not stat.S_ISREG(st.st_mode):
        fix = f"name a file in it, e.g. {path}/out" if stat.S_ISDIR(st.st_mode) else "pass a path for a new file"
        raise OutputPathError(f"{shown}: is {_kind(st.st_mode)}, never replaced by the {what}; fix: {fix}")
    owner = protected.owner(real, st)
    if owner is not None:
        raise OutputPathError(f"{shown}: is {protected.why} ({owner}), never overwritten by the {what}; "
                              "fix: pass another path")
    if need_parent and not real.parent.is_dir():
        raise OutputPathError(f"{real.parent}: no such directory for the {what}; "
                              f"fix: `mkdir -p {real.parent}` or pass another path")
    return real


def write_output(path: Path, fill: Callable[[BinaryIO], None] | bytes, protected: Protected = Protected(), *,
                 what: str = "output", mode: int = 0o644) -> Path:
    """Write ``path`` (``fill(fileobj)`` or the bytes) atomically, never replacing a non-regular
    file or one of ``protected``. Returns the real path written. OSError propagates (the caller
    words it); :class:`OutputPathError` is the refusal. No temp file stays behind on failure."""
    real = resolve_output(path, protected, what=what)
    dfd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            before: os.stat_result | None = os.stat(real.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            before = None
        if before is not None and not stat.S_ISREG(before.st_mode):
            raise OutputPathError(f"{path}: is {_kind(before.st_mode)}, never replaced by the {what}; "
                                  "fix: pass a path for a new file")
        tmp = f".{real.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                if isinstance(fill, bytes):
                    fh.write(fill)
                else:
                    fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
            _recheck(real, dfd, before, path, what)
            os.replace(tmp, real.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return real


def _recheck(real: Path, dfd: int, before: os.stat_result | None, path: Path, what: str) -> None:
    """The target is still what was checked: absent, or the same regular file."""
    try:
        now: os.stat_result | None = os.stat(real.name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        now = None
    if now is None:
        return
    if not stat.S_ISREG(now.st_mode):
        raise OutputPathError(f"{path}: became {_kind(now.st_mode)} while the {what} was written; "
                              "nothing replaced; fix: pass a path for a new file")
    if before is not None and (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        raise OutputPathError(f"{path}: was replaced by another file while the {what} was written; "
                              "nothing replaced; fix: rerun")
