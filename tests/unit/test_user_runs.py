"""``runs/`` and stale analyses: a checkout's ``runs/`` is moved aside (never into the
experiment), a fresh campaign refuses an ``$EXP_DIR/runs`` that already holds output, and an
``analysis_summary.json`` older than this round's TRAIN end is archived (renamed aside, never
deleted) and journaled, so VAL and GATE run ``analyze`` again."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import RUNS_OWNER, Layout
from shoprld.daemon.services.validate import problems
from shoprld.states import val
from shoprld.states.base import RoundContext
from tests.demotree import make_tree
from tests.roundctx import minimal_context
from tests.unit.test_roundplan import commit_checkpoint
from tests.unit.test_validate import check

Events = list[tuple[str, dict[str, Any]]]


def _trained(ctx: RoundContext, at: float) -> None:
    """This round's final checkpoint committed at ``at`` (TRAIN's end)."""
    commit_checkpoint(ctx.layout.save_dir, ctx.end_iteration)
    os.utime(ckpt.iter_dir(ctx.layout.save_dir, ctx.end_iteration) / "common.pt", (at, at))


def _summary(ctx: RoundContext, at: float, text: str = '{"candidates": 3}\n') -> Path:
    path = ctx.plan.analysis_dir / "analysis_summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (at, at))
    return path


def test_an_analysis_older_than_train_end_is_archived_and_journaled(tmp_path: Path) -> None:
    """An older campaign's round-000 summary (a merged runs/): renamed aside in its dir, with
    ``analysis.stale`` naming both times; VAL then starts analyze (``_analysis_done`` False)."""
    events: Events = []
    ctx = minimal_context(tmp_path, 0, events=events)
    end = time.time() - 60
    _trained(ctx, end)
    path = _summary(ctx, end - 86400, '{"from": "the previous campaign"}\n')
    assert not val._analysis_done(ctx)
    assert not path.exists()
    archived = path.with_name("analysis_summary.json.archived-1")
    assert archived.read_text() == '{"from": "the previous campaign"}\n'
    stale = [f for e, f in events if e == "analysis.stale"]
    assert len(stale) == 1 and stale[0]["train_end"] == pytest.approx(end)
    assert stale[0]["archived"] == str(archived)
    assert ctx.analysis_summary() is None  # nothing left to use: analyze runs


def test_an_analysis_written_after_train_end_is_used(tmp_path: Path) -> None:
    events: Events = []
    ctx = minimal_context(tmp_path, 0, events=events)
    end = time.time() - 60
    _trained(ctx, end)
    path = _summary(ctx, end + 5)
    assert ctx.analysis_summary() == path and val._analysis_done(ctx)
    assert path.exists() and events == []


def test_train_end_falls_back_to_the_export_record(tmp_path: Path) -> None:
    """No final checkpoint on disk (pruned): the EXPORT_HF record, written after TRAIN, is the bound."""
    events: Events = []
    ctx = minimal_context(tmp_path, 0, events=events)
    rec = ctx.record_path("export")
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text(json.dumps({"iteration": ctx.end_iteration}))
    at = time.time() - 30
    os.utime(rec, (at, at))
    assert ctx.train_end() == pytest.approx(at)
    _summary(ctx, at - 1)
    assert ctx.analysis_summary() is None and [e for e, _ in events if e == "analysis.stale"]


def _cfg(root: Path) -> tuple[Path, Layout]:
    campaign = make_tree(root, rounds=2)
    cfg = load_config(campaign)
    return campaign, Layout.from_config(cfg)


def test_a_fresh_campaign_refuses_a_foreign_exp_runs_dir(tmp_path: Path) -> None:
    """check (and run, through the same validation) exit 3 with one line; the fix moves it aside."""
    campaign, layout = _cfg(tmp_path)
    old = layout.runs / "round-000-online-analysis"
    old.mkdir(parents=True)
    (old / "analysis_summary.json").write_text("{}\n")
    code, _, err = check(campaign)
    assert code == 3, err
    line = err.strip()
    assert "\n" not in line and f"{layout.runs} already holds tool output" in line, line
    assert re.search(rf"fix: move it aside \(mv {re.escape(str(layout.runs))} "
                     rf"{re.escape(str(layout.runs))}\.pre-shoprld-\d{{8}}\)", line), line
    # The campaign's own runs/: marked when shoprld made it (even with the state dir lost), or
    # any runs/ of a campaign that has state.
    cfg = load_config(campaign)
    (layout.runs / RUNS_OWNER).write_text("demo/x\n")
    assert not [p for p in problems(cfg, layout) if "already holds" in p.line()]
    (layout.runs / RUNS_OWNER).unlink()
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    (layout.state_dir / "journal.jsonl").write_text("")
    assert not [p for p in problems(cfg, layout) if "already holds" in p.line()]


def test_the_layout_marks_its_runs_dir(tmp_path: Path) -> None:
    campaign, layout = _cfg(tmp_path)
    layout.ensure(load_config(campaign))
    assert (layout.runs / RUNS_OWNER).is_file()


def test_an_empty_exp_runs_dir_is_not_refused(tmp_path: Path) -> None:
    campaign, layout = _cfg(tmp_path)
    layout.runs.mkdir(parents=True)
    assert not [p for p in problems(load_config(campaign), layout) if "already holds" in p.line()]


def test_a_real_runs_dir_in_the_checkout_is_moved_aside_never_into_the_experiment(tmp_path: Path) -> None:
    """The fix names runs.pre-shoprld-<date> beside it, not $EXP_DIR/runs; check says it first."""
    campaign, layout = _cfg(tmp_path)
    link = layout.project_root / "runs"
    link.mkdir()
    code, _, err = check(campaign)
    assert code == 3 and f"mv {link} {link}.pre-shoprld-" in err and str(layout.runs) not in err, err
    with pytest.raises(ConfigError, match=r"mv \S+/runs \S+/runs\.pre-shoprld-\d{8}\)"):
        layout.ensure_runs_link()
