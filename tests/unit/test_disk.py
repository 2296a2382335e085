"""shoprld.daemon.foundation.storage.disk: the logic that needs no mounts (forecast, limits, guard, ENOSPC text,
preflight lines, the monitor through its sampler seam, reclaim confinement)."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoprld.daemon.foundation.storage import disk, diskcheck, reclaim
from shoprld.daemon.foundation.storage.disk import (
    DiskSample,
    GiB,
    Guard,
    Level,
    Limits,
    is_enospc,
    enospc_line,
    log_says_enospc,
)
from shoprld.daemon.foundation.storage.diskbudget import limits
from shoprld.daemon.foundation.storage.diskcheck import PreflightProblem
from structlog.testing import capture_logs

from tests.fsfixtures import DiskEvents

MiB = 1 << 20


def smp(free: int, inodes: int = 10_000, *, read_only: bool = False) -> DiskSample:
    """A synthetic sample, for the pure guard logic."""
    return DiskSample(
        path=Path("/vol"),
        total_bytes=100 * MiB,
        free_bytes=free,
        avail_bytes=free,
        inodes_total=20_000,
        inodes_free=inodes,
        read_only=read_only,
        at=0.0,
    )


LIM = Limits(soft_bytes=8 * MiB, hard_bytes=4 * MiB, soft_inodes=2000, hard_inodes=1000)
HYST = MiB


# ---------------------------------------------------------------------------- forecast, limits


@pytest.mark.parametrize(
    "kwargs",
    [
        {"soft_override": 4 * MiB, "hard_override": 4 * MiB},
        {"soft_override": 3 * MiB, "hard_override": 4 * MiB},
        {"hard_override": 4 * MiB, "hard_inodes": 10, "soft_inodes": 10},
    ],
)
def test_limits_reject_soft_not_above_hard(kwargs: dict[str, int]) -> None:
    """soft <= hard, in bytes or in inodes, is a ValueError."""
    with pytest.raises(ValueError, match="soft"):
        limits(20 * MiB, 2 * MiB, **kwargs)


# ---------------------------------------------------------------------------- guard


def test_guard_flapping_around_soft_changes_once() -> None:
    """A value flapping just around soft enters SOFT once and stays there."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    changes = [g.observe(smp(LIM.soft_bytes + d)) for d in (-1, 1, -1, HYST, -1, HYST // 2, 1, -1)]
    assert changes == [Level.SOFT] + [None] * 7
    assert g.observe(smp(LIM.soft_bytes + HYST + 1)) is Level.OK
    assert g.level is Level.OK and g.reason == ""


def test_guard_enters_hard_at_once_from_ok() -> None:
    """One sample below hard goes straight to HARD, with no debounce and no SOFT first."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    assert g.observe(smp(100 * MiB)) is None
    assert g.observe(smp(LIM.hard_bytes - 1)) is Level.HARD
    assert "hard limit" in g.reason


def test_guard_leaves_hard_only_above_hard_plus_hysteresis() -> None:
    """HARD holds up to hard + hysteresis, then yields to SOFT, then OK past soft + hysteresis."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    g.observe(smp(0))
    assert g.observe(smp(LIM.hard_bytes + 1)) is None
    assert g.observe(smp(LIM.hard_bytes + HYST)) is None
    assert g.observe(smp(LIM.hard_bytes + HYST + 1)) is Level.SOFT
    assert g.observe(smp(LIM.soft_bytes + HYST)) is None
    assert g.observe(smp(LIM.soft_bytes + HYST + 1)) is Level.OK


