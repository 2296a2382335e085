"""GPU hygiene in a container: NVML's pids are host pids, none of them a process of this /proc.

The seam is the probe (:class:`~shoprld.daemon.services.gpus.GpuProbe`): it lists host pids that
do not exist here, with their memory. Everything else is real: our processes are real children
holding device nodes made in the test's temp dir (never the machine's ``/dev/nvidia*``), tagged
as the engine tags them, stopped by real signals; the zombie is a real child nobody reaps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoprld.daemon.services import gpucontainer, gpus
from shoprld.daemon.services.gpus import GpuProcess, Owners
from shoprld.daemon.services.processes import CHILD_TAG, pid_alive
from tests.gpunodes import HOLD, make_nodes

GIB = 1024**3


def _absent_pids(n: int) -> list[int]:
    """Pids no process has here (as a host's pids look from inside a container)."""
    out, pid = [], 3_000_000
    while len(out) < n:
        if not os.path.exists(f"/proc/{pid}"):
            out.append(pid)
        pid += 7
    return out


class HostPidGpu:
    """NVML as a container sees it: host pids. ``ours`` maps a host pid to our real process (the
    driver lists it while that process lives); ``foreign`` host pids stay listed for ``looks``
    looks (None: always)."""

    name = "fake-nvml"

    def __init__(self, ours: dict[int, tuple[int, int | None]], foreign: dict[int, int | None],
                 looks: int | None = None) -> None:
        self.ours, self.foreign, self.looks, self.n = ours, foreign, looks, 0

    def compute_apps(self) -> list[GpuProcess] | None:
        self.n += 1
        out = [GpuProcess(host, used, 0, "GPU-c0") for host, (local, used) in self.ours.items() if pid_alive(local)]
        if self.looks is None or self.n <= self.looks:
            out += [GpuProcess(host, used, 0, "GPU-c0") for host, used in self.foreign.items()]
        return out


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.items.append((event, fields))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [f for e, f in self.items if e == name]


@pytest.fixture
def nodes(tmp_path: Path) -> tuple[str, str]:
    return make_nodes(tmp_path / "dev")


def _holder(tmp_path: Path, held: str, *, role: str | None, new_session: bool = True,
            code: str = HOLD) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != CHILD_TAG}
    env["GPU_NODES"] = held
    if role:
        env[CHILD_TAG] = f"{tmp_path / 'state'}|{role}"
    p = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=new_session)
    for _ in range(600):
        fds = gpucontainer.device_fds(p.pid, str(tmp_path / "dev" / "nvidia"))
        if fds is not None and fds.cuda:
            return p
        time.sleep(0.05)
    p.kill()
    raise AssertionError("the holder never opened its device nodes")


def _free(probe: gpus.GpuProbe, tmp_path: Path, prefix: str, events: Events, *, timeout: float,
          live: frozenset[str] = frozenset(), free_memory: int = 0, grace: float = 2.0) -> str | None:
    return anyio.run(lambda: gpus.make_free(
        probe, visible=[0], owners=Owners.of(tmp_path / "state"), is_live=lambda role: role in live,
        timeout=timeout, grace=grace, emit=events, monotonic=time.monotonic, stage="trainer",
        free_memory=free_memory, dev_prefix=prefix))


