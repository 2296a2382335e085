"""rehearse_judge's pieces: the decisive line of a dead program's output (outside data: a
property test too), a file the daemon archived, and the merge of several engine passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.ops.rehearse_judge import (CONTRACT, STAGES, TRAINER, Pass, decisive_line, judge_pass, lacks,
                                               latest, merge)
from tests.demotree import make_tree

TRACEBACK = """=== shoprld 2026-12-05T10:00:00Z start trainer: python train.py --custom-config-path /r/slime.yaml
Traceback (most recent call last):
  File "train.py", line 12, in <module>
    args = parse_args()
  File "slime/utils/arguments.py", line 1400, in parse_args
    with open(args.custom_config_path) as f:
FileNotFoundError: [Errno 2] No such file or directory: '/r/runs/loop/round-000/slime.yaml'
"""


def test_decisive_line_is_the_exception_line_of_a_traceback() -> None:
    assert decisive_line(TRACEBACK) == (
        "FileNotFoundError: [Errno 2] No such file or directory: '/r/runs/loop/round-000/slime.yaml'")
    assert decisive_line(TRACEBACK + "ray: job failed\n") == decisive_line(TRACEBACK)
    assert decisive_line("KeyError: 'rho'\n") == "KeyError: 'rho'"
    assert decisive_line("step 1\n[demo fault] crashing at rollout 1\n\n") == "[demo fault] crashing at rollout 1"
    assert decisive_line("=== shoprld x start trainer: y\n") == ""


@settings(max_examples=200)
@given(st.text())
def test_decisive_line_never_raises_and_is_one_bounded_line(text: str) -> None:
    line = decisive_line(text)
    assert len(line) <= 240
    assert "\n" not in line and "\r" not in line
    assert line == "" or line in text


def test_an_archived_file_is_read_and_named(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    adir = runs / "round-000-online-analysis"
    adir.mkdir(parents=True)
    summary = adir / "analysis_summary.json"
    assert lacks(summary, ("candidates",), runs) == (
        "analysis_summary.json was not written (runs/round-000-online-analysis/analysis_summary.json)")
    for n in (1, 2, 10):
        (adir / f"analysis_summary.json.archived-{n}").write_text(json.dumps({"analyzed_cards": n}))
    assert latest(summary) == adir / "analysis_summary.json.archived-10"
    assert lacks(summary, ("analyzed_cards", "candidates"), runs) == (
        "analysis_summary.json lacks `candidates` (runs/round-000-online-analysis/analysis_summary.json.archived-10, "
        "archived by the daemon; the file has: analyzed_cards)")
    # A whole run dir archived by a retry: its file is read there.
    gate = runs / "round-000-online-gate.archived-1"
    gate.mkdir()
    (gate / "online_gate_manifest.json").write_text(json.dumps({"status": "complete"}))
    assert lacks(runs / "round-000-online-gate" / "online_gate_manifest.json", ("status", "input"), runs) == (
        "online_gate_manifest.json lacks `input` (runs/round-000-online-gate.archived-1/online_gate_manifest.json, "
        "archived by the daemon; the file has: status)")


def _pass(verdicts: dict[str, str], blamed: str | None = None) -> Pass:
    p = Pass(cfg=None, layout=None, journal=[], records={})  # type: ignore[arg-type]
    p.verdicts = {n: verdicts.get(n, "not reached") for n, _ in STAGES}
    p.blamed = blamed
    return p


def test_merge_keeps_the_first_mismatch_then_ok_then_where_it_stopped() -> None:
    first = _pass({"preflight": "ok", "train.check_command": "train.check_command printed no JSON object on stdout"},
                  blamed="train.check_command")
    second = _pass({"preflight": "ok", "train.check_command": "skipped (not configured)", TRAINER: "ok",
                    "sidecar.command": "not judged: stopped by the daemon (signal 15) as its stage ended",
                    "val.command": "summary.json lacks `counts.coverage` (runs/round-000-bare-val/summary.json)"},
                   blamed="val.command")
    out = dict(merge([first, second]))
    assert out["preflight"] == "ok"
    assert out["train.check_command"] == (
        f"train.check_command printed no JSON object on stdout [{CONTRACT} §3.2]")
    assert out[TRAINER] == "ok"
    assert out["sidecar.command"].startswith("not judged: stopped by the daemon")
    assert out["val.command"].endswith(f"[{CONTRACT} §6]")
    assert out["gate.command"] == ("not reached (the rehearsal stopped at val.command): needs a bare val "
                                   "summary.json the daemon accepts (val.command)")
    assert out["export"].startswith("not reached")  # in no pass: never claimed ok


def _journal(*moves: tuple[str, str], message: str = "") -> list[dict[str, Any]]:
    return [{"event": "transition", "src": s, "dst": d, "message": message} for s, d in moves]


def test_a_dead_trainer_is_blamed_for_its_own_line_not_progress_pattern(tmp_path: Path) -> None:
    cfg = load_config(make_tree(tmp_path / "t", rounds=1))
    layout = Layout.from_config(cfg)
    msg = "TRAIN failed after 1 attempts: trainer exited (status 1) before iter_0000002 was complete; see /x.log"
    j = _journal(("", "PREFLIGHT_DISK"), ("PREFLIGHT_DISK", "START_SHOPSIM"), ("START_SHOPSIM", "TRAIN"),
                 ("TRAIN", "FAILED"), message=msg)
    p = judge_pass(Pass(cfg, layout, j, {}, trainer_log=TRACEBACK))
    assert p.blamed == TRAINER
    assert p.verdicts[TRAINER] == (
        "the trainer died on its own: \"FileNotFoundError: [Errno 2] No such file or directory: "
        "'/r/runs/loop/round-000/slime.yaml'\" (TRAIN failed after 1 attempts: trainer exited (status 1) before "
        "iter_0000002 was complete)")
    # The same silent log from a trainer that finished: only then is the pattern blamed.
    fine = judge_pass(Pass(cfg, layout, _journal(("", "PREFLIGHT_DISK"), ("PREFLIGHT_DISK", "START_SHOPSIM"),
                                                 ("START_SHOPSIM", "TRAIN"), ("TRAIN", "EXPORT_HF")), {},
                           trainer_log="=== shoprld t start trainer: x\nstep one\n"))
    assert "progress_pattern" in fine.verdicts[TRAINER]


def test_a_trainer_that_printed_no_progress_line_at_all_is_not_a_pattern_problem(tmp_path: Path) -> None:
    """Stalled before its first rollout (no slime progress line of any shape): the verdict is the
    trainer's last line, not progress_pattern; with slime's lines there, the pattern is blamed."""
    cfg = load_config(make_tree(tmp_path / "t", rounds=1))
    layout = Layout.from_config(cfg)
    msg = "TRAIN failed after 1 attempts: trainer stalled: no progress for 120s; see /x.log"
    j = _journal(("", "PREFLIGHT_DISK"), ("PREFLIGHT_DISK", "START_SHOPSIM"), ("START_SHOPSIM", "TRAIN"),
                 ("TRAIN", "FAILED"), message=msg)
    hung = "=== shoprld t start trainer: x\nloading weights from /m\n"
    v = judge_pass(Pass(cfg, layout, j, {}, trainer_log=hung)).verdicts[TRAINER]
    assert v == ("the trainer printed no progress line (its last line: 'loading weights from /m'); TRAIN failed "
                 "after 1 attempts: trainer stalled: no progress for 120s")
    ray = hung + "(TrainActor pid=7) [2026-12-05 10:00:00] train_metric_utils.py:41 - rollout 1: {'a': 1}\n"
    cfg2 = cfg.model_copy(update={"train": cfg.train.model_copy(update={"progress_pattern": r"(?m)^rollout (\d+)\b"})})
    v2 = judge_pass(Pass(cfg2, layout, j, {}, trainer_log=ray)).verdicts[TRAINER]
    assert v2.startswith("train.progress_pattern '(?m)^rollout (\\\\d+)\\\\b' never matched slime's progress lines"), v2