def test_guard_goes_from_hard_straight_to_ok_when_space_returns() -> None:
    """Freeing a lot at once leaves HARD for OK in one change."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    g.observe(smp(0))
    assert g.observe(smp(50 * MiB)) is Level.OK


def test_guard_treats_inodes_like_bytes() -> None:
    """Inodes below hard go HARD at once and need the inode hysteresis to leave."""
    g = Guard(LIM, hysteresis_bytes=HYST, hysteresis_inodes=50)
    assert g.observe(smp(50 * MiB, inodes=999)) is Level.HARD
    assert "inodes" in g.reason
    assert g.observe(smp(50 * MiB, inodes=1050)) is None
    assert g.observe(smp(50 * MiB, inodes=1051)) is Level.SOFT
    assert g.observe(smp(50 * MiB, inodes=2051)) is Level.OK


def test_guard_counts_a_read_only_volume_as_hard() -> None:
    """A volume that went read-only cannot take a save: HARD."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    assert g.observe(smp(50 * MiB, read_only=True)) is Level.HARD
    assert "read-only" in g.reason


def test_guard_force_hard_reports_a_change_once() -> None:
    """Forcing HARD (an ENOSPC) is a change the first time only."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    assert g.force_hard("ENOSPC at /vol/x") is Level.HARD
    assert g.force_hard("ENOSPC at /vol/y") is None
    assert g.reason == "ENOSPC at /vol/y"


@given(st.lists(st.integers(min_value=0, max_value=12 * MiB), max_size=60))
def test_guard_changes_only_across_the_full_band(frees: list[int]) -> None:
    """Every change is justified by its sample: entries below a limit, exits beyond limit + hysteresis."""
    g = Guard(LIM, hysteresis_bytes=HYST)
    for free in frees:
        before = g.level
        change = g.observe(smp(free))
        assert (change is None) == (g.level is before)
        if change is Level.HARD:
            assert free < LIM.hard_bytes
        elif change is Level.SOFT and before is Level.OK:
            assert LIM.hard_bytes <= free < LIM.soft_bytes
        elif change is Level.SOFT:
            assert LIM.hard_bytes + HYST < free <= LIM.soft_bytes + HYST
        elif change is Level.OK:
            assert free > LIM.soft_bytes + HYST


# ---------------------------------------------------------------------------- ENOSPC recognition


def test_is_enospc_is_false_for_other_errors() -> None:
    """EACCES (or any non-space error) is not a full disk."""
    assert not is_enospc(PermissionError(errno.EACCES, "Permission denied"))
    assert not is_enospc(ValueError("no"))


def test_is_enospc_accepts_enospc_and_edquot() -> None:
    """ENOSPC and EDQUOT from a write both mean the write did not fit."""
    assert is_enospc(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert is_enospc(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))


def test_is_enospc_ignores_inotify_watch_limit() -> None:
    """watchdog's inotify watch-limit ENOSPC is not a full disk."""
    assert not is_enospc(OSError(errno.ENOSPC, "inotify watch limit reached"))


def test_is_enospc_looks_through_groups_and_causes() -> None:
    """An ENOSPC inside a task-group ExceptionGroup or behind `raise from` is found."""
    full = OSError(errno.ENOSPC, "No space left on device")
    assert is_enospc(ExceptionGroup("tg", [ValueError("x"), ExceptionGroup("inner", [full])]))
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("save failed") from exc
    except RuntimeError as wrapped:
        assert is_enospc(wrapped)


@pytest.mark.parametrize(
    "tail",
    [
        "OSError: [Errno 28] No space left on device: '/ephemeral/x/iter_0000040/common.pt'",
        "write error: ENOSPC",
        "cp: error writing 'a': Disk quota exceeded",
        "RuntimeError: [enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing file "
        "data/3: file write failed\nOSError: errno 28",
        "Traceback...\n  File train.py\n[Errno 28] while saving",
    ],
)
def test_log_says_enospc_recognises_disk_full(tail: str) -> None:
    """The usual disk-full messages in a child's log tail are recognised."""
    assert log_says_enospc(tail)


