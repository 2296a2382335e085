"""The save interval for each trainer launch (shoprld.daemon.round.saves; issue 17, item 1)."""

from __future__ import annotations

from types import SimpleNamespace

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.round import saves
from shoprld.daemon.ops.check import run_check
from shoprld.daemon.foundation.storage.checkpoints import IterationMapping, scan
from shoprld.daemon.round.plan import read_witness
from shoprld.daemon.round.resume import Moment, SaveDir, Witness, retention
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.config.configsections import SavesSection
from shoprld.daemon.foundation.records.layout import Layout
from tests.demotree import make_tree
from tests.unit.test_checkpoints import save as megatron_save
from tests.unit.test_checkpoints import write_tracker

SEED = SavesSection(mode="adaptive")  # the seed's guesses: 3 min saves, 850 s steps, 2 faults in 25 h
seconds = st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False)


def slime_saves(interval: int, start: int, end: int) -> list[int]:
    """The rollouts slime saves at, resuming at ``start`` with ``--num-rollout end + 1``
    (train.py + should_run_periodic_action: every ``interval``, and always the last rollout)."""
    return [i for i in range(start, end + 1) if (i + 1) % interval == 0 or i == end]


# -- the formula -------------------------------------------------------------------------------------
@given(seconds, seconds, seconds)
def test_young_daly_is_the_square_root_of_twice_cost_times_mtbf(cost: float, mtbf: float, step: float) -> None:
    """The optimum, times the step time, squared, is 2 x save cost x MTBF."""
    steps = saves.young_daly_steps(cost, mtbf, step)
    assert math.isclose((steps * step) ** 2, 2 * cost * mtbf, rel_tol=1e-9)


@given(seconds, seconds, seconds, st.floats(min_value=1.01, max_value=100))
def test_young_daly_grows_with_the_cost_and_the_mtbf_and_shrinks_with_the_step(
        cost: float, mtbf: float, step: float, k: float) -> None:
    """k x the cost or the MTBF gives sqrt(k) x the interval; k x the step time gives 1/k."""
    base = saves.young_daly_steps(cost, mtbf, step)
    assert math.isclose(saves.young_daly_steps(k * cost, mtbf, step), math.sqrt(k) * base, rel_tol=1e-9)
    assert math.isclose(saves.young_daly_steps(cost, k * mtbf, step), math.sqrt(k) * base, rel_tol=1e-9)
    assert math.isclose(saves.young_daly_steps(cost, mtbf, k * step), base / k, rel_tol=1e-9)


@pytest.mark.parametrize("args", [(0, 1, 1), (1, 0, 1), (1, 1, 0), (-1, 1, 1)])
def test_young_daly_refuses_a_non_positive_input(args: tuple[float, float, float]) -> None:
    """A zero or negative save cost, MTBF or step time is an error, never a zero interval."""
    with pytest.raises(ValueError):
        saves.young_daly_steps(*args)


def test_the_seeds_guesses_give_a_save_every_five_or_six_steps() -> None:
    """3 min saves, an MTBF of 12.5 h (2 faults in 25 h), 850 s steps: sqrt(2*180*45000)/850 = 4.7
    steps; 5 would save at iteration 19, the eve of round 0's final, so 6 is chosen."""
    assert saves.young_daly_steps(180, 45_000, 850) == pytest.approx(4.735, abs=1e-3)
    assert saves.steps_interval(4.735, 20, 20) == 6
    assert slime_saves(6, 1, 20) == [5, 11, 17, 20]


@given(opt=st.floats(min_value=0, max_value=1e6), left=st.integers(1, 10_000), end=st.integers(1, 10**6))
def test_the_interval_stays_in_one_to_steps_left_and_off_the_eve_of_the_final(opt: float, left: int, end: int) -> None:
    """Clamped to [1, steps left]; moved by at most a quarter of itself, and only to leave the
    step before the final save without a save."""
    k0 = max(1, min(left, round(opt)))
    k = saves.steps_interval(opt, left, end)
    assert 1 <= k <= left
    if k0 == left:
        assert k == left  # the whole round: one save at its end, whatever the end
    if k != k0:
        assert end % k0 == 0 and end % k != 0 and 2 <= k < left
        assert abs(k - k0) <= max(1, int(k0 * saves.NUDGE))


