"""The phase-aware stall verdict (issue 30): signals in, a verdict out. Pure: no I/O, no clock.

A slime step has phases, each with signals that a working trainer keeps moving:

- LOADING: from the launch to the first rollout activity (Megatron's init and checkpoint load,
  the SGLang engines' start, the first weight update). Signals: the trainer's log lines, ShopSim
  requests, SGLang's generated tokens.
- ROLLOUT: generation against SGLang and ShopSim, from a step's end (training's or a save's) to
  ``Timer train start`` (older logs: ``Timer actor_train start``). Signals: ShopSim requests
  (the service's request log growing), lease activity (``free_slots`` changing), SGLang's
  ``generation_tokens_total``, log lines.
- TRAINING: ``Timer train start`` to ``Timer actor_train end``: the log-prob passes, then the
  optimizer steps. Signals: the trainer's own log lines (each pass's timer lines, a line per
  optimizer step).
- SAVING: ``Timer save_model start`` to ``... end``. Signals: the checkpoint's bytes growing,
  log lines.

A log line matching the noise pattern (an access line of SGLang's server, ``GET /metrics``)
is no sign of life: in slime#1487 those lines went on for hours while training hung.

The verdict: a hang when the current phase's signals have all been still for longer than the
phase's quiet bound. The bound is learned from this campaign's own phases: ``factor`` x the
95th percentile of the longest still gap each finished phase had (so a phase whose only signal
is its end, a training without step lines, learns its whole duration), never below
``quiet_min``. Until a phase has ``min_samples`` finished instances the bound is the
conservative ``floor`` (LOADING: ``loading_floor``; it learns from one launch, as launches
are few). A phase whose signals keep moving is never called hung, however long it runs: a slow
ShopSim or a long generation is not a hang.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Phase(str, Enum):
    LOADING = "loading"
    ROLLOUT = "rollout"
    TRAINING = "training"
    SAVING = "saving"


class Marker(str, Enum):
    """What a trainer log line says about the phase (slime's own lines; see :data:`MARKERS`)."""

    TRAIN_START = "train_start"
    TRAIN_END = "train_end"
    SAVE_START = "save_start"
    SAVE_END = "save_end"


# slime's timer lines (slime/observability/timer.py: ``Timer {name} start`` / ``Timer {name}
# end``). Training starts at ``Timer train start`` (megatron_utils/actor.py ``train_actor``:
# the forward-only log-prob passes, ``Timer ref_log_probs`` and ``Timer log_probs``, come before
# ``Timer actor_train``, and nothing of a rollout moves during them); ``actor_train start`` is the
# last line slime#1487 printed before its hang.
MARKERS: tuple[tuple[str, Marker], ...] = (
    ("Timer train start", Marker.TRAIN_START),
    ("Timer actor_train start", Marker.TRAIN_START),
    ("Timer actor_train end", Marker.TRAIN_END),
    ("Timer save_model start", Marker.SAVE_START),
    ("Timer save_model end", Marker.SAVE_END),
)

# The signals each phase keeps moving while it works. Lease activity and tokens count in
# LOADING too: they are how a loading launch turns into a rollout.
SIGNALS: dict[Phase, frozenset[str]] = {
    Phase.LOADING: frozenset({"log_lines", "shopsim_requests", "leases", "tokens"}),
    Phase.ROLLOUT: frozenset({"log_lines", "shopsim_requests", "leases", "tokens"}),
    Phase.TRAINING: frozenset({"log_lines"}),
    Phase.SAVING: frozenset({"log_lines", "checkpoint_bytes"}),
}
# What ends LOADING: the first sign of a rollout.
ROLLOUT_SIGNALS = frozenset({"shopsim_requests", "leases", "tokens"})
KEEP = 50  # finished phases remembered per phase (the newest)


def markers_in(lines: Iterable[str]) -> list[Marker]:
    """The phase markers in ``lines``, in order."""
    out = []
    for line in lines:
        for text, marker in MARKERS:
            if text in line:
                out.append(marker)
                break
    return out


def p95(values: list[float]) -> float:
    """The 95th percentile, nearest rank (no interpolation: a bound is a value seen)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Bounds:
    """The verdict's knobs, in seconds (``[train]`` stall_* keys)."""

    factor: float = 3.0          # x p95 of a phase's learned longest still gap
    quiet_min: float = 300.0     # no learned bound is shorter
    floor: float = 1800.0        # a phase with fewer than min_samples finished instances
    loading_floor: float = 5400.0  # LOADING before any launch was seen (stall_factor x stall_min)
    min_samples: int = 3


@dataclass
class Learned:
    """Each phase's longest still gaps, newest last: what this campaign's steps taught."""

    gaps: dict[Phase, list[float]] = field(default_factory=lambda: {p: [] for p in Phase})

    def add(self, phase: Phase, gap: float) -> None:
        kept = self.gaps.setdefault(phase, [])
        kept.append(round(gap, 3))
        del kept[:-KEEP]

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "gaps": {p.value: list(v) for p, v in self.gaps.items()}}

    @classmethod
    def from_json(cls, doc: object) -> Learned:
        """Whatever the file holds: a malformed document teaches nothing (the floors apply)."""
        out = cls()
        gaps = doc.get("gaps") if isinstance(doc, dict) else None
        if not isinstance(gaps, dict):
            return out
        for phase in Phase:
            raw = gaps.get(phase.value)
            if isinstance(raw, list):
                vals = [float(v) for v in raw if isinstance(v, (int, float)) and not isinstance(v, bool)
                        and math.isfinite(v) and v >= 0]
                out.gaps[phase] = vals[-KEEP:]
        return out


