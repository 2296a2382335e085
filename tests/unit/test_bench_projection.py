"""The real-campaign projection that bench_timeline prints (tests/bench/projection.py)."""

from __future__ import annotations

import pytest

from tests.bench.projection import (ASYNC_MEASURED, HOUR, INPUTS, SYNC_ASSUMED, SYNC_MEASURED, Fault, Policy, SaveCost,
                                    Seed, phase_bound, project, replay_floor, stall_detect_s, what_it_needs,
                                    young_daly_steps)


def test_fault_free_seed_is_its_wall_minus_the_stall() -> None:
    """The seed's fault-free length is its measured rounds less the 5.4 h round-001 stall."""
    seed = Seed()
    assert seed.wall_s() == pytest.approx(25 * HOUR + 20 * 60)
    assert seed.fault_free_s() == pytest.approx(seed.wall_s() - 5.4 * HOUR)


def test_young_daly_interval_in_steps() -> None:
    """sqrt(2 C M / (1 + 2 lag)) in whole steps: 180 s saves, a 12.7 h MTBF and 850 s steps give 5
    steps; with one interval of lag, sqrt(3) fewer; 1.21 s async saves give one step."""
    assert young_daly_steps(180, 25.33 * HOUR / 2, 850, 20) == 5
    assert young_daly_steps(180, 25.33 * HOUR / 2, 850, 20, lag=1) == 3
    assert young_daly_steps(1.21, 25.33 * HOUR / 2, 850, 20, lag=1) == 1
    assert young_daly_steps(1e6, 1e9, 850, 20) == 20   # clamped to the round
    assert young_daly_steps(0.0, 1.0, 850, 20) == 1    # never below one step


def test_no_faults_costs_only_the_extra_saves() -> None:
    """Without faults, sync adaptive saves cost (saves per round - 1) x save cost per round; fixed
    costs nothing."""
    seed = Seed(faults=(), round_wall_s=(HOUR, HOUR), save=SYNC_ASSUMED)
    fixed = project(seed, Policy(saves="fixed"))
    assert fixed.hours == 2.0 and fixed.saves_per_round == 1 and fixed.fault_costs_h == []
    adaptive = project(seed, Policy(saves="adaptive", mtbf_prior_s=2 * HOUR))
    want = 2 * (adaptive.saves_per_round - 1) * 180 / HOUR
    assert adaptive.save_overhead_h == pytest.approx(want, abs=0.01)
    assert adaptive.hours == pytest.approx(2.0 + want, abs=0.01)


def test_async_saves_pay_the_first_save_per_launch_and_one_interval_of_lag() -> None:
    """Worked by hand, one round of 20 steps saving every 4 (fixed), one crash: 4 mid-round saves
    cost 50 + 3 x 2 s; the crash loses half an interval plus the lag (2 + 4 steps) and pays a
    first save again (48 s). One save a round gets no async flags: no lag, nothing extra."""
    cost = SaveCost("test", first_s=50.0, later_s=2.0, lag=1)
    seed = Seed(round_wall_s=(10 * HOUR,), faults=(Fault("crash", 0),), save=cost)
    p = project(seed, Policy(saves="fixed", fixed_interval=4))
    assert p.save_overhead_h == round((50 + 3 * 2) / HOUR, 2) and p.lag_intervals == 1
    assert p.fault_costs_h[0]["steps_rerun"] == 6.0
    assert p.hours == round((10 * HOUR + 56 + 52 + 180 + 6 * 850 + 48) / HOUR, 2)
    once = project(seed, Policy(saves="fixed"))
    assert once.lag_intervals == 0 and once.save_overhead_h == 0.0 and once.fault_costs_h[0]["steps_rerun"] == 10
    assert once.hours == round((10 * HOUR + 52 + 180 + 10 * 850) / HOUR, 2)


def test_stall_costs_detection_relaunch_and_half_an_interval() -> None:
    """A stall costs max(stall_min, k x step) + relaunch + load + half an interval of steps (expected)."""
    seed = Seed(round_wall_s=(10 * HOUR,), faults=(Fault("stall", 0, 3 * HOUR),), save=SYNC_ASSUMED)
    p = project(seed, Policy(saves="fixed", fixed_interval=4, stall_min_s=600, stall_factor=3, stall_verdict="steps"))
    cost = 3 * 850 + 52 + 180 + 2 * 850
    assert p.fault_costs_h[0]["hours"] == round(cost / HOUR, 2)
    assert p.hours == round((7 * HOUR + 4 * 180 + cost) / HOUR, 2)  # 5 saves a round, 4 extra


def test_worst_case_loses_a_whole_interval() -> None:
    """loss="worst" re-runs a whole save interval; a crash has no detection delay."""
    seed = Seed(round_wall_s=(HOUR,), faults=(Fault("crash", 0),))
    expected = project(seed, Policy(saves="fixed"))
    worst = project(seed, Policy(saves="fixed", loss="worst"))
    assert worst.fault_costs_h[0]["steps_rerun"] == 20 and expected.fault_costs_h[0]["steps_rerun"] == 10
    assert worst.fault_costs_h[0]["detect_h"] == 0.0
    assert worst.hours - expected.hours == pytest.approx(10 * 850 / HOUR, abs=0.01)