# -- the MTBF ---------------------------------------------------------------------------------------
@given(faults=st.floats(min_value=0.01, max_value=100), window=seconds)
def test_with_no_observation_the_mtbf_is_the_prior(faults: float, window: float) -> None:
    """Before the campaign has trained, the MTBF is the prior's window over its faults."""
    assert saves.learned_mtbf(faults, window, 0, 0.0) == pytest.approx(window / faults)


@given(k=st.integers(0, 1000), exposure=st.floats(min_value=0, max_value=1e8))
def test_the_mtbf_learns_from_the_campaign(k: int, exposure: float) -> None:
    """One more fault lowers it; more hours without one raise it; much data outweighs the prior."""
    m = saves.learned_mtbf(2, 90_000, k, exposure)
    assert saves.learned_mtbf(2, 90_000, k + 1, exposure) < m
    assert saves.learned_mtbf(2, 90_000, k, exposure + 3600) > m
    assert saves.learned_mtbf(2, 90_000, 10_000, 10_000 * 3600.0) == pytest.approx(3600, rel=0.01)


# -- the choice -------------------------------------------------------------------------------------
ROOM = saves.DiskRoom(need_bytes=100, room_bytes=1000)
NO_ROOM = saves.DiskRoom(need_bytes=1000, room_bytes=100)


@settings(max_examples=300)
@given(cost=seconds, faults=st.integers(0, 50), exposure=st.floats(0, 1e7), step=st.one_of(st.none(), seconds),
       rnd=st.integers(0, 50), spr=st.integers(1, 200), done=st.integers(0, 199), room=st.sampled_from([ROOM, NO_ROOM, None]))
def test_every_round_still_ends_on_its_final_save(cost: float, faults: int, exposure: float, step: float | None,
                                                  rnd: int, spr: int, done: int, room: saves.DiskRoom | None) -> None:
    """Whatever the inputs, slime under the chosen interval saves the round's last rollout; a
    mid-round choice saves at least every `interval` steps and never on the final's eve; a
    one-per-round choice (no room, or an optimum as long as the round) saves only the last."""
    m = IterationMapping(spr)
    end, floor = m.end_iteration(rnd), m.end_iteration(rnd - 1) if rnd else 0
    resume = floor + min(done, spr - 1)
    history = saves.History(save_costs=(cost,), faults=tuple(float(i) for i in range(faults)),
                            exposure_s=exposure, step_s=step)
    c = saves.choose(SEED, fixed_interval=10_000, history=history, steps_left=end - resume, end_iteration=end,
                     num_rollout=m.num_rollout(rnd), room=room)
    points = slime_saves(c.interval, resume + 1, end)
    assert points[-1] == end
    if c.mid_round:
        assert room is not None and room.ok
        assert 1 <= c.interval < end - resume
        assert all(b - a <= c.interval for a, b in zip([resume, *points], points))
    else:
        assert points == [end]
        assert c.interval >= 10_000
    if room is not None and not room.ok:
        assert not c.mid_round and ("no disk room" in c.reason or "not shorter" in c.reason)


def test_no_room_falls_back_to_one_save_per_round_and_says_why() -> None:
    """An optimum of a few steps but no room for one more checkpoint: the seed's interval, and
    the reason names the disk and its numbers."""
    c = saves.choose(SEED, fixed_interval=10_000, history=saves.History(), steps_left=20, end_iteration=40,
                     num_rollout=41, room=saves.DiskRoom(need_bytes=170 * 2**30, room_bytes=33 * 2**30))
    assert (c.mid_round, c.interval, c.disk_room) == (False, 10_000, False)
    assert "no disk room for a mid-round save (needs 170.0GiB free, 33.0GiB there)" in c.reason
    assert "one save per round" in saves.describe(c)


