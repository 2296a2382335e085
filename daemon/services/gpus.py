"""GPU hygiene between stages: no GPU stage starts on GPUs an earlier stage left taken.

slime's rollout engines and SGLang's schedulers can outlive their job (upstream stops the
whole Ray cluster by name around every job, and notes orphaned schedulers; shoprld stops only
processes it can prove are its own). A trainer or val
server started next to such a straggler runs out of GPU memory, or worse, shares the GPU
and runs slowly all night. So before a GPU stage starts (the trainer in TRAIN, the val server
in VAL or GATE), :func:`ensure_free` looks at the visible GPUs (``gpus.visible``, nvidia-smi's
indices, the ids the children get as ``CUDA_VISIBLE_DEVICES``) and sorts every compute
process on them into one of three kinds:

- **live**: ours, and it belongs to a child of this campaign that is running now (a parked
  val server with ``val.reuse_server``). Left alone, and it does not block.
- **straggler**: ours, and no live child owns it. Stopped: SIGTERM, ``gpus.straggler_grace``,
  then SIGKILL, to its whole process group when every member of the group is ours too,
  otherwise to the pid alone. Never by name.
- **foreign**: anything else. Never touched; it blocks, and it is named in the failure line.

"Ours" is decided from the kernel's records, never from a name:

- its environment carries ``SHOPRLD_CHILD=<state_dir>|<role>``. Every child the engine starts
  gets that tag, and its descendants inherit it whatever session or group they move to
  (torchrun's ranks, SGLang's schedulers, a stage's orphaned grandchildren). The role says
  which child it came from, and so whether that child is live; or
- its session is the one of the Ray head this campaign started (``<ray_tmp>/shoprld-head.json``):
  Ray's workers keep the head's session, but a Ray job's environment carries no tag.

A process whose environment cannot be read (another user's) is foreign. Then the wait:
until no straggler or foreign process holds a visible GPU, at most ``gpus.free_timeout``
seconds (the stop's grace counts within it). Journal events: ``gpu.wait`` (what was found),
``gpu.straggler_stopped`` (one per pid: the signal that ended it), ``gpu.free`` (the wait, in
seconds). When the GPUs are still taken, the caller gets ONE line naming each pid, its GPU,
its memory and whose it is, and the stage retries under its policy, then fails (exit 6).

How to look is the :class:`GpuProbe` seam (:mod:`.gpuprobes`, re-exported here): NVML, else
``nvidia-smi --query-compute-apps``, else nothing (no driver: the demo and CI), chosen by
``gpus.probe``.

In a container (AutoDL: Docker without ``--pid=host``) NVML lists the host's pids, which this
``/proc`` does not have. :mod:`.gpucontainer` detects that; then ours are found by their open
``/dev/nvidia*`` files (``gpus.devices``) among the tagged processes and the Ray head's session,
and "free" is judged by the memory the listed processes hold (``gpus.free_memory``), not by
their pids; the rest is named by host pid and memory. A zombie counts as gone in both modes.

This module imports only the standard library, anyio and :mod:`.processes` at load time, so a
GPU machine's bare Python can run it (``tests/gpu/hygiene_h200.py``).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.to_thread

from shoprld.daemon.foundation.system.proctable import environ, group_pids
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.services import gpucontainer
from shoprld.daemon.services.gpuprobes import (
    MIB, AutoProbe, GpuProbe, GpuProbeError, GpuProcess, NoProbe, NvmlProbe, SmiProbe, build_probe, parse_compute_apps,
    parse_gpu_indices,
)
from shoprld.daemon.services.processes import CHILD_TAG, ChildHost, pid_alive, proc_start_ticks

if TYPE_CHECKING:
    from shoprld.daemon.round.plan import RoundPlan  # the round layer sits above: for typing only

_POLL_S = 0.5


# -- whose is it --------------------------------------------------------------------------------
Kind = Literal["live", "straggler", "foreign", "exited"]


@dataclass(frozen=True)
class Owners:
    """How to tell this campaign's processes: its tag prefix, and its Ray head's session."""

    tag_prefix: str        # "<state_dir>|": SHOPRLD_CHILD values of this campaign start with it
    ray_sid: int | None = None

    @classmethod
    def of(cls, state_dir: Path | str, ray_sid: int | None = None) -> Owners:
        return cls(f"{state_dir}|", ray_sid)

    def role_of(self, pid: int) -> str | None:
        """The child role ``pid`` came from ("ray" for the Ray head's session), or None if not ours."""
        if pid <= 1 or pid == os.getpid():
            return None
        want = f"{CHILD_TAG}={self.tag_prefix}".encode()
        for item in environ(pid):  # empty when gone, or not ours to read
            if item.startswith(want):
                return item[len(want):].decode(errors="replace") or "?"
        if self.ray_sid is not None and self.ray_sid > 1:
            try:
                if os.getsid(pid) == self.ray_sid:
                    return ChildRole.RAY
            except OSError:
                pass
        return None


@dataclass(frozen=True)
class Holder:
    """A process on a visible GPU, and what hygiene makes of it."""

    proc: GpuProcess
    kind: Kind
    role: str   # the child role it came from ("" when foreign)
    comm: str   # /proc/<pid>/comm, for the operator ("?" when not visible here)

    def as_dict(self) -> dict[str, Any]:
        used = self.proc.used_bytes
        return {"pid": self.proc.pid, "gpu": self.proc.gpu, "uuid": self.proc.uuid, "comm": self.comm,
                "used_mib": None if used is None else round(used / MIB), "kind": self.kind, "role": self.role}

    def phrase(self, survived: bool = False) -> str:
        """``pid 1234 (python, 20.1 GiB, not ours)``."""
        used = self.proc.used_bytes
        mem = "memory n/a" if used is None else human_bytes(used)
        whose = ("not ours" if self.kind == "foreign" else "exited, its memory not yet released"
                 if self.kind == "exited" else f"ours: {self.role}" + (", survived SIGKILL" if survived else ""))
        return f"pid {self.proc.pid} ({self.comm}, {mem}, {whose})"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "?"
    except OSError:
        return "?"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def classify(procs: Iterable[GpuProcess], *, visible: Sequence[int], owners: Owners,
             is_live: Callable[[str], bool]) -> list[Holder]:
    """The processes on the visible GPUs (one per pid), each sorted as live, straggler or foreign.

    A process on a GPU with no known index is kept (conservatively: it may be on ours). A zombie
    here is "exited": nothing to stop (a container's PID 1 does not reap), and it blocks only
    while the driver still lists its memory (measured: about 0.5 s after the exit on an H200)."""
    seen: set[int] = set()
    out: list[Holder] = []
    for p in procs:
        if p.pid in seen or (p.gpu is not None and p.gpu not in visible):
            continue
        seen.add(p.pid)
        role = owners.role_of(p.pid)
        if _zombie(p.pid):
            kind: Kind = "exited"
        elif role is None:
            kind = "foreign"
        elif role != ChildRole.RAY and is_live(role):
            kind = "live"
        else:
            kind = "straggler"
        out.append(Holder(p, kind, role or "", _comm(p.pid)))
    return out


# -- stopping what is ours ----------------------------------------------------------------------
def _targets(pid: int, owners: Owners, is_live: Callable[[str], bool]) -> tuple[str, int]:
    """("group", pgid) when every member of pid's group is a straggler of ours, else ("pid", pid)."""
    try:
        pgid = os.getpgid(pid)
    except OSError:
        return "pid", pid
    if pgid <= 1 or pgid == os.getpgrp():
        return "pid", pid
    for member in group_pids(pgid):
        role = owners.role_of(member)
        if role is None or (role != ChildRole.RAY and is_live(role)):
            return "pid", pid
    return "group", pgid


def _send(target: tuple[str, int], sig: int) -> None:
    try:
        if target[0] == "group":
            os.killpg(target[1], sig)
        else:
            os.kill(target[1], sig)
    except (ProcessLookupError, PermissionError):
        pass


def _target_alive(target: tuple[str, int], pid: int, ticks: int | None) -> bool:
    if pid_alive(pid, ticks):
        return True
    return target[0] == "group" and any(pid_alive(m) for m in group_pids(target[1]))


async def stop_stragglers(stragglers: Sequence[Holder], *, owners: Owners, is_live: Callable[[str], bool],
                          grace: float, emit: Callable[..., None]) -> set[int]:
    """SIGTERM, ``grace`` seconds, SIGKILL: to each straggler's group when all of it is ours,
    else to the pid alone. Shielded, so a cancelled caller leaves none half-stopped. Returns
    the pids still alive after the SIGKILL (a process stuck in the kernel)."""
    with anyio.CancelScope(shield=True):
        todo = []
        for h in stragglers:
            ticks = proc_start_ticks(h.proc.pid)
            if ticks is None:
                continue  # already gone
            # Decided again here, just before the signal: never on a pid that is no longer ours.
            if owners.role_of(h.proc.pid) is None:
                continue
            todo.append((h, ticks, _targets(h.proc.pid, owners, is_live)))
        for _, _, target in todo:
            _send(target, signal.SIGTERM)
        with anyio.move_on_after(grace):
            while any(_target_alive(t, h.proc.pid, ticks) for h, ticks, t in todo):
                await anyio.sleep(0.05)
        killed = []
        for h, ticks, target in todo:
            if _target_alive(target, h.proc.pid, ticks):
                _send(target, signal.SIGKILL)
                killed.append(h.proc.pid)
        with anyio.move_on_after(5.0):
            while any(pid_alive(h.proc.pid, ticks) for h, ticks, _ in todo):
                await anyio.sleep(0.05)
        left = set()
        for h, ticks, target in todo:
            alive = pid_alive(h.proc.pid, ticks)
            if alive:
                left.add(h.proc.pid)
            emit("gpu.straggler_stopped", **h.as_dict(), signal="SIGKILL" if h.proc.pid in killed else "SIGTERM",
                 target=f"{target[0]} {target[1]}", alive=alive)
        return left


# -- the wait -----------------------------------------------------------------------------------
def failure_line(blocking: Sequence[Holder], *, timeout: float, stage: str, survivors: set[int]) -> str:
    """ONE line: each pid, its GPU, its memory and whose it is, and the fix."""
    parts = [f"GPU {h.proc.gpu if h.proc.gpu is not None else h.proc.uuid or '?'} still holds "
             f"{h.phrase(survived=h.proc.pid in survivors)}" for h in blocking[:4]]
    if len(blocking) > 4:
        parts.append(f"and {len(blocking) - 4} more")
    foreign = any(h.kind == "foreign" for h in blocking)
    gpus = sorted({str(h.proc.gpu) for h in blocking if h.proc.gpu is not None})
    fix = ("end it (shoprld never stops a process that is not its own)" if len(blocking) == 1 else
           "end them (shoprld never stops a process that is not its own)") if foreign else \
        ("the driver still holds an exited process's memory: wait, or reset the GPU"
         if all(h.kind == "exited" for h in blocking) else
         "the process ignored SIGKILL (stuck in the driver): reset or reboot the GPU")
    where = f", or take GPU {','.join(gpus)} out of gpus.visible" if foreign and gpus else ""
    return (f"{'; '.join(parts)} after {timeout:.0f} s (gpus.free_timeout), before the {stage} starts; "
            f"fix: {fix}{where}")


async def _look(probe: GpuProbe) -> list[GpuProcess] | None:
    return await anyio.to_thread.run_sync(probe.compute_apps)


def our_holders(owners: Owners, is_live: Callable[[str], bool], dev_prefix: str) -> list[Holder]:
    """Container mode: this campaign's processes holding a CUDA context (by their device files),
    each live or straggler; their memory is not known per pid (NVML's pids are the host's)."""
    out: list[Holder] = []
    for pid, role, minor in gpucontainer.cuda_pids(owners.role_of, dev_prefix):
        kind: Kind = "live" if role != ChildRole.RAY and is_live(role) else "straggler"
        out.append(Holder(GpuProcess(pid, None, minor, f"{dev_prefix}{minor}"), kind, role, _comm(pid)))
    return out


async def _make_free_container(probe: GpuProbe, found: list[GpuProcess], *, visible: Sequence[int], owners: Owners,
                               is_live: Callable[[str], bool], timeout: float, grace: float, free_memory: int,
                               emit: Callable[..., None], monotonic: Callable[[], float], t0: float, stage: str,
                               dev_prefix: str) -> str | None:
    """:func:`make_free` when NVML lists host pids (``found``: its first list): ours by their
    device files, stopped as in host mode; free once the listed memory on the visible GPUs, less
    the largest holder per live child of ours, is at most ``free_memory`` (unknown: never)."""
    stopped: set[int] = set()
    survivors: set[int] = set()
    announced = False
    rest: list[GpuProcess] = []
    left: list[Holder] = []

    def judge(listed: list[GpuProcess]) -> tuple[bool, list[Holder], list[Holder], list[GpuProcess]]:
        ours = our_holders(owners, is_live, dev_prefix)
        live = [h for h in ours if h.kind == "live"]
        strag = [h for h in ours if h.kind == "straggler"]
        _, others = gpucontainer.split_memory(gpucontainer.on_visible(listed, visible), len(live))
        held = gpucontainer.held_bytes(others)
        return (not strag and held is not None and held <= free_memory), live, strag, others

    def free_event(live: list[Holder], others: list[GpuProcess]) -> None:
        emit("gpu.free", stage=stage, probe=probe.name, mode="container", waited_s=round(monotonic() - t0, 3),
             kept=[h.as_dict() for h in live], held_mib=round((gpucontainer.held_bytes(others) or 0) / MIB),
             listed=[gpucontainer.as_dict(p) for p in others])

    with anyio.move_on_after(max(0.0, timeout - (monotonic() - t0))):
        while True:
            ok, live, left, rest = judge(found)
            if ok:
                free_event(live, rest)
                return None
            if not announced:
                announced = True
                emit("gpu.wait", stage=stage, probe=probe.name, mode="container", timeout_s=timeout,
                     holders=[h.as_dict() for h in live + left], listed=[gpucontainer.as_dict(p) for p in found],
                     free_memory_mib=free_memory // MIB)
            new = [h for h in left if h.proc.pid not in stopped]
            if new:
                stopped.update(h.proc.pid for h in new)
                survivors |= await stop_stragglers(new, owners=owners, is_live=is_live, grace=grace, emit=emit)
            else:
                await anyio.sleep(_POLL_S)
            try:
                found = await _look(probe) or []
            except GpuProbeError as exc:
                emit("gpu.probe_error", stage=stage, probe=probe.name, error=str(exc))
                return None
    try:  # the deadline: one last look (the driver frees a killed process's memory a little late)
        last = await _look(probe)
    except GpuProbeError:
        last = None
    if last is not None:
        ok, live, left, rest = judge(last)
        if ok:
            free_event(live, rest)
            return None
    return gpucontainer.failure_line(rest, [h.phrase(survived=h.proc.pid in survivors) for h in left],
                                     timeout=timeout, stage=stage, allowed=free_memory)


async def make_free(probe: GpuProbe, *, visible: Sequence[int], owners: Owners, is_live: Callable[[str], bool],
                    timeout: float, grace: float, emit: Callable[..., None], monotonic: Callable[[], float],
                    stage: str, free_memory: int = 0, dev_prefix: str = "/dev/nvidia") -> str | None:
    """Wait (at most ``timeout`` s) until no straggler or foreign process holds a visible GPU,
    stopping the stragglers. None when free (or nothing to check), else the one failure line.

    When NVML's pids are host pids (:func:`.gpucontainer.detect_mode`), the container mode
    takes over: ours by their device files, free by memory (``free_memory`` bytes allowed)."""
    t0 = monotonic()
    try:
        found = await _look(probe)
    except GpuProbeError as exc:
        # A broken probe must not hold the campaign: say so, and go on as without GPUs.
        emit("gpu.probe_error", stage=stage, probe=probe.name, error=str(exc))
        return None
    if found is None:
        return None  # no GPUs to check (no driver, no tool): the demo and CI
    if gpucontainer.detect_mode(found, dev_prefix) == "container":
        return await _make_free_container(
            probe, found, visible=visible, owners=owners, is_live=is_live,
            timeout=timeout, grace=grace, free_memory=free_memory, emit=emit, monotonic=monotonic, t0=t0,
            stage=stage, dev_prefix=dev_prefix)
    stopped: set[int] = set()
    survivors: set[int] = set()
    announced = False
    blocking: list[Holder] = []
    with anyio.move_on_after(timeout):
        while True:
            holders = classify(found or [], visible=visible, owners=owners, is_live=is_live)
            blocking = [h for h in holders if h.kind != "live"]
            if not blocking:
                emit("gpu.free", stage=stage, probe=probe.name, waited_s=round(monotonic() - t0, 3),
                     kept=[h.as_dict() for h in holders])
                return None
            if not announced:
                announced = True
                emit("gpu.wait", stage=stage, probe=probe.name, timeout_s=timeout,
                     holders=[h.as_dict() for h in holders])
            new = [h for h in blocking if h.kind == "straggler" and h.proc.pid not in stopped]
            if new:
                stopped.update(h.proc.pid for h in new)
                survivors |= await stop_stragglers(new, owners=owners, is_live=is_live, grace=grace, emit=emit)
            else:
                await anyio.sleep(_POLL_S)
            try:
                found = await _look(probe)
            except GpuProbeError as exc:
                emit("gpu.probe_error", stage=stage, probe=probe.name, error=str(exc))
                return None
    # The deadline: one last look (the driver frees a killed process's memory a little late).
    try:
        found = await _look(probe)
    except GpuProbeError:
        found = None
    if found is not None:
        holders = classify(found, visible=visible, owners=owners, is_live=is_live)
        blocking = [h for h in holders if h.kind != "live"]
        if not blocking:
            emit("gpu.free", stage=stage, probe=probe.name, waited_s=round(monotonic() - t0, 3),
                 kept=[h.as_dict() for h in holders])
            return None
    return failure_line(blocking, timeout=timeout, stage=stage, survivors=survivors)


def ray_head_sid(ray_tmp: Path) -> int | None:
    """The session of the Ray head this campaign started, while that head (or its orphans) may
    hold it: its leader alive with the recorded start time, or gone. A reused pid is not ours."""
    try:
        rec = json.loads((ray_tmp / "shoprld-head.json").read_text())  # raylauncher._HEAD_RECORD
        pid, sid = int(rec.get("pid", 0)), int(rec.get("sid", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if pid > 1 and sid == pid and (pid_alive(pid, rec.get("start_ticks")) or not pid_alive(pid)):
        return sid
    return None


async def ensure_free(plan: RoundPlan, host: ChildHost, stage: str, probe: GpuProbe | None = None) -> str | None:
    """The hook a GPU stage calls just before it starts its GPU process: None when the visible
    GPUs hold nothing of an earlier stage (stragglers of ours are stopped), else ONE line."""
    g = plan.cfg.gpus
    owners = Owners.of(plan.layout.state_dir, ray_head_sid(plan.layout.ray_tmp))

    def is_live(role: str) -> bool:
        child = host.find_child(role)
        return child is not None and child.alive()

    return await make_free(probe or build_probe(g.probe, g.nvidia_smi), visible=g.visible, owners=owners,
                           is_live=is_live, timeout=g.free_timeout, grace=g.straggler_grace, emit=host.emit,
                           monotonic=host.clock.monotonic, stage=stage, free_memory=int(g.free_memory),
                           dev_prefix=g.devices)


__all__ = [
    "AutoProbe", "GpuProbe", "GpuProbeError", "GpuProcess", "Holder", "NoProbe", "NvmlProbe", "Owners", "SmiProbe",
    "build_probe", "classify", "ensure_free", "failure_line", "make_free", "parse_compute_apps",
    "parse_gpu_indices", "ray_head_sid", "stop_stragglers",
]
