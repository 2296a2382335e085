"""Project the real campaign's wall time under shoprld's policy (issue 17, item 6).

A pure function, no I/O: the seed's measured durations and faults go in, shoprld's save and
stall policy is applied, and the hours come out. ``bench_timeline.py`` prints it as the
"projection" column next to the replay's own figures, and ``tests/unit/test_bench_projection.py``
pins its arithmetic.

The inputs come from ../shared/SHOPSIMRL.md ("Measured on the real 4xA800 run") and
REFERENCE.md ("Megatron checkpoints"):

- the four rounds took 4 h 37 m, 10 h 44 m, 5 h 26 m and 4 h 33 m; round-001 lost about 5.4 h to
  an unexplained stall, so its fault-free length is 10 h 44 m - 5.4 h;
- a slime step takes ~850 s (750-920 s on average); a round is 20 steps;
- a checkpoint is ~53 GB with optimizer state. Its saves were measured on one H100 (megatron-core
  0.19.2's torch_dist at 8.07 and 27.4 GB, a line through both at 53 GB:
  run/gpu-smoke/results/saves-h100-2026-12-05.jsonl): a synchronous save takes 61.8 s; an async
  one (``--async-save --use-persistent-ckpt-worker``) blocks training 47.3 s the first time in a
  process and 1.2 s after, the write going on behind it. Loading one on a relaunch is not
  measured: 3 min assumed (53 GB at ~300 MB/s);
- a trainer relaunch costs the "gate -> next slime start" gap, ~52 s, plus that load;
- the issue counts two faults in the 25 h night. One is round-001's stall; the other is not
  described, so it is modelled as a trainer crash in the middle of a round (the bench's
  round-002 fault). What it cost the seed is unknown, so it stays in the seed's round times
  (``lost_in_seed_s=0``) and shoprld's cost for it is added on top: conservative, it may count
  that fault twice.

shoprld's policy, as the recipe configures it:

- a stall is declared by the phase-aware verdict (issue 30, daemon/round/stall.py): the phase the
  trainer hangs in has had no signal for ``phase_factor`` (3) x the 95th percentile of that
  phase's longest still gap in this campaign, at least ``quiet_min`` (5 min). Which phase the
  seed's round-001 stall hung in is unknown, so the projection takes the slowest bound, training's
  (``stall_phase``). ``stall_verdict="steps"`` is the older rule: ``max(stall_min, stall_factor x
  median step)`` without a step (30 min, k = 3). Then the trainer is killed and relaunched;
- a crash is noticed at once (the child's exit);
- either way the steps since the last save are re-run. A fault is equally likely anywhere
  in a save interval, so the expected loss is half an interval (``loss="expected"``), and at
  worst a whole interval (``loss="worst"``). An async save is resumable only once the next save
  starts (slime finalizes it then), so with async saves a fault loses one interval more (the lag);
- ``fixed`` saves once per round (the seed's ``--save-interval 10000``); ``adaptive`` picks
  the Young/Daly interval ``sqrt(2 x C x MTBF / (1 + 2 lag))`` in whole steps, clamped to
  [1, steps_per_round], with C the save's blocking time and the MTBF prior = the seed's night
  (two faults in ~25.4 h), as daemon/round/saves.py does. Every save but the round's last
  (which the seed pays too, synchronously: slime forces it) costs its blocking time: a launch's
  first async save ``first_s``, each later one ``later_s``; a relaunch starts a new process, so
  its first save costs ``first_s`` again. A launch that saves once gets no async flags
  (daemon/round/asyncsave.py ``pays_off``), so one save per round costs nothing over the seed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

HOUR = 3600.0


@dataclass(frozen=True)
class Input:
    """One input of the projection and where it comes from: ``measured`` (by whom, where),
    ``cited`` (from what document) or ``assumed`` (and why)."""

    value: float
    source: Literal["measured", "cited", "assumed"]
    where: str

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "where": self.where}


# Every input, labelled (bench_timeline prints them with the projection).
INPUTS: dict[str, Input] = {
    "step_s": Input(850.0, "cited", "SHOPSIMRL.md, Measured: a slime step 750-920 s on average"),
    "longest_step_s": Input(1589.0, "cited", "SHOPSIMRL.md, Measured: range 445-1589 s"),
    "rollout_s": Input(290.0, "cited", "SHOPSIMRL.md, Measured: about 290 s of rollout"),
    "training_s": Input(560.0, "cited", "SHOPSIMRL.md, Measured: about 560 s of training"),
    "round_walls": Input(25 * HOUR + 20 * 60, "cited", "SHOPSIMRL.md, Measured: 4h37, 10h44, 5h26, 4h33"),
    "stall_lost_s": Input(5.4 * HOUR, "cited", "SHOPSIMRL.md, Measured: round 1 lost about 5.4 h"),
    "relaunch_s": Input(52.0, "cited", "SHOPSIMRL.md, Measured: gate to the next slime start 50-55 s"),
    "save_sync_s": Input(61.8, "measured", "one H100, megatron-core 0.19.2 torch_dist sync save of 8.07 and "
                         "27.4 GB (GPT weights + Adam states): 22.9 s and 39.6 s, a line through both at 53 GB "
                         "(run/gpu-smoke/results/saves-h100-2026-12-05.jsonl)"),
    "save_sync_assumed_s": Input(180.0, "assumed", "the earlier rounds' guess: 53 GB (REFERENCE.md) at ~300 MB/s"),
    "load_s": Input(180.0, "assumed", "the same 53 GB read back on a relaunch at ~300 MB/s; no load was measured"),
    "train_lines_per_step": Input(2.0, "cited", "slime logs `step N: {...}` per optimizer step "
                                  "(slime/backends/megatron_utils/model.py:918, THUDM/slime 624b824a); the recipe's "
                                  "--rollout-batch-size 16 x --n-samples-per-prompt 8 / --global-batch-size 64 "
                                  "= 2 steps per rollout (SHOPSIMRL.md's recipe)"),
    "rollout_gap_s": Input(100.0, "assumed", "the longest still gap of a rollout: one generation of up to "
                           "--rollout-max-response-len 4096 tokens between two ShopSim requests (~40 tok/s); "
                           "with SGLang's /metrics watched, tokens move within it"),
    "training_gap_p95_s": Input(433.0, "assumed", "the slowest step's training (1589 s - 290 s of rollout = 1299 s) "
                                "over the lines slime prints in it (`Timer train start`, then `Timer ref_log_probs` "
                                "and `Timer log_probs` start/end: actor.py:433/363, a `step N` line per optimizer "
                                "step: model.py:918): its longest still gap is one optimizer step, a third of it when "
                                "a forward-only log-prob pass costs 1 unit a sample and a training pass with full "
                                "recompute 4 (2 steps x 64 x 4 against 2 passes x 128 x 1)"),
    "loading_gap_s": Input(180.0, "assumed", "a launch's longest still gap: the 53 GB checkpoint load (load_s)"),
    # The blocking part of an async save (Megatron --async-save with --use-persistent-ckpt-worker):
    # training waits for the plan and the copy to host memory; the write runs behind it.
    "async_first_block_s": Input(47.3, "measured", "one H100, megatron-core 0.19.2 torch_dist async save of 8.07 "
                                 "and 27.4 GB, the process's first: 20.6 s and 32.1 s blocking, a line through both "
                                 "at 53 GB (run/gpu-smoke/results/saves-h100-2026-12-05.jsonl)"),
    "async_block_s": Input(1.21, "measured", "the same runs, the process's second save: 0.18 s and 0.63 s blocking, "
                           "a line through both at 53 GB (plan cached, host buffers reused)"),
}


@dataclass(frozen=True)
class Fault:
    """One fault of the real night: what it was and in which round (0-based)."""

    kind: Literal["stall", "crash"]
    round: int
    lost_in_seed_s: float = 0.0  # the wall time it cost the seed beyond the round's work


@dataclass(frozen=True)
class SaveCost:
    """What a mid-round save blocks training for: a launch's first, each later one, and the
    intervals a fault loses beyond the last save (an async save is resumable only once the next
    one starts: 1)."""

    name: str
    first_s: float
    later_s: float
    lag: int = 0


SYNC_ASSUMED = SaveCost("sync, 3 min (assumed)", INPUTS["save_sync_assumed_s"].value,
                        INPUTS["save_sync_assumed_s"].value)
SYNC_MEASURED = SaveCost(f"sync, {INPUTS['save_sync_s'].value:g} s (measured)", INPUTS["save_sync_s"].value,
                         INPUTS["save_sync_s"].value)
ASYNC_MEASURED = SaveCost(f"async, {INPUTS['async_first_block_s'].value:g} s then {INPUTS['async_block_s'].value:g} s "
                          "blocking, one interval of lag (measured)", INPUTS["async_first_block_s"].value,
                          INPUTS["async_block_s"].value, lag=1)
# Not an option today, what would lower the floor: slime finalizes an async save only when the
# next one starts (slime/backends/megatron_utils/actor.py:579-582), where Megatron's own loop
# finalizes each iteration once the write is done (maybe_finalize_async_save(blocking=False)).
ASYNC_NO_LAG = dataclasses.replace(ASYNC_MEASURED, name="async, measured, no lag (if slime finalized a save "
                                   "once written: not today's slime)", lag=0)
SAVE_COSTS = (SYNC_ASSUMED, SYNC_MEASURED, ASYNC_MEASURED, ASYNC_NO_LAG)


@dataclass(frozen=True)
class Seed:
    """The real campaign as measured (SHOPSIMRL.md): per-round wall times, faults, step time."""

    round_wall_s: tuple[float, ...] = (4 * HOUR + 37 * 60, 10 * HOUR + 44 * 60, 5 * HOUR + 26 * 60,
                                       4 * HOUR + 33 * 60)
    faults: tuple[Fault, ...] = (Fault("stall", 1, 5.4 * HOUR), Fault("crash", 2))
    step_s: float = 850.0
    longest_step_s: float = 1589.0       # the slowest step measured (445-1589 s)
    steps_per_round: int = 20
    save: SaveCost = field(default_factory=lambda: ASYNC_MEASURED)
    load_cost_s: float = INPUTS["load_s"].value
    relaunch_s: float = INPUTS["relaunch_s"].value
    # Each phase's longest still gap (its p95 in a campaign), what the phase-aware verdict learns.
    rollout_gap_s: float = INPUTS["rollout_gap_s"].value
    training_gap_s: float = INPUTS["training_gap_p95_s"].value
    loading_gap_s: float = INPUTS["loading_gap_s"].value

    def fault_free_s(self) -> float:
        """The campaign without the seed's fault losses (what shoprld cannot beat)."""
        return sum(self.round_wall_s) - sum(f.lost_in_seed_s for f in self.faults)

    def wall_s(self) -> float:
        return sum(self.round_wall_s)


