"""What TRAIN reads, at each poll, for the phase-aware stall verdict (daemon/round/stall.py).

Each signal is what a working trainer keeps moving, read from where a real deployment has it:

- ``log_lines``: the trainer's own lines in the stage log (``train.stall_line_pattern``, minus
  ``train.stall_noise_pattern``: SGLang's access lines are not the trainer's progress, and the
  sidecar's lines in the same log do not match slime's format);
- ``shopsim_requests``: the size of ShopSim's request log (``shop_agent.log``: the service
  appends a line per request);
- ``leases``: ShopSim's ``free_slots``, as the supervisor last read it (no extra request);
- ``tokens``: SGLang's ``generation_tokens_total`` from ``train.engine_metrics_url``;
- ``checkpoint_bytes``: the bytes of the newest ``iter_*`` dir in the save dir.

A signal that cannot be read is None (not watched), never a zero: an unreadable log is no
evidence of a hang. GPU activity is not a signal here: the probes report memory per process,
which a deadlocked collective keeps as a working one does, and a hung NCCL collective spins its
GPUs at 100 % utilisation (see the README's stall section).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from shoprld.daemon.foundation.config.configsections import TrainSection
from shoprld.daemon.foundation.records.store import replace_json
from shoprld.daemon.round.stall import Bounds, Learned, Marker, StallWatch, Verdict, engine_signals, markers_in

ITER_PREFIX = "iter_"


def checkpoint_bytes(save_dir: Path) -> float | None:
    """The bytes of the newest ``iter_*`` dir (by name: Megatron's zero-padded iteration), its
    files and one level of subdirs; None when there is none."""
    try:
        names = [e.name for e in os.scandir(save_dir)
                 if e.name.startswith(ITER_PREFIX) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    if not names:
        return None
    newest = save_dir / max(names)
    total = 0
    try:
        for entry in os.scandir(newest):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
            elif entry.is_dir(follow_symlinks=False):
                for sub in os.scandir(entry.path):
                    if sub.is_file(follow_symlinks=False):
                        total += sub.stat(follow_symlinks=False).st_size
    except OSError:
        return None
    return float(total) + len(names)  # a new iter dir moves the signal too


def file_size(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return float(os.stat(path).st_size)
    except OSError:
        return None


class TrainSignals:
    """One launch's readings. ``lines(text)`` takes each chunk of the stage log TRAIN reads
    anyway; ``poll()`` reads the rest."""

    def __init__(self, *, line_pattern: str, noise_pattern: str, save_dir: Path, request_log: Path | None,
                 engine_url: str | None, http: httpx.AsyncClient | None) -> None:
        self.line_re, self.noise_re = re.compile(line_pattern), re.compile(noise_pattern)
        self.save_dir, self.request_log = save_dir, request_log
        self.engine_url, self.http = engine_url, http
        self.log_lines = 0
        self.running: float | None = None  # the engines' running requests (evidence only)

    def lines(self, text: str) -> list[Marker]:
        """Count the trainer's lines of life in ``text``; return the phase markers among them."""
        mine = [ln for ln in text.splitlines() if self.line_re.search(ln) and not self.noise_re.search(ln)]
        self.log_lines += len(mine)
        return markers_in(mine)

    async def poll(self, free_slots: int | None) -> dict[str, float | None]:
        tokens = None
        if self.engine_url and self.http is not None:
            try:
                r = await self.http.get(self.engine_url, timeout=2.0)
                if r.status_code == 200:
                    tokens, self.running = engine_signals(r.text)
            except (httpx.HTTPError, OSError):
                tokens = None
        return {"log_lines": float(self.log_lines), "shopsim_requests": file_size(self.request_log),
                "leases": None if free_slots is None else float(free_slots), "tokens": tokens,
                "checkpoint_bytes": checkpoint_bytes(self.save_dir)}


class PhaseWatch:
    """One trainer launch under the phase-aware verdict: the signals read, the verdict kept (with
    what this campaign's earlier phases taught, in ``learned_file``), each finished phase logged."""

    def __init__(self, cfg: TrainSection, *, now: float, learned_file: Path, save_dir: Path, request_log: Path | None,
                 http: httpx.AsyncClient | None, adopted: bool) -> None:
        bounds = Bounds(factor=cfg.stall_phase_factor, quiet_min=cfg.stall_quiet_min, floor=cfg.stall_min,
                        loading_floor=cfg.stall_factor * cfg.stall_min, min_samples=cfg.stall_min_samples)
        self.learned_file = learned_file
        self.watch = StallWatch(now, Learned.from_json(read_learned(learned_file)), bounds, adopted=adopted)
        self.signals = TrainSignals(line_pattern=cfg.stall_line_pattern, noise_pattern=cfg.stall_noise_pattern,
                                    save_dir=save_dir, request_log=request_log, engine_url=cfg.engine_metrics_url,
                                    http=http)

    async def poll(self, text: str, now: float, free_slots: int | None,
                   emit: Callable[..., Any]) -> Verdict | None:
        """One poll: ``text`` is the stage log's new lines. Returns the verdict, if a hang."""
        markers = self.signals.lines(text)
        finished = len(self.watch.finished)
        self.watch.observe(now, await self.signals.poll(free_slots), markers)
        for phase, took, gap in self.watch.finished[finished:]:
            emit("train.phase", phase=phase.value, seconds=round(took, 3), longest_still_s=round(gap, 3))
        if len(self.watch.finished) > finished:
            replace_json(self.learned_file, self.watch.learned.to_json())  # a cache: no fsync
        return self.watch.verdict(now)

    def rearm(self, now: float) -> None:
        """After an alert-only verdict: the next one only after another whole bound."""
        self.watch.last_moved = now


def read_learned(path: Path) -> object:
    """The learned bounds' document, or None (absent, not a regular file, not JSON: the floors
    apply until the campaign's phases teach them again)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
