"""``shoprld report`` (issue 18, item 3): the journal read into a timeline, and one self-contained page."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shoprld.daemon.ops import report
from shoprld.daemon.ops.demo import create_tree

T0 = 1_800_000_000.0
CANARY = "demo-fake-wandb-key-0000000000000000"  # the demo tree's fake WANDB_API_KEY


def _rec(seq: int, t: float, event: str, **fields: Any) -> dict[str, Any]:
    return {"event": event, "seq": seq, "t": T0 + t, "round": fields.pop("round", 0), **fields}


def journal_with_faults() -> list[dict[str, Any]]:
    """Two rounds: a stage retry, a stall, a daemon crash (no final state, then a start), a park."""
    j = [
        _rec(1, 0, "transition", src=None, dst="PREFLIGHT_DISK", trigger="start"),
        _rec(2, 1, "transition", src="PREFLIGHT_DISK", dst="START_SHOPSIM", trigger="preflight_ok", free_bytes=90 << 30),
        _rec(3, 2, "transition", src="START_SHOPSIM", dst="TRAIN", trigger="shopsim_ready", free_bytes=90 << 30),
        _rec(4, 30, "checkpoint.committed", iteration=10, bytes=4 << 30, latency_ms=12.5, free_bytes=86 << 30),
        _rec(5, 40, "train.stall", idle_s=600.0),
        _rec(6, 41, "transition", src="TRAIN", dst="TRAIN", trigger="retry", message="trainer stalled"),
        _rec(7, 60, "checkpoint.committed", iteration=20, bytes=4 << 30, latency_ms=9.0, free_bytes=82 << 30),
        # the daemon dies in TRAIN; systemd starts it again
        _rec(8, 70, "transition", src=None, dst="PREFLIGHT_DISK", trigger="resume"),
        _rec(9, 71, "transition", src="PREFLIGHT_DISK", dst="START_SHOPSIM", trigger="preflight_ok"),
        _rec(10, 72, "transition", src="START_SHOPSIM", dst="TRAIN", trigger="shopsim_ready"),
        _rec(11, 80, "stage.outcome", state="TRAIN", kind="done", step_seconds=1.5),
        _rec(12, 81, "transition", src="TRAIN", dst="EXPORT_HF", trigger="trained", free_bytes=80 << 30),
        _rec(13, 90, "transition", src="EXPORT_HF", dst="VAL", trigger="exported"),
        _rec(14, 95, "transition", src="VAL", dst="GATE", trigger="validated"),
        _rec(15, 99, "transition", src="GATE", dst="INJECT", trigger="gated"),
        _rec(16, 100, "transition", src="INJECT", dst="NEXT_ROUND", trigger="injected"),
        _rec(17, 101, "transition", src="NEXT_ROUND", dst="TRAIN", trigger="next_round", round=1),
        _rec(18, 130, "disk.hard_limit", free_bytes=1 << 30, soft_limit_bytes=12 << 30, hard_limit_bytes=8 << 30,
             round=1),
        _rec(19, 131, "transition", src="TRAIN", dst="PAUSED_DISK", trigger="park_disk", round=1,
             message=f"free 1 GiB < hard limit; the key was {CANARY}"),
    ]
    return j


def test_journal_faults_become_marks_segments_disk_and_step_times() -> None:
    """A retry and a ShopSim restart are restarts, a start after a non-final state is a crash, a
    stall and PAUSED_DISK are marked; step time comes from TRAIN's outcome, or from two commits."""
    found = report.analyse(journal_with_faults(), now=T0 + 500, alive=False)
    kinds = [(round(t - T0), r, k) for t, r, k, _ in found["marks"]]
    assert kinds == [(40, 0, "stall"), (41, 0, "restart"), (70, 0, "crash"), (131, 1, "park")]
    assert found["segments"][0] == (T0, T0 + 1, "PREFLIGHT_DISK", 0)
    assert found["segments"][-1] == (T0 + 131, T0 + 131, "PAUSED_DISK", 1)  # not alive: ends at the last record
    assert found["step_seconds"] == {0: 1.5}
    assert [b >> 30 for _, b in found["disk"]] == [90, 90, 86, 82, 80, 1]
    assert found["limits"] == (12 << 30, 8 << 30)
    assert [c["iteration"] for c in found["checkpoints"]] == [10, 20]
    # No step_seconds on the outcome: two commits of the round give (60 - 30) / (20 - 10) s a step.
    without = [r for r in journal_with_faults() if r["event"] != "stage.outcome"]
    assert report.analyse(without, now=T0, alive=False)["step_seconds"] == {0: 3.0}


