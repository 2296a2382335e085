"""The phase-aware stall verdict (daemon/round/stall.py): table tests, and the /metrics parser
under hypothesis (it parses an engine's output)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from shoprld.daemon.round.stall import (Bounds, Learned, Marker, Phase, StallWatch, bound, engine_signals,
                                        markers_in, p95, parse_metrics)

B = Bounds(factor=5.0, quiet_min=10.0, floor=100.0, loading_floor=300.0, min_samples=3)


def trained(**gaps: list[float]) -> Learned:
    learned = Learned()
    for name, values in gaps.items():
        for v in values:
            learned.add(Phase(name), v)
    return learned


@pytest.mark.parametrize("phase,gaps,expected", [
    # too few finished phases: the floor (LOADING's own floor)
    (Phase.ROLLOUT, [], (100.0, "floor")),
    (Phase.TRAINING, [4.0, 4.0], (100.0, "floor")),
    (Phase.LOADING, [], (300.0, "floor")),
    # learned: factor x p95 of the longest still gaps
    (Phase.TRAINING, [4.0, 4.0, 6.0], (30.0, "learned from 3")),
    # never below quiet_min
    (Phase.ROLLOUT, [0.5, 0.5, 0.5], (10.0, "learned from 3")),
    # LOADING learns from one launch
    (Phase.LOADING, [20.0], (100.0, "learned from 1")),
])
def test_bound_table(phase: Phase, gaps: list[float], expected: tuple[float, str]) -> None:
    assert bound(phase, trained(**{phase.value: gaps}), B) == expected


def test_p95_is_a_value_seen() -> None:
    assert p95([1.0]) == 1.0
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([3.0, 1.0, 2.0]) == 3.0


def run(watch: StallWatch, script: list[tuple[float, dict[str, float | None], list[Marker]]]) -> list[tuple[float, Phase]]:
    """Feed polls; return (time, phase) at each verdict."""
    hits = []
    for now, values, markers in script:
        watch.observe(now, values, markers)
        v = watch.verdict(now)
        if v is not None:
            hits.append((now, v.phase))
    return hits


def healthy_steps(t0: float, steps: int, *, slow: float = 1.0) -> list[tuple[float, dict[str, float | None], list[Marker]]]:
    """A step: 10 s of rollout (a request a second), 6 s of training (a line every 2 s), a 3 s save
    (bytes growing each second). ``slow`` stretches the rollout, its requests still coming."""
    script: list[tuple[float, dict[str, float | None], list[Marker]]] = []
    t, req, lines, ck = t0, 0, 0, 0
    for _ in range(steps):
        for _ in range(int(10 * slow)):
            t += 1.0
            req += 1
            script.append((t, {"shopsim_requests": req, "log_lines": lines, "checkpoint_bytes": ck}, []))
        t += 0.5
        lines += 2
        script.append((t, {"shopsim_requests": req, "log_lines": lines, "checkpoint_bytes": ck}, [Marker.TRAIN_START]))
        for _ in range(3):
            t += 2.0
            lines += 1
            script.append((t, {"shopsim_requests": req, "log_lines": lines, "checkpoint_bytes": ck}, []))
        lines += 2
        script.append((t, {"shopsim_requests": req, "log_lines": lines, "checkpoint_bytes": ck},
                       [Marker.TRAIN_END, Marker.SAVE_START]))
        for _ in range(3):
            t += 1.0
            ck += 100
            script.append((t, {"shopsim_requests": req, "log_lines": lines, "checkpoint_bytes": ck}, []))
        lines += 1
        script.append((t, {"shopsim_requests": req, "log_lines": lines, "checkpoint_bytes": ck}, [Marker.SAVE_END]))
    return script


def test_healthy_steps_learn_each_phase_and_never_fire() -> None:
    watch = StallWatch(0.0, Learned(), B)
    assert run(watch, healthy_steps(0.0, 5)) == []
    assert len(watch.learned.gaps[Phase.TRAINING]) == 5
    assert watch.learned.gaps[Phase.TRAINING][-1] == 2.0
    assert watch.learned.gaps[Phase.SAVING][-1] == 1.0


@pytest.mark.parametrize("shape,after,quiet_signals,phase,limit", [
    # slime#1484: engines up, then nothing: no request, no token, no line (LOADING learned from a launch)
    ("1484", "loading", {"shopsim_requests": 0, "tokens": 0.0, "log_lines": 3}, Phase.LOADING, 25.0),
    # slime#1487: the rollout is done, training starts, no line after it
    ("1487", "training", {"shopsim_requests": 50, "log_lines": 80}, Phase.TRAINING, 10.0),
    # a rollout hang mid-round (the bench's DEMO_STALL_AT): requests stop
    ("rollout", "rollout", {"shopsim_requests": 50, "log_lines": 80}, Phase.ROLLOUT, 10.0),
])
def test_hang_shapes(shape: str, after: str, quiet_signals: dict[str, float], phase: Phase, limit: float) -> None:
    learned = Learned()
    learned.add(Phase.LOADING, 5.0)
    watch = StallWatch(0.0, learned, B)
    run(watch, healthy_steps(0.0, 5))
    t = 200.0
    if after == "loading":
        watch = StallWatch(t, watch.learned, B)  # a relaunch: a new launch, same campaign
    elif after == "training":
        watch.observe(t, quiet_signals, [Marker.TRAIN_START])
    else:
        watch.observe(t, quiet_signals, [])
    hits = run(watch, [(t + k, dict(quiet_signals), []) for k in range(1, 40)])
    assert hits, shape
    when, where = hits[0]
    assert where is phase
    assert when - t == pytest.approx(limit + 1.0, abs=1.0)


def test_slow_but_moving_never_fires() -> None:
    """A step 3x slower (a slow ShopSim: its rollout 3x longer, requests still coming) never fires,
    nor does a 10x one: the bound is on stillness, not on a phase's length."""
    watch = StallWatch(0.0, Learned(), B)
    script = healthy_steps(0.0, 5)
    script += healthy_steps(script[-1][0], 2, slow=3.0)
    script += healthy_steps(script[-1][0] + 1000, 1, slow=10.0)
    assert run(watch, script) == []


