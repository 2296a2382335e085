"""GPU hygiene when NVML's pids are not ours to see: the "container" mode.

In a Docker container without ``--pid=host`` (an AutoDL instance), NVML and ``nvidia-smi
--query-compute-apps`` report the host's pids. None of them is a process of this ``/proc``
(or one that is, by chance of numbering, holds no GPU), so matching pids would call every
holder foreign, and a stage's orphaned SGLang scheduler would block the next stage until
``gpus.free_timeout``. :func:`detect_mode` tells the two cases apart; in container mode
:func:`make_free_container` works from our side instead:

- **ours** are found by their open GPU device files (``/proc/<pid>/fd`` links to
  ``/dev/nvidia<N>`` together with ``/dev/nvidia-uvm``, which every CUDA context opens and an
  NVML-only reader such as Ray's dashboard agent does not), among this campaign's tagged
  processes and its Ray head's session (:class:`~.gpus.Owners`). Live ones are kept,
  stragglers stopped exactly as in host mode. A zombie counts as gone (PID 1 of a container
  does not reap).
- **free** is judged by memory: NVML's listed processes on the visible GPUs hold at most
  ``gpus.free_memory`` in total, once our stragglers are gone. A live child of ours (a parked
  val server) holds memory under a host pid we cannot map, so the largest listed holders, one
  per live holder of ours, are taken as its own.
- **the rest** is named in one line by host pid and memory, never touched.

The device-file prefix is a parameter so that tests use nodes made in a temp dir.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from shoprld.daemon.foundation.system.proctable import pids
from shoprld.daemon.services.gpuprobes import MIB, GpuProbe, GpuProbeError, GpuProcess
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.services.processes import pid_alive

DEV_PREFIX = "/dev/nvidia"
Mode = Literal["host", "container"]


@dataclass(frozen=True)
class DeviceFds:
    """The GPU device files a process has open."""

    minors: frozenset[int]  # N of each /dev/nvidia<N>
    uvm: bool               # /dev/nvidia-uvm: a CUDA context, not only NVML

    @property
    def cuda(self) -> bool:
        return bool(self.minors) and self.uvm


def device_fds(pid: int, dev_prefix: str = DEV_PREFIX) -> DeviceFds | None:
    """The ``dev_prefix<N>`` and ``dev_prefix-uvm`` files ``pid`` has open; None when its fds
    cannot be read (another user's process, or gone)."""
    gpu = re.compile(re.escape(dev_prefix) + r"(\d+)")
    minors: set[int] = set()
    uvm = False
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in entries:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if m := gpu.fullmatch(target):
            minors.add(int(m.group(1)))
        elif target == f"{dev_prefix}-uvm":
            uvm = True
    return DeviceFds(frozenset(minors), uvm)


def detect_mode(found: Sequence[GpuProcess], dev_prefix: str = DEV_PREFIX) -> Mode:
    """"host" when a listed pid is a process here that holds a GPU device file (or whose files
    we may not read: another user's, then judged as in host mode); "container" when none of the
    listed pids is such a process. Nothing listed: "host" (nothing to tell apart)."""
    for pid in {p.pid for p in found}:
        if not pid_alive(pid):
            continue
        fds = device_fds(pid, dev_prefix)
        if fds is None or fds.minors:
            return "host"
    return "container" if found else "host"


def cuda_pids(role_of: Callable[[int], str | None], dev_prefix: str = DEV_PREFIX) -> list[tuple[int, str, int]]:
    """(pid, role, GPU device minor) of each process here that ``role_of`` calls ours and that
    holds a CUDA context. The minor is of the first ``/dev/nvidia<N>`` it holds (not always
    nvidia-smi's index: shown, never used to filter)."""
    out: list[tuple[int, str, int]] = []
    for pid in pids():
        role = role_of(pid)
        if role is None or not pid_alive(pid):
            continue
        fds = device_fds(pid, dev_prefix)
        if fds is not None and fds.cuda:
            out.append((pid, role, min(fds.minors)))
    return out


def on_visible(found: Sequence[GpuProcess], visible: Sequence[int]) -> list[GpuProcess]:
    return [p for p in found if p.gpu is None or p.gpu in visible]


def split_memory(found: Sequence[GpuProcess], n_live: int) -> tuple[list[GpuProcess], list[GpuProcess]]:
    """(taken as our live holders', the rest): the ``n_live`` largest listed pids are ours."""
    by_pid: dict[int, list[GpuProcess]] = {}
    for p in found:
        by_pid.setdefault(p.pid, []).append(p)

    def size(entries: list[GpuProcess]) -> int:
        return sum(e.used_bytes or 0 for e in entries)

    ranked = sorted(by_pid.values(), key=size, reverse=True)
    return ([e for es in ranked[:n_live] for e in es], [e for es in ranked[n_live:] for e in es])


def held_bytes(procs: Sequence[GpuProcess]) -> int | None:
    """Their memory in total; None when the driver gives no number for one of them."""
    if any(p.used_bytes is None for p in procs):
        return None
    return sum(p.used_bytes or 0 for p in procs)


def _mem(used: int | None) -> str:
    return "memory n/a" if used is None else human_bytes(used)


def failure_line(rest: Sequence[GpuProcess], survivors: Sequence[str], *, timeout: float, stage: str,
                 allowed: int) -> str:
    """ONE line: the host pids still holding memory (not ours), our survivors, and the fix."""
    parts = []
    if rest:
        per_pid: dict[int, list[GpuProcess]] = {}
        for p in rest:
            per_pid.setdefault(p.pid, []).append(p)
        named = [f"host pid {pid} ({_mem(held_bytes(es))}, GPU "
                 f"{','.join(str(e.gpu) if e.gpu is not None else e.uuid or '?' for e in es)})"
                 for pid, es in list(per_pid.items())[:4]]
        if len(per_pid) > 4:
            named.append(f"and {len(per_pid) - 4} more")
        total = held_bytes(rest)
        parts.append(f"GPU memory still held ({_mem(total)} > gpus.free_memory {allowed // MIB} MiB) by "
                     f"{', '.join(named)}, not ours (NVML lists host pids here; no process of ours holds them)")
    if survivors:
        parts.append("ours still alive: " + ", ".join(survivors[:4]))
    gpus = sorted({str(p.gpu) for p in rest if p.gpu is not None})
    fix = ("end them from the host or the instance's console (shoprld never stops a process that is not its own)"
           if rest else "the process ignored SIGKILL (stuck in the driver): reset or reboot the GPU")
    where = f", or take GPU {','.join(gpus)} out of gpus.visible" if rest and gpus else ""
    return (f"container mode: {'; '.join(parts)} after {timeout:.0f} s (gpus.free_timeout), before the {stage} "
            f"starts; fix: {fix}{where}")


def as_dict(p: GpuProcess) -> dict[str, object]:
    return {"host_pid": p.pid, "gpu": p.gpu, "uuid": p.uuid,
            "used_mib": None if p.used_bytes is None else round(p.used_bytes / MIB)}


def mode_line(probe: GpuProbe, dev_prefix: str = DEV_PREFIX) -> str:
    """``check``'s one line: which hygiene mode applies on this machine now."""
    try:
        found = probe.compute_apps()
    except GpuProbeError as exc:
        return f"GPU hygiene: the probe failed ({exc}); stages go on as without GPUs"
    if found is None:
        return f"GPU hygiene: no GPU or NVML here (probe {probe.name}): nothing to check"
    if not found:
        return (f"GPU hygiene: no compute process on the GPUs now (probe {probe.name}); host pids or container "
                "mode is decided at each GPU stage")
    n = len({p.pid for p in found})
    if detect_mode(found, dev_prefix) == "host":
        return f"GPU hygiene: host pids match: NVML's pids are processes here ({n} listed, probe {probe.name})"
    return (f"GPU hygiene: container: pids from NVML are host pids ({n} listed, none a GPU process here); "
            f"holders found by their {dev_prefix}* fds, free judged by memory used (probe {probe.name})")


__all__ = ["DEV_PREFIX", "DeviceFds", "Mode", "as_dict", "cuda_pids", "detect_mode", "device_fds", "failure_line",
           "held_bytes", "mode_line", "on_visible", "split_memory"]