def test_torn_journal_line_is_skipped_with_a_note(tmp_path: Path) -> None:
    """A daemon killed mid-write leaves half a line: the report reads the rest and says where."""
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps(_rec(1, 0, "transition", src=None, dst="TRAIN", trigger="start")) + '\n{"event": "tra')
    recs, notes = report.read_journal(path)
    assert [r["seq"] for r in recs] == [1]
    assert notes == [f"{path}:2: not a JSON line (a torn write?); skipped"]


_EXTERNAL = [
    re.compile(r"""\b(?:src|href|xlink:href|action|srcset)\s*=\s*["']?\s*(?:https?:|//|ftp:)""", re.I),
    re.compile(r"""url\(\s*["']?\s*(?:https?:|//)""", re.I),
    re.compile(r"<script|<link|<iframe|<img|@import", re.I),
]


def _tree_with_journal(tmp_path: Path) -> Path:
    campaign = create_tree(tmp_path, fast=True, rounds=2)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in journal_with_faults()))
    (state / "status.json").write_text(json.dumps({
        "state": "PAUSED_DISK", "round": 1, "rounds_done": [
            {"round": 0, "val": 0.4375, "metric_name": "success_rate", "gate": "complete", "branch": "selected",
             "duration_seconds": 100.0}]}))
    return campaign


def test_page_has_every_plot_as_inline_svg_and_nothing_external(tmp_path: Path) -> None:
    """The page holds the four plots as inline SVG, the marks, the checkpoints, the config and the
    environment; no script, stylesheet, image or font is fetched; the .env values are masked."""
    pytest.importorskip("matplotlib")
    campaign = _tree_with_journal(tmp_path)
    out = tmp_path / "out" / "report.html"
    assert report.run_report(campaign, out) == 0
    page = out.read_text(encoding="utf-8")
    for key in report.PLOTS:
        m = re.search(rf'<section id="plot-{key}" class=plot>(.*?)</section>', page, re.S)
        assert m, key
        svg = m.group(1)
        assert "<svg" in svg and "</svg>" in svg, key
        assert len(re.findall(r"<path|<rect|<use", svg)) > 10, f"{key}: an empty plot"
    for rx in _EXTERNAL:
        assert not rx.search(page), rx.pattern
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page  # inline SVG, not a pasted file
    assert "daemon crash (resumed)" in page and "parked for disk" in page and "stall" in page
    assert "round-000" in page and "0.4375" in page
    assert CANARY not in page and "***" in page  # the park message quoted the key: masked
    assert "[campaign]" in page and "shoprld" in page  # the campaign file and the environment


def test_default_output_is_beside_the_campaign_file(tmp_path: Path) -> None:
    """Without -o the report lands next to the campaign file, named after the campaign."""
    campaign = create_tree(tmp_path, fast=True, rounds=1)
    assert report.default_output(campaign) == tmp_path.resolve() / "demo-report.html"


def test_without_the_extra_one_line_and_exit_3(tmp_path: Path) -> None:
    """Without matplotlib, `shoprld report` says how to install it in one line and exits 3."""
    campaign = create_tree(tmp_path, fast=True, rounds=1)
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'matplotlib' or name.startswith('matplotlib.'):\n"
            "            raise ImportError('blocked for the test')\n"
            "sys.meta_path.insert(0, Block())\n"
            "from shoprld.daemon.ops import cli\n"
            f"sys.exit(cli.main(['report', '-c', {str(campaign)!r}]))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "pip install 'shoprld[report]'" in res.stderr
    assert not (tmp_path / "demo-report.html").exists()


def test_the_daemon_never_imports_the_plotting_library() -> None:
    """Importing the engine, the CLI and status loads neither matplotlib nor the report module."""
    code = ("import sys, shoprld.daemon.core.engine, shoprld.daemon.ops.cli, shoprld.daemon.foundation.status, shoprld.daemon.ops.demo\n"
            "print([m for m in ('matplotlib', 'shoprld.daemon.ops.report') if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "[]", res.stderr
