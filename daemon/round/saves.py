"""Saves that pay for themselves: slime's ``--save-interval`` for each trainer launch (issue 17).

Theory of operation
-------------------
A save costs ``C`` seconds of training; a fault throws away everything since the last save.
Young's optimum (Daly's first order) saves every ``sqrt(2 * C * MTBF)`` seconds of work. This
module turns that into slime's ``--save-interval``, in steps (rollouts), once per trainer launch:

* **C**, the save cost: the median of the campaign's last few measured saves. The trainer logs
  each one (slime: ``Timer save_model end (elapsed: X s)``, which includes the ``--save-hf``
  export; the gpu-smoke trainer: ``saved checkpoint iter N in X s``). Before the next launch the
  previous launch's log is read for them and each is journaled as ``save.timed``. Before the
  first one: ``[saves] cost_guess``.
* **MTBF**: the prior ``[saves] prior_faults`` in ``prior_window`` (the seed's night: two faults
  in 25 h) counted as pseudo-observations, plus this campaign's own: the trainer failures the
  journal records (``attempt.failed`` in TRAIN after a trainer ran: crashes, stalls, ShopSim
  outages; and a daemon that died in TRAIN without its trainer being adopted again) over the
  hours spent in TRAIN. ``MTBF = (window + hours) / (prior_faults + faults)``: the prior's word
  at first, the campaign's own as it accumulates (the Gamma-Poisson posterior mean of the rate).
* **the step time**: TRAIN's median step of the latest round that reported one (``stage.outcome``);
  before that, ``[saves] step_guess``.

The interval is ``round(sqrt(2 C M) / step)``, at least 1. slime saves when
``(rollout_id + 1) % interval == 0`` and always at the last rollout, so every round still ends on
its complete final checkpoint, whatever the interval. An interval that would put a save on the
step just before the final one is moved by a step or two (the optimum is flat; that save would
buy nothing). An optimum at least as long as the steps left, or a disk without room for the
campaign's peak (:func:`daemon.preflight.budget_for`: each save supersedes the one before, so a
mid-round save needs what the final one needs), gives the seed's one save per round:
``max(train.save_interval, --num-rollout)``, which never fires before the last rollout; the
first time, ``saves.no_room`` is journaled with the numbers.

Every choice is journaled as ``save.interval`` with its inputs and where each came from, shown by
``shoprld status`` (one line) and ``shoprld check`` (one line), and recorded in
``<artifacts>/saves/<round_id>.json``: ``{save_interval}`` reads the record, so every reader of
the round's values (the argv, the Ray job's env, the ledger) agrees with what was launched.
``[saves] mode = "fixed"`` (the default) keeps ``train.save_interval`` as it is.

slime's rule, read upstream (THUDM/slime ``train.py`` at 624b824a, lines 49-80, and
``slime/utils/misc.py`` ``should_run_periodic_action``, lines 107-128): a save runs when
``rollout_id == num_rollout - 1`` (forced and synchronous even with ``--async-save``; added by
PR #1143, commit 0fe58b45, 2025-12-18), or ``(rollout_id + 1) % save_interval == 0``, or at an
epoch end (``(rollout_id + 1) % num_rollout_per_epoch == 0``). Older slime (e.g. 005bd1a0)
had no forced last save: with it, a round would end on a checkpoint only when its end is a
multiple of the interval. ``save_model`` is wrapped in slime's ``@timer``
(``slime/observability/timer.py``), which logs ``Timer save_model end (elapsed: X.Xs)`` on rank 0.

Pure where it can be: :func:`young_daly_steps`, :func:`learned_mtbf`, :func:`read_history` and
:func:`choose` take plain values; :func:`choose_for_launch` does the reading and the writing.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.system import logchunks
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configsections import SavesSection
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.paths import record_file, round_id
from shoprld.daemon.foundation.storage.preflight import budget_for
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.foundation.records.store import Store, atomic_write_json, read_json
from shoprld.daemon.round import asyncsave, resume

# The trainers' save-timing lines: slime's @timer on save_model (rank 0), and the gpu-smoke
# megatron-core trainer's own line. The seconds are the first group.
SAVE_TIMING = re.compile(
    rb"Timer save_model end \(elapsed: (\d+(?:\.\d+)?)s\)"
    rb"|saved checkpoint iter \d+ in (\d+(?:\.\d+)?) s\b")
RECENT_SAVES = 5  # the save cost is the median of the last few: a disk that fills slows down
NUDGE = 0.25      # how far (a fraction of the optimum) an interval may move off the eve of the final save


# -- the formula ---------------------------------------------------------------------------------
def young_daly_steps(save_cost_s: float, mtbf_s: float, step_s: float, lag_intervals: int = 0) -> float:
    """The optimal work between saves, in steps (unrounded).

    Per second of work, saves every ``T`` cost ``C / T`` and faults cost what a fault loses over
    the MTBF: ``T / 2`` on average since the last save, plus ``lag_intervals * T`` when the last
    save(s) cannot be resumed from yet (an async save's tracker lands only when the next save
    starts: ``lag_intervals = 1``). The minimum of ``C / T + (1/2 + lag) T / MTBF`` is at
    ``T = sqrt(2 C MTBF / (1 + 2 lag))``: Young's ``sqrt(2 C MTBF)`` when nothing lags."""
    if save_cost_s <= 0 or mtbf_s <= 0 or step_s <= 0 or lag_intervals < 0:
        raise ValueError(f"save cost, MTBF and step time must be > 0 and the lag >= 0, got {save_cost_s}, "
                         f"{mtbf_s}, {step_s}, {lag_intervals}")
    return math.sqrt(2.0 * save_cost_s * mtbf_s / (1 + 2 * lag_intervals)) / step_s