@pytest.mark.parametrize(
    "tail",
    [
        "OSError: [Errno 28] inotify watch limit reached",
        "Error: ENOSPC: System limit for number of file watchers reached",
        "RuntimeError: PytorchStreamWriter failed writing file data/3: file write failed",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "",
    ],
)
def test_log_says_enospc_rejects_other_failures(tail: str) -> None:
    """The inotify limit, a torch write failure without errno 28, and OOMs are not disk-full."""
    assert not log_says_enospc(tail)


_LOG_PIECES = st.sampled_from([
    "OSError: [Errno 28] No space left on device: '/eph/iter_0000040/common.pt'", "write error: ENOSPC",
    "Disk quota exceeded", "OSError: [Errno 28] inotify watch limit reached",
    "Error: ENOSPC: System limit for number of file watchers reached",
    "RuntimeError: PytorchStreamWriter failed writing file data/3: file write failed", "OSError: errno 28",
    "CUDA out of memory", "step 12 done", "",
])


@given(st.lists(st.one_of(_LOG_PIECES, st.text(max_size=40)), max_size=8))
def test_the_quoted_evidence_is_what_the_recogniser_decided_on(pieces: list[str]) -> None:
    """A failure's cause quotes enospc_line: a line of the tail itself, never an inotify-limit
    line, and present exactly when log_says_enospc says disk-full (one recogniser, issue 16)."""
    tail = "\n".join(pieces)
    line = enospc_line(tail)
    assert bool(line) == log_says_enospc(tail)
    if line:
        assert any(line == ln.strip()[:300] for ln in tail.splitlines())
        assert "inotify" not in line.lower() and "file watchers" not in line.lower()


# ---------------------------------------------------------------------------- preflight lines, df


def test_preflight_problem_is_one_line() -> None:
    """A problem prints as one line `what: where (fix)`, even when a path holds a newline."""
    p = PreflightProblem("ephemeral root is missing", "/eph\nemeral", "mount it")
    assert p.line() == "ephemeral root is missing: /eph\\nemeral (mount it)"
    assert "\n" not in p.line()


def test_df_summary_has_a_row_per_path_and_aligned_columns(tmp_path: Path) -> None:
    """df_summary prints a header and one aligned row per label, including a missing path."""
    text = diskcheck.df_summary({"repo": Path("/"), "volume": tmp_path / "missing"})
    lines = text.splitlines()
    assert len(lines) == 3
    assert lines[0].split()[:3] == ["LABEL", "FILESYSTEM", "SIZE"]
    assert lines[1].startswith("repo ") and lines[1].endswith(" /")
    assert "No such file or directory" in lines[2]
    pct_end = lines[0].index("USE%") + len("USE%") - 1
    assert lines[1][pct_end] == "%"  # right-aligned numeric columns line up under the header


# ---------------------------------------------------------------------------- monitor (sampler seam)