def test_fixed_mode_passes_train_save_interval_and_judges_nothing() -> None:
    """mode = fixed (the default): train.save_interval as it is, no optimum."""
    c = saves.choose(SavesSection(), fixed_interval=5, history=saves.History(), steps_left=20, end_iteration=20,
                     num_rollout=21, room=None)
    assert (c.mode, c.interval, c.optimum_steps) == ("fixed", 5, None)


def test_the_sources_say_guess_until_measured() -> None:
    """Each input names where it came from: the guesses first, then the campaign's own numbers."""
    first = saves.choose(SEED, fixed_interval=10_000, history=saves.History(), steps_left=20, end_iteration=20,
                         num_rollout=21, room=ROOM)
    assert first.save_cost_source.startswith("guess") and first.step_source.startswith("guess")
    assert first.mtbf_s == pytest.approx(12.5 * 3600) and "0 fault(s)" in first.mtbf_source
    later = saves.choose(SEED, fixed_interval=10_000, steps_left=20, end_iteration=40, num_rollout=41, room=ROOM,
                         history=saves.History(save_costs=(100, 400, 120), faults=(1.0,), exposure_s=3600, step_s=700))
    assert later.save_cost_s == 120 and later.save_cost_source.startswith("measured (median of the last 3)")
    assert later.mtbf_s == pytest.approx((25 + 1) * 3600 / 3) and "1 fault(s) in 1 h" in later.mtbf_source
    assert later.step_s == 700 and later.step_source.startswith("measured")


# -- the journal ------------------------------------------------------------------------------------
def rec(t: float, event: str, state: str = "TRAIN", **fields: Any) -> dict[str, Any]:
    return {"t": t, "event": event, "state": state, **fields}


def test_history_counts_trainer_failures_not_failures_before_the_trainer() -> None:
    """A crash or stall after the trainer started is a fault; an emit that failed before it is not."""
    records = [
        rec(0, "transition", src="START_SHOPSIM", dst="TRAIN"),
        rec(10, "stage.spawn", role="trainer"),
        rec(100, "stage.outcome", kind="retry", step_seconds=9.0),
        rec(100, "attempt.failed", stalled=True),
        rec(101, "transition", src="TRAIN", dst="TRAIN", trigger="retry"),
        rec(102, "attempt.failed"),  # the emit failed: no trainer ran in this attempt
        rec(103, "transition", src="TRAIN", dst="TRAIN", trigger="retry"),
        rec(104, "stage.spawn", role="emit"),
        rec(200, "transition", src="TRAIN", dst="EXPORT_HF", state="EXPORT_HF"),
    ]
    h = saves.read_history(records, now=1000)
    assert h.faults == (100,)
    assert h.exposure_s == pytest.approx(200)  # TRAIN from t=0 to t=200; not the EXPORT_HF tail
    assert h.step_s == 9.0


def test_a_daemon_that_died_in_train_is_a_fault_unless_its_trainer_is_adopted() -> None:
    """A restart after dying in TRAIN lost the trainer's work when a new trainer must be spawned;
    an adopted trainer lost nothing. The downtime is not training time."""
    died = [rec(0, "transition", src="START_SHOPSIM", dst="TRAIN"), rec(5, "stage.spawn", role="trainer"),
            rec(50, "checkpoint.committed", iteration=4),
            rec(5000, "transition", state="PREFLIGHT_DISK", src=None, dst="PREFLIGHT_DISK"),
            rec(5001, "transition", src="START_SHOPSIM", dst="TRAIN")]
    relaunched = saves.read_history([*died, rec(5002, "stage.spawn", role="trainer")], now=5002)
    adopted = saves.read_history([*died, rec(5002, "child.adopted", role="trainer")], now=5002)
    assert relaunched.faults == (50,) and adopted.faults == ()
    assert relaunched.exposure_s == pytest.approx(50 + 1 + 0)


def test_a_save_timing_harvested_twice_counts_once() -> None:
    """save.timed is keyed by where in which log it was read."""
    t = {"seconds": 12.5, "log": "/l/r000-train.log", "at": 1234}
    h = saves.read_history([rec(1, "save.timed", **t), rec(2, "save.timed", **t),
                            rec(3, "save.timed", seconds=20.0, log="/l/r000-train.log", at=99)], now=3)
    assert sorted(h.save_costs) == [12.5, 20.0]


