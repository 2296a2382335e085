"""``shoprld report`` (issue 18, item 3): the journal read into a timeline, and one self-contained page."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.ops import report, reportpage
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout
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
        _rec(5, 40.5, "attempt.failed", state="TRAIN", attempt=1, exit_status=-9, stalled=True,
             cause={"name": "stall", "detail": f"RuntimeError: NCCL timeout (key {CANARY})",
                    "advice": "look at where it hangs: py-spy dump"},
             bundle="/vol/logs/bundles/round-000-train-1", message="no progress for 600 s"),
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
             "duration_seconds": 100.0, "val_n": 12, "val_requested": 16, "reward_mean": 0.5, "reward_sem": 0.14}]}))
    layout = Layout.from_config(load_config(campaign))
    layout.logs.mkdir(parents=True, exist_ok=True)
    for rnd, rewards in ((0, [0.1, 0.2, 0.3]), (1, [0.35, 0.5])):
        first = rnd * 20 + 1
        lines = ["=== shoprld start trainer: python train.py"]
        for i, r in enumerate(rewards):
            rid = first + i
            lines.append(f"(RolloutManager pid=9) [2026-12-01 01:00:0{i}] rollout_metrics.py:268 - perf {rid}: "
                         f"{{'rollout/raw_reward': {r}, 'perf/rollout_time': {40 + i}.5, 'rollout/step': {rid}}}")
            lines.append(f"[2026-12-01 01:00:0{i}] model.py:918 - step {rid}: {{'train/loss': {1 - r}, "
                         f"'train/grad_norm': np.float64({0.5 + r}), 'train/step': {rid}}}")
        layout.stage_log(rnd, "TRAIN").write_text("\n".join(lines) + "\n")
    return campaign


def test_page_has_every_plot_as_inline_svg_and_nothing_external(tmp_path: Path) -> None:
    """The page holds every plot as inline SVG, the marks, the checkpoints, the config and the
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
    assert "round-000" in page and "0.438 ± 0.143" in page
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
    code = ("import sys, shoprld.daemon.core.engine, shoprld.daemon.ops.cli, shoprld.daemon.foundation.records.status, shoprld.daemon.ops.demo\n"
            "print([m for m in ('matplotlib', 'shoprld.daemon.ops.report', 'shoprld.daemon.ops.reportpage') "
            "if m in sys.modules])")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "[]", res.stderr


def test_per_step_curves_come_from_every_rounds_train_log(tmp_path: Path) -> None:
    """slime's metric lines in each round's TRAIN log become one chart per metric, a line per
    round, on slime's rollout axis (step lines on the optimizer-step axis)."""
    pytest.importorskip("matplotlib")
    data = report.gather(_tree_with_journal(tmp_path))
    assert sorted(data.curves) == [0, 1]
    assert data.curves[0].rollout["rollout/raw_reward"] == {1: 0.1, 2: 0.2, 3: 0.3}
    assert data.curves[1].rollout["rollout/raw_reward"] == {21: 0.35, 22: 0.5}
    assert data.curves[1].step["train/grad_norm"] == {21: 0.85, 22: 1.0}
    chosen, others = reportpage.pick_curves(data)
    assert chosen[0] == ("rollout", "rollout/raw_reward") and ("step", "train/loss") in chosen and not others
    page = reportpage.render(data)
    section = re.search(r'<section id="plot-curves" class=plot>(.*?)</section>', page, re.S).group(1)
    assert section.count("<svg") == len(chosen) == 4
    for key in ("rollout/raw_reward", "train/loss", "train/grad_norm", "perf/rollout_time"):
        assert key in section
    assert "in 2 round(s)' TRAIN logs: 10 lines read" in section


def test_validation_has_error_bars_from_the_tools_n_and_sem_and_says_when_n_is_small(tmp_path: Path) -> None:
    """The round's record carries the val tool's N and reward s.e.; the success rate's s.e. is
    sqrt(p(1-p)/N); N=12 is called small; no base val: the page says how to record one."""
    pytest.importorskip("matplotlib")
    data = report.gather(_tree_with_journal(tmp_path))
    v = data.vals[0]
    assert (v.n, v.requested, v.reward_mean, v.reward_sem) == (12, 16, 0.5, 0.14)
    assert v.success_sem() == pytest.approx((0.4375 * 0.5625 / 12) ** 0.5)
    assert data.base is None and "--base" in data.base_note and "base-bare-val" in data.base_note
    page = reportpage.render(data)
    assert "0.438 ± 0.143" in page and "0.500 ± 0.140" in page and "12 of 16" in page
    assert "Small N (under 30 episodes): round-000 (N=12)" in page
    svg = re.search(r'<section id="plot-val" class=plot>.*?(<svg.*?</svg>)', page, re.S).group(1)
    assert "±1 s.e." in svg and "base model" not in svg  # no base line drawn without a base val