def test_long_generation_moves_by_its_tokens() -> None:
    """No ShopSim request for 60 s while the engine's token counter grows: no verdict. The same
    60 s with the tokens still: a verdict."""
    watch = StallWatch(0.0, Learned(), B)
    run(watch, healthy_steps(0.0, 4))
    base = {"shopsim_requests": 40.0, "log_lines": 50.0}
    moving = [(100.0 + k, {**base, "tokens": 1000.0 + 50 * k}, []) for k in range(60)]
    assert run(watch, moving) == []
    still = [(160.0 + k, {**base, "tokens": 4000.0}, []) for k in range(60)]
    assert run(watch, still)[0][0] == pytest.approx(160.0 + 11.0, abs=1.0)


def test_noise_free_log_lines_keep_a_quiet_training_alive() -> None:
    """Training moves only by its lines: a line every 8 s (within 10 s) keeps it alive."""
    watch = StallWatch(0.0, Learned(), B)
    run(watch, healthy_steps(0.0, 4))
    watch.observe(200.0, {"log_lines": 100.0}, [Marker.TRAIN_START])
    assert run(watch, [(200.0 + 8 * k, {"log_lines": 100.0 + k}, []) for k in range(1, 20)]) == []


def test_unwatched_signal_is_not_movement() -> None:
    watch = StallWatch(0.0, Learned(), B)
    watch.observe(1.0, {"tokens": None, "log_lines": 1})
    watch.observe(2.0, {"tokens": None, "log_lines": 1})
    assert "tokens" not in watch.values
    assert watch.phase is Phase.LOADING


def test_verdict_names_the_signals_and_their_ages() -> None:
    watch = StallWatch(0.0, Learned(), B)
    watch.observe(1.0, {"shopsim_requests": 1, "log_lines": 1})
    watch.observe(2.0, {"shopsim_requests": 2, "log_lines": 1})  # LOADING -> ROLLOUT
    v = watch.verdict(2.0 + 101.0)
    assert v is not None and v.phase is Phase.ROLLOUT and v.basis == "floor"
    assert v.ages["shopsim_requests"] == 101.0 and v.ages["log_lines"] is None
    assert "rollout" in v.message() and "limit 100.0s" in v.message()


def test_markers_in_slime_lines() -> None:
    lines = ["[2026-01-23 17:02:54] timer.py:24 - Timer actor_train start",
             '(SGLangEngine pid=1) INFO: 1.2.3.4:5 - "GET /metrics HTTP/1.1" 200 OK',
             "[t] timer.py:24 - Timer actor_train end", "[t] timer.py:0 - Timer save_model start",
             "[t] timer.py:0 - Timer save_model end (elapsed: 1.0s)"]
    assert markers_in(lines) == [Marker.TRAIN_START, Marker.TRAIN_END, Marker.SAVE_START, Marker.SAVE_END]


def test_training_starts_at_slimes_train_timer_before_the_log_prob_passes() -> None:
    """slime's train_actor (megatron_utils/actor.py) prints `Timer train start`, then the
    forward-only log-prob passes, then `Timer actor_train start`: the passes belong to TRAINING,
    so a pass with no rollout signal moving is judged by training's bound, not rollout's."""
    lines = ["timer.py:24 - Timer train_wait end (elapsed: 1.0s)", "timer.py:24 - Timer train start",
             "timer.py:24 - Timer ref_log_probs start", "timer.py:24 - Timer ref_log_probs end (elapsed: 90.0s)",
             "timer.py:24 - Timer actor_train start", "model.py:918 - step 0: {}",
             "timer.py:24 - Timer actor_train end (elapsed: 300.0s)", "timer.py:24 - Timer train end (elapsed: 400.0s)",
             "timer.py:24 - Timer train_wait start"]
    assert markers_in(lines) == [Marker.TRAIN_START, Marker.TRAIN_START, Marker.TRAIN_END]
    watch = StallWatch(0.0, trained(rollout=[2.0, 2.0, 2.0], training=[50.0, 50.0, 50.0]), B)
    watch.observe(1.0, {"shopsim_requests": 1.0}, [])
    watch.observe(2.0, {"shopsim_requests": 2.0}, [Marker.TRAIN_START])  # `Timer train start`
    assert watch.phase is Phase.TRAINING
    watch.observe(60.0, {"shopsim_requests": 2.0}, [])  # a 58 s log-prob pass: no rollout signal
    assert watch.verdict(60.0) is None  # training's bound is 250 s; rollout's would be 10 s