def test_adaptive_beats_fixed_on_the_seed_night() -> None:
    """On the seed's night, Young/Daly saves cut the projected hours below one save per round,
    with each save cost; the measured async save beats both sync ones."""
    for cost in (SYNC_ASSUMED, SYNC_MEASURED, ASYNC_MEASURED):
        seed = Seed(save=cost)
        assert project(seed, Policy(saves="adaptive")).hours < project(seed, Policy(saves="fixed")).hours
    hours = [project(Seed(save=c), Policy()).hours for c in (SYNC_ASSUMED, SYNC_MEASURED, ASYNC_MEASURED)]
    assert hours == sorted(hours, reverse=True)


def test_what_21h_needs_is_the_projection_under_cheaper_saves_and_quicker_verdicts() -> None:
    """Twenty rows (four save costs x the older verdict, the phase verdict in training, loading
    and rollout, and a verdict at once); the measured async/training row is the recipe's
    projection itself, each quicker verdict never costs more hours, and a cheaper save is taken
    more often."""
    rows = what_it_needs(Seed(), 21.0)
    assert len(rows) == 20
    recipe = [r for r in rows if r["save"] == ASYNC_MEASURED.name]
    assert recipe[1]["hours"] == project(Seed(), Policy(saves="adaptive")).hours
    assert recipe[0]["hours"] == project(Seed(), Policy(saves="adaptive", stall_verdict="steps")).hours
    for k in range(0, 20, 5):
        hours = [r["hours"] for r in rows[k:k + 5]]
        assert hours == sorted(hours, reverse=True)  # each verdict quicker than the one before
        assert rows[k + 4]["stall_detect_s"] == 0.0
    assert all(r["meets"] == (r["hours"] <= 21.0) for r in rows)
    assert rows[5]["interval_steps"] < rows[0]["interval_steps"]  # a cheaper save: saved more often
    assert rows[15]["hours"] < rows[10]["hours"]  # without the lag, less is re-run


def test_phase_bounds_from_the_labelled_inputs() -> None:
    """factor 3 x each phase's longest still gap, at least 5 min: training (1589 - 290) / 3 x 3 =
    1299 s; loading 3 x 180 s; rollout 3 x 100 s = the 5-min minimum; saving 5 min."""
    seed, pol = Seed(), Policy()
    assert phase_bound(seed, pol, "training") == 1299.0
    assert phase_bound(seed, pol, "loading") == 540.0
    assert phase_bound(seed, pol, "rollout") == 300.0
    assert phase_bound(seed, pol, "saving") == 300.0
    assert stall_detect_s(seed, pol) == 1299.0  # the seed's stall: phase unknown, the slowest
    assert stall_detect_s(seed, Policy(stall_verdict="steps")) == 2550.0
    assert {i.source for i in INPUTS.values()} <= {"measured", "cited", "assumed"}
    assert all(i.where for i in INPUTS.values())
    assert INPUTS["save_sync_s"].source == INPUTS["async_first_block_s"].source == "measured"


def test_replay_floor_is_the_best_whole_step_interval() -> None:
    """Worked by hand: 100 steps in 5 rounds, 0.3 s saves, 0.88 s steps, 4 faults, 2.65 s stall
    verdict, no relaunch: interval 4 costs (25 - 5) x 0.3 + 4 x 2.5 x 0.88 + 2.65 = 17.45 s."""
    f = replay_floor(fault_free_s=112.19, steps=100, rounds=5, save_s=0.3, step_s=0.88, faults=4,
                     stall_detect_s=2.65, relaunch_s=0.0)
    assert f["interval_steps"] == 4 and f["fault_cost_s"] == pytest.approx(17.45)
    assert f["faulted_over_fault_free"] == round((112.19 + 17.45) / 112.19, 3)
    free = replay_floor(fault_free_s=100.0, steps=100, rounds=5, save_s=0.3, step_s=0.88, faults=0,
                        stall_detect_s=0.0, relaunch_s=0.0)
    assert free["interval_steps"] == 20 and free["fault_cost_s"] == 0.0  # no faults: one save per round


def test_replay_floor_counts_the_first_save_per_launch_and_the_lag() -> None:
    """Worked by hand: 100 steps in 5 rounds, async saves (0.05 s first, 0.001 s later, one
    interval of lag), 0.88 s steps, 4 faults, no stall verdict, no relaunch: interval 1 costs
    95 x 0.001 + 9 x 0.049 + 4 x (1 + 1) x 0.88 = 7.576 s; without the lag 4 x 1 x 0.88: 4.056 s."""
    f = replay_floor(fault_free_s=100.0, steps=100, rounds=5, save_s=0.001, step_s=0.88, faults=4,
                     stall_detect_s=0.0, relaunch_s=0.0, first_save_s=0.05, lag=1)
    assert f["interval_steps"] == 1 and f["fault_cost_s"] == pytest.approx(7.58, abs=0.005)
    g = replay_floor(fault_free_s=100.0, steps=100, rounds=5, save_s=0.001, step_s=0.88, faults=4,
                     stall_detect_s=0.0, relaunch_s=0.0, first_save_s=0.05, lag=0)
    assert g["fault_cost_s"] == pytest.approx(4.06, abs=0.005)