def test_the_base_model_line_comes_from_its_val_summary(tmp_path: Path) -> None:
    """--base names the base model's summary.json (or its dir); <runs>/base-bare-val is found by
    itself; a named file that is not a val summary is a one-line error."""
    pytest.importorskip("matplotlib")
    campaign = _tree_with_journal(tmp_path)
    layout = Layout.from_config(load_config(campaign))
    summary = {"counts": {"completed": 40, "requested": 40}, "primary": {"success_rate": 0.25, "reward_mean": 0.3,
                                                                          "reward_sem": 0.07}}
    base_dir = layout.runs / "base-bare-val"
    base_dir.mkdir(parents=True)
    (base_dir / "summary.json").write_text(json.dumps(summary))
    data = report.gather(campaign)
    assert data.base is not None and (data.base.success_rate, data.base.n) == (0.25, 40)
    svg = reportpage.plot_val(reportpage._pyplot(), data)
    assert "base model 0.25 ±1 s.e. (N=40)" in svg
    assert "base model 0.250 ± 0.068" in reportpage.header(data)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({**summary, "primary": {"success_rate": 0.5}}))
    assert report.gather(campaign, base=other).base.success_rate == 0.5
    (other / "empty.json").write_text(json.dumps({"counts": {"completed": 0, "requested": 30},
                                                  "primary": {"success_rate": None, "reward_sem": None}}))
    empty = report.gather(campaign, base=other / "empty.json")
    assert empty.base is None and "completed no episode (counts.completed=0)" in empty.base_note
    (other / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"^--base .*bad.json: not a val summary.*; fix: "):
        report.gather(campaign, base=other / "bad.json")
    out = tmp_path / "r.html"
    res = subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "report", "-c", str(campaign), "-o",
                          str(out), "--base", str(other / "missing.json")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 3 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert not out.exists()


def test_header_says_wall_time_best_round_restarts_stalls_and_failures_with_causes(tmp_path: Path) -> None:
    """The top of the page: wall time, best round, the daemon crash and the retry, the stall, and
    each failed attempt with its cause, decisive line, advice and bundle (secrets masked)."""
    pytest.importorskip("matplotlib")
    data = report.gather(_tree_with_journal(tmp_path))
    assert data.span == (T0, T0 + 131)
    assert data.counts == {"crashes": 1, "retries": 1, "shopsim_restarts": 0, "stalls": 1}
    top = reportpage.header(data)
    assert "2m11s since" in top
    assert "round-000: 0.438 ± 0.143 (N=12)" in top
    assert "1 daemon crash(es) resumed, 1 stage retries, 0 ShopSim restarts" in top
    assert "failed attempts</b>1: stall ×1" in top
    assert "round-000 TRAIN attempt 1" in top and "exit -9" in top
    assert "RuntimeError: NCCL timeout" in top and "py-spy dump" in top
    assert "/vol/logs/bundles/round-000-train-1" in top
    assert CANARY not in top and "***" in top
    page = reportpage.render(data)
    assert page.index('id="summary"') < page.index('id="plot-timeline"')


