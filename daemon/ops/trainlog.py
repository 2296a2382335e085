"""The trainer's per-step metrics, read from a round's TRAIN log for ``shoprld report``.

What slime writes (THUDM/slime, ``slime/observability/``; SHOPSIMRL.md and the contract's §10.5):
every process logs ``[YYYY-mm-dd HH:MM:SS] <file>.py:<line> - <message>``, and the messages that
carry metrics are

- ``perf <rollout_id>: {...}`` (the rollout manager after generation: ``rollout/*`` and
  ``perf/*`` keys; the train actor: ``perf/*_time``, ``perf/step_time``),
- ``rollout <rollout_id>: {...}`` (the train actor's data-parallel source rank: ``rollout/*``),
- ``eval <rollout_id>: {...}`` (``eval/*``),
- ``step <n>: {...}`` and ``<role>-step <n>: {...}`` per optimizer step (``train/*``; ``n`` is
  the accumulated step, ``rollout_id * steps_per_rollout + step``, not a rollout id).

The ``{...}`` is Python's ``repr`` of a dict (single quotes; ``nan``/``inf``; newer NumPy
prints ``np.float64(0.5)``), or JSON in the stand-in trainer (``run/demo/slime_train.py``).
Through ``ray job submit`` the lines also carry Ray's ``(ActorClass pid=N)`` prefix.

So the parser is a scanner, not an evaluator: it finds the message anywhere in the line, then
takes every ``'key': <number>`` pair in the dict text (a number, or one wrapped in a call such
as ``np.float64(...)``/``tensor(...)``); keys are restricted to the characters metric names use
(so a key never carries markup or matplotlib's mathtext ``$``). Anything else (a string value,
a list, a torn line, binary garbage) is ignored: any bytes at all give a result or nothing,
never an exception. Lines are read in bounded chunks, so a log with no newline in a gigabyte
costs no more memory than :data:`MAX_LINE`. Standard library only.

A rollout or step logged twice (a trainer restarted from its last checkpoint re-does the
rollouts after it) keeps its last value: that is the run that counted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

MAX_LINE = 256 * 1024  # longer lines (no slime metric line is near this) are skipped whole
MAX_KEYS = 200  # metric names kept per round; more are counted, not kept
MAX_POINTS = 200_000  # points kept per round (a 100k-rollout log stays bounded)
CHUNK = 1 << 20
# Larger magnitudes are dropped: no metric slime logs comes near, and matplotlib cannot put ticks
# on a span of 1e308 (a hand-made or corrupted line must not cost the report).
VALUE_MAX = 1e15

# ` - perf 6: {`, ` - critic-step 12: {` (the message after slime's `file.py:line - `).
_MESSAGE = re.compile(rb"(?:^|\s)-\s+(?:[A-Za-z_]{1,20}-)?(perf|rollout|eval|step)\s+(\d{1,12}):\s*\{")
_KEY = r"[A-Za-z0-9_./@:+\-]{1,120}"
_NUMBER = r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf|Infinity)"
# 'key': 0.5 | "key": 0.5 | 'key': np.float64(0.5) | 'key': tensor(0.5, device='cuda:0')
_PAIR = re.compile(rf"""(["'])({_KEY})\1\s*:\s*(?:[A-Za-z_][A-Za-z0-9_.]{{0,40}}\(\s*)?({_NUMBER})(?![\w.])""")
# Counters, not curves: the step keys slime adds for W&B, the stand-in's rollout total.
NOT_CURVES = frozenset({"rollout/step", "train/step", "eval/step", "rollout/num_rollout"})
# Which kind of x a message's number is.
X_ROLLOUT, X_STEP = "rollout", "step"


def parse_line(line: bytes) -> tuple[str, int, dict[str, float]] | None:
    """``(x kind, x, {metric: value})`` of one slime metric line, or None when it is not one.

    ``x kind`` is :data:`X_STEP` for ``step N`` lines (an optimizer step), else
    :data:`X_ROLLOUT`. Only finite values within ±:data:`VALUE_MAX` are kept; counters
    (:data:`NOT_CURVES`) are dropped."""
    if len(line) > MAX_LINE:
        return None
    m = _MESSAGE.search(line)
    if m is None:
        return None
    kind = X_STEP if m.group(1) == b"step" else X_ROLLOUT
    x = int(m.group(2))
    body = line[m.end() - 1:].decode("utf-8", errors="replace")
    values: dict[str, float] = {}
    for pm in _PAIR.finditer(body):
        key = pm.group(2)
        if key in NOT_CURVES:
            continue
        try:
            v = float(pm.group(3))
        except ValueError:  # the regex admits only float() spellings; belt and braces
            continue
        if math.isfinite(v) and abs(v) <= VALUE_MAX:
            values[key] = v
    if not values:
        return None
    return kind, x, values


def iter_lines(fh: BinaryIO, max_line: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[bytes]:
    """The file's lines (without the newline), reading ``chunk`` bytes at a time; a line longer
    than ``max_line`` is dropped whole, without ever holding more than about ``max_line + chunk``."""
    rest = b""
    skipping = False
    while True:
        block = fh.read(chunk)
        if not block:
            break
        parts = (rest + block).split(b"\n")
        rest = parts.pop()
        for i, line in enumerate(parts):
            if i == 0 and skipping:
                skipping = False
                continue
            yield line
        if len(rest) > max_line:
            rest, skipping = b"", True
    if rest and not skipping:
        yield rest


@dataclass
class Curves:
    """One round's metrics: ``{metric: {x: value}}`` for rollout-indexed and step-indexed lines."""

    rollout: dict[str, dict[int, float]] = field(default_factory=dict)
    step: dict[str, dict[int, float]] = field(default_factory=dict)
    lines: int = 0  # metric lines read
    dropped_keys: int = 0  # metric names over MAX_KEYS
    dropped_points: int = 0  # points over MAX_POINTS

    def keys(self) -> set[str]:
        return set(self.rollout) | set(self.step)

    def points(self) -> int:
        return sum(len(v) for v in self.rollout.values()) + sum(len(v) for v in self.step.values())


def read_curves(path: Path) -> Curves | None:
    """The metrics of one TRAIN log; None when the file cannot be opened (no log yet)."""
    try:
        fh = open(path, "rb")
    except OSError:
        return None
    out = Curves()
    points = 0
    with fh:
        try:
            for line in iter_lines(fh):
                if b": {" not in line and b":{" not in line:
                    continue  # the cheap test: most lines of a real log are not metric lines
                found = parse_line(line)
                if found is None:
                    continue
                kind, x, values = found
                out.lines += 1
                table = out.step if kind == X_STEP else out.rollout
                for key, v in values.items():
                    series = table.get(key)
                    if series is None:
                        if len(out.rollout) + len(out.step) >= MAX_KEYS:
                            out.dropped_keys += 1
                            continue
                        series = table[key] = {}
                    if x not in series:
                        if points >= MAX_POINTS:
                            out.dropped_points += 1
                            continue
                        points += 1
                    series[x] = v
        except OSError:
            pass  # a log that vanished mid-read (retention): what was read is shown
    return out