def learned_mtbf(prior_faults: float, prior_window_s: float, faults: int, exposure_s: float) -> float:
    """The prior's faults in its window, plus the campaign's own faults in its training time."""
    if prior_faults <= 0 or prior_window_s <= 0 or faults < 0 or exposure_s < 0:
        raise ValueError("the prior must be > 0, the observed faults and hours >= 0")
    return (prior_window_s + exposure_s) / (prior_faults + faults)


def steps_interval(optimum_steps: float, steps_left: int, end_iteration: int) -> int:
    """The optimum rounded into ``[1, steps_left]``, moved off a save on the step before the
    final one (``end_iteration % k == 0``) when a neighbour within :data:`NUDGE` avoids it."""
    k = max(1, min(steps_left, round(optimum_steps)))
    if k == 1 or k == steps_left or end_iteration % k:  # steps_left: one save per round, nothing to move
        return k
    reach = max(1, int(k * NUDGE))
    for d in range(1, reach + 1):
        for cand in (k + d, k - d):
            if 2 <= cand < steps_left and end_iteration % cand:
                return cand
    return k


# -- what the journal says ----------------------------------------------------------------------
@dataclass(frozen=True)
class History:
    """What this campaign has measured so far (from the journal)."""

    save_costs: tuple[float, ...] = ()   # seconds, oldest first
    faults: tuple[float, ...] = ()       # the times (epoch seconds) trainer work was lost
    exposure_s: float = 0.0              # seconds spent in TRAIN
    step_s: float | None = None          # the latest round's median step time
    async_disabled: bool = False         # a trainer's log said Megatron disabled --async-save


def timing_key(rec: Mapping[str, Any]) -> tuple[str, int]:
    """A save timing's identity: where in which log it was read (harvested twice, counted once)."""
    return str(rec.get("log", "")), int(rec.get("at", -1))


def read_history(records: Iterable[Mapping[str, Any]], *, now: float) -> History:
    """The save costs, faults, training time and step time in journal records (in order)."""
    costs: dict[tuple[str, int], float] = {}
    faults: list[float] = []
    exposure = 0.0
    step: float | None = None
    prev: Mapping[str, Any] | None = None
    trainer_ran = False
    died_in_train: float | None = None  # a daemon died in TRAIN: lost work, unless the trainer is adopted
    async_disabled = False
    for rec in records:
        event, t = rec.get("event"), _num(rec.get("t"))
        restart = event == "transition" and rec.get("src") is None
        before = _num(prev.get("t")) if prev is not None else None
        if prev is not None and prev.get("state") == "TRAIN" and t is not None and before is not None and not restart:
            exposure += max(0.0, t - before)
        if restart and prev is not None and prev.get("state") == "TRAIN":
            died_in_train = _num(prev.get("t"))
        if event == "transition":
            trainer_ran = False
        elif event in ("stage.spawn", "child.adopted") and rec.get("role") == ChildRole.TRAINER:
            if died_in_train is not None and event == "stage.spawn":
                faults.append(died_in_train)
            died_in_train = None
            trainer_ran = True
        elif event == "attempt.failed" and rec.get("state") == "TRAIN" and trainer_ran and t is not None:
            faults.append(t)
        elif event == "save.timed" and (s := _num(rec.get("seconds"))) is not None and s > 0:
            costs[timing_key(rec)] = s
        elif event == "stage.outcome" and rec.get("state") == "TRAIN" and (s := _num(rec.get("step_seconds"))):
            step = s if s > 0 else step
        elif event == ASYNC_DISABLED_EVENT:
            async_disabled = True
        prev = rec
    if prev is not None and prev.get("state") == "TRAIN" and (last := _num(prev.get("t"))) is not None:
        exposure += max(0.0, now - last)  # the attempt under way
    return History(tuple(costs.values()), tuple(faults), exposure, step, async_disabled)