def test_a_finished_rounds_record_keeps_the_val_tools_n_and_sem() -> None:
    """NEXT_ROUND's round line (rounds.jsonl, status, round.done) carries counts.completed,
    counts.requested, reward_mean and reward_sem from the bare val's summary.json, and those
    validate against status.json's schema; a summary without them gives None, never a crash."""
    import jsonschema

    from shoprld.daemon.foundation.records.status import SCHEMA_FILE
    from shoprld.states.next_round import RoundRecords

    summary = {"counts": {"completed": 28, "requested": 30, "coverage": 0.93},
               "primary": {"success_rate": 0.25, "reward_mean": 0.31, "reward_sem": 0.081}}
    got = RoundRecords(summary, summary["primary"], {"decision": "complete"}, {"branch": "kept"}, {}).result()
    assert {k: got[k] for k in ("val", "val_n", "val_requested", "reward_mean", "reward_sem")} == {
        "val": 0.25, "val_n": 28, "val_requested": 30, "reward_mean": 0.31, "reward_sem": 0.081}
    schema = json.loads(SCHEMA_FILE.read_text())
    item = {"$defs": schema["$defs"], **schema["properties"]["rounds_done"]["items"], "additionalProperties": False}
    jsonschema.validate({"round": 0, "duration_seconds": 1.0, **got}, item)
    bare = RoundRecords({"counts": {"completed": True}}, {"reward_sem": float("nan")}, {}, {}, {}).result()
    assert (bare["val_n"], bare["reward_sem"], bare["reward_mean"]) == (None, None, None)
    assert report.ReportData  # the report reads these (test_validation_has_error_bars...)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                     max_leaves=20)
_NUMBERISH = st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats() | st.text(max_size=5)


@settings(max_examples=300, deadline=None)
@given(doc=_JSON | st.fixed_dictionaries({"counts": st.dictionaries(st.sampled_from(["completed", "requested"]),
                                                                      _NUMBERISH),
                                           "primary": st.dictionaries(
                                               st.sampled_from(["success_rate", "reward_mean", "reward_sem"]),
                                               _NUMBERISH)}))
def test_any_val_summary_gives_sane_numbers_or_none(doc: Any) -> None:
    """A val summary.json (outside data) of any shape: None or finite numbers and counts in
    range, and the s.e. and the page's numbers never raise."""
    from shoprld.daemon.ops.reportdata import COUNT_MAX, ValStats

    for stats in (ValStats.from_summary(doc), ValStats.from_round(doc) if isinstance(doc, dict) else None):
        if stats is None:
            continue
        for v in (stats.success_rate, stats.reward_mean, stats.reward_sem):
            assert v is None or (isinstance(v, float) and math.isfinite(v))
        for n in (stats.n, stats.requested):
            assert n is None or (type(n) is int and 0 <= n <= COUNT_MAX)
        sem = stats.success_sem()
        assert sem is None or math.isfinite(sem)
        reportpage._pm(stats.success_rate, sem)


@settings(max_examples=100, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(["state", "attempt", "cause", "bundle", "exit_status", "message"]),
                              _JSON, max_size=6))
def test_any_failed_attempt_record_renders_in_the_header(fields: dict[str, Any]) -> None:
    """An attempt.failed journal record with any field values (a hand-edited journal) becomes a
    header line without an exception, every text escaped."""
    rec = {"event": "attempt.failed", "seq": 1, "t": T0, "round": 0, **fields}
    found = report.analyse([rec], now=T0, alive=False)
    data = report.ReportData(campaign="c", experiment="e", rounds=1, state="FAILED", **found)
    top = reportpage.header(data)
    assert "round-000" in top and "<script" not in top


@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=30),
       val=_NUMBERISH, sem=_NUMBERISH, n=_NUMBERISH)
def test_the_plots_draw_whatever_numbers_the_parsers_let_through(values: list[float], val: Any, sem: Any,
                                                                 n: Any) -> None:
    """Curves from any metric line the trainer-log reader accepts, and a val from any record the
    report reads, draw without an exception (matplotlib cannot tick a span of 1e308)."""
    pytest.importorskip("matplotlib")
    from shoprld.daemon.ops import trainlog
    from shoprld.daemon.ops.reportdata import ValStats, as_num

    curves = trainlog.Curves()
    for i, v in enumerate(values):
        found = trainlog.parse_line(f"x - perf {i}: {{'m/x': {v!r}}}".encode())
        if found:
            curves.rollout.setdefault("m/x", {})[i] = found[2]["m/x"]
    row = {"round": 0, "val": val, "val_n": n if isinstance(n, int) else 30, "reward_mean": val, "reward_sem": sem}
    data = report.ReportData(campaign="c", experiment="e", rounds=1, state="DONE", curves={0: curves},
                             rounds_done=[row] if as_num(val) is not None else [])
    stats = ValStats.from_round(row)
    if stats:
        data.vals = {0: stats}
        data.base = stats if stats.success_rate is not None else None
    plt = reportpage._pyplot()
    if curves.rollout:
        assert "<svg" in reportpage.plot_curve(plt, data, "rollout", "m/x")
    assert "<svg" in reportpage.plot_val(plt, data)