def test_save_timings_reads_slimes_timer_line_and_the_smoke_trainers() -> None:
    """slime's @timer line (with Ray's actor prefix) and train_mcore.py's line; nothing else."""
    log = (b"(MegatronTrainRayActor pid=812) [2026-12-01 03:12:09] timer.py:33 - Timer save_model end (elapsed: 187.4s)\n"
           b"[2026-12-01 03:12:09] timer.py:30 - Timer save_model start\n"
           b"saved checkpoint iter 40 in 3.250 s (123456 bytes)\n"
           b"Timer update_weights end (elapsed: 9.0s)\n")
    found = saves.save_timings(log, base_offset=1000)
    assert [s for _, s in found] == [187.4, 3.25]
    assert found[0][0] > 1000


# -- retention while a round trains ----------------------------------------------------------------
def _training(tmp_path: Path, round_index: int, witness: Witness | None = None, keep_finals: int = 1) -> list[int]:
    d = SaveDir(scan(tmp_path), IterationMapping(20), round_index, witness)
    return sorted(retention(d, Moment.TRAINING, keep_finals=keep_finals).keep & {c.iteration for c in d.scan.checkpoints})


def test_a_new_save_supersedes_the_rounds_older_saves_but_never_the_finals(tmp_path: Path) -> None:
    """Round 1 with saves at 25 and 31: 25 goes, 31 (the resume point) and round 0's final 20 stay."""
    for n in (20, 25, 31):
        megatron_save(tmp_path, n)
    unvouched = Witness(25)
    assert _training(tmp_path, 1, unvouched) == [20, 31]
    d = SaveDir(scan(tmp_path), IterationMapping(20), 1, unvouched)
    assert [c.iteration for c in retention(d, Moment.TRAINING).doomed] == [25]
    assert _training(tmp_path, 2, unvouched) == [20, 25, 31]  # nothing of round 2 yet: nothing superseded


def test_a_vouched_save_supersedes_the_oldest_final_too(tmp_path: Path) -> None:
    """Issue 25: once ShopSim vouched for round 1's save 31, round 0's final 20 goes (keep_finals=1),
    so the disk holds one checkpoint between saves; unvouched, 20 stays for a rollback. With
    keep_finals=2 the newest older final stays beside the save."""
    for n in (20, 25, 31):
        megatron_save(tmp_path, n)
    assert _training(tmp_path, 1, Witness(31)) == [31]
    assert _training(tmp_path, 1, Witness(25)) == [20, 31]
    assert _training(tmp_path, 1, Witness(31), keep_finals=2) == [20, 31]
    for n in (1, 10):
        megatron_save(tmp_path, n)
    write_tracker(tmp_path, "31")  # older finals saved late: the tracker still names 31
    assert _training(tmp_path, 1, Witness(99), keep_finals=2) == [20, 31]


@pytest.mark.parametrize(("witness", "expected"), [
    (None, True),                                     # no witness: ShopSim is not ours, nothing rolls back
    ('{"iteration": 31, "outage": false}', True),
    ('{"iteration": 30, "outage": false}', False),    # not seen alive since the save
    ('{"iteration": 40, "outage": true}', False),     # an outage freezes the witness
    ('{"iteration": "31"}', False), ("not json", False), ("[]", False),
])
def test_vouched_reads_the_witness_conservatively(tmp_path: Path, witness: str | None, expected: bool) -> None:
    """Only a well-formed, outage-free witness at or past the save vouches for it."""
    path = tmp_path / "shopsim.witness"
    if witness is not None:
        path.write_text(witness)
    d = SaveDir(scan(tmp_path), IterationMapping(20), 1, read_witness(path))
    assert d.vouched(31) is expected


# -- the launch, end to end on a demo tree ---------------------------------------------------------
ADAPTIVE = {r"^\[sidecar\]$": '[saves]\nmode = "adaptive"\ncost_guess = "1s"\nstep_guess = "1s"\n'
                              'prior_faults = 1\nprior_window = "8s"\n\n[sidecar]'}


