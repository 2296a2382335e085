"""Numbers for people: bytes, durations, counts and rounds, as every message, log line, status
view and report writes them. The one formatter of each (standard library only: ``shoprld status``
imports it).
"""

from __future__ import annotations

import math


def human_bytes(n: float | None) -> str:
    """Binary units, one decimal above bytes: ``512 B``, ``1.5 KiB``, ``53.1 GiB``; ``?`` when unknown."""
    if not isinstance(n, (int, float)) or isinstance(n, bool) or not math.isfinite(n):
        return "?"  # unknown, or whatever a status document held instead of a number
    v, unit = float(n), "B"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(v) < 1024:
            break
        v, unit = v / 1024, u
    return f"{int(n)} B" if unit == "B" else f"{v:.1f} {unit}"


def human_duration(seconds: float | None) -> str:
    """Two units at most: 42s, 3m05s, 12m, 6h12m, 2d03h; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(max(0.0, seconds) + 0.5)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 10:
        return f"{m}m{s:02d}s"
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def human_count(n: float | None) -> str:
    """Decimal suffixes: 950, 1.2k, 3.4M, 5.0G; ``?`` when unknown."""
    if n is None:
        return "?"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(int(n))


def round_label(index: int, rounds: int) -> str:
    """The one way rounds are named to people, everywhere: ``round-002 (3 of 5)``.

    ``round-002`` is the 0-based id the files and the ledger use; ``3 of 5`` counts from one.
    """
    return f"round-{max(index, 0):03d} ({index + 1} of {rounds})" if rounds > 0 else f"round-{max(index, 0):03d}"
