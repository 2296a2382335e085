"""The readers of the real tools' files (issue 14): each accepts exactly what the real tool writes
(contracts/shopsimrl-tools.md §5-§7), reads the failure shape by the tool's rules, refuses a file
from another round's weights, and turns a truncated file or JSON of the wrong shape into one line
that names the file and what is missing (never a `status` the tool did not write)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shoprld.daemon.foundation.tools.files import read_analysis, read_bare_summary, read_gate
from shoprld.daemon.foundation.tools.payload import ToolOutputError
from shoprld.states import gate as gate_state
from shoprld.states import val as val_state
from tests.roundctx import minimal_context

SHA = "ab" * 32

# §5: analysis_summary.json on success, exactly the real fields (no status key).
REAL_ANALYSIS = {"schema_version": "shopsimrl-online-failure-analysis-v1", "created_at": "2026-12-01T00:00:00+00:00",
                 "triage_groups": 5, "analyzed_cards": 5, "eligible_cards": 3, "candidates": 2,
                 "proposal_history_records": 4, "evidence_only_card_ids": ["failure-x-01"],
                 "candidate_pool_path": "/abs/runs/round-001-online-analysis/candidate_pool.json",
                 "current_skillbank_sha256": SHA, "compilation_input_sha256": SHA}
# §5: the fallback.
FALLBACK = {"schema_version": "shopsimrl-online-failure-analysis-v1", "created_at": "2026-12-01T00:00:00+00:00",
            "status": "failed", "submitted_candidates": False,
            "error": {"type": "FileNotFoundError", "message": "no triage.json under runs/slime-training/round-001"},
            "triage_groups": 0, "analyzed_cards": 0, "eligible_cards": 0, "candidates": 0,
            "proposal_history_records": 0, "evidence_only_card_ids": [], "candidate_pool_path": "/abs/pool.json",
            "current_skillbank_sha256": SHA, "compilation_input_sha256": None}
# §6: the bare summary.json (no weight_version).
REAL_SUMMARY = {"schema_version": "shopsimrl-eval-summary-v2", "created_at": "2026-12-01T00:00:00+00:00",
                "counts": {"requested": 400, "trace_files": 400, "completed": 398, "failed": 2, "scored": 398,
                           "coverage": 0.995},
                "primary": {"reward_mean": 0.41, "reward_sem": 0.02, "success_rate": 0.3},
                "reward_components": {"r_strict": 0.4, "r_success": 0.3},
                "behavior": {"steps_mean": 9.1, "termination_reasons": {"purchase": 398}},
                "cost": {"duration_ms_mean": 1234.5, "tokens": {"total_tokens": 10}}, "errors": {"HTTPError": 2}}
# §7: online_gate_manifest.json (complete), and contributions.json with dropped pairs.
REAL_MANIFEST = {"schema_version": "shopsimrl-online-validation-gate-v2", "created_at": "2026-12-01T00:00:00+00:00",
                 "status": "complete", "config": {"name": "round-001-online-gate"}, "protocol": {"split": "val"},
                 "input": {"proposal_checkpoint": "qwen35-4b-round-001", "pool_sha256": SHA, "assignment_sha256": SHA,
                           "task_ids": [1, 2, 3], "model": {"checkpoint_id": "round-001-checkpoint"},
                           "bare_baseline": {"checkpoint_id": "round-001-checkpoint", "observations": 2}},
                 "summary": {"counts": {"requested": 3, "completed": 2}},
                 "output": {"contributions_sha256": SHA, "selected_skillbank_sha256": SHA,
                            "proposal_ledger_sha256": SHA, "selected_chunk_ids": []}}
CONTRIBUTIONS = {"schema_version": "shopsimrl-online-chunk-contributions-v2", "observations": 2,
                 "requested_observations": 3, "dropped_episode_ids": ["task-000003__sample-000"]}


def write(path: Path, obj: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=2))
    return path


# -- analysis_summary.json -------------------------------------------------------------------------
def test_a_real_success_summary_reads_without_a_status_key(tmp_path: Path) -> None:
    """The real success shape (no status) is an ok analysis with its candidates and ledger."""
    write(tmp_path / "analysis_summary.json", REAL_ANALYSIS)
    (tmp_path / "proposal_ledger.jsonl").write_text("{}\n")
    a = read_analysis(tmp_path)
    assert a is not None and (a.kind, a.candidates, a.ledger) == ("ok", 2, tmp_path / "proposal_ledger.jsonl")


def test_the_fallback_is_failed_with_its_error_and_no_ledger(tmp_path: Path) -> None:
    """status failed: the error is kept, and a ledger left there (an earlier compile's) is not this one's."""
    write(tmp_path / "analysis_summary.json", FALLBACK)
    (tmp_path / "proposal_ledger.jsonl").write_text('{"stale": true}\n')
    a = read_analysis(tmp_path)
    assert a is not None and a.kind == "failed" and a.ledger is None
    assert a.error == "FileNotFoundError: no triage.json under runs/slime-training/round-001"
    assert "no proposal ledger" in a.note()


def test_a_silent_empty_analysis_is_detected(tmp_path: Path) -> None:
    """Success-shaped, 0 candidates, every latest card an ANALYST_ERROR: silent_empty, not ok."""
    write(tmp_path / "analysis_summary.json", {**REAL_ANALYSIS, "eligible_cards": 0, "candidates": 0})
    cards = [{"source_trajectory_id": f"t{i}", "eligible_for_consolidation": False, "status": "ANALYST_ERROR",
              "error": {"type": "KeyError", "message": "BAILIAN_API_KEY"}, "input_fingerprint": SHA} for i in range(5)]
    (tmp_path / "failure_cards.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cards))
    a = read_analysis(tmp_path)
    assert a is not None and (a.kind, a.analyst_errors) == ("silent_empty", 5)


def test_no_proposal_cards_are_not_silent_empty(tmp_path: Path) -> None:
    """0 eligible cards because the analyst proposed nothing (NO_PROPOSAL) is a real, ok outcome."""
    write(tmp_path / "analysis_summary.json", {**REAL_ANALYSIS, "eligible_cards": 0, "candidates": 0})
    card = {"source_trajectory_id": "t0", "status": "NO_PROPOSAL", "eligible_for_consolidation": False}
    (tmp_path / "failure_cards.jsonl").write_text(json.dumps(card) + "\n")
    a = read_analysis(tmp_path)
    assert a is not None and a.kind == "ok"


def test_a_retrained_rounds_analysis_with_history_reads(tmp_path: Path) -> None:
    """A later round's summary (history records, a rerun after retraining) reads the same way."""
    write(tmp_path / "analysis_summary.json", {**REAL_ANALYSIS, "proposal_history_records": 12, "triage_groups": 0,
                                               "analyzed_cards": 0, "eligible_cards": 0, "candidates": 0})
    a = read_analysis(tmp_path)
    assert a is not None and a.kind == "ok" and a.candidates == 0


@pytest.mark.parametrize(("text", "want"), [
    (json.dumps(REAL_ANALYSIS, indent=2)[:-40], "truncated"),
    ("[1, 2]", "holds a JSON list, not the object"),
    (json.dumps({k: v for k, v in REAL_ANALYSIS.items() if k != "candidates"}), "'candidates' must be an integer (missing)"),
    (json.dumps({**REAL_ANALYSIS, "eligible_cards": "3"}), "'eligible_cards' must be an integer (str '3')"),
])
def test_a_bad_analysis_summary_is_one_line_naming_the_file(tmp_path: Path, text: str, want: str) -> None:
    """Truncated or of the wrong shape: one line with the path and what is missing."""
    (tmp_path / "analysis_summary.json").write_text(text)
    with pytest.raises(ToolOutputError) as info:
        read_analysis(tmp_path)
    msg = str(info.value)
    assert msg.startswith(str(tmp_path / "analysis_summary.json")) and want in msg and "\n" not in msg


# -- the bare summary.json and the gate manifest, through the stages' own judges -------------------
@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = minimal_context(tmp_path, 1)
    c.record_path("export").parent.mkdir(parents=True)
    c.record_path("export").write_text("{}")
    return c


def _age(path: Path, seconds: float) -> None:
    t = path.stat().st_mtime - seconds
    os.utime(path, (t, t))


def test_a_real_bare_summary_with_partial_coverage_passes(ctx) -> None:  # type: ignore[no-untyped-def]
    """The real summary (no weight_version) at coverage 0.995 passes the default min_coverage, newer than the export.
    Its two failed episodes count only if a daemon watched the services while it ran (its record
    names this summary file): one a crashed daemon left is rerun (found by chaos); a whole one is not."""
    path = write(ctx.runs / "round-001-bare-val" / "summary.json", REAL_SUMMARY)
    s = read_bare_summary(path)
    assert s is not None and (s.coverage, s.failed) == (0.995, 2)
    assert val_state._judge(ctx) == (s, None) and not val_state.completed(ctx)
    assert val_state._done(ctx, s).kind == "done"  # what the watching daemon does: records it
    assert ctx.read_record("val")["failed"] == 2 and val_state.completed(ctx)
    write(path, REAL_SUMMARY)  # another run's file (another mtime): not the one recorded
    os.utime(path, ns=(path.stat().st_mtime_ns + 1000, path.stat().st_mtime_ns + 1000))
    assert not val_state.completed(ctx)
    ctx.record_path("val").unlink()
    write(path, {**REAL_SUMMARY, "counts": {**REAL_SUMMARY["counts"], "completed": 400, "failed": 0, "coverage": 1.0}})
    assert val_state.completed(ctx)


def test_the_failure_shape_of_a_bare_run_is_refused(ctx) -> None:  # type: ignore[no-untyped-def]
    """Every episode failed (a dead val server: the real run still exits 0): coverage 0 is below the minimum."""
    write(ctx.runs / "round-001-bare-val" / "summary.json",
          {**REAL_SUMMARY, "counts": {**REAL_SUMMARY["counts"], "completed": 0, "failed": 400, "coverage": 0.0},
           "primary": {"reward_mean": None, "reward_sem": None, "success_rate": None}})
    _, problem = val_state._judge(ctx)
    assert problem is not None and "coverage 0 is below val.min_coverage 0.95 (400 of 400 episodes failed)" in problem


def test_a_bare_summary_from_before_a_retrain_is_not_this_rounds(ctx) -> None:  # type: ignore[no-untyped-def]
    """A summary older than this round's export (the weights were retrained since) is not accepted."""
    path = write(ctx.runs / "round-001-bare-val" / "summary.json", REAL_SUMMARY)
    _age(path, 60)
    summary, problem = val_state._judge(ctx)
    assert summary is not None and problem is not None and "older than this round's export" in problem
    assert not val_state.completed(ctx)


@pytest.mark.parametrize(("text", "want"), [
    (json.dumps(REAL_SUMMARY)[:50], "truncated"),
    (json.dumps({**REAL_SUMMARY, "counts": {"requested": 1}}), "counts.coverage must be a number (None)"),
    (json.dumps({"schema_version": "x"}), "no 'counts' object"),
])
def test_a_bad_bare_summary_is_one_line(ctx, text: str, want: str) -> None:  # type: ignore[no-untyped-def]
    """VAL gets one line naming summary.json and what is missing (and retries): never a crash."""
    path = ctx.runs / "round-001-bare-val" / "summary.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    summary, problem = val_state._judge(ctx)
    assert summary is None and problem is not None and problem.startswith(str(path)) and want in problem
    assert not val_state.completed(ctx)


def test_a_real_complete_gate_with_dropped_pairs_reads_complete(ctx) -> None:  # type: ignore[no-untyped-def]
    """complete despite a dropped pair (listed in contributions.json); no weight_version anywhere.
    Left by a crashed daemon, it is not reused (found by chaos: the pair was dropped because
    ShopSim died while no daemon watched); the same manifest without drops is."""
    d = ctx.runs / "round-001-online-gate"
    write(d / "contributions.json", CONTRIBUTIONS)
    write(d / "selected_skillbank.json", {"schema_version": "shopsimrl-skillbank-v1", "skills": []})
    write(d / "online_gate_manifest.json", REAL_MANIFEST)
    g = read_gate(d)
    assert g is not None and (g.status, g.dropped, g.observations) == ("complete", 1, 2)
    assert not gate_state._finished(ctx, d)
    assert gate_state._leftover(d) == "complete, but 1 pair(s) dropped while no daemon watched the val server and ShopSim"
    write(d / "contributions.json", {**CONTRIBUTIONS, "observations": 3, "dropped_episode_ids": []})
    assert gate_state._finished(ctx, d)


def test_the_incomplete_shape_and_no_manifest(ctx) -> None:  # type: ignore[no-untyped-def]
    """incomplete (output null) reads incomplete; a pre-rollout error leaves no manifest: None."""
    d = ctx.runs / "round-001-online-gate"
    assert read_gate(d) is None
    write(d / "online_gate_manifest.json", {**REAL_MANIFEST, "status": "incomplete", "output": None})
    g = read_gate(d)
    assert g is not None and g.status == "incomplete" and not gate_state._finished(ctx, d)


def test_a_gate_from_before_a_retrain_is_not_reused(ctx) -> None:  # type: ignore[no-untyped-def]
    """A complete manifest older than this round's export (retrained weights) is not reused."""
    d = ctx.runs / "round-001-online-gate"
    write(d / "selected_skillbank.json", {"skills": []})
    _age(write(d / "online_gate_manifest.json", REAL_MANIFEST), 60)
    assert not gate_state._finished(ctx, d)


@pytest.mark.parametrize(("obj", "want"), [
    ({**REAL_MANIFEST, "status": "ok"}, "'status' must be complete or incomplete ('ok')"),
    ({k: v for k, v in REAL_MANIFEST.items() if k != "status"}, "'status' must be complete or incomplete (None)"),
])
def test_a_manifest_of_the_wrong_shape_is_one_line(tmp_path: Path, obj: dict, want: str) -> None:
    """A status the tool never writes is refused by name, in one line."""
    write(tmp_path / "online_gate_manifest.json", obj)
    with pytest.raises(ToolOutputError) as info:
        read_gate(tmp_path)
    assert want in str(info.value) and str(info.value).startswith(str(tmp_path))
