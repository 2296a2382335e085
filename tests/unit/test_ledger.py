"""The ledger: columns, idempotent appends across restarts, sanitizing, overflow, git, the CLI."""

from __future__ import annotations

import io
import json
import os
import sys
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.ops.ledgercmd import print_ledger
from shoprld.daemon.foundation.records.ledger import (
    COLUMNS, POINTER_PREFIX, Ledger, LedgerError, git_info, make_row, sanitize,
)

HEADER = ("index branch parent_commit commit recipe metric_name metric_value memory_gb elapsed_min launcher "
          "job_id command log_path status description exp_dir checkpoint_path artifacts_path cache_root causes")


def row(i: int, **over: str) -> dict[str, str]:
    base = dict(index=str(i), branch="main", commit="c0ffee", recipe="demo", metric_name="success_rate",
                metric_value="0.41", elapsed_min="118.0", launcher="local", command="python train.py --key ***",
                log_path=f"/ephemeral/exp/logs/r{i:03d}-train.log", status="keep",
                description=f"round {i}", exp_dir="/ephemeral/exp",
                checkpoint_path="/ephemeral/exp/checkpoints/megatron", artifacts_path="/ephemeral/exp/artifacts",
                cache_root="/ephemeral/cache")
    base.update(over)
    return make_row(**base)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "repo" / "reports" / "shoprld" / "demo.tsv", overflow_dir=tmp_path / "vol" / "ledger")


def test_header_has_exactly_the_spec_columns(ledger: Ledger) -> None:
    """The file starts with the SPEC §6 header, tab-separated, in order."""
    assert ledger.append(row(0))
    lines = ledger.path.read_text().splitlines()
    assert lines[0] == "\t".join(HEADER.split()) and tuple(HEADER.split()) == COLUMNS
    assert lines[1].split("\t")[COLUMNS.index("status")] == "keep"
    assert ledger.rows() == [row(0)]


def test_append_is_idempotent_across_restarts(ledger: Ledger) -> None:
    """Re-recording a round (after a crash) never duplicates it, even from a fresh Ledger object."""
    assert ledger.append(row(0)) is True
    assert ledger.append(row(1)) is True
    assert ledger.append(row(1, description="again")) is False
    again = Ledger(ledger.path, overflow_dir=ledger.overflow_dir)
    assert again.has_round(1) and not again.has_round(2)
    assert again.append(row(0)) is False
    assert [r["index"] for r in again.rows()] == ["0", "1"]
    assert again.rows()[1]["description"] == "round 1"


def test_every_write_replaces_the_file_atomically(ledger: Ledger) -> None:
    """Each append is a whole-file replace (new inode) and leaves no temp file behind."""
    ledger.append(row(0))
    before = os.stat(ledger.path).st_ino
    ledger.append(row(1))
    assert os.stat(ledger.path).st_ino != before
    assert sorted(p.name for p in ledger.path.parent.iterdir()) == ["demo.tsv"]


def test_tabs_and_newlines_are_sanitized(ledger: Ledger) -> None:
    """Tabs, newlines and CRs in values become spaces, so one row stays one line."""
    ledger.append(row(0, description="line one\nline\ttwo\r\nthree"))
    assert ledger.rows()[0]["description"] == "line one line two three"
    assert len(ledger.path.read_text().splitlines()) == 2
    assert sanitize("a\x1eb\u2028c\x0bd") == "a b c d"


def test_redact_applies_to_every_field(tmp_path: Path) -> None:
    """The redact callable masks secrets in every column, including the command."""
    led = Ledger(tmp_path / "l.tsv", overflow_dir=tmp_path / "o", redact=lambda s: s.replace("hunter22", "***"))
    led.append(row(0, command="train --wandb-key hunter22", description="key hunter22 leaked"))
    text = led.path.read_text()
    assert "hunter22" not in text and text.count("***") >= 2


def test_bad_rows_are_rejected(ledger: Ledger) -> None:
    """Unknown columns, a bad status or a missing index raise ValueError and write nothing."""
    with pytest.raises(ValueError, match="unknown column"):
        make_row(index="0", metric="x")
    with pytest.raises(ValueError, match="status 'maybe'"):
        ledger.append(row(0, status="maybe"))
    with pytest.raises(ValueError, match="no index"):
        ledger.append(row(0, index=""))
    assert not ledger.path.exists()


def test_make_row_fills_missing_columns() -> None:
    """make_row gives every column, "" by default, values as strings."""
    r = make_row(index=3, metric_value=0.5, status="crash")
    assert list(r) == list(COLUMNS) and r["index"] == "3" and r["metric_value"] == "0.5" and r["branch"] == ""


