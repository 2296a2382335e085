"""shoprld.daemon.foundation.storage.diskbudget: the peak's forecast, the scale-free floors and the budget
that `check`, PREFLIGHT_DISK and the save planner share (issue 25: the user's small data disk)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from shoprld.daemon.foundation.storage.diskbudget import Budget, Forecast, Limits, floor_unit, forecast, limits

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def test_forecast_uses_measured_size_when_known() -> None:
    """A measured checkpoint size wins over the estimate and is flagged as measured."""
    f = forecast(last_checkpoint_bytes=53 * GiB, estimate_bytes=60 * GiB, keep=2, hf_bytes=8 * GiB, margin_bytes=GiB)
    assert (f.checkpoint_bytes, f.measured) == (53 * GiB, True)
    assert f.total == 53 * GiB * 2 + 8 * GiB + GiB


@pytest.mark.parametrize("last", [None, 0])
def test_forecast_falls_back_to_estimate(last: int | None) -> None:
    """Before the first checkpoint (or with an empty measurement) the estimate is used."""
    f = forecast(last_checkpoint_bytes=last, estimate_bytes=60 * GiB, hf_bytes=0, margin_bytes=0)
    assert (f.checkpoint_bytes, f.keep, f.measured, f.total) == (60 * GiB, 2, False, 120 * GiB)


def test_forecast_rejects_negative_inputs() -> None:
    """Negative sizes are configuration errors."""
    with pytest.raises(ValueError, match="margin_bytes"):
        forecast(last_checkpoint_bytes=None, estimate_bytes=1, hf_bytes=0, margin_bytes=-1)
    with pytest.raises(ValueError, match="present_bytes"):
        forecast(last_checkpoint_bytes=None, estimate_bytes=1, hf_bytes=0, margin_bytes=0, present_bytes=-1)


def test_what_is_on_the_volume_is_not_needed_again() -> None:
    """A resume with the previous final and the HF dir on the volume needs one new checkpoint
    plus the margin, not the whole peak (the old PREFLIGHT wanted 117 GiB on a rerun)."""
    f = forecast(last_checkpoint_bytes=53 * GiB, estimate_bytes=53 * GiB, keep=2, hf_bytes=9 * GiB,
                 margin_bytes=2 * GiB, present_bytes=53 * GiB + 9 * GiB)
    assert f.peak_bytes == 115 * GiB
    assert f.total == 55 * GiB
    # Whatever is present, the next save is always new.
    assert forecast(last_checkpoint_bytes=53 * GiB, estimate_bytes=1, keep=2, hf_bytes=9 * GiB, margin_bytes=0,
                    present_bytes=500 * GiB).total == 53 * GiB


def test_default_floors_are_small_fractions_of_a_checkpoint() -> None:
    """hard = 1/64 and soft = 1/32 of a checkpoint, whatever the volume: no checkpoint-sized
    floor on top of a forecast that already reserves the save in flight."""
    for total in (50 * GiB, 4000 * GiB):
        lim = limits(total, 53 * GiB)
        assert (lim.hard_bytes, lim.soft_bytes) == (53 * GiB // 64, 53 * GiB // 32)
        assert (lim.hard_inodes, lim.soft_inodes) == (1000, 2000)


def test_limit_overrides_win() -> None:
    """Overrides replace the derived limits; a hard override moves the derived soft with it."""
    assert limits(20 * MiB, 2 * MiB, soft_override=8 * MiB, hard_override=4 * MiB) == Limits(8 * MiB, 4 * MiB, 2000, 1000)
    assert limits(20 * MiB, 2 * MiB, hard_override=4 * MiB).soft_bytes == 4 * MiB + floor_unit(2 * MiB)


@given(ckpt=st.integers(64, 2**50), scale=st.sampled_from([1, 2, 1024]))
def test_floors_scale_with_the_checkpoint(ckpt: int, scale: int) -> None:
    """A campaign scaled by a factor gets floors scaled by it (within the rounding of one byte
    per unit), so a 1024x smaller campaign on a tmpfs behaves the same."""
    small, big = limits(0, ckpt), limits(0, ckpt * scale)
    assert abs(big.hard_bytes - small.hard_bytes * scale) < scale
    assert abs(big.soft_bytes - small.soft_bytes * scale) < 2 * scale
    assert small.hard_bytes < small.soft_bytes < ckpt


@given(ckpt=st.integers(1, 2**45), hf=st.integers(0, 2**40), present=st.integers(0, 2**47),
       free=st.integers(0, 2**48))
def test_budget_is_monotone_in_free_space(ckpt: int, hf: int, present: int, free: int) -> None:
    """More free space never turns an ok budget into a refusal, and `ok` implies the next save fits."""
    fc = forecast(last_checkpoint_bytes=ckpt, estimate_bytes=ckpt, keep=2, hf_bytes=hf, margin_bytes=2 * floor_unit(ckpt),
                  present_bytes=present)
    lim = limits(free, ckpt)
    b, more = (Budget(forecast=fc, limits=lim, free_bytes=f, total_bytes=2**49) for f in (free, free + ckpt))
    assert not b.ok or more.ok
    assert not b.next_save_fits or more.next_save_fits
    if b.ok:
        assert b.next_save_fits


def test_the_show_case_fits_exactly_what_upstream_fits() -> None:
    """Issue 25's scaled box: 2 x 53 + 9 + 6 MiB free, default floors: unattended ok; with only
    2 x 53 + 9 MiB it is not (it would park), yet the first round still fits."""
    fc = Forecast(checkpoint_bytes=53 * MiB, keep=2, hf_bytes=9 * MiB, margin_bytes=2 * floor_unit(53 * MiB), measured=False)
    lim = limits(0, 53 * MiB)
    assert Budget(forecast=fc, limits=lim, free_bytes=(2 * 53 + 9 + 6) * MiB, total_bytes=200 * MiB).ok
    tight = Budget(forecast=fc, limits=lim, free_bytes=(2 * 53 + 9) * MiB, total_bytes=200 * MiB)
    assert not tight.ok and tight.next_save_fits
    one = Budget(forecast=fc, limits=lim, free_bytes=(53 + 9) * MiB, total_bytes=200 * MiB)
    assert not one.next_save_fits

