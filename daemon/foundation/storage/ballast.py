"""The ballast: a preallocated file on the volume, released at the hard limit so that the last
writes (state, a final save) can land.

PREFLIGHT_DISK makes sure it exists (``[disk] ballast``); the engine releases it when
:mod:`.disk`'s guard goes HARD. On disk: the ballast file and its ``.partial`` while it is
being allocated, nothing else.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import structlog

from shoprld.daemon.foundation.storage.disk import DISK_FULL_ERRNOS

__all__ = ["Ballast"]

# Its events are the disk's (``disk.ballast_created``, ``disk.ballast_released``, ...): the
# disk's logger.
log = structlog.get_logger("shoprld.daemon.foundation.storage.disk")


class Ballast:
    """A preallocated file on the volume, released at the hard limit so the last writes can land.

    ``ensure()`` allocates real blocks with ``posix_fallocate`` (tmpfs and ext4 both honour it)
    into ``<name>.partial`` and renames it into place, so a crash mid-allocation never leaves a
    short ballast under the real name.
    """

    def __init__(self, path: Path, size_bytes: int) -> None:
        if size_bytes <= 0:
            raise ValueError(f"ballast size must be > 0, got {size_bytes}")
        self.path = Path(path)
        self.size_bytes = size_bytes
        self._partial = self.path.with_name(self.path.name + ".partial")

    @property
    def present(self) -> bool:
        """Whether the ballast file exists (at any size)."""
        return self.path.is_file()

    def ensure(self) -> bool:
        """Make sure the ballast holds ``size_bytes`` of real blocks.

        A no-op when it already does. Returns ``False`` and logs ``disk.ballast_failed`` when the
        volume has no room (ENOSPC/EDQUOT), leaving no partial file behind; other ``OSError``
        (permissions, a read-only volume) propagate, since they are configuration errors.
        """
        try:
            st = self.path.stat()
        except FileNotFoundError:
            st = None
        if st is not None and st.st_size == self.size_bytes and st.st_blocks * 512 >= self.size_bytes:
            return True
        _unlink_quiet(self._partial)
        try:
            fd = os.open(self._partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size_bytes)
            finally:
                os.close(fd)
            os.replace(self._partial, self.path)
        except OSError as exc:
            _unlink_quiet(self._partial)
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            log.warning(
                "disk.ballast_failed",
                path=str(self.path),
                size_bytes=self.size_bytes,
                error=os.strerror(exc.errno or 0),
            )
            return False
        log.info("disk.ballast_created", path=str(self.path), size_bytes=self.size_bytes)
        return True

    def release(self) -> int:
        """Delete the ballast; return the bytes its blocks held (0 if it was absent)."""
        freed = 0
        for p in (self.path, self._partial):
            try:
                freed += p.lstat().st_blocks * 512
                p.unlink()
            except FileNotFoundError:
                continue
        log.warning("disk.ballast_released", path=str(self.path), freed_bytes=freed)
        return freed


def _unlink_quiet(p: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        p.unlink()
