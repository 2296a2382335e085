"""Megatron's async save as the trainer's command asks for it, and the line that says it is off.

slime (``--async-save``, passed through to Megatron) saves a checkpoint in the background: the
save blocks training only for its planning and the device-to-host copy, then a worker writes the
shards. Megatron keeps it only with ``--use-persistent-ckpt-worker``: otherwise its
``validate_args`` warns "--async-save is not supported without --use-persistent-ckpt-worker.
Disabling --async-save." and every save is synchronous (megatron/training/arguments.py, the
``if args.use_dist_ckpt and args.async_save`` block). slime parses its arguments with unknown
ones ignored, so a misspelt flag is silent too; slime since 8f732538 (2026-06) sets the worker
itself (``_set_default_megatron_args``), older slime does not. So the flags are checked where
they are written (``shoprld check``: :func:`command_line`) and where they take effect (TRAIN reads
the trainer's log for Megatron's line: :func:`log_says_disabled`, journaled as
``train.async_save_disabled``; the save-interval model then stops counting the async lag).

The placeholders give the flags only to a launch that saves inside the round (:func:`pays_off`).
slime forces a launch's last save synchronous (``train.py``: ``force_sync`` at the last rollout),
so a launch whose one save is the round's final would pay an async save's FIRST save in full:
the process's first async save sets up the worker and its host buffers. Measured on one H100
(megatron-core 0.19.2, ``run/gpu-smoke/results/saves-h100-2026-12-05.jsonl``), at 53 GB by a line
through 8.07 and 27.4 GB: a first async save takes 98.5 s in full (47.3 s of it blocking), a sync
save 61.8 s; a later async save blocks 1.2 s and takes 45.1 s in full.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

ASYNC_FLAG = "--async-save"
WORKER_FLAG = "--use-persistent-ckpt-worker"
PLACEHOLDERS = {"{async_save}": ASYNC_FLAG, "{async_save_worker}": WORKER_FLAG}
DISABLED = b"Disabling --async-save"
# Megatron prints it while it validates its arguments, before the model loads: the head of the
# launch's log is enough (a Ray job's log can be tens of MiB later on).
HEAD_BYTES = 8 << 20

State = Literal["on", "off", "no_worker"]


def pays_off(enabled: bool, interval: int, steps_per_round: int) -> bool:
    """Whether ``{async_save}`` and ``{async_save_worker}`` give the flags to a launch whose
    ``--save-interval`` is ``interval``: ``saves.async_save`` is on and the interval fires inside
    the round (a launch with one save would pay a first async save, slower than a sync one)."""
    return enabled and 0 < interval < steps_per_round


def flags_state(command: Sequence[str], enabled: bool) -> State:
    """What the trainer's argv template asks Megatron for: ``on`` (both flags), ``off`` (no
    ``--async-save``), ``no_worker`` (``--async-save`` alone: Megatron disables it). The two
    placeholders count only when ``saves.async_save`` is on (else they are left out)."""
    words = set()
    for arg in command:
        if arg in PLACEHOLDERS:
            if enabled:
                words.add(PLACEHOLDERS[arg])
        else:
            words.add(arg)
    if ASYNC_FLAG not in words:
        return "off"
    return "on" if WORKER_FLAG in words else "no_worker"


def command_line(command: Sequence[str], enabled: bool) -> str:
    """One line for ``shoprld check``: what the saves will be, and the fix when the flags disagree."""
    state = flags_state(command, enabled)
    if state == "on":
        return (f"async saves: on ({ASYNC_FLAG} {WORKER_FLAG}) for launches that save mid-round; a mid-round "
                f"save blocks only for its copy, its tracker lands when the next save starts; TRAIN warns if "
                f"Megatron disables it")
    if state == "no_worker":
        return (f"warning: train.command passes {ASYNC_FLAG} without {WORKER_FLAG}: Megatron disables async "
                f"saves (\"Disabling --async-save\") unless slime sets the worker itself; fix: add "
                f"\"{{async_save_worker}}\" (or {WORKER_FLAG}) after {ASYNC_FLAG} in train.command")
    return (f"async saves: off (train.command has no {ASYNC_FLAG}; saves.async_save = {str(enabled).lower()}): "
            f"every save blocks training for its whole write")


def log_says_disabled(log: Path, offset: int) -> bool:
    """Whether the launch's log (from ``offset``, its header) has Megatron's disabling line."""
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            return DISABLED in fh.read(HEAD_BYTES)
    except OSError:
        return False
