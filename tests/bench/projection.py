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

- a stall is declared after ``max(stall_min, stall_factor x median step)`` without a step
  (run/slime-4xa800.toml: 30 min, k = 3), then the trainer is killed and relaunched;
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
    mtbf_prior_s: float | None = None     # None: the seed's night (its wall / its faults)
    loss: Literal["expected", "worst"] = "expected"


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
        detect = max(policy.stall_min_s, policy.stall_factor * seed.step_s) if f.kind == "stall" else 0.0
        cost = detect + seed.relaunch_s + seed.load_cost_s + lost_steps * seed.step_s
        total += cost
        costs.append({"round": f.round, "fault": f.kind, "detect_h": round(detect / HOUR, 2),
                      "steps_rerun": lost_steps, "hours": round(cost / HOUR, 2)})
    return Projection(hours=round(total / HOUR, 2), fault_free_hours=round(seed.fault_free_s() / HOUR, 2),
                      interval_steps=interval, saves_per_round=saves_per_round,
                      save_overhead_h=round(save_overhead / HOUR, 2), fault_costs_h=costs)


# Megatron's --async-save: training waits only for the copy of the state to host memory; the
# write runs behind it. Assumed, not measured here: ~13 GB per rank on 4 GPUs copied at a few
# GB/s plus the save plan, ~20 s. REFERENCE.md lists its known pains (#1908 hang, #2422 tiny
# shards, the tracker trailing by one interval).
ASYNC_SAVE_BLOCKING_S = 20.0


def what_it_needs(seed: Seed, target_h: float = 21.0) -> list[dict[str, Any]]:
    """The projection under each save cost x stall verdict, against ``target_h``: the seed's
    assumed 3-min synchronous save or an async save's blocking copy; a stall declared after
    k x the median step (the recipe's k = 3) or after the slowest step ever measured (the
    least a verdict from step lines alone can wait without killing a healthy slow step)."""
    rows = []
    for save_name, cost in (("sync 3 min (assumed)", seed.save_cost_s), ("async, ~20 s blocking (assumed)",
                                                                       ASYNC_SAVE_BLOCKING_S)):
        for stall_name, detect in (("k = 3 x median step", 3 * seed.step_s),
                                   ("the slowest step measured", seed.longest_step_s)):
            p = project(dataclasses.replace(seed, save_cost_s=cost),
                        Policy(saves="adaptive", stall_min_s=detect, stall_factor=0.0))
            rows.append({"save": save_name, "save_blocking_s": cost, "stall_verdict": stall_name,
                         "stall_detect_s": detect, "interval_steps": p.interval_steps, "hours": p.hours,
                         "meets": p.hours <= target_h})
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
