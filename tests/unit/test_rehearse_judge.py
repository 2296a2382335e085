"""rehearse's verdict on the real gate's pre-rollout refusal (exit 1, traceback, no manifest):
it names the tool's own error, and the undersized split that provoked it, not a missing file."""

from __future__ import annotations

import json
from pathlib import Path

from shoprld.daemon.config import load_config
from shoprld.daemon.layout import Layout
from shoprld.daemon.rehearse import Scratch, judge
from tests.demotree import make_tree

TRACEBACK = ("Traceback (most recent call last):\n  File \"shopsimrl/trace2skill_evaluation.py\", line 365\n"
             "    raise GateEvaluationError(\"OLS requires more observations than chunk factors\")\n"
             "shopsimrl.paired_validation.GateEvaluationError: OLS requires more observations than chunk factors\n")
SMALL = ("val split too small for the gate: 4 val tasks in /x/persona_splits.v1.json, the gate's regression has up "
         "to 16 factors (SkillBank chunks + max_candidates); the real gate refuses before any rollout: `OLS requires "
         "more observations than chunk factors`")


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
        "than chunk factors) and wrote no online_gate_manifest.json; " + SMALL)


def test_gate_that_exits_0_without_a_manifest_is_still_a_missing_file(tmp_path: Path) -> None:
    cfg = load_config(make_tree(tmp_path / "t", rounds=1))
    layout = Layout.from_config(cfg)
    sc = Scratch(tmp_path / "scratch")
    sc.records.mkdir(parents=True)
    _record(sc, 2, "gate.command", 0)
    assert dict(judge(cfg, layout, sc, []))["gate.command"].startswith("online_gate_manifest.json was not written")