def _tree(tmp_path: Path, edits: dict[str, str] | None = None) -> tuple[Any, Layout]:
    cfg = load_config(make_tree(tmp_path, rounds=2, edits={**ADAPTIVE, **(edits or {})}))
    layout = Layout.from_config(cfg)
    layout.ensure(cfg)
    return cfg, layout


def test_a_launch_journals_its_choice_and_records_it_for_the_placeholder(tmp_path: Path) -> None:
    """sqrt(2 x 1 s x 8 s) = 4 steps of 1 s: the choice is emitted as save.interval with its
    inputs, recorded, and {save_interval} reads it; fixed mode would read train.save_interval."""
    cfg, layout = _tree(tmp_path)
    events: list[tuple[str, dict[str, Any]]] = []
    log = layout.stage_log(0, "train")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("emit output\n")
    choice = saves.choose_for_launch(cfg, layout, 0, log=log, now=time.time(), emit=lambda e, **f: events.append((e, f)))
    assert choice is not None and choice.mid_round and choice.interval == 3  # 4 would save at 19, the eve of 20
    assert [e for e, _ in events] == ["save.interval"]
    fields = events[0][1]
    assert {"interval", "save_cost_s", "save_cost_source", "mtbf_s", "mtbf_source", "step_s", "step_source",
            "disk_room", "summary"} <= set(fields)
    assert fields["disk_room"] is True and fields["summary"].startswith("adaptive: a save every 3 steps")
    assert saves.placeholder_value(cfg, layout, 0) == "3"
    assert saves.placeholder_value(cfg.model_copy(update={"saves": SavesSection()}), layout, 0) == "10000"
    assert json.loads(saves.record_path(layout, 0).read_text())["log_offset"] == len("emit output\n")


def test_the_next_launch_reads_the_previous_launchs_save_timings(tmp_path: Path) -> None:
    """What the trainer logged after the last launch is journaled (save.timed, each once) and
    becomes the save cost: 4 s saves make the interval sqrt(2 x 4 x 8) = 8 steps."""
    cfg, layout = _tree(tmp_path)
    log = layout.stage_log(0, "train")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("before the launch: Timer save_model end (elapsed: 999.0s)\n")
    saves.choose_for_launch(cfg, layout, 0, log=log, now=time.time(), emit=lambda e, **f: None)
    with open(log, "a") as fh:
        fh.write("[t] timer.py:0 - Timer save_model end (elapsed: 4.0s)\n[t] timer.py:0 - Timer save_model end (elapsed: 4.0s)\n")
    events: list[tuple[str, dict[str, Any]]] = []
    choice = saves.choose_for_launch(cfg, layout, 0, log=log, now=time.time(), emit=lambda e, **f: events.append((e, f)))
    assert [e for e, _ in events] == ["save.timed", "save.timed", "save.interval"]
    assert choice is not None and choice.save_cost_s == 4.0 and choice.save_cost_source.startswith("measured")
    assert choice.interval == 8  # round 0 ends at 20: no save on its eve (19)


def test_no_room_on_the_volume_falls_back_and_check_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A hard limit above the free space: one save per round, and `shoprld check` prints why."""
    cfg, layout = _tree(tmp_path, {r'^hard_limit = "64MiB"$': 'hard_limit = "900TiB"',
                                   r'^soft_limit = "128MiB"$': 'soft_limit = "1000TiB"'})
    choice = saves.plan(cfg, layout, 0, now=time.time())
    assert (choice.mid_round, choice.disk_room, choice.interval) == (False, False, 10_000)
    run_check(cfg.source)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("saves: "))
    assert "one save per round" in line and "no disk room for a mid-round save" in line


def test_check_shows_the_adaptive_interval_in_the_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`check --print-commands` shows the trainer's --save-interval as a launch would get it."""
    cfg, _ = _tree(tmp_path)
    run_check(cfg.source, print_commands=True)
    out = capsys.readouterr().out
    assert "saves: adaptive: a save every 3 steps" in out
    assert "--save-interval 3 " in out
