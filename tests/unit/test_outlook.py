"""Planning (issue 18, item 6): the campaign ETA, and whether the next round fits the deadline and the disk."""

from __future__ import annotations

from shoprld.daemon.core.outlook import make_outlook

GiB = 1 << 30
BASE = dict(rounds=5, current=1, durations=[100.0, 120.0, 110.0], round_started_at=1000.0, now=1040.0,
            train_eta=None, in_train=False, deadline=None, free_bytes=None, hard_limit_bytes=None, need_bytes=None)


def plan(**kw: object):  # type: ignore[no-untyped-def]
    return make_outlook(**{**BASE, **kw})  # type: ignore[arg-type]


def test_eta_is_the_rest_of_this_round_plus_the_later_rounds_at_the_median() -> None:
    """Round 2 of 5, 40 s into a 110 s median round: 70 s left here, then 3 rounds of 110 s."""
    p = plan()
    assert (p.median_round_seconds, p.round_left_seconds, p.campaign_eta_seconds) == (110.0, 70.0, 70.0 + 3 * 110.0)
    assert p.next_round == 2


def test_train_eta_is_a_floor_and_the_only_estimate_before_a_round_finished() -> None:
    """TRAIN's own remainder is never undercut, and is all there is before the first round ends."""
    assert plan(in_train=True, train_eta=200.0).round_left_seconds == 200.0
    first = plan(current=0, durations=[], in_train=True, train_eta=30.0)
    assert (first.round_left_seconds, first.campaign_eta_seconds, first.fits_deadline) == (30.0, None, None)
    last = plan(current=4, durations=[], in_train=True, train_eta=30.0)
    assert (last.campaign_eta_seconds, last.next_round) == (30.0, None)


def test_the_next_round_must_end_before_the_deadline() -> None:
    """now + what is left + one median round against the deadline; a "no" is one line with the fix."""
    assert plan(deadline=1040.0 + 70.0 + 110.0).fits_deadline is True
    p = plan(deadline=1040.0 + 70.0 + 109.0)
    assert p.fits_deadline is False
    [(reason, line)] = p.problems()
    assert reason == "deadline" and line.startswith("round-002 (3 of 5) will not fit before the deadline")
    assert "fix: extend campaign.deadline" in line


def test_the_next_round_must_fit_above_the_hard_limit() -> None:
    """Free bytes minus the hard limit against the forecast; unknown without a disk sample."""
    assert plan(free_bytes=30 * GiB, hard_limit_bytes=10 * GiB, need_bytes=20 * GiB).fits_disk is True
    p = plan(free_bytes=30 * GiB, hard_limit_bytes=10 * GiB, need_bytes=21 * GiB)
    assert (p.fits_disk, p.disk_room_bytes) == (False, 20 * GiB)
    assert [r for r, _ in p.problems()] == ["disk"]
    assert "needs 21.0 GiB above the hard limit, 20.0 GiB is left" in p.problems()[0][1]
    assert plan(need_bytes=21 * GiB).fits_disk is None


def test_the_last_round_has_no_next_round_to_warn_about() -> None:
    """In the last round nothing is planned after it: no deadline or disk warning."""
    p = plan(current=4, deadline=1041.0, free_bytes=0, hard_limit_bytes=GiB, need_bytes=GiB)
    assert (p.next_round, p.fits_deadline, p.fits_disk, p.problems()) == (None, None, None, [])