def bound(phase: Phase, learned: Learned, bounds: Bounds) -> tuple[float, str]:
    """The phase's quiet bound and how it was set ("learned from N" or "floor")."""
    gaps = learned.gaps.get(phase, [])
    need = 1 if phase is Phase.LOADING else bounds.min_samples
    if len(gaps) >= need:
        return max(bounds.quiet_min, bounds.factor * p95(gaps)), f"learned from {len(gaps)}"
    return (bounds.loading_floor if phase is Phase.LOADING else bounds.floor), "floor"


@dataclass(frozen=True)
class Verdict:
    """A hang: the phase, how long its signals were still, the bound, and each signal's age."""

    phase: Phase
    quiet_s: float
    limit_s: float
    basis: str
    ages: dict[str, float | None]  # seconds since each signal last moved (None: never, this launch)

    def message(self) -> str:
        still = ", ".join(f"{k} {('never' if v is None else f'{v:.1f}s')}" for k, v in sorted(self.ages.items()))
        return (f"trainer hung in {self.phase.value}: no signal of that phase moved for {self.quiet_s:.1f}s "
                f"(limit {self.limit_s:.1f}s, {self.basis}; last moved: {still})")


class StallWatch:
    """One trainer launch's phases. Feed it :meth:`observe` at each poll; ask :meth:`verdict`."""

    def __init__(self, now: float, learned: Learned, bounds: Bounds, *, adopted: bool = False) -> None:
        self.learned, self.bounds = learned, bounds
        # A trainer adopted mid-flight (a daemon restart) may be in any phase: until a marker or
        # a rollout signal says which, the most lenient phase's bound applies, and the part of a
        # phase seen is not learned from.
        self.unknown = adopted
        self.phase = Phase.LOADING
        self.phase_start = now
        self.last_moved = now       # the current phase's last movement (its start counts)
        self.max_gap = 0.0          # the current phase's longest still gap so far
        self.values: dict[str, float] = {}
        self.moved_at: dict[str, float] = {}
        self.finished: list[tuple[Phase, float, float]] = []  # (phase, duration, longest gap)

    def observe(self, now: float, values: Mapping[str, float | None], markers: Iterable[Marker] = ()) -> None:
        """One poll: the signals' current values (counters or gauges; None: not watched) and the
        phase markers read since the last poll, in order. Returns nothing; the learned gaps grow
        as phases finish."""
        moved = set()
        for name, value in values.items():
            if value is None:
                continue
            if name in self.values and value != self.values[name]:
                moved.add(name)
                self.moved_at[name] = now
            self.values[name] = value
        for marker in markers:
            self._transition(now, _NEXT[marker])
        if self.phase is Phase.LOADING and moved & ROLLOUT_SIGNALS:
            self._transition(now, Phase.ROLLOUT)
        if moved & SIGNALS[self.phase]:
            self.max_gap = max(self.max_gap, now - self.last_moved)
            self.last_moved = now

    def _transition(self, now: float, to: Phase) -> None:
        if to is self.phase:
            return
        gap = max(self.max_gap, now - self.last_moved)
        if not self.unknown:
            self.learned.add(self.phase, gap)
            self.finished.append((self.phase, now - self.phase_start, gap))
        self.unknown = False
        self.phase, self.phase_start, self.last_moved, self.max_gap = to, now, now, 0.0

    def limit(self) -> tuple[float, str]:
        if self.unknown:
            return max((bound(p, self.learned, self.bounds) for p in Phase), key=lambda b: b[0])[0], "adopted"
        return bound(self.phase, self.learned, self.bounds)

    def verdict(self, now: float) -> Verdict | None:
        quiet = now - self.last_moved
        limit, basis = self.limit()
        if quiet <= limit:
            return None
        ages = {k: (round(now - self.moved_at[k], 3) if k in self.moved_at else None)
                for k in sorted(SIGNALS[self.phase]) if k in self.values}
        return Verdict(self.phase, round(quiet, 3), round(limit, 3), basis, ages)


_NEXT = {Marker.TRAIN_START: Phase.TRAINING, Marker.TRAIN_END: Phase.ROLLOUT,
         Marker.SAVE_START: Phase.SAVING, Marker.SAVE_END: Phase.ROLLOUT}


# -- SGLang's Prometheus /metrics -------------------------------------------------------------------

TOKEN_METRICS = ("sglang:generation_tokens_total", "sglang_generation_tokens_total")
RUNNING_METRICS = ("sglang:num_running_reqs", "sglang_num_running_reqs")


def parse_metrics(text: str) -> dict[str, float]:
    """The Prometheus text exposition's samples, summed over label sets: ``{name: value}``.
    Comments, blank lines and lines that do not parse are skipped (the engine's words, not ours)."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            close = rest.rfind("}")
            if close < 0:
                continue
            fields = rest[close + 1:].split()
        else:
            name, *fields = line.split()
        if not fields or not name:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def engine_signals(text: str) -> tuple[float | None, float | None]:
    """(generated tokens so far, running requests) from one /metrics answer; None when absent."""
    samples = parse_metrics(text)
    tokens = next((samples[n] for n in TOKEN_METRICS if n in samples), None)
    running = next((samples[n] for n in RUNNING_METRICS if n in samples), None)
    return tokens, running
