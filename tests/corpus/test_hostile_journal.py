"""Journal and status values out of any sane range (issue 26, "bounded memory"): ``report`` and
``status`` skip a record or row whose round, step, count or time is out of range (``"round":
10**30``, negative steps, year 9999, NaN, inf), with a note, and never build anything per round up
to such a value (one record with ``round: 10**30`` used to OOM-kill ``report``)."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.records.statusview import ROUND_MAX, render_plain, view
from shoprld.daemon.ops import report
from shoprld.daemon.ops.demo import create_tree

T0 = 1_800_000_000.0
HOSTILE = [10**30, -1, -(10**30), 2**63, float("nan"), float("inf"), -float("inf"), 253_402_300_799.0, 1e308,
           True, "3", None]


def _rec(t: float, event: str, **f: Any) -> dict[str, Any]:
    return {"event": event, "t": t, "round": f.pop("round", 0), **f}


def _good() -> list[dict[str, Any]]:
    return [_rec(T0, "transition", src=None, dst="TRAIN"),
            _rec(T0 + 10, "checkpoint.committed", iteration=10, bytes=1 << 30, latency_ms=3.0),
            _rec(T0 + 20, "checkpoint.committed", iteration=20, bytes=1 << 30, latency_ms=3.0),
            _rec(T0 + 30, "transition", src="TRAIN", dst="EXPORT_HF", free_bytes=1 << 40)]


@pytest.mark.parametrize("key", ["round", "t", "step", "iteration", "bytes", "free_bytes", "latency_ms",
                                 "step_seconds", "idle_s"])
@pytest.mark.parametrize("value", [10**30, -5, float("nan"), float("inf"), 253_402_300_799.0])
def test_analyse_skips_a_record_out_of_range_with_a_note(key: str, value: float) -> None:
    bad = _rec(T0 + 15, "transition", src="TRAIN", dst="TRAIN", trigger="retry")
    bad[key] = value
    notes: list[str] = []
    found = report.analyse([*_good(), bad], now=T0 + 40, alive=False, notes=notes)
    sane = report.insane(bad) is None
    assert sane == (not notes), (key, value, notes)
    if not sane:
        assert "skipped" in notes[0] and key in notes[0]
        assert all(s[3] < ROUND_MAX for s in found["segments"])
        assert all(math.isfinite(a) and math.isfinite(b) for a, b, *_ in found["segments"])


_value = st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                   st.text(max_size=5), st.sampled_from(HOSTILE))
_record = st.fixed_dictionaries(
    {"event": st.sampled_from(["transition", "checkpoint.committed", "train.stall", "stage.outcome",
                               "shopsim.died", "disk.hard_limit"])},
    optional={k: _value for k in ("t", "round", "iteration", "bytes", "free_bytes", "latency_ms", "step_seconds",
                                   "soft_limit_bytes", "hard_limit_bytes", "idle_s")}
    | {"dst": st.sampled_from(["TRAIN", "PAUSED_DISK", "FAILED", "DONE"]), "src": st.none() | st.just("TRAIN"),
       "state": st.just("TRAIN"), "trigger": st.just("retry")})


@settings(max_examples=150, deadline=None)
@given(st.lists(_record, max_size=12))
def test_analyse_never_raises_and_stays_bounded(journal: list[dict[str, Any]]) -> None:
    """Any values at all: no exception, every drawn round below the ceiling, every drawn time finite."""
    notes: list[str] = []
    found = report.analyse([*_good(), *journal], now=T0 + 40, alive=True, notes=notes)
    assert all(0 <= s[3] < ROUND_MAX and math.isfinite(s[0]) and math.isfinite(s[1]) for s in found["segments"])
    assert all(0 <= m[1] < ROUND_MAX for m in found["marks"])
    assert all(0 <= c["round"] < ROUND_MAX for c in found["checkpoints"])
    assert len(notes) <= 21


def test_report_on_a_journal_with_round_10_30_writes_a_page_with_a_note(tmp_path: Path) -> None:
    """The issue's repro: one record with round 10**30 (and friends); the page is written, small,
    and names what it skipped."""
    pytest.importorskip("matplotlib")
    campaign = create_tree(tmp_path, fast=True, rounds=2)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    hostile = [_rec(T0 + 31, "transition", src="TRAIN", dst="TRAIN", round=10**30),
               _rec(253_402_300_799.0, "transition", src="TRAIN", dst="TRAIN"),
               _rec(T0 + 32, "checkpoint.committed", iteration=30, bytes=-(1 << 40)),
               _rec(T0 + 33, "stage.outcome", state="TRAIN", step_seconds=float("nan"))]
    (state / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*_good(), *hostile]))
    (state / "status.json").write_text(json.dumps({"state": "TRAIN", "round": 0, "rounds_done": [
        {"round": 10**30, "val": 0.5}, {"round": 0, "val": 0.25}]}))
    out = tmp_path / "r.html"
    assert report.run_report(campaign, out) == 0
    page = out.read_text(encoding="utf-8")
    assert len(page) < 3_000_000
    assert page.count("skipped") >= 5, re.findall(r"[^>]*skipped[^<]*", page)
    assert "round=1000000000000000000000000000000" in page
    assert "round-1000000000000000000000000000000" not in page


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("key", ["round", "step", "rounds_done"])
def test_status_view_skips_values_out_of_range_with_a_note(key: str, value: Any) -> None:
    doc: dict[str, Any] = {"state": "TRAIN", "round": 1, "rounds": 3, "step": 5, "steps_per_round": 100,
                           "rounds_done": [{"round": 0, "val": 0.5}]}
    if key == "rounds_done":
        doc["rounds_done"].append({"round": value, "val": value})
    else:
        doc[key] = value
    text = render_plain(view(doc, time.time()))
    assert len(text) < 5000
    out_of_range = isinstance(value, int) and not isinstance(value, bool) and not (
        0 <= value < (ROUND_MAX if key != "step" else 2**62 + 1))
    if key == "rounds_done":
        out_of_range = not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < ROUND_MAX)
    assert ("skipped" in text) == out_of_range, text
    assert "round-1000000000000000000000000000000" not in text
