"""rehearse's verdict on the real gate's pre-rollout refusal (exit 1, traceback, no manifest):
it names the tool's own error, and the undersized split that provoked it, not a missing file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.ops.rehearse import Scratch
from shoprld.daemon.ops.rehearse_judge import Pass, judge_pass, merge, read_records
from tests.demotree import make_tree

TRACEBACK = ("Traceback (most recent call last):\n  File \"shopsimrl/trace2skill_evaluation.py\", line 365\n"
             "    raise GateEvaluationError(\"OLS requires more observations than chunk factors\")\n"
             "shopsimrl.paired_validation.GateEvaluationError: OLS requires more observations than chunk factors\n")
SMALL = ("val split too small for the gate: 4 val tasks in /x/persona_splits.v1.json, the gate's regression has up "
         "to 16 factors (SkillBank chunks + max_candidates); the real gate refuses before any rollout: `OLS requires "
         "more observations than chunk factors`")


def judge(cfg: Config, layout: Layout, sc: Scratch, journal: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return merge([judge_pass(Pass(cfg, layout, journal, read_records(sc.records)))])


def _record(sc: Scratch, n: int, stage: str, rc: int, stderr: str = "", notes: list[str] | None = None) -> None:
    (sc.records / f"{n}-1-{stage}.json").write_text(json.dumps(
        {"stage": stage, "returncode": rc, "signals": [], "seconds": 0.1, "stdout": "", "stderr_tail": stderr,
         "notes": notes or [], "cwd": "/"}))


def test_gate_refusal_names_the_tools_error_and_the_split(tmp_path: Path) -> None:
    cfg = load_config(make_tree(tmp_path / "t", rounds=1))
    layout = Layout.from_config(cfg)
    sc = Scratch(tmp_path / "scratch")
    sc.records.mkdir(parents=True)
    _record(sc, 1, "train.emit_command", 0, notes=["val split: first 17 tasks of /x", SMALL])
    _record(sc, 2, "gate.command", 1, TRACEBACK)
    verdicts = dict(judge(cfg, layout, sc, []))
    assert verdicts["gate.command"] == (
        "gate.command exited 1 (shopsimrl.paired_validation.GateEvaluationError: OLS requires more observations "
        "than chunk factors) and wrote no online_gate_manifest.json; " + SMALL
        + " [tools contract §7]")


def test_gate_that_exits_0_without_a_manifest_is_still_a_missing_file(tmp_path: Path) -> None:
    cfg = load_config(make_tree(tmp_path / "t", rounds=1))
    layout = Layout.from_config(cfg)
    sc = Scratch(tmp_path / "scratch")
    sc.records.mkdir(parents=True)
    _record(sc, 2, "gate.command", 0)
    assert dict(judge(cfg, layout, sc, []))["gate.command"].startswith("online_gate_manifest.json was not written")


def test_analyst_errors_behind_a_success_shaped_analyze_are_named(tmp_path: Path) -> None:
    """The real analyze exits 0 with counts even when every card is an ANALYST_ERROR (here: the
    trainer stand-in's retry trace lacked job/provenance/selected_skills)."""
    cfg = load_config(make_tree(tmp_path / "t", rounds=1))
    layout = Layout.from_config(cfg)
    sc = Scratch(tmp_path / "scratch")
    sc.records.mkdir(parents=True)
    adir = layout.runs / "round-000-online-analysis"
    adir.mkdir(parents=True)
    (adir / "analysis_summary.json").write_text(json.dumps(
        {"schema_version": "v1", "triage_groups": 1, "analyzed_cards": 1, "eligible_cards": 0, "candidates": 0}))
    (adir / "candidate_pool.json").write_text(json.dumps({"schema_version": "v1", "candidates": []}))
    msg = "trace is not a failed retry under the configured full skill: /r/full-skill-retry.json"
    (adir / "failure_cards.jsonl").write_text("".join(json.dumps(c) + "\n" for c in (
        {"source_trajectory_id": "g2-retry", "status": "ANALYST_ERROR", "error": {"type": "KeyError", "message": "x"}},
        {"source_trajectory_id": "g2-retry", "status": "ANALYST_ERROR", "error": {"type": "ValueError", "message": msg}},
        {"source_trajectory_id": "g3-retry", "status": "NO_PROPOSAL", "eligible_for_consolidation": False})))
    (sc.records / "1-1-gate.analyze_command.json").write_text(json.dumps(
        {"stage": "gate.analyze_command", "returncode": 0, "stdout": '{\n  "candidates": 0\n}\n', "stderr_tail": "",
         "notes": []}))
    assert dict(judge(cfg, layout, sc, []))["gate.analyze_command"] == (
        f"the analyst failed on 1 of 2 full-skill retry traces (ANALYST_ERROR ValueError: {msg}); their cards "
        "count as analyzed but give no candidates [tools contract §5]")
    (adir / "failure_cards.jsonl").write_text(json.dumps({"source_trajectory_id": "g3-retry", "status": "NO_PROPOSAL"}))
    assert "ANALYST_ERROR" not in dict(judge(cfg, layout, sc, []))["gate.analyze_command"]