@dataclass(frozen=True)
class Policy:
    """shoprld's save and stall policy (the recipe's values by default)."""

    saves: Literal["fixed", "adaptive"] = "adaptive"
    fixed_interval: int = 10000          # the seed's and the recipe's --save-interval
    stall_min_s: float = 1800.0           # train.stall_min
    stall_factor: float = 3.0             # train.stall_factor
    stall_verdict: Literal["steps", "phases"] = "phases"  # train.stall_verdict
    phase_factor: float = 3.0             # train.stall_phase_factor
    quiet_min_s: float = 300.0            # train.stall_quiet_min
    stall_phase: Literal["loading", "rollout", "training", "saving"] = "training"  # unknown: the slowest
    mtbf_prior_s: float | None = None     # None: the seed's night (its wall / its faults)
    loss: Literal["expected", "worst"] = "expected"


def phase_bound(seed: Seed, policy: Policy, phase: str) -> float:
    """The phase-aware verdict's bound in ``phase``: factor x its longest still gap, at least
    quiet_min (a save's bytes grow all along: quiet_min)."""
    gap = {"loading": seed.loading_gap_s, "rollout": seed.rollout_gap_s, "training": seed.training_gap_s,
           "saving": 0.0}[phase]
    return max(policy.quiet_min_s, policy.phase_factor * gap)


