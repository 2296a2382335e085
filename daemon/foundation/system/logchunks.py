"""Reading a stage log in bounded pieces: a round's trainer log is tens of MiB (four SGLang
engines' request lines), and a read of the whole file, its decode and a slice copy, is that much
more daemon memory each time (issue 27: its RSS must stay flat however long the log grows).

:func:`line_chunks` yields whole lines a MiB at a time; the scans built on it keep only
offsets and small matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

CHUNK_BYTES = 1 << 20


def line_chunks(path: Path, offset: int = 0, size: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` pieces of ``path`` from ``offset`` on, each ending with a newline (a
    line longer than ``size`` comes whole). A last line without its newline is not yielded: it
    may still be being written. Raises ``OSError`` as ``open`` does."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        pos, pending = offset, b""
        while data := fh.read(size):
            pending += data
            cut = pending.rfind(b"\n") + 1
            if cut:
                yield pos, pending[:cut]
                pos, pending = pos + cut, pending[cut:]


def last_offset(path: Path, needle: bytes) -> int | None:
    """The offset of the last ``needle`` in the whole lines of ``path``; None when absent."""
    found = None
    for pos, chunk in line_chunks(path):
        i = chunk.rfind(needle)
        if i >= 0:
            found = pos + i
    return found


def after_last_match(path: Path, pattern: re.Pattern[bytes]) -> int | None:
    """The offset just past the line of the last match of ``pattern`` (a one-line pattern)."""
    found = None
    for pos, chunk in line_chunks(path):
        for m in pattern.finditer(chunk):
            found = pos + m.end()
    if found is None:
        return None
    with open(path, "rb") as fh:  # past the rest of that line and its newline
        fh.seek(found)
        return found + len(fh.readline())


def read_from(path: Path, offset: int) -> bytes:
    """What ``path`` holds from ``offset`` to its end."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read()