def save_timings(data: bytes, *, base_offset: int = 0) -> list[tuple[int, float]]:
    """``(byte offset, seconds)`` of every save-timing line in a piece of trainer log."""
    return [(base_offset + m.start(), float(m.group(1) or m.group(2))) for m in SAVE_TIMING.finditer(data)]


NO_ROOM = "no disk room for a mid-round save"
# TRAIN journals it when the trainer's log has Megatron's line below (daemon/round/asyncsave.py).
ASYNC_DISABLED_EVENT = "train.async_save_disabled"


# -- the choice -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DiskRoom:
    """Whether mid-round saves fit: the campaign's disk budget need against the free bytes."""

    need_bytes: int
    room_bytes: int

    @property
    def ok(self) -> bool:
        return self.room_bytes >= self.need_bytes


@dataclass(frozen=True)
class SaveChoice:
    """One launch's ``--save-interval`` and everything it came from (the ``save.interval`` event)."""

    mode: str
    interval: int                 # what --save-interval gets
    mid_round: bool               # True: saves inside the round; False: one save per round
    reason: str                   # why, in words (the fallback's cause when mid_round is False)
    optimum_steps: float | None
    steps_left: int
    save_cost_s: float
    save_cost_source: str
    mtbf_s: float
    mtbf_source: str
    step_s: float
    step_source: str
    disk_room: bool | None        # None: not judged (fixed mode, or the volume could not be read)
    disk_need_bytes: int | None
    disk_room_bytes: int | None
    async_save: bool = False      # the lag of one interval counted (saves.async_save, not disabled)

    def as_event(self) -> dict[str, Any]:
        """The ``save.interval`` fields, with the one-line ``summary`` that status shows."""
        return {**asdict(self), "summary": describe(self)}


def choose(saves: SavesSection, *, fixed_interval: int, history: History, steps_left: int,
           end_iteration: int, num_rollout: int, room: DiskRoom | None, async_save: bool = False) -> SaveChoice:
    """The interval for one launch (see the module docstring); pure."""
    recent = history.save_costs[-RECENT_SAVES:]
    cost, cost_src = ((statistics.median(recent), f"measured (median of the last {len(recent)})") if recent
                      else (saves.cost_guess, "guess ([saves] cost_guess)"))
    faults = len(history.faults)
    mtbf = learned_mtbf(saves.prior_faults, saves.prior_window, faults, history.exposure_s)
    mtbf_src = (f"prior ({saves.prior_faults:g} faults in {saves.prior_window / 3600:.3g} h) + "
                f"{faults} fault(s) in {history.exposure_s / 3600:.3g} h of training")
    step, step_src = ((history.step_s, "measured (TRAIN's median)") if history.step_s
                      else (saves.step_guess, "guess ([saves] step_guess)"))
    once = max(fixed_interval, num_rollout)  # never fires before the last rollout
    lagged = async_save and not history.async_disabled  # the argv asks for it, and Megatron kept it
    as_fixed = SaveChoice(mode=saves.mode, interval=fixed_interval, mid_round=fixed_interval < steps_left,
                          reason="train.save_interval ([saves] mode = fixed)", optimum_steps=None,
                          steps_left=steps_left, save_cost_s=cost, save_cost_source=cost_src, mtbf_s=mtbf,
                          mtbf_source=mtbf_src, step_s=step, step_source=step_src,
                          disk_room=None if room is None else room.ok,
                          disk_need_bytes=None if room is None else room.need_bytes,
                          disk_room_bytes=None if room is None else room.room_bytes, async_save=lagged)
    if saves.mode == "fixed":
        return as_fixed
    optimum = young_daly_steps(cost, mtbf, step, lag_intervals=1 if lagged else 0)
    k = steps_interval(optimum, steps_left, end_iteration)
    if k >= steps_left:  # an interval of the whole round could still fire once before its end
        return replace(as_fixed, interval=once, mid_round=False, optimum_steps=optimum,
                       reason=f"the optimum ({optimum:.1f} steps) is not shorter than the {steps_left} steps left")
    if room is None or not room.ok:
        why = ("the volume could not be read" if room is None else
               f"{NO_ROOM} (needs {_gib(room.need_bytes)} free, "
               f"{_gib(room.room_bytes)} there)")
        return replace(as_fixed, interval=once, mid_round=False, optimum_steps=optimum, reason=why)
    return replace(as_fixed, interval=k, mid_round=True, optimum_steps=optimum,
                   reason=f"Young/Daly: a save every {k} steps")