def stall_detect_s(seed: Seed, policy: Policy) -> float:
    """How long a stall goes on before the verdict, under ``policy``."""
    if policy.stall_verdict == "phases":
        return phase_bound(seed, policy, policy.stall_phase)
    return max(policy.stall_min_s, policy.stall_factor * seed.step_s)


def young_daly_steps(save_cost_s: float, mtbf_s: float, step_s: float, steps_per_round: int, lag: int = 0) -> int:
    """The Young/Daly optimum ``sqrt(2 C M / (1 + 2 lag))`` (daemon/round/saves.py), in whole
    steps within one round."""
    return max(1, min(steps_per_round, round(math.sqrt(2 * save_cost_s * mtbf_s / (1 + 2 * lag)) / step_s)))


@dataclass(frozen=True)
class Projection:
    hours: float
    fault_free_hours: float
    interval_steps: int
    saves_per_round: int
    save_overhead_h: float
    save: str = ""
    lag_intervals: int = 0
    fault_costs_h: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"hours": self.hours, "fault_free_hours": self.fault_free_hours,
                "interval_steps": self.interval_steps, "saves_per_round": self.saves_per_round,
                "save_overhead_h": self.save_overhead_h, "save": self.save, "lag_intervals": self.lag_intervals,
                "fault_costs_h": self.fault_costs_h}