def test_learned_round_trips_and_survives_garbage() -> None:
    learned = trained(rollout=[1.0, 2.0], training=[3.0])
    assert Learned.from_json(learned.to_json()).gaps == learned.gaps
    for junk in (None, [], {"gaps": 3}, {"gaps": {"rollout": ["x", True, -1, float("nan"), 2.0]}}):
        got = Learned.from_json(junk)
        assert all(v in ([], [2.0]) for v in got.gaps.values())


SGLANG_METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",tp_rank="0"} 12.0
sglang:num_running_reqs{engine_type="unified",model_name="qwen",tp_rank="1"} 3.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen"} 123456.0
"""


def test_engine_signals_from_sglang_metrics() -> None:
    assert engine_signals(SGLANG_METRICS) == (123456.0, 15.0)
    assert engine_signals("") == (None, None)


@given(st.text(max_size=400))
def test_parse_metrics_never_raises(text: str) -> None:
    out = parse_metrics(text)
    assert all(isinstance(v, float) for v in out.values())


@given(st.dictionaries(st.from_regex(r"[a-z_:][a-z0-9_:]{0,20}", fullmatch=True),
                       st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=8))
def test_parse_metrics_reads_what_was_written(samples: dict[str, float]) -> None:
    text = "\n".join(f"{k} {v!r}" for k, v in samples.items())
    assert parse_metrics(text) == pytest.approx({k: float(v) for k, v in samples.items()})


def test_an_adopted_trainer_gets_the_most_lenient_bound_until_its_phase_shows() -> None:
    """A daemon restarted mid-training adopts the trainer: its phase is unknown, so LOADING's
    quick bound must not fire during a training that shows no line for a while."""
    learned = trained(loading=[1.0], training=[8.0, 8.0, 8.0], rollout=[1.0, 1.0, 1.0])
    watch = StallWatch(0.0, learned, B, adopted=True)
    assert watch.limit() == (100.0, "adopted")  # the floor of the unlearned saving phase
    assert watch.verdict(50.0) is None
    watch.observe(51.0, {"log_lines": 1.0}, [Marker.TRAIN_END])
    assert watch.limit() == (10.0, "learned from 3") and watch.phase is Phase.ROLLOUT
    assert len(watch.learned.gaps[Phase.LOADING]) == 1  # the partial phase taught nothing


def test_trainer_lines_exclude_engine_access_lines_and_the_sidecar() -> None:
    """slime#1487's log kept growing with the engines' access lines: they are not the trainer's."""
    from shoprld.daemon.foundation.config.configsections import TrainSection
    from shoprld.daemon.services.stallsignals import TrainSignals

    cfg = TrainSection()
    sig = TrainSignals(line_pattern=cfg.stall_line_pattern, noise_pattern=cfg.stall_noise_pattern,
                       save_dir=Path("/nonexistent"), request_log=None, engine_url=None, http=None)
    text = "\n".join([
        "(MegatronTrainRayActor pid=19450) [2026-03-24 06:36:50] timer.py:24 - Timer actor_train start",
        '(SGLangEngine pid=17467) [2026-03-24 06:36:52] INFO:     172.17.0.11:41646 - "GET /metrics HTTP/1.1" 200 OK',
        '[2026-03-24 06:36:52] http.py:1 - 127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK',
        "shopsimrl: watch-analyze: 1 new card(s)",
        "[2026-03-24 06:37:50] model.py:0 - step 3: {'train/loss': 0.1}",
    ])
    assert sig.lines(text) == [Marker.TRAIN_START]
    assert sig.log_lines == 2


def test_checkpoint_bytes_follow_the_newest_iter_dir(tmp_path: Path) -> None:
    from shoprld.daemon.services.stallsignals import checkpoint_bytes

    assert checkpoint_bytes(tmp_path) is None
    (tmp_path / "iter_0000004").mkdir()
    (tmp_path / "iter_0000004" / "__0_0.distcp").write_bytes(b"x" * 10)
    (tmp_path / "iter_0000009").mkdir()
    assert checkpoint_bytes(tmp_path) == 0 + 2  # the newest is empty (+ the dir count)
    (tmp_path / "iter_0000009" / "__0_0.distcp").write_bytes(b"x" * 100)
    assert checkpoint_bytes(tmp_path) == 100 + 2