# -- reading the world, once per launch ------------------------------------------------------------
def record_path(layout: Layout, round_index: int) -> Path:
    """The round's last choice."""
    return record_file(layout.artifacts, "saves", round_id(round_index))


def placeholder_value(cfg: Config, layout: Layout, round_index: int, *, planned: bool = False) -> str:
    """``{save_interval}``: the round's recorded adaptive choice, else ``train.save_interval``.
    ``planned`` (check --print-commands): the interval a launch at the round's start would get now."""
    if cfg.saves.mode != "adaptive":
        return str(cfg.train.save_interval)
    if planned:
        return str(plan(cfg, layout, round_index, now=time.time(), planned=True).interval)
    rec = read_json(record_path(layout, round_index)) or {}
    if isinstance(rec.get("interval"), int) and rec["interval"] >= 1:
        return str(rec["interval"])
    return str(cfg.train.save_interval)


def hf_at_every_save(cfg: Config, interval: int) -> bool:
    """Whether a launch passes ``--save-hf`` (``{save_hf} {save_hf_dir}``). slime writes the HF
    copy synchronously after EVERY save (``actor.py`` ``save_model`` calls
    ``save_hf_model_to_path`` after ``save``; it has no "final save only" option), ~9 GB for the
    seed's model. So a launch whose interval can fire inside the round leaves it out when a
    converter can write the copy once (``export.command``): EXPORT_HF converts the round's final
    checkpoint. Without a converter, or with one save per round, ``--save-hf`` stays."""
    return not (interval < cfg.campaign.steps_per_round and cfg.export.command)


def save_hf_left_out(cfg: Config, interval: int) -> bool:
    """Whether a launch with this interval ran without ``--save-hf`` because ``{save_hf}`` left it
    out (a literal ``--save-hf`` in train.command is always passed)."""
    return "{save_hf}" in cfg.train.command and not hf_at_every_save(cfg, interval)


def disk_room(cfg: Config, layout: Layout) -> DiskRoom | None:
    """Room for mid-round saves on the volume now (None when it cannot be read), from the
    campaign's budget (``preflight.budget_for``). Each save supersedes the one before it (and,
    once vouched for, the oldest kept final: ``round/resume.py``, ``Moment.TRAINING``), so mid-round
    saves need what the round's own peak needs: that it lands above the soft floor."""
    try:
        b = budget_for(cfg, layout)
    except OSError:
        return None
    fc = b.forecast
    peak = max(b.next_save_bytes, fc.peak_bytes - fc.present_bytes)
    return DiskRoom(need_bytes=peak + b.limits.soft_bytes, room_bytes=b.free_bytes)  # ok == b.round_fits


def _steps_left(cfg: Config, layout: Layout, round_index: int, *, planned: bool) -> tuple[int, int, int]:
    """(steps left, end iteration, --num-rollout) of the round, from its resume point."""
    m = ckpt.IterationMapping(cfg.campaign.steps_per_round, cfg.train.end_offset)
    end = m.end_iteration(round_index)
    floor = m.end_iteration(round_index - 1) if round_index > 0 else 0
    latest = None if planned else resume.SaveDir(ckpt.scan(layout.save_dir), m, round_index).resume_point
    start = max(floor, latest.iteration) if latest is not None else floor
    return max(1, end - start), end, m.num_rollout(round_index)


