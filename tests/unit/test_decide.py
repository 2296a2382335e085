"""machine.decide(): every (state, outcome) pair, as a table, plus the rules behind the rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shoprld.daemon.foundation.tools.causes import CUDA_OOM, NCCL_TIMEOUT, Cause
from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, EXIT_GATE, EXIT_OK, EXIT_STAGE
from shoprld.daemon.round.machine import (
    RETRY,
    TRANSITIONS,
    WORKING_STATES,
    Counters,
    Deadline,
    Decision,
    Occurrence,
    Enter,
    Exit,
    Fail,
    Finish,
    IllegalTransition,
    Machine,
    Park,
    Retry,
    RetryPolicy,
    State,
    Stay,
    Stop,
    decide,
)
from shoprld.daemon.foundation.system.retry import Backoff, may_retry

S = State
NO_DEADLINE = Deadline(at=None, need_s=0.0, now=1000.0)
POLICY = RetryPolicy(retries=2, backoff=5.0)
MID = Counters(round=1, rounds=3)  # a campaign in its second of three rounds


def run(state: State, ending: Occurrence, counters: Counters = MID, stop_mode: str | None = None,
        deadline: Deadline = NO_DEADLINE, policy: RetryPolicy = POLICY) -> Decision:
    return decide(state, ending, counters, stop_mode, deadline, policy)


# What a plain `done` leads to in each working state: (next state, trigger, round after).
DONE_TABLE = {
    S.PREFLIGHT_DISK: (S.START_SHOPSIM, "preflight_ok", 1),
    S.START_SHOPSIM: (S.TRAIN, "shopsim_ready", 1),
    S.TRAIN: (S.EXPORT_HF, "trained", 1),
    S.EXPORT_HF: (S.VAL, "exported", 1),
    S.VAL: (S.GATE, "validated", 1),
    S.GATE: (S.INJECT, "gated", 1),
    S.INJECT: (S.NEXT_ROUND, "injected", 1),
    S.NEXT_ROUND: (S.TRAIN, "next_round", 2),
}

# Every other outcome, the same in every working state: kind -> (next, trigger, action type, code).
FAILURES = {
    "retry": (None, RETRY, Retry, None),  # None: the same state
    "fail": (S.FAILED, "fail", Fail, EXIT_STAGE),
    "gate_stop": (S.FAILED, "fail", Fail, EXIT_GATE),
    "disk": (S.PAUSED_DISK, "park_disk", Park, None),
    "disk_hard": (S.PAUSED_DISK, "park_disk", Park, None),
    "disk_soft": (None, None, Stay, None),
    "disk_ok": (None, None, Stay, None),
    "stop": (S.STOPPED, "stop", Stop, EXIT_OK),
    "error": (None, None, Exit, EXIT_CONFIG),
    "checkpoint": (None, None, Stay, None),
}


@pytest.mark.parametrize("state", WORKING_STATES, ids=lambda s: s.value)
def test_done_and_skipped_advance_along_the_table(state: State) -> None:
    """A stage done (or skipped) in each working state enters the next state by the table's trigger."""
    for kind in ("done", "skipped"):
        d = run(state, Occurrence(kind))  # type: ignore[arg-type]
        nxt, trigger, rnd = DONE_TABLE[state]
        assert (d.next, d.trigger, d.action, d.counters.round) == (nxt, trigger, Enter(nxt), rnd)
        m = Machine(state)
        assert m.fire(trigger) is nxt  # the trigger is legal from there: the engine fires it


@pytest.mark.parametrize("kind", sorted(FAILURES))
@pytest.mark.parametrize("state", WORKING_STATES, ids=lambda s: s.value)
def test_every_other_outcome_in_every_working_state(state: State, kind: str) -> None:
    """Every non-done outcome leads where the table says, with the action the engine applies."""
    nxt, trigger, action, code = FAILURES[kind]
    d = run(state, Occurrence(kind, "why", exit_code=EXIT_CONFIG))  # type: ignore[arg-type]
    assert d.next is (nxt or state) and d.trigger == trigger and type(d.action) is action
    if code is not None:
        assert d.action.code == code  # type: ignore[union-attr]
    if trigger is not None:
        assert Machine(state).fire(trigger) is d.next


@pytest.mark.parametrize("state", [S.DONE, S.STOPPED, S.PAUSED_DISK, S.FAILED], ids=lambda s: s.value)
def test_nothing_but_a_checkpoint_or_disk_ok_arrives_where_no_stage_runs(state: State) -> None:
    """A stage outcome in a parked or terminal state is a bug (raised); a late checkpoint is nothing."""
    assert run(state, Occurrence("checkpoint")).action == Stay()
    assert run(state, Occurrence("disk_ok")).action == Stay()
    for kind in ("done", "retry", "fail", "disk", "stop"):
        with pytest.raises(IllegalTransition):
            run(state, Occurrence(kind))  # type: ignore[arg-type]


