"""The terminal view of ``shoprld run`` and ``shoprld demo``, for a person (issue 18).

Three outputs, picked by :func:`terminal_mode`:

- ``json``: JSON lines, the machine's log. Whenever stdout is not a terminal, or systemd
  runs us (``JOURNAL_STREAM`` or ``INVOCATION_ID`` set): journald and pipes get data.
- ``dev``: structlog's console renderer, every event with every field (``--verbose``).
- ``compact``: this module. One line per state change, one per round result, warnings and
  errors on one line each, and ONE live line for TRAIN's progress (redrawn in place with a
  carriage return, never one line per step). Everything else is left to the log file.

The compact renderer is the last processor of the console handler's ProcessorFormatter: it
turns an event dict into a line, or into "" (dropped). Lines never wrap (cut to the terminal's
width) and floats are short (``0.252 s/step``, never ``0.25241874999``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from shoprld.daemon.foundation.system.units import human_duration, round_label

LIVE = "\r"  # a rendered line starting with this replaces the live progress line
# The run's fatal line: `shoprld run` prints it in full on stderr at exit (``final_message``),
# so the compact view does not show it twice, once cut to the terminal's width.
FINAL_EVENTS = frozenset({"campaign.failed", "stage.error"})
# A warning or error line ("12:00:00  ! ..."): wrapped by the terminal, never cut, since its
# end (the cause's line, the bundle's path) is the point of it.
_ALERT_LINE = re.compile(r"^\d\d:\d\d:\d\d  [!✗] ")


def terminal_mode(stream: TextIO, *, verbose: bool = False, environ: Mapping[str, str] = os.environ) -> str:
    """``json`` (not a TTY, or under systemd), ``dev`` (``--verbose`` on a TTY) or ``compact``."""
    if environ.get("JOURNAL_STREAM") or environ.get("INVOCATION_ID"):
        return "json"
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return "json"
    return "dev" if verbose else "compact"


@dataclass(frozen=True)
class Campaign:
    """What the compact view needs to number rounds and steps (events carry only indexes)."""

    rounds: int
    steps_per_round: int


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _bar(step: int, total: int, width: int = 20) -> str:
    frac = min(1.0, max(0.0, step / total)) if total > 0 else 0.0
    full = int(frac * width + 0.5)
    return "█" * full + "░" * (width - full)


class CompactRenderer:
    """A structlog processor: event dict -> one short line, ``LIVE + line``, or "" (dropped)."""

    def __init__(self, campaign: Campaign) -> None:
        self.c = campaign

    def _round(self, ev: Mapping[str, Any]) -> str:
        r = ev.get("round")
        return round_label(r, self.c.rounds) if isinstance(r, int) and not isinstance(r, bool) else ""

    def __call__(self, _logger: Any, _name: str, ev: dict[str, Any]) -> str:
        name = str(ev.get("event", ""))
        now = time.strftime("%H:%M:%S")
        if name == "transition":
            src = ev.get("src")
            came = f"  (from {src}, {ev.get('trigger')})" if src else f"  ({ev.get('trigger')})"
            return f"{now}  {self._round(ev)}  {ev.get('dst')}{came}"
        if name == "train.progress":
            step = ev.get("step") if isinstance(ev.get("step"), int) else 0
            total = self.c.steps_per_round
            s = ev.get("step_seconds")
            rate = ""
            eta = ""
            if isinstance(s, (int, float)) and s > 0:
                rate = f"  {s:.2f} s/step" if s >= 0.1 else f"  {1 / s:.1f} steps/s"
                eta = f"  ETA {human_duration(max(0, total - step) * s)}"
            return f"{LIVE}{now}  {self._round(ev)}  TRAIN {_bar(step, total)} {step}/{total}{rate}{eta}"
        if name == "round.done":
            val = ev.get("val")
            metric = ev.get("metric_name") or "val"
            dur = ev.get("duration_seconds")
            return (f"{now}  {self._round(ev)}  done: {metric} {_short(val) if val is not None else '-'}, "
                    f"gate {ev.get('gate') or '-'}, skillbank {ev.get('branch') or '-'}"
                    + (f", {human_duration(dur)}" if isinstance(dur, (int, float)) else ""))
        if name == "campaign.done":
            return f"{now}  campaign finished: {ev.get('reason')}"
        if name == "daemon.stopped":
            return f"{now}  stopped: {ev.get('reason')}"
        level = str(ev.get("level", "info"))
        if name in FINAL_EVENTS and level in ("error", "critical"):
            return ""  # `shoprld run` prints this message in full as its last line (stderr)
        if level in ("warning", "error", "critical"):
            detail = ev.get("message") or ev.get("error") or ev.get("reason") or ev.get("warning") or ""
            mark = "!" if level == "warning" else "✗"
            return f"{now}  {mark} {name}" + (f": {_short(detail)}" if detail else "")
        return ""


class CompactHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes the compact lines: drops empty ones, redraws the live line in place."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._live = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if not text:
                return
            width = max(40, shutil.get_terminal_size((100, 24)).columns - 1)
            if text.startswith(LIVE):
                line = text[len(LIVE):].replace("\n", " ")[:width]
                self.stream.write(f"\r\x1b[2K{line}")
                self._live = True
            else:
                prefix = "\r\x1b[2K" if self._live else ""
                self._live = False
                lines = [ln if _ALERT_LINE.match(ln) else ln[:width] for ln in text.splitlines()] or [""]
                self.stream.write(prefix + "\n".join(lines) + "\n")
            self.flush()
        except Exception:  # noqa: BLE001 - logging must never raise into the daemon
            self.handleError(record)

    def close(self) -> None:
        if self._live:  # leave the cursor on a fresh line
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._live = False
        super().close()