def _end(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_device_fds_and_the_mode(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """A listed pid that is a process here holding a GPU node: host mode. Listed pids that do not
    exist here, or exist but hold no GPU node: container mode. Nothing listed: host."""
    prefix, held = nodes
    holder = _holder(tmp_path, held, role=None)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        fds = gpucontainer.device_fds(holder.pid, prefix)
        assert fds is not None and fds.minors == {0} and fds.uvm and fds.cuda
        assert gpucontainer.device_fds(plain.pid, prefix) == gpucontainer.DeviceFds(frozenset(), False)
        absent = _absent_pids(2)
        assert gpucontainer.detect_mode([GpuProcess(holder.pid, GIB, 0)], prefix) == "host"
        assert gpucontainer.detect_mode([GpuProcess(p, GIB, 0) for p in absent], prefix) == "container"
        assert gpucontainer.detect_mode([GpuProcess(plain.pid, GIB, 0), GpuProcess(absent[0], 1, 0)],
                                        prefix) == "container"
        assert gpucontainer.detect_mode([], prefix) == "host"
        # The machine's real nodes are never looked at: the prefix decides.
        assert gpucontainer.detect_mode([GpuProcess(holder.pid, GIB, 0)], str(tmp_path / "other")) == "container"
    finally:
        _end(holder, plain)


def test_container_mode_stops_ours_and_names_the_host_pid_not_ours(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """NVML lists two host pids: one is our orphaned stage process (found by its device files and
    its tag), one is nobody's here. Ours is SIGTERMed; the other blocks until the timeout and is
    named in ONE line by host pid and memory."""
    prefix, held = nodes
    ours = _holder(tmp_path, held, role="trainer")
    host_ours, host_foreign = _absent_pids(2)
    probe = HostPidGpu({host_ours: (ours.pid, 3 * GIB)}, {host_foreign: int(2.5 * GIB)})
    try:
        events = Events()
        line = _free(probe, tmp_path, prefix, events, timeout=1.0)
        assert ours.poll() == -signal.SIGTERM
        assert line is not None and "\n" not in line
        assert line.startswith(f"container mode: GPU memory still held (2.5 GiB > gpus.free_memory 0 MiB) by "
                               f"host pid {host_foreign} (2.5 GiB, GPU 0), not ours")
        assert "before the trainer starts; fix: end them from the host" in line and "out of gpus.visible" in line
        assert str(host_ours) not in line
        [wait] = events.named("gpu.wait")
        assert wait["mode"] == "container" and {h["pid"] for h in wait["holders"]} == {ours.pid}
        assert {p["host_pid"] for p in wait["listed"]} == {host_ours, host_foreign}
        [stopped] = events.named("gpu.straggler_stopped")
        assert (stopped["pid"], stopped["role"], stopped["signal"], stopped["alive"]) == \
            (ours.pid, "trainer", "SIGTERM", False)
        assert not events.named("gpu.free")
    finally:
        _end(ours)


def test_container_mode_waits_for_the_memory_then_is_free(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """A host pid not ours holds memory for a few looks, then lets go: the wait ends free, by memory."""
    prefix, _ = nodes
    host_foreign = _absent_pids(1)[0]
    probe = HostPidGpu({}, {host_foreign: GIB}, looks=3)
    events = Events()
    assert _free(probe, tmp_path, prefix, events, timeout=60) is None
    assert probe.n >= 4
    [free] = events.named("gpu.free")
    assert free["mode"] == "container" and free["held_mib"] == 0 and free["listed"] == []
    assert events.named("gpu.wait")[0]["free_memory_mib"] == 0


def test_container_mode_memory_within_free_memory_does_not_block(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """``gpus.free_memory``: a host pid holding less than it is no reason to wait; an unknown
    amount ([N/A]) always is."""
    prefix, _ = nodes
    small = _absent_pids(1)[0]
    events = Events()
    assert _free(HostPidGpu({}, {small: 200 * 2**20}), tmp_path, prefix, events, timeout=5,
                 free_memory=256 * 2**20) is None
    assert events.named("gpu.free")[0]["held_mib"] == 200
    line = _free(HostPidGpu({}, {small: None}), tmp_path, prefix, Events(), timeout=0.5, free_memory=GIB)
    assert line is not None and f"host pid {small} (memory n/a, GPU 0)" in line


def test_container_mode_keeps_a_live_child_and_its_memory(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """A live child of ours (a parked val server) is left alone, and the largest listed holder is
    taken as its memory: the stage does not wait for it."""
    prefix, held = nodes
    parked = _holder(tmp_path, held, role="val_server")
    host_parked = _absent_pids(1)[0]
    try:
        events = Events()
        assert _free(HostPidGpu({host_parked: (parked.pid, 20 * GIB)}, {}), tmp_path, prefix, events, timeout=5,
                     live=frozenset({"val_server"})) is None
        assert parked.poll() is None
        [free] = events.named("gpu.free")
        assert [h["pid"] for h in free["kept"]] == [parked.pid] and free["held_mib"] == 0
        assert not events.named("gpu.straggler_stopped")
    finally:
        _end(parked)


def test_a_zombie_of_ours_counts_as_gone(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """PID 1 of a container does not reap. Our straggler here is a direct child of this test that
    is never reaped: once SIGTERM ends it, it is a zombie, and the wait is over (no SIGKILL)."""
    prefix, held = nodes
    ours = _holder(tmp_path, held, role="trainer", new_session=False)
    host_ours = _absent_pids(1)[0]
    try:
        events = Events()
        assert _free(HostPidGpu({host_ours: (ours.pid, GIB)}, {}), tmp_path, prefix, events, timeout=60,
                     grace=30) is None
        stat = Path(f"/proc/{ours.pid}/stat").read_text()
        assert stat.rsplit(")", 1)[1].split()[0] == "Z"  # still there, unreaped
        [stopped] = events.named("gpu.straggler_stopped")
        assert (stopped["signal"], stopped["target"], stopped["alive"]) == ("SIGTERM", f"pid {ours.pid}", False)
        assert events.named("gpu.free")[0]["mode"] == "container"
    finally:
        _end(ours)


def test_a_zombie_listed_in_host_mode_is_gone_once_its_memory_is(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """Host mode (a listed pid holds a GPU node here): a listed pid that is a zombie here, which no
    one reaps, is neither stopped nor foreign; it blocks only while the driver still lists it (on
    an H200 NVML listed an exited process's memory for about 0.5 s)."""
    prefix, held = nodes
    live = _holder(tmp_path, held, role="val_server")
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(600):
            if Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        probe = HostPidGpu({}, {live.pid: GIB, zombie.pid: GIB})
        events = Events()
        assert _free(probe, tmp_path, prefix, events, timeout=1.0, live=frozenset({"val_server"})) == (
            f"GPU 0 still holds pid {zombie.pid} (python, 1.0 GiB, exited, its memory not yet released) after 1 s "
            "(gpus.free_timeout), before the trainer starts; fix: the driver still holds an exited process's "
            "memory: wait, or reset the GPU")
        probe = HostPidGpu({live.pid + 0: (live.pid, GIB)}, {zombie.pid: GIB}, looks=2)
        events = Events()
        assert _free(probe, tmp_path, prefix, events, timeout=30, live=frozenset({"val_server"})) is None
        assert [h["kind"] for h in events.named("gpu.wait")[0]["holders"]] == ["live", "exited"]
        assert not events.named("gpu.straggler_stopped")
        assert [h["pid"] for h in events.named("gpu.free")[0]["kept"]] == [live.pid]
    finally:
        _end(live, zombie)


def test_mode_line(tmp_path: Path, nodes: tuple[str, str]) -> None:
    """``check``'s line for each case."""
    prefix, held = nodes
    holder = _holder(tmp_path, held, role=None)
    try:
        assert "no GPU or NVML here" in gpucontainer.mode_line(gpus.NoProbe(), prefix)
        assert "no compute process on the GPUs now" in gpucontainer.mode_line(HostPidGpu({}, {}), prefix)
        assert gpucontainer.mode_line(HostPidGpu({}, {holder.pid: GIB}), prefix).startswith(
            "GPU hygiene: host pids match: NVML's pids are processes here (1 listed")
        line = gpucontainer.mode_line(HostPidGpu({}, dict.fromkeys(_absent_pids(2), GIB)), prefix)
        assert line.startswith("GPU hygiene: container: pids from NVML are host pids (2 listed, none a GPU "
                               f"process here); holders found by their {prefix}* fds, free judged by memory used")
    finally:
        _end(holder)


@given(st.lists(st.tuples(st.integers(1, 50), st.one_of(st.none(), st.integers(0, 2**40)), st.integers(0, 3)),
                max_size=20),
       st.integers(0, 5))
def test_split_memory_takes_the_largest_pids_for_our_live_children(rows: list[tuple[int, int | None, int]],
                                                                   n_live: int) -> None:
    """NVML's list (any pids, sizes, unknown sizes, several GPUs per pid): every entry lands on
    one side, whole pids only, at most ``n_live`` pids taken, none smaller than one left."""
    found = [GpuProcess(pid, used, gpu) for pid, used, gpu in rows]
    taken, rest = gpucontainer.split_memory(found, n_live)
    assert sorted(taken + rest, key=repr) == sorted(found, key=repr)
    assert not {p.pid for p in taken} & {p.pid for p in rest} and len({p.pid for p in taken}) <= n_live

    def size(pid: int) -> int:
        return sum(p.used_bytes or 0 for p in found if p.pid == pid)

    if taken and rest:
        assert min(size(p.pid) for p in taken) >= max(size(p.pid) for p in rest)
    held = gpucontainer.held_bytes(rest)
    assert held is None if any(p.used_bytes is None for p in rest) else held == sum(p.used_bytes or 0 for p in rest)
