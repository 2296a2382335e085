"""The real-campaign projection that bench_timeline prints (tests/bench/projection.py)."""

from __future__ import annotations

import pytest

from tests.bench.projection import HOUR, Fault, Policy, Seed, project, replay_floor, what_it_needs, young_daly_steps


def test_fault_free_seed_is_its_wall_minus_the_stall() -> None:
    """The seed's fault-free length is its measured rounds less the 5.4 h round-001 stall."""
    seed = Seed()
    assert seed.wall_s() == pytest.approx(25 * HOUR + 20 * 60)
    assert seed.fault_free_s() == pytest.approx(seed.wall_s() - 5.4 * HOUR)


def test_young_daly_interval_in_steps() -> None:
    """sqrt(2 C M) in whole steps: 180 s saves, a 12.7 h MTBF and 850 s steps give 5 steps."""
    assert young_daly_steps(180, 25.33 * HOUR / 2, 850, 20) == 5
    assert young_daly_steps(1e6, 1e9, 850, 20) == 20   # clamped to the round
    assert young_daly_steps(0.0, 1.0, 850, 20) == 1    # never below one step


def test_no_faults_costs_only_the_extra_saves() -> None:
    """Without faults, adaptive saves cost (saves per round - 1) x save cost per round; fixed costs nothing."""
    seed = Seed(faults=(), round_wall_s=(HOUR, HOUR))
    fixed = project(seed, Policy(saves="fixed"))
    assert fixed.hours == 2.0 and fixed.saves_per_round == 1 and fixed.fault_costs_h == []
    adaptive = project(seed, Policy(saves="adaptive", mtbf_prior_s=2 * HOUR))
    want = 2 * (adaptive.saves_per_round - 1) * seed.save_cost_s / HOUR
    assert adaptive.save_overhead_h == pytest.approx(want, abs=0.01)
    assert adaptive.hours == pytest.approx(2.0 + want, abs=0.01)


def test_stall_costs_detection_relaunch_and_half_an_interval() -> None:
    """A stall costs max(stall_min, k x step) + relaunch + load + half an interval of steps (expected)."""
    seed = Seed(round_wall_s=(10 * HOUR,), faults=(Fault("stall", 0, 3 * HOUR),))
    p = project(seed, Policy(saves="fixed", fixed_interval=4, stall_min_s=600, stall_factor=3))
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
    """On the seed's night, Young/Daly saves cut the projected hours below one save per round."""
    assert project(Seed(), Policy(saves="adaptive")).hours < project(Seed(), Policy(saves="fixed")).hours


def test_what_21h_needs_is_the_projection_under_cheaper_saves_and_quicker_verdicts() -> None:
    """Four rows (sync/async save x k-median/slowest-step verdict); the first is the recipe's
    projection itself, and each cheaper assumption never costs more hours."""
    rows = what_it_needs(Seed(), 21.0)
    assert len(rows) == 4
    assert rows[0]["hours"] == project(Seed(), Policy(saves="adaptive")).hours
    assert rows[1]["hours"] <= rows[0]["hours"] and rows[2]["hours"] <= rows[0]["hours"]
    assert rows[3]["hours"] == min(r["hours"] for r in rows)
    assert all(r["meets"] == (r["hours"] <= 21.0) for r in rows)
    assert rows[2]["interval_steps"] < rows[0]["interval_steps"]  # a cheaper save: saved more often


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
