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
- a checkpoint is ~53 GB with optimizer state. No save time is measured; the whole "training's
  end -> compile done" window, which holds the final save, is 8-14 min. We assume 3 min per save
  (53 GB at ~300 MB/s to shared storage) and the same to load one on a relaunch;
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
  worst a whole interval (``loss="worst"``);
- ``fixed`` saves once per round (the seed's ``--save-interval 10000``); ``adaptive`` picks
  the Young/Daly interval ``sqrt(2 x save_cost x MTBF)`` in whole steps, clamped to
  [1, steps_per_round], with the MTBF prior = the seed's night (two faults in ~25.4 h). Every
  save but the round's last (which the seed pays too) costs ``save_cost_s`` more wall time.
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
    "save_sync_s": Input(180.0, "assumed", "53 GB (REFERENCE.md) at ~300 MB/s; no save time is measured"),
    "load_s": Input(180.0, "assumed", "the same 53 GB read back on a relaunch"),
    "train_lines_per_step": Input(2.0, "assumed", "slime logs each optimizer step; the recipe's "
                                  "--rollout-batch-size 16 x --n-samples-per-prompt 8 / --global-batch-size 64 "
                                  "= 2 steps per rollout (SHOPSIMRL.md's recipe)"),
    "rollout_gap_s": Input(100.0, "assumed", "the longest still gap of a rollout: one generation of up to "
                           "--rollout-max-response-len 4096 tokens between two ShopSim requests (~40 tok/s); "
                           "with SGLang's /metrics watched, tokens move within it"),
    "training_gap_p95_s": Input(650.0, "assumed", "(the slowest step 1589 s - 290 s of rollout) / 2 step lines: "
                                "the slowest training's longest still gap"),
    "loading_gap_s": Input(180.0, "assumed", "a launch's longest still gap: the 53 GB checkpoint load (load_s)"),
    # The blocking part of an async save (Megatron --async-save with --use-persistent-ckpt-worker):
    # training waits for the copy to host memory; the write runs behind it. ASSUMED until helper
    # The worse of the two measured blocking times: the first async save of a trainer process
    # (47 s at 53 GB; a later one blocks 1.2 s). Every relaunch starts a new process, so a round
    # pays the first-save figure at least once; counting it for every save is conservative.
    "async_save_blocking_s": Input(47.0, "measured", "one H100, megatron-core 0.19.2 torch_dist async save of "
                                   "8.07 and 27.4 GB (GPT weights + Adam states), first save of the process: "
                                   "20.6 s and 32.1 s blocking, a line through both at 53 GB "
                                   "(run/gpu-smoke/results/saves-h100-2026-12-05.jsonl)"),
}


@dataclass(frozen=True)
class Fault:
    """One fault of the real night: what it was and in which round (0-based)."""

    kind: Literal["stall", "crash"]
    round: int
    lost_in_seed_s: float = 0.0  # the wall time it cost the seed beyond the round's work


@dataclass(frozen=True)
class Seed:
    """The real campaign as measured (SHOPSIMRL.md): per-round wall times, faults, step time."""

    round_wall_s: tuple[float, ...] = (4 * HOUR + 37 * 60, 10 * HOUR + 44 * 60, 5 * HOUR + 26 * 60,
                                       4 * HOUR + 33 * 60)
    faults: tuple[Fault, ...] = (Fault("stall", 1, 5.4 * HOUR), Fault("crash", 2))
    step_s: float = 850.0
    longest_step_s: float = 1589.0       # the slowest step measured (445-1589 s)
    steps_per_round: int = 20
    save_cost_s: float = 180.0
    load_cost_s: float = 180.0
    relaunch_s: float = 52.0
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


def young_daly_steps(save_cost_s: float, mtbf_s: float, step_s: float, steps_per_round: int) -> int:
    """The Young/Daly optimum ``sqrt(2 C M)``, in whole steps within one round."""
    return max(1, min(steps_per_round, round(math.sqrt(2 * save_cost_s * mtbf_s) / step_s)))


@dataclass(frozen=True)
class Projection:
    hours: float
    fault_free_hours: float
    interval_steps: int
    saves_per_round: int
    save_overhead_h: float
    fault_costs_h: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"hours": self.hours, "fault_free_hours": self.fault_free_hours,
                "interval_steps": self.interval_steps, "saves_per_round": self.saves_per_round,
                "save_overhead_h": self.save_overhead_h, "fault_costs_h": self.fault_costs_h}


