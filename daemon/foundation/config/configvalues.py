"""Campaign config values: the scalar types the sections are built from, and their parsers.

Sizes (``53GiB``), durations (``1h30m``), deadlines (an ISO time or a duration), http(s) URLs,
GPU compute capabilities, and the strict TOML scalars (issue 15), each bounded by what a
campaign can sensibly ask for. A parser raises ``ValueError`` with the one-line problem and,
where it helps, ``; fix: ...``; config.py turns that into the file's one-line error. Pure: no
disk, no environment.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, Strict

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|d|h|m|s)")


# Upper bounds on what a campaign can sensibly ask for (README, "Configuration"). Beyond them a
# value is a typo, not a plan, and would overflow somewhere at 3 a.m. (timedelta, fallocate).
MAX_SIZE = 1024**5  # 1 PiB
MAX_DURATION = 366 * 86400.0  # a year
MAX_ROUNDS = 10_000
MAX_STEPS_PER_ROUND = 1_000_000
MAX_COUNT = 1_000_000  # slots, concurrencies, tasks, retries, save_interval's siblings


def _bounded_size(value: int) -> int:
    if value > MAX_SIZE:
        raise ValueError("a size above 1PiB is not plausible; fix: give the size with its unit, e.g. 53GiB")
    return value


def parse_size(value: Any) -> int:
    """``"53GiB"``, ``"500MB"``, ``1048576`` -> bytes (at most :data:`MAX_SIZE`)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 53GiB or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return _bounded_size(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2) is not None and m.group(2).lower() in _SIZE_UNITS:
            number = float(m.group(1))  # 400 digits parse as inf: refused below, never int(inf)
            if math.isfinite(number):
                return _bounded_size(int(number * _SIZE_UNITS[m.group(2).lower()]))
            return _bounded_size(MAX_SIZE + 1)
    raise ValueError("expected a size such as 53GiB, 500MB or a number of bytes")


def parse_duration(value: Any) -> float:
    """``"1h30m"``, ``"45s"``, ``90`` -> seconds (finite, at most :data:`MAX_DURATION`)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30m, 2h or a number of seconds")
    seconds: float | None = None
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        parts = _DURATION_RE.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            scale = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
            seconds = sum(float(n) * scale[u] for n, u in parts)
    if seconds is None:
        raise ValueError("expected a duration such as 30m, 2h or a number of seconds")
    if math.isnan(seconds):
        raise ValueError("a duration must be a number; fix: use e.g. 30m, 2h or a number of seconds")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > MAX_DURATION:
        raise ValueError("a duration above a year is not plausible; fix: use e.g. 30m, 2h or 10d")
    return seconds


Size = Annotated[int, BeforeValidator(parse_size)]
Duration = Annotated[float, BeforeValidator(parse_duration)]
# TOML has real integers, floats and booleans, so the fields take exactly those: in lax mode
# pydantic made `rounds = true` one round and `rounds = 1e9` a billion (issue 15). A float field
# takes an integer (TOML `3` for 3.0), never a bool, NaN or inf.
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Command = tuple[str, ...]


def normalize_sm(value: str | int | float | None) -> str | None:
    """A compute capability, normalized (``gpus.build_sm``; envinfo compares the GPUs' with it):
    ``80``, ``"sm_80"``, ``"SM80"``, ``"8.0"``, ``8.0`` -> ``"SM80"``; None for blank or junk."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip().lower().replace("sm_", "").replace("sm", "").replace("compute_", "")
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    if m:
        return f"SM{int(m.group(1))}{int(m.group(2))}"
    m = re.fullmatch(r"(\d{2,3})([a-z]?)", text)
    if m:
        return f"SM{m.group(1)}{m.group(2)}"
    return None


def _http_url(v: str) -> str:
    """An http(s) URL with a host and a valid port (urlsplit raises on ``http://[::1``)."""
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc}); fix: e.g. http://127.0.0.1:5700") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host; fix: e.g. http://127.0.0.1:5700")
    return v


Url = Annotated[str, AfterValidator(_http_url)]


def deadline_seconds_or_time(value: str) -> datetime | float:
    """An ISO time (with a zone, or UTC) -> datetime; a duration -> seconds."""
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    except ValueError:
        pass
    try:
        return parse_duration(value)
    except ValueError:
        raise ValueError(
            "expected an ISO time (2026-12-01T08:00:00Z) or a duration (10h)"
        ) from None


def resolve_deadline(value: str, first_start: float) -> float | None:
    """The absolute deadline (epoch seconds) for ``campaign.deadline``."""
    if not value:
        return None
    parsed = deadline_seconds_or_time(value)
    if isinstance(parsed, datetime):
        return parsed.timestamp()
    return first_start + timedelta(seconds=parsed).total_seconds()