def project(seed: Seed, policy: Policy) -> Projection:
    """The real campaign's hours under ``policy``: fault-free seed + extra saves + each fault's cost."""
    rounds = len(seed.round_wall_s)
    sv = seed.save
    if policy.saves == "adaptive":
        mtbf = policy.mtbf_prior_s or seed.wall_s() / max(1, len(seed.faults))
        interval = young_daly_steps(sv.later_s, mtbf, seed.step_s, seed.steps_per_round, lag=sv.lag)
    else:
        interval = max(1, min(seed.steps_per_round, policy.fixed_interval))
    saves_per_round = math.ceil(seed.steps_per_round / interval)
    mid = saves_per_round - 1  # the round's last save is the seed's too
    # A launch that saves once gets no async flags: no lag, and nothing over the seed's save.
    lag = sv.lag if mid else 0
    first_again = (sv.first_s - sv.later_s) if mid else 0.0  # a relaunch's new process pays its first save
    save_overhead = rounds * (sv.first_s + (mid - 1) * sv.later_s) if mid else 0.0
    lost_steps = (interval / 2 if policy.loss == "expected" else float(interval)) + lag * interval
    costs, total = [], seed.fault_free_s() + save_overhead
    for f in seed.faults:
        detect = stall_detect_s(seed, policy) if f.kind == "stall" else 0.0
        cost = detect + seed.relaunch_s + seed.load_cost_s + lost_steps * seed.step_s + first_again
        total += cost
        costs.append({"round": f.round, "fault": f.kind, "detect_h": round(detect / HOUR, 2),
                      "steps_rerun": lost_steps, "hours": round(cost / HOUR, 2)})
    return Projection(hours=round(total / HOUR, 2), fault_free_hours=round(seed.fault_free_s() / HOUR, 2),
                      interval_steps=interval, saves_per_round=saves_per_round,
                      save_overhead_h=round(save_overhead / HOUR, 2), save=sv.name, lag_intervals=lag,
                      fault_costs_h=costs)


def what_it_needs(seed: Seed, target_h: float = 21.0) -> list[dict[str, Any]]:
    """The projection under each save cost x stall verdict, against ``target_h``: the earlier
    rounds' assumed 3-min synchronous save, the measured synchronous one, and the measured async
    one (the recipe's: first and later blocking times, one interval of lag); the older verdict
    (k = 3 x the median step), the phase-aware one with the stall in each phase (training's is
    the projection's own: the seed's stall's phase is unknown), and a verdict at once (the floor
    no verdict can beat: what is left is the saves, the relaunch, the load and the re-run)."""
    rows = []
    for cost in SAVE_COSTS:
        saved = dataclasses.replace(seed, save=cost)
        verdicts: list[tuple[str, Policy]] = [
            ("steps: k = 3 x median step", Policy(stall_verdict="steps")),
            *((f"phases: hang in {ph}", Policy(stall_phase=ph)) for ph in ("training", "loading", "rollout")),
            ("at once (the floor)", Policy(stall_verdict="steps", stall_min_s=0.0, stall_factor=0.0)),
        ]
        for stall_name, pol in verdicts:
            p = project(saved, pol)
            rows.append({"save": cost.name, "save_blocking_s": [cost.first_s, cost.later_s], "lag": p.lag_intervals,
                         "stall_verdict": stall_name, "stall_detect_s": stall_detect_s(saved, pol),
                         "interval_steps": p.interval_steps, "hours": p.hours, "meets": p.hours <= target_h})
    return rows


def replay_floor(*, fault_free_s: float, steps: int, rounds: int, save_s: float, step_s: float, faults: int,
                 stall_detect_s: float, relaunch_s: float, first_save_s: float | None = None,
                 lag: int = 0) -> dict[str, Any]:
    """The replay's least expected faulted / fault-free ratio, for ANY save policy with whole-step
    intervals: the best interval's extra saves (the round's last save is in the fault-free run
    too) plus, per fault, the expected re-run (half an interval, and half of the step the fault
    cut, plus ``lag`` intervals when saves are async) and a relaunch, plus the stall's detection.
    With ``first_save_s`` a launch's first mid-round save costs that instead of ``save_s``: once a
    round, and again after each fault's relaunch. A policy of one save per round pays neither
    (no async flags). What the replay can show at best, before any overhead of the daemon's own."""
    best: tuple[float, int] | None = None
    first = save_s if first_save_s is None else first_save_s
    for tau in range(1, max(1, steps // rounds) + 1):
        extra = max(0.0, steps / tau - rounds)
        mid = extra > 0
        extra_saves = extra * save_s + ((rounds + faults) * (first - save_s) if mid else 0.0)
        rerun = (tau + 1) / 2 + (lag * tau if mid else 0)
        cost = extra_saves + faults * (rerun * step_s + relaunch_s) + stall_detect_s
        if best is None or cost < best[0]:
            best = (cost, tau)
    assert best is not None
    return {"interval_steps": best[1], "fault_cost_s": round(best[0], 2),
            "faulted_over_fault_free": round((fault_free_s + best[0]) / fault_free_s, 3) if fault_free_s else None,
            "inputs": {"fault_free_s": fault_free_s, "save_s": save_s, "first_save_s": first, "lag": lag,
                       "step_s": step_s, "faults": faults, "stall_detect_s": stall_detect_s,
                       "relaunch_s": relaunch_s}}