def test_every_trigger_decide_uses_is_in_the_table() -> None:
    """decide() never invents a trigger: each one it returned above is a TRANSITIONS entry or retry."""
    names = {t for t, _, _ in TRANSITIONS} | {RETRY}
    used = {DONE_TABLE[s][1] for s in DONE_TABLE} | {f[1] for f in FAILURES.values() if f[1]} | {"finish", "deadline"}
    assert used <= names


def test_the_last_round_finishes_and_status_keeps_its_index() -> None:
    """NEXT_ROUND of the last round goes to DONE by `finish`, with the last round's index kept."""
    d = run(S.NEXT_ROUND, Occurrence("done"), Counters(round=2, rounds=3))
    assert (d.next, d.trigger, d.action, d.counters.round) == (S.DONE, "finish", Finish("done"), 2)


def test_a_start_with_every_round_recorded_finishes_at_once() -> None:
    """START_SHOPSIM done with the reconciled round past the end finishes (nothing to train)."""
    d = run(S.START_SHOPSIM, Occurrence("done"), Counters(round=3, rounds=3))
    assert (d.next, d.trigger, d.action, d.counters.round) == (S.DONE, "finish", Finish("done"), 2)


@pytest.mark.parametrize("state", [S.START_SHOPSIM, S.NEXT_ROUND], ids=lambda s: s.value)
def test_the_deadline_does_not_start_a_round_that_cannot_finish(state: State) -> None:
    """With less time left than the median round, the next round is not started: DONE by `deadline`."""
    late = Deadline(at=1000.0 + 50.0, need_s=60.0, now=1000.0)
    d = run(state, Occurrence("done"), deadline=late)
    assert d.next is S.DONE and d.trigger == "deadline" and isinstance(d.action, Finish)
    assert d.action.reason == "deadline"
    assert d.action.message == f"deadline: round-{d.counters.round:03d} needs ~60s but only 50s are left"
    assert run(state, Occurrence("done"), deadline=replace(late, at=1000.0 + 61.0)).next is S.TRAIN


def test_stop_modes_wait_for_their_safe_point() -> None:
    """`checkpoint` stops after any stage but TRAIN (a checkpoint is its safe point); `round` after NEXT_ROUND."""
    assert isinstance(run(S.TRAIN, Occurrence("done"), stop_mode="checkpoint").action, Enter)
    assert run(S.EXPORT_HF, Occurrence("done"), stop_mode="checkpoint").action == Stop("requested")
    assert run(S.TRAIN, Occurrence("checkpoint"), stop_mode="checkpoint").action == Stop("requested")
    assert run(S.VAL, Occurrence("checkpoint"), stop_mode="checkpoint").action == Stay()
    assert isinstance(run(S.INJECT, Occurrence("done"), stop_mode="round").action, Enter)
    assert run(S.NEXT_ROUND, Occurrence("done"), stop_mode="round").action == Stop("requested")


def test_a_pending_park_waits_for_the_stage_or_the_next_checkpoint() -> None:
    """A soft limit parks once the stage is done (or TRAIN commits a checkpoint), before any stop."""
    soft = run(S.VAL, Occurrence("disk_soft", "free 1 GiB < soft limit 2 GiB on /v"))
    assert soft.action == Stay() and soft.counters.park_pending == "free 1 GiB < soft limit 2 GiB on /v"
    d = run(S.VAL, Occurrence("done"), soft.counters, stop_mode="round")
    assert d.action == Park("free 1 GiB < soft limit 2 GiB on /v") and d.counters.park_pending is None
    assert run(S.TRAIN, Occurrence("checkpoint"), soft.counters).action == Park("free 1 GiB < soft limit 2 GiB on /v")
    assert run(S.VAL, Occurrence("disk_ok"), soft.counters).counters.park_pending is None


def test_a_soft_limit_in_train_parks_at_once_when_the_next_save_cannot_fit() -> None:
    """TRAIN below the soft limit with no room for one more checkpoint parks now, and says why."""
    d = run(S.TRAIN, Occurrence("disk_soft", "free 1 GiB < soft limit 2 GiB on /v", fits=False))
    assert d.action == Park("free 1 GiB < soft limit 2 GiB on /v; the next save cannot fit")
    assert run(S.VAL, Occurrence("disk_soft", "x", fits=False)).action == Stay()  # no save is coming


