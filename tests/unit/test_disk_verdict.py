"""disk.py is the one judge of ok/soft/hard: the engine's verdict after reclaiming and the wait
for space both use the guard's rule and hysteresis (issue 16), without moving its level."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from shoprld.daemon.foundation.storage.disk import DiskSample, Guard, Level, Limits, wait_for_space

MiB = 1 << 20
LIM = Limits(soft_bytes=300 * MiB, hard_bytes=100 * MiB, soft_inodes=200, hard_inodes=100)
HYST = 50 * MiB


def smp(free: int) -> DiskSample:
    return DiskSample(path=Path("/v"), total_bytes=1000 * MiB, free_bytes=free, avail_bytes=free,
                      inodes_total=10_000, inodes_free=5_000, read_only=False, at=0.0)


def test_the_verdict_uses_the_guards_hysteresis_and_leaves_its_level_alone() -> None:
    """Just above soft is still SOFT for a guard at SOFT (hysteresis); the guard's level is not moved."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    g.observe(smp(LIM.soft_bytes - 1))
    v = g.verdict(smp(LIM.soft_bytes + HYST // 2))
    assert v.level is Level.SOFT and g.level is Level.SOFT
    assert g.verdict(smp(LIM.soft_bytes + HYST + 1)).level is Level.OK
    assert not g.verdict(smp(LIM.soft_bytes + HYST + 1)).holds(Level.SOFT)
    assert g.level is Level.SOFT  # only the monitor's observe() moves it, so its disk.ok is still emitted


def test_a_hard_guard_freed_above_hard_but_not_soft_is_soft() -> None:
    """Reclaiming from HARD to between the limits gives SOFT (park at the next safe point), not OK."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    g.observe(smp(LIM.hard_bytes - 1))
    assert g.verdict(smp(LIM.hard_bytes + HYST // 2)).level is Level.HARD
    v = g.verdict(smp(LIM.hard_bytes + HYST + 1))
    assert v.level is Level.SOFT and not v.holds(Level.HARD) and v.holds(Level.SOFT)
    assert v.park_reason(Path("/v"), Level.SOFT) == "free 150.0 MiB < soft limit 300.0 MiB on /v"


def test_the_park_reason_and_room_for_one_more_save() -> None:
    v = Guard(LIM, hysteresis_bytes=HYST).verdict(smp(LIM.hard_bytes - MiB))
    assert v.level is Level.HARD and v.holds(Level.SOFT) and v.holds(Level.HARD)
    assert v.park_reason(Path("/v"), Level.HARD) == "free 99.0 MiB < hard limit 100.0 MiB on /v"
    assert v.park_reason(Path("/v"), Level.SOFT) == "free 99.0 MiB < soft limit 300.0 MiB on /v"
    soft = Guard(LIM, hysteresis_bytes=HYST).verdict(smp(LIM.hard_bytes + 20 * MiB))
    assert soft.fits(20 * MiB) and not soft.fits(20 * MiB + 1)


@pytest.mark.anyio
async def test_wait_for_space_needs_the_hysteresis_and_the_settle_time() -> None:
    """Free just above soft does not end the wait; above soft + hysteresis for `settle` seconds does."""
    g = Guard(LIM, hysteresis_bytes=HYST)  # OK: the wait still asks for the way up from SOFT
    frees = iter([LIM.soft_bytes + 1, LIM.soft_bytes + HYST // 2, LIM.soft_bytes + HYST + 1,
                  LIM.soft_bytes + 1, *[LIM.soft_bytes + HYST + 1] * 4])
    seen: list[int] = []
    now = [0.0]

    def sampler(path: Path) -> DiskSample:
        now[0] += 1.0
        seen.append(next(frees))
        return smp(seen[-1])

    with anyio.fail_after(10):
        await wait_for_space(Path("/v"), g, settle=2.0, interval=0.001, monotonic=lambda: now[0], sampler=sampler)
    # the first OK run is broken by a dip; the second lasts 2 s (3 samples) before returning
    assert len(seen) == 7