class FakeVolume:
    """The sampler seam: a volume whose free bytes the test sets, and which can fail once."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.fail_next = False
        self.calls = 0

    def __call__(self, path: Path) -> DiskSample:
        self.calls += 1
        if self.fail_next:
            self.fail_next = False
            raise OSError(errno.EIO, "Input/output error")
        return DiskSample(path, 100 * MiB, self.free, self.free, 20_000, 10_000, False, float(self.calls))


@asynccontextmanager
async def fake_monitor(**options: Any) -> AsyncIterator[tuple[disk.Monitor, FakeVolume, DiskEvents]]:
    """disk.monitor (with ``options``) on a FakeVolume with 50 MiB free, started in a task group:
    yields (monitor, volume, events) once the first sample is in, and cancels it after the block."""
    vol, ev = FakeVolume(50 * MiB), DiskEvents()
    async with anyio.create_task_group() as tg:
        mon = await tg.start(partial(disk.monitor, sampler=vol, **options), Path("/vol"),
                             Guard(LIM, hysteresis_bytes=HYST), ev.emit)
        yield mon, vol, ev
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_monitor_start_hands_back_after_first_sample() -> None:
    """tg.start(monitor, ...) returns the Monitor once the first sample is taken and emitted."""
    async with fake_monitor() as (mon, _, ev):
        assert isinstance(mon, disk.Monitor)
        assert mon.last is not None and mon.last.free_bytes == 50 * MiB
        assert ev.names() == ["disk.sample"]
        assert ev.all[0]["soft_limit_bytes"] == LIM.soft_bytes


@pytest.mark.anyio
async def test_monitor_poke_samples_now_and_emits_the_change() -> None:
    """With an hour-long interval, poke() alone brings the hard-limit event."""
    async with fake_monitor(interval=3600) as (mon, vol, ev):
        vol.free = MiB
        mon.poke()
        hard = await ev.wait_for("disk.hard_limit")
        assert (hard["free_bytes"], hard["level"], hard["hard_limit_bytes"]) == (MiB, "hard", LIM.hard_bytes)
        assert ev.names() == ["disk.sample", "disk.hard_limit"]  # a poke emits no disk.sample


@pytest.mark.anyio
async def test_monitor_report_enospc_is_a_hard_limit_even_with_free_space() -> None:
    """An ENOSPC reported by the engine is a hard-limit event; the next sample may clear it."""
    with capture_logs() as logs:
        async with fake_monitor(interval=3600) as (mon, _, ev):
            mon.report_enospc("/vol/exp/checkpoints/iter_0000040")
            hard = await ev.wait_for("disk.hard_limit")
            assert hard["reason"] == "ENOSPC at /vol/exp/checkpoints/iter_0000040"
            mon.poke()
            await ev.wait_for("disk.ok")
    assert [e["event"] for e in logs if e["event"].startswith("disk.")] == ["disk.hard_limit", "disk.ok"]


@pytest.mark.anyio
async def test_monitor_survives_a_failing_sampler() -> None:
    """A sampler OSError is logged as disk.sample_failed and the monitor keeps going."""
    with capture_logs() as logs:
        async with fake_monitor(interval=3600) as (mon, vol, ev):
            vol.fail_next = True
            mon.poke()
            vol.free = 0
            with anyio.fail_after(5):
                while vol.calls < 2:
                    await anyio.sleep(0.01)
            mon.poke()
            await ev.wait_for("disk.hard_limit")
    assert any(e["event"] == "disk.sample_failed" and e["errno"] == errno.EIO for e in logs)


def test_monitor_rejects_a_non_positive_interval() -> None:
    """interval must be positive: a zero interval would be a busy loop."""
    with pytest.raises(ValueError, match="interval"):
        disk.Monitor(Path("/vol"), Guard(LIM, hysteresis_bytes=HYST), DiskEvents().emit, interval=0)


# ---------------------------------------------------------------------------- reclaim confinement


def test_clear_dir_contents_refuses_outside_within(tmp_path: Path) -> None:
    """A dir that is not strictly inside `within` (itself, outside, or via a symlink) is refused."""
    camp, other = tmp_path / "campaign", tmp_path / "shared-cache"
    (camp / "exp" / "tmp").mkdir(parents=True)
    other.mkdir()
    (other / "keep").write_text("x")
    (camp / "exp" / "sneaky").symlink_to(other)
    for d in (camp, other, camp / "exp" / "sneaky", camp / ".." / "shared-cache"):
        with pytest.raises(ValueError, match="refusing"):
            reclaim.clear_dir_contents(d, within=camp)
    assert (other / "keep").exists()


def test_clear_dir_contents_of_a_missing_dir_frees_nothing(tmp_path: Path) -> None:
    """A campaign tmp dir that was never created frees 0 bytes and is fine."""
    assert reclaim.clear_dir_contents(tmp_path / "exp" / "tmp", within=tmp_path) == 0
    assert reclaim.reclaimable_tmp(tmp_path / "exp" / "tmp") == 0