def test_enospc_in_a_stage_parks_and_says_where() -> None:
    assert run(S.EXPORT_HF, Occurrence("disk", "No space left")).action == \
        Park("ENOSPC during EXPORT_HF: No space left", enospc=True)


def test_retries_back_off_then_fail_with_the_count() -> None:
    """Each failure without progress doubles the wait; the one past `retries` fails the campaign (exit 6)."""
    c, waits = MID, []
    for _ in range(POLICY.retries):
        d = run(S.VAL, Occurrence("retry", "boom"), c)
        assert d.next is S.VAL and isinstance(d.action, Retry)
        waits.append(d.action.delay)
        c = d.counters
    assert waits == [5.0, 10.0] and c.attempt == 3 and c.restarts == 2
    d = run(S.VAL, Occurrence("retry", "boom"), c)
    assert d.action == Fail("VAL failed after 3 attempts: boom", EXIT_STAGE, "failed")
    # With a classified cause, the decisive line rides along (not only the symptom).
    why = Cause("python_exception", "KeyError: 'rho'", "fix it")
    d = run(S.VAL, Occurrence("retry", "curriculum.json: not written by inject.command", cause=why), c)
    assert d.action == Fail("VAL failed after 3 attempts: curriculum.json: not written by inject.command "
                            "(cause: python_exception: KeyError: 'rho')", EXIT_STAGE, "failed")
    assert run(S.VAL, Occurrence("done"), c).counters.attempt == 1  # done forgets the failures
    assert run(S.VAL, Occurrence("done"), c).counters.failures == {}


def test_progress_resets_the_backoff() -> None:
    """A failed attempt that saved a new checkpoint retries at once and starts the count afresh."""
    c = run(S.TRAIN, Occurrence("retry", "stall"), MID).counters
    d = run(S.TRAIN, Occurrence("retry", "stall", progressed=True), c)
    assert d.action == Retry(0.0, "stall") and d.counters.failures[S.TRAIN] == 0


def test_the_same_oom_twice_is_not_tried_a_third_time() -> None:
    """A CUDA OOM twice in a row fails with the cause's advice; another cause in between does not."""
    oom = Cause(CUDA_OOM, "CUDA out of memory", "lower the batch")
    first = run(S.TRAIN, Occurrence("retry", "x", cause=oom), replace(MID, rounds=3), policy=RetryPolicy(9, 1.0))
    assert isinstance(first.action, Retry)
    d = run(S.TRAIN, Occurrence("retry", "x", cause=oom), first.counters, policy=RetryPolicy(9, 1.0))
    assert d.action == Fail("TRAIN failed twice in a row with cuda_oom (CUDA out of memory); not retried a "
                            "third time; fix: lower the batch", EXIT_STAGE, "failed")
    other = run(S.TRAIN, Occurrence("retry", "x", cause=Cause(NCCL_TIMEOUT)), first.counters, policy=RetryPolicy(9, 1.0))
    assert isinstance(run(S.TRAIN, Occurrence("retry", "x", cause=oom), other.counters,
                          policy=RetryPolicy(9, 1.0)).action, Retry)


def test_a_stage_error_exits_with_its_code_where_it_stands() -> None:
    d = run(S.GATE, Occurrence("error", "gate.command: not found", exit_code=EXIT_CONFIG))
    assert (d.next, d.trigger, d.action) == (S.GATE, None, Exit("gate.command: not found", EXIT_CONFIG))


def test_one_backoff_rule_for_stages_and_shopsim() -> None:
    """The stage curve doubles up to five minutes; ShopSim's doubles five times, at most 30 s."""
    assert [Backoff(5.0).delay(n) for n in range(0, 9)] == [0.0, 5, 10, 20, 40, 80, 160, 300, 300]
    shopsim = Backoff(1.0, 30.0, max_doublings=5)
    assert [shopsim.delay(n) for n in (1, 2, 5, 6, 7, 50)] == [1, 2, 16, 30, 30, 30]
    assert may_retry(2, 2) and not may_retry(3, 2)  # retries = 2: three attempts in all


def test_the_deadline_needs_the_median_round() -> None:
    """One slow round does not end the campaign: the need is the median, 0 before any round."""
    assert Deadline.of(100.0, [10.0, 10.0, 95.0], 0.0).need_s == 10.0
    assert Deadline.of(100.0, [], 0.0).says_stop(0) is None
    assert Deadline.of(100.0, [], 101.0).says_stop(0) is not None  # already passed
