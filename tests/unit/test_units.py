"""The one formatter of bytes, durations and counts (daemon/foundation/system/units.py)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from shoprld.daemon.foundation.system.units import human_bytes, human_count, human_duration


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (42.4, "42s"), (185, "3m05s"), (725, "12m"),
                                               (22_320, "6h12m"), (183_600, "2d03h"), (None, "?"),
                                               (math.nan, "?"), (math.inf, "?")])
def test_human_duration(seconds: float | None, text: str) -> None:
    """Durations use two units at most; an unknown one is '?'."""
    assert human_duration(seconds) == text


@pytest.mark.parametrize(("n", "text"), [(512, "512 B"), (1536, "1.5 KiB"), (56_800_000_000, "52.9 GiB"),
                                         (612 * 1024**3, "612.0 GiB"), (2 * 1024**4, "2.0 TiB"), (None, "?"),
                                         ("12", "?"), (True, "?"), (math.inf, "?")])
def test_human_bytes(n: object, text: str) -> None:
    """Sizes use binary units with one decimal; what is not a number reads '?'."""
    assert human_bytes(n) == text  # type: ignore[arg-type]


@given(st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True)))
def test_human_bytes_is_one_short_word_pair_for_any_number(n: float) -> None:
    """Any number (a status document's field may hold anything) gives '?' or '<number> <unit>'."""
    text = human_bytes(n)
    assert text == "?" or text.split(" ")[1] in ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


@pytest.mark.parametrize(("n", "text"), [(950, "950"), (1200, "1.2k"), (3_400_000, "3.4M"), (None, "?")])
def test_human_count(n: float | None, text: str) -> None:
    """Counts use decimal suffixes."""
    assert human_count(n) == text
