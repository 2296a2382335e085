"""Crash injection: random SIGKILLs of the daemon and its children never break a guarantee."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.chaos import run


def _check(report) -> None:  # type: ignore[no-untyped-def]
    assert report.failures == []
    assert report.max_trainers_at_once <= 1, "two trainers ran at once"


def test_chaos_quick(tmp_path: Path) -> None:
    """A seeded quick run (8 daemon kills): the campaign completes with the
    reference results, one ledger row per round, every end checkpoint saved once, and never two
    trainers at once. (Stalls and leaked leases are in the full mode and test_engine_faults.)"""
    kills = int(os.environ.get("SHOPRLD_CHAOS_KILLS", "8"))
    report = run(tmp_path, seed=11, kills=kills, child_kills=0, per_campaign=kills, faults=False)
    _check(report)
    assert report.daemon_kills >= kills


@pytest.mark.full_chaos
def test_chaos_ci(tmp_path: Path) -> None:
    """By hand (open issue): 60 daemon SIGKILLs (seed 7) with a stall, a crash and leaked leases
    in the first campaign; its last run still had a campaign whose files differed."""
    report = run(tmp_path, seed=7, kills=60, child_kills=0)
    _check(report)
    assert report.daemon_kills >= 60


@pytest.mark.full_chaos
def test_chaos_with_child_kills(tmp_path: Path) -> None:
    """By hand (open issue): 60 daemon and 20 child SIGKILLs; killing val/gate/analysis children
    can still make a round's files differ from the reference (see the README's gaps)."""
    report = run(tmp_path, seed=7, kills=60, child_kills=20)
    _check(report)
    assert report.daemon_kills >= 60 and sum(report.child_kills.values()) >= 20


@pytest.mark.full_chaos
def test_chaos_full(tmp_path: Path) -> None:
    """The full mode (by hand: pytest -m full_chaos, ~20 min): ≥ 200 daemon SIGKILLs and ≥ 50
    child SIGKILLs, seeded and reproducible."""
    report = run(tmp_path, seed=7, kills=200, child_kills=50)
    _check(report)
    assert report.daemon_kills >= 200 and sum(report.child_kills.values()) >= 50