def plan(cfg: Config, layout: Layout, round_index: int, *, now: float, planned: bool = False,
         fresh: Iterable[Mapping[str, Any]] = ()) -> SaveChoice:
    """The choice for a launch of ``round_index`` now (``planned``: from the round's start, as
    ``check`` shows it). ``fresh``: ``save.timed`` records not in the journal yet."""
    records = _journal(layout)
    history = read_history([*records, *fresh], now=now)
    room = disk_room(cfg, layout) if cfg.saves.mode == "adaptive" else None
    steps_left, end, num_rollout = _steps_left(cfg, layout, round_index, planned=planned)
    return choose(cfg.saves, fixed_interval=cfg.train.save_interval, history=history, steps_left=steps_left,
                  end_iteration=end, num_rollout=num_rollout, room=room,
                  async_save=asyncsave.flags_state(cfg.train.command, cfg.saves.async_save) == "on")


def _journal(layout: Layout) -> list[dict[str, Any]]:
    return list(Store(layout.state_dir).journal()) if layout.state_dir.exists() else []


def harvest(layout: Layout, round_index: int) -> list[dict[str, Any]]:
    """The save timings the previous launch logged (this round's, else the previous round's
    last launch), as ``save.timed`` event fields: ``{seconds, log, at}``."""
    rec = read_json(record_path(layout, round_index))
    if rec is None and round_index > 0:
        rec = read_json(record_path(layout, round_index - 1))
    if rec is None or not isinstance(rec.get("log"), str) or not isinstance(rec.get("log_offset"), int):
        return []
    timings: list[tuple[int, float]] = []
    try:  # a MiB at a time: the launch's output is tens of MiB of engine lines
        for pos, chunk in logchunks.line_chunks(Path(rec["log"]), rec["log_offset"]):
            timings += save_timings(chunk, base_offset=pos)
    except OSError:
        return []
    return [{"seconds": s, "log": rec["log"], "at": at} for at, s in timings]


def choose_for_launch(cfg: Config, layout: Layout, round_index: int, *, log: Path, now: float,
                      emit: Callable[..., None]) -> SaveChoice | None:
    """Before a trainer launch: journal the previous launch's save timings, choose this launch's
    interval, journal it (``save.interval``) and record it for ``{save_interval}``. In fixed mode
    nothing is read, written or journaled: ``train.save_interval`` is passed as before."""
    if cfg.saves.mode != "adaptive":
        return None
    fresh = harvest(layout, round_index)
    for timing in fresh:
        emit("save.timed", **timing)
    choice = plan(cfg, layout, round_index, now=now, fresh=[{"event": "save.timed", **t} for t in fresh])
    try:
        offset = log.stat().st_size
    except OSError:
        offset = 0
    path = record_path(layout, round_index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {**choice.as_event(), "round": round_index, "chosen_at": now,
                             "log": str(log), "log_offset": offset})
    emit("save.interval", **choice.as_event())
    if choice.reason.startswith(NO_ROOM) and not any(r.get("event") == "saves.no_room" for r in _journal(layout)):
        # Once a campaign: the disk holds the seed's one save per round, not mid-round saves.
        emit("saves.no_room", need_bytes=choice.disk_need_bytes, free_bytes=choice.disk_room_bytes,
             message=choice.reason)
    return choice


def describe(choice: SaveChoice) -> str:
    """One line for ``check`` and ``status``."""
    if choice.mode == "fixed":
        return f"fixed: --save-interval {choice.interval} (train.save_interval)"
    inputs = (f"save {choice.save_cost_s:.0f}s {_short(choice.save_cost_source)}"
              f"{' async, its lag counted' if choice.async_save else ''}, "
              f"MTBF {choice.mtbf_s / 3600:.3g}h {_short(choice.mtbf_source)}, "
              f"step {choice.step_s:.0f}s {_short(choice.step_source)}")
    if choice.mid_round:
        return f"adaptive: a save every {choice.interval} steps ({inputs})"
    return f"adaptive: one save per round (--save-interval {choice.interval}), as the seed: {choice.reason} ({inputs})"


def _short(source: str) -> str:
    return "(guess)" if source.startswith("guess") else "(measured)" if source.startswith("measured") else \
        "(learned)" if " 0 fault" not in source else "(prior)"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}GiB"


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
