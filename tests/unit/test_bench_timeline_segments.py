"""bench_timeline's per-fault costs: round segments cut at each round's last rollout."""

from __future__ import annotations

from tests.bench.bench_timeline import relaunches, round_of, round_segments


def test_segments_add_up_to_the_wall_and_cut_at_each_rounds_last_rollout() -> None:
    """Round k ends when rollout (k+1)*steps is logged for the last time; the tail is the rest."""
    steps = 5
    last_seen = {5: 10.0, 10: 18.0, 15: 40.0, 3: 2.0}
    seg = round_segments(last_seen, steps, rounds=3, wall=45.0)
    assert seg == [10.0, 8.0, 22.0, 5.0]
    assert sum(x for x in seg if x is not None) == 45.0


def test_a_round_that_never_finished_has_no_segment() -> None:
    """A run that stopped in round 1 has no segment for rounds 1 and later, nor a tail."""
    assert round_segments({5: 10.0}, 5, rounds=3, wall=30.0) == [10.0, None, None, None]


def test_round_of_follows_the_cumulative_num_rollout() -> None:
    """Round 0 trains rollouts 0..steps, round k > 0 trains (k*steps, (k+1)*steps]."""
    assert [round_of(r, 5) for r in (0, 5, 6, 10, 11, 25)] == [0, 0, 1, 1, 2, 4]


def test_rollouts_are_read_from_slimes_perf_lines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The trainer stand-in's perf lines give (rollout id, step seconds); the rollout lines do not count twice."""
    from tests.bench.common import rollouts_in

    log = tmp_path / "r001-train.log"
    log.write_text('[2026-12-01 19:29:59] rollout_metrics.py:0 - perf 6: {"perf/step_time": 1.499}\n'
                   '[2026-12-01 19:29:59] train_metric_utils.py:0 - rollout 6: {"rollout/reward": 0.5}\n'
                   '[demo fault] stall at rollout 7: alive, making no progress\n'
                   '[2026-12-01 19:30:09] rollout_metrics.py:0 - perf 6: {"perf/step_time": 1.412}\n')
    assert rollouts_in([log]) == [(6, 1.499), (6, 1.412)]


def test_relaunches_time_each_trainer_restart_after_a_failure_in_train() -> None:
    """Per failure in TRAIN: seconds to the new trainer's spawn and to its first progress line
    (train.resume_check), and the tools reused; a spawn with no failure before it is no relaunch."""
    recs = [
        {"event": "stage.spawn", "role": "trainer", "t": 100.0},            # the round's first launch
        {"event": "train.resume_check", "t": 100.5},
        {"event": "attempt.failed", "state": "TRAIN", "round": 1, "cause": {"name": "stall"}, "t": 110.0},
        {"event": "train.tool_reused", "role": "emit", "saved_s": 0.07, "t": 110.01},
        {"event": "stage.spawn", "role": "sidecar", "t": 110.02},
        {"event": "stage.spawn", "role": "trainer", "t": 110.05},
        {"event": "train.resume_check", "t": 110.6},
        {"event": "attempt.failed", "state": "VAL", "round": 1, "t": 120.0},  # not TRAIN: ignored
    ]
    assert relaunches(recs, base=100.0) == [
        {"t": 10.0, "round": 1, "cause": "stall", "reused": [{"role": "emit", "saved_s": 0.07}],
         "to_spawn_s": 0.05, "spawn_to_first_progress_s": 0.55}]
