"""The trainer-log reader behind the report's per-step curves (issue 28, item 8).

The lines are slime's own (THUDM/slime ``slime/observability/``): a Python dict repr after
``perf N:``/``rollout N:``/``step N:``, with Ray's actor prefix when run as a Ray job, and the
stand-in trainer's JSON variant (``run/demo/slime_train.py``)."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.ops import trainlog

REAL = [
    # slime's rollout manager (rollout_metrics.py), as `ray job submit` forwards it
    b"(RolloutManager pid=4242) [2026-12-01 19:29:59] rollout_metrics.py:268 - perf 6: "
    b"{'rollout/response_len/mean': 812.5, 'rollout/truncated_ratio': 0.0625, "
    b"'perf/rollout_time': 41.2, 'rollout/repetition_frac': np.float64(0.03125), 'rollout/step': 6}",
    # the train actor's data-parallel source rank (train_metric_utils.py)
    b"(MegatronTrainRayActor pid=4300) [2026-12-01 19:30:40] train_metric_utils.py:135 - rollout 6: "
    b"{'rollout/raw_reward': 0.4375, 'rollout/advantages': -1.2e-09, 'rollout/log_probs': -0.317}",
    # an optimizer step (megatron_utils/model.py), with a value that is not finite
    b"[2026-12-01 19:30:41] model.py:918 - step 12: {'train/loss': 0.0123, 'train/grad_norm': nan, "
    b"'train/lr-pg_0': 1e-06, 'train/step': 12}",
    # a critic's step and an eval line
    b"[2026-12-01 19:30:41] model.py:918 - critic-step 12: {'train/critic-value_loss': 0.5}",
    b"[2026-12-01 19:31:00] rollout_metrics.py:247 - eval 6: {'eval/shop': 0.41, 'eval/shop-truncated_ratio': 0.0}",
]


def test_real_slime_lines_give_their_metrics() -> None:
    """repr dicts, np.float64(...), exponents; counters and NaN dropped; step lines are steps."""
    got = [trainlog.parse_line(ln) for ln in REAL]
    assert got[0] == ("rollout", 6, {"rollout/response_len/mean": 812.5, "rollout/truncated_ratio": 0.0625,
                                     "perf/rollout_time": 41.2, "rollout/repetition_frac": 0.03125})
    assert got[1] == ("rollout", 6, {"rollout/raw_reward": 0.4375, "rollout/advantages": -1.2e-09,
                                     "rollout/log_probs": -0.317})
    assert got[2] == ("step", 12, {"train/loss": 0.0123, "train/lr-pg_0": 1e-06})
    assert got[3] == ("step", 12, {"train/critic-value_loss": 0.5})
    assert got[4] == ("rollout", 6, {"eval/shop": 0.41, "eval/shop-truncated_ratio": 0.0})
    # A magnitude no metric reaches (a corrupted line) is dropped: matplotlib cannot tick 1e308.
    assert trainlog.parse_line(b"x - perf 1: {'a/b': 1.7e308, 'a/c': -2e15, 'a/d': 1e15}") == (
        "rollout", 1, {"a/d": 1e15})


def test_other_lines_are_not_metrics() -> None:
    """slime's other messages, shoprld's own banner, a torn line and the old progress line."""
    for line in (b"=== shoprld 2026-12-05T16:57:20Z start trainer: python train.py --num-rollout 21",
                 b"[2026-12-01 19:30:41] dp_schedule.py:152 - step 3: 5 samples < dp_size 8",
                 b"[2026-12-01 19:30:41] model.py:918 - step 12: {'train/loss': ",
                 b"rollout 6/20 step_time=1.0 reward=0.5",
                 b"[2026-12-01 19:30:41] model.py:918 - step 12: {'train/$\\\\frac$': 1.0}",
                 b"successfully saved checkpoint from iteration 20 to /save [ t 1/2, p 1/1 ]"):
        assert trainlog.parse_line(line) is None, line


def test_the_stand_in_trainer_lines_are_read(tmp_path: Path) -> None:
    """The stand-in's JSON lines, written by the stand-in itself: reward per rollout, step time, loss per step."""
    save = tmp_path / "save"
    env = {"PATH": "/usr/bin:/bin", "WANDB_API_KEY": "k" * 40, "DEMO_STEP_SECONDS": "0"}
    res = subprocess.run([sys.executable, "run/demo/slime_train.py", "--save", str(save), "--num-rollout", "4",
                          "--save-interval", "100"], capture_output=True, text=True, timeout=60, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    log = tmp_path / "r000-train.log"
    log.write_text(res.stdout)
    curves = trainlog.read_curves(log)
    # Per rollout: its data line and its perf line; per optimizer step (2 a rollout): a step line.
    assert curves is not None and curves.lines == 16, res.stdout + res.stderr
    assert sorted(curves.rollout["rollout/reward"]) == [0, 1, 2, 3]
    assert sorted(curves.step["train/loss"]) == list(range(8))
    assert sorted(curves.rollout["perf/step_time"]) == [0, 1, 2, 3]
    assert "rollout/num_rollout" not in curves.rollout  # a counter, not a curve


def test_a_rollout_done_twice_keeps_the_last_value(tmp_path: Path) -> None:
    """A trainer restarted from its checkpoint re-does rollouts: the run that counted wins."""
    log = tmp_path / "r001-train.log"
    log.write_bytes(b"x - rollout 21: {'rollout/raw_reward': 0.1}\nx - rollout 22: {'rollout/raw_reward': 0.2}\n"
                    b"x - rollout 22: {'rollout/raw_reward': 0.3}\n")
    curves = trainlog.read_curves(log)
    assert curves is not None and curves.rollout == {"rollout/raw_reward": {21: 0.1, 22: 0.3}}
    assert trainlog.read_curves(tmp_path / "missing.log") is None


def test_an_endless_line_is_skipped_in_bounded_memory() -> None:
    """A line longer than MAX_LINE is dropped whole; the lines around it still come out."""
    big = b"x" * (trainlog.MAX_LINE * 3)
    data = b"a\n" + big + b"\nb - perf 1: {'perf/x': 1}\n" + big
    lines = list(trainlog.iter_lines(io.BytesIO(data), chunk=4096))
    assert lines == [b"a", b"b - perf 1: {'perf/x': 1}"]


KEYS = st.from_regex(r"\A[a-z]{1,8}/[a-z_]{1,12}(/[a-z]{1,6})?\Z")
VALUES = st.floats(min_value=-trainlog.VALUE_MAX, max_value=trainlog.VALUE_MAX, width=64)


@settings(max_examples=200, deadline=None)
@given(metrics=st.dictionaries(KEYS.filter(lambda k: k not in trainlog.NOT_CURVES), VALUES, min_size=1, max_size=8),
       rid=st.integers(0, 10**9), as_json=st.booleans(), ray=st.booleans())
def test_any_metric_dict_round_trips(metrics: dict[str, float], rid: int, as_json: bool, ray: bool) -> None:
    """Whatever finite floats slime prints (repr, or the stand-in's JSON), the same come back."""
    body = json.dumps(metrics) if as_json else repr(metrics)
    prefix = "(RolloutManager pid=7) " if ray else ""
    line = f"{prefix}[2026-12-01 00:00:00] rollout_metrics.py:268 - perf {rid}: {body}".encode()
    got = trainlog.parse_line(line)
    assert got == ("rollout", rid, metrics)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=2000))
def test_any_bytes_never_crash_the_parser(data: bytes) -> None:
    """Garbage, torn lines, invalid UTF-8: a result or None, never an exception; values finite."""
    for chunk in (data, b"x - perf 3: {" + data, b"x - step 3: {'a/b': " + data):
        got = trainlog.parse_line(chunk)
        if got is not None:
            assert all(math.isfinite(v) for v in got[2].values())
    parts = data.split(b"\n")
    expected = parts[:-1] + ([parts[-1]] if parts[-1] else [])
    assert list(trainlog.iter_lines(io.BytesIO(data), chunk=7)) == expected