def project(seed: Seed, policy: Policy) -> Projection:
    """The real campaign's hours under ``policy``: fault-free seed + extra saves + each fault's cost."""
    rounds = len(seed.round_wall_s)
    if policy.saves == "adaptive":
        mtbf = policy.mtbf_prior_s or seed.wall_s() / max(1, len(seed.faults))
        interval = young_daly_steps(seed.save_cost_s, mtbf, seed.step_s, seed.steps_per_round)
    else:
        interval = max(1, min(seed.steps_per_round, policy.fixed_interval))
    saves_per_round = math.ceil(seed.steps_per_round / interval)
    save_overhead = rounds * (saves_per_round - 1) * seed.save_cost_s
    lost_steps = interval / 2 if policy.loss == "expected" else float(interval)
    costs, total = [], seed.fault_free_s() + save_overhead
    for f in seed.faults:
        detect = stall_detect_s(seed, policy) if f.kind == "stall" else 0.0
        cost = detect + seed.relaunch_s + seed.load_cost_s + lost_steps * seed.step_s
        total += cost
        costs.append({"round": f.round, "fault": f.kind, "detect_h": round(detect / HOUR, 2),
                      "steps_rerun": lost_steps, "hours": round(cost / HOUR, 2)})
    return Projection(hours=round(total / HOUR, 2), fault_free_hours=round(seed.fault_free_s() / HOUR, 2),
                      interval_steps=interval, saves_per_round=saves_per_round,
                      save_overhead_h=round(save_overhead / HOUR, 2), fault_costs_h=costs)


ASYNC_SAVE_BLOCKING_S = INPUTS["async_save_blocking_s"].value


def what_it_needs(seed: Seed, target_h: float = 21.0) -> list[dict[str, Any]]:
    """The projection under each save cost x stall verdict, against ``target_h``: the assumed
    3-min synchronous save or an async save's blocking part (``INPUTS``); the older verdict
    (k = 3 x the median step), the phase-aware one with the stall in each phase (training's is
    the projection's own: the seed's stall's phase is unknown), and a verdict at once (the floor
    no verdict can beat: what is left is the saves, the relaunch, the load and the re-run)."""
    rows = []
    async_in = INPUTS["async_save_blocking_s"]
    for save_name, cost in (("sync 3 min (assumed)", seed.save_cost_s),
                            (f"async, {async_in.value:g} s blocking ({async_in.source})", async_in.value)):
        saved = dataclasses.replace(seed, save_cost_s=cost)
        verdicts: list[tuple[str, Policy]] = [
            ("steps: k = 3 x median step", Policy(stall_verdict="steps")),
            *((f"phases: hang in {ph}", Policy(stall_phase=ph)) for ph in ("training", "loading", "rollout")),
            ("at once (the floor)", Policy(stall_verdict="steps", stall_min_s=0.0, stall_factor=0.0)),
        ]
        for stall_name, pol in verdicts:
            p = project(saved, pol)
            rows.append({"save": save_name, "save_blocking_s": cost, "stall_verdict": stall_name,
                         "stall_detect_s": stall_detect_s(saved, pol), "interval_steps": p.interval_steps,
                         "hours": p.hours, "meets": p.hours <= target_h})
    return rows


def replay_floor(*, fault_free_s: float, steps: int, rounds: int, save_s: float, step_s: float, faults: int,
                 stall_detect_s: float, relaunch_s: float) -> dict[str, Any]:
    """The replay's least expected faulted / fault-free ratio, for ANY save policy with whole-step
    intervals: the best interval's extra saves (the round's last save is in the fault-free run
    too) plus, per fault, the expected re-run (half an interval, and half of the step the fault
    cut) and a relaunch, plus the stall's detection. What the replay can show at best, before
    any overhead of the daemon's own."""
    best: tuple[float, int] | None = None
    for tau in range(1, max(1, steps // rounds) + 1):
        extra_saves = max(0.0, steps / tau - rounds) * save_s
        cost = extra_saves + faults * ((tau + 1) / 2 * step_s + relaunch_s) + stall_detect_s
        if best is None or cost < best[0]:
            best = (cost, tau)
    assert best is not None
    return {"interval_steps": best[1], "fault_cost_s": round(best[0], 2),
            "faulted_over_fault_free": round((fault_free_s + best[0]) / fault_free_s, 3) if fault_free_s else None,
            "inputs": {"fault_free_s": fault_free_s, "save_s": save_s, "step_s": step_s, "faults": faults,
                       "stall_detect_s": stall_detect_s, "relaunch_s": relaunch_s}}