def test_overflow_moves_the_full_ledger_and_leaves_a_pointer(tmp_path: Path) -> None:
    """Past max_bytes the repo keeps a pointer plus the last rows; every row stays readable."""
    led = Ledger(tmp_path / "repo" / "demo.tsv", overflow_dir=tmp_path / "vol" / "ledger", max_bytes=4096,
                 summary_rows=3)
    for i in range(40):
        assert led.append(row(i, description="x" * 60))
    repo = led.path.read_text().splitlines()
    full = led.overflow_path.read_text().splitlines()
    assert repo[0] == f"{POINTER_PREFIX}{led.overflow_path.resolve()} (40 rows, 0.0 MiB)"
    assert repo[2] == "\t".join(COLUMNS) and [ln.split("\t")[0] for ln in repo[3:]] == ["37", "38", "39"]
    assert len(full) == 41 and led.path.stat().st_size < 4096
    assert [r["index"] for r in led.rows()] == [str(i) for i in range(40)]
    assert led.has_round(0) and led.append(row(5)) is False
    assert led.append(row(40)) and led.rows()[-1]["index"] == "40"


def test_crash_between_overflow_and_pointer_writes_loses_nothing(tmp_path: Path) -> None:
    """If the daemon died after writing the full file but before the pointer, the row is still seen."""
    led = Ledger(tmp_path / "demo.tsv", overflow_dir=tmp_path / "vol", max_bytes=2048, summary_rows=2)
    for i in range(30):
        led.append(row(i))
    pointer_before = led.path.read_bytes()
    led.append(row(30))
    led.path.write_bytes(pointer_before)  # the pointer rewrite "never happened"
    assert led.has_round(30) and led.append(row(30)) is False
    assert len(led.rows()) == 31


def test_missing_overflow_file_is_an_error_not_a_truncation(tmp_path: Path) -> None:
    """If the volume with the full ledger is gone, reading fails loudly instead of rewriting a short ledger."""
    led = Ledger(tmp_path / "demo.tsv", overflow_dir=tmp_path / "vol", max_bytes=1024)
    for i in range(20):
        led.append(row(i))
    led.overflow_path.unlink()
    with pytest.raises(LedgerError, match="the full ledger is missing"):
        led.append(row(20))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=4))
def test_any_text_round_trips_sanitized(tmp_path_factory: pytest.TempPathFactory, values: list[str]) -> None:
    """Whatever text goes in comes back as its sanitized form, one row per append."""
    d = tmp_path_factory.mktemp("prop")
    led = Ledger(d / "l.tsv", overflow_dir=d / "o")
    for i, v in enumerate(values):
        led.append(row(i, description=v, recipe=v))
    got = led.rows()
    assert [r["description"] for r in got] == [sanitize(v) for v in values]
    assert [r["recipe"] for r in got] == [sanitize(v) for v in values]


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env, timeout=30).stdout.strip()


def test_git_info_of_a_real_repo(tmp_path: Path) -> None:
    """commit, branch and parent come from git rev-parse."""
    _git(tmp_path, "init", "-q", "-b", "exp/round-3")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    parent = _git(tmp_path, "rev-parse", "HEAD")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "two")
    info = git_info(tmp_path)
    assert info == {"commit": _git(tmp_path, "rev-parse", "HEAD"), "branch": "exp/round-3", "parent_commit": parent}


def test_git_info_outside_a_repo_is_empty(tmp_path: Path) -> None:
    """Not a git repo: every field is "" rather than an error."""
    assert git_info(tmp_path / "nowhere") == {"commit": "", "branch": "", "parent_commit": ""}


@pytest.fixture
def campaign_file(tmp_path: Path) -> Path:
    cfg = tmp_path / "demo.toml"
    cfg.write_text(f'[campaign]\nname = "demo"\nrounds = 2\nsteps_per_round = 3\n'
                   f'[storage]\nrepo = "{tmp_path / "repo"}"\nephemeral_root = "{tmp_path / "vol"}"\n'
                   f'user = "tester"\n[train]\ncommand = ["python", "train.py"]\n')
    return cfg


def test_print_ledger_json_and_tsv(campaign_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`shoprld ledger --json` lists every row; piped, it prints the raw TSV with the header."""
    led = Ledger(tmp_path / "repo" / "reports" / "shoprld" / "demo.tsv",
                 overflow_dir=tmp_path / "vol" / "nemo-rl" / "tester" / "nemo-rl-auto-research" / "demo" / "ledger")
    led.append(row(0))
    led.append(row(1, status="discard"))
    assert print_ledger(campaign_file, as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == [row(0), row(1, status="discard")]
    assert print_ledger(campaign_file, as_json=False) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "\t".join(COLUMNS) and len(lines) == 3 and lines[2].split("\t")[13] == "discard"


def test_print_ledger_with_no_rows_yet(campaign_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the first round, the ledger prints an empty JSON list."""
    assert print_ledger(campaign_file, as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == []


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_print_ledger_on_a_terminal_is_a_table(campaign_file: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the ledger is a table of the key columns, with the file's path."""
    led = Ledger(tmp_path / "repo" / "reports" / "shoprld" / "demo.tsv",
                 overflow_dir=tmp_path / "vol" / "nemo-rl" / "tester" / "nemo-rl-auto-research" / "demo" / "ledger")
    led.append(row(0, metric_value="0.4375"))
    term = _Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setenv("COLUMNS", "160")
    assert print_ledger(campaign_file) == 0
    text = term.getvalue()
    assert str(led.path) in text and "0.4375" in text and "success_rate" in text and "1 row;" in text
