"""GPU hygiene with real processes: a stage's orphan is stopped, a process not ours is refused.

The GPU is the only fake: a probe (the documented :class:`~shoprld.daemon.services.gpus.GpuProbe` seam)
that says which live pids "hold GPU memory", or a stand-in ``nvidia-smi`` program named by
``gpus.nvidia_smi`` for the daemon run. The processes, sessions, tags and signals are real.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from shoprld.daemon.services import gpus
from shoprld.daemon.core.children import TaggingLauncher as _TaggingLauncher
from shoprld.daemon.services.gpus import GpuProcess, Owners
from shoprld.daemon.services.processes import CHILD_TAG, LocalLauncher, pid_alive
from tests.demotree import journal, kill_tree_leftovers, make_tree, run_daemon
from tests.gpunodes import HOLD, make_nodes

GIB = 1024**3
# Every process that "holds GPU 0" holds device nodes made in the test's temp dir open, as a CUDA
# process holds /dev/nvidia*: so its pid is one of ours to see, and the host-pid mode applies.
SLEEP = HOLD
# A stage that leaves an orphan: it starts a grandchild (same session and group, the tag
# inherited), prints its pid and exits, as a slime job can leave an SGLang scheduler behind.
STAGE = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
         "print('orphan', p.pid, flush=True)")


class FakeGpu:
    """GPU 0 "holds" these pids (with their bytes) for as long as they live."""

    name = "fake"

    def __init__(self, held: dict[int, int | None]) -> None:
        self.held = held
        self.looks = 0

    def compute_apps(self) -> list[GpuProcess] | None:
        self.looks += 1
        return [GpuProcess(pid, used, 0, "GPU-fake0") for pid, used in self.held.items() if pid_alive(pid)]


class Events:
    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.items.append((event, fields))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [f for e, f in self.items if e == name]


def _nodes(tmp_path: Path) -> dict[str, str]:
    prefix, held = make_nodes(tmp_path / "dev")
    return {"GPU_NODES": held, "DEV_PREFIX": prefix}


async def _orphan_of_a_stage(state_dir: Path, log: Path) -> int:
    launcher = _TaggingLauncher(LocalLauncher(), str(state_dir))  # exactly how the engine launches
    env = {**os.environ, **_nodes(log.parent)}
    stage = await launcher.start("trainer", [sys.executable, "-c", STAGE, SLEEP], env=env,
                                 cwd=log.parent, log=log, redacted_argv=["stage"])
    assert await stage.wait() == 0  # the stage is gone (and reaped); its child lives on
    return int(log.read_text().split("orphan")[-1].split()[0])


def _wait_holding(pid: int) -> None:
    """Until ``pid`` has opened its device nodes (the mode is judged from its open files)."""
    for _ in range(600):
        if any("nvidia" in target for target in _fds(pid)):
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never opened its device nodes")


def _fds(pid: int) -> list[str]:
    out = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    except OSError:
        pass
    return out


def _free(probe: gpus.GpuProbe, state_dir: Path, events: Events, *, timeout: float,
          live: frozenset[str] = frozenset()) -> str | None:
    return anyio.run(lambda: gpus.make_free(
        probe, visible=[0], owners=Owners.of(state_dir), is_live=lambda role: role in live, timeout=timeout,
        grace=2.0, emit=events, monotonic=time.monotonic, stage="trainer",
        dev_prefix=str(state_dir.parent / "dev" / "nvidia")))


def test_an_orphan_of_our_stage_is_stopped_and_the_gpu_is_free(tmp_path: Path) -> None:
    """A stage's orphaned child (our session, our tag) holding GPU 0 is SIGTERMed with its group,
    and the hygiene step reports gpu.wait, gpu.straggler_stopped and gpu.free."""
    state_dir = tmp_path / "state"
    orphan = anyio.run(_orphan_of_a_stage, state_dir, tmp_path / "stage.log")
    try:
        _wait_holding(orphan)
        assert pid_alive(orphan)
        events = Events()
        assert _free(FakeGpu({orphan: 4 * GIB}), state_dir, events, timeout=30) is None
        assert not pid_alive(orphan)
        [wait] = events.named("gpu.wait")
        assert wait["holders"][0] | {"comm": "?"} == {"pid": orphan, "gpu": 0, "uuid": "GPU-fake0", "comm": "?",
                                                      "used_mib": 4096, "kind": "straggler", "role": "trainer"}
        [stopped] = events.named("gpu.straggler_stopped")
        assert stopped["pid"] == orphan and stopped["signal"] == "SIGTERM" and stopped["target"].startswith("group ")
        assert stopped["alive"] is False
        [free] = events.named("gpu.free")
        assert free["waited_s"] >= 0 and free["stage"] == "trainer"
    finally:
        if pid_alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_a_straggler_that_ignores_sigterm_gets_sigkill(tmp_path: Path) -> None:
    """An orphan that ignores SIGTERM is SIGKILLed after the grace."""
    state_dir = tmp_path / "state"
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + HOLD
    orphan = anyio.run(lambda: _orphan_of_a_stage_argv(state_dir, tmp_path / "stage.log", stubborn))
    try:
        _wait_holding(orphan)  # its handler is installed before it opens the nodes
        events = Events()
        assert _free(FakeGpu({orphan: GIB}), state_dir, events, timeout=30) is None
        assert not pid_alive(orphan)
        assert [s["signal"] for s in events.named("gpu.straggler_stopped")] == ["SIGKILL"]
    finally:
        if pid_alive(orphan):
            os.kill(orphan, signal.SIGKILL)


async def _orphan_of_a_stage_argv(state_dir: Path, log: Path, code: str) -> int:
    launcher = _TaggingLauncher(LocalLauncher(), str(state_dir))
    env = {**os.environ, **_nodes(log.parent)}
    stage = await launcher.start("val_server", [sys.executable, "-c", STAGE, code], env=env,
                                 cwd=log.parent, log=log, redacted_argv=["stage"])
    await stage.wait()
    return int(log.read_text().split("orphan")[-1].split()[0])


def test_a_process_not_ours_is_never_touched_and_named_in_one_line(tmp_path: Path) -> None:
    """A process started outside our sessions without our tag keeps running; after the wait the
    hygiene step returns one line naming its pid, GPU, memory and "not ours"."""
    env = {**{k: v for k, v in os.environ.items() if k != CHILD_TAG}, **_nodes(tmp_path)}
    foreign = subprocess.Popen([sys.executable, "-c", SLEEP], env=env, start_new_session=True)
    try:
        _wait_holding(foreign.pid)
        events = Events()
        line = _free(FakeGpu({foreign.pid: int(1.5 * GIB)}), tmp_path / "state", events, timeout=0.6)
        assert foreign.poll() is None  # untouched
        assert line is not None and "\n" not in line
        assert line.startswith(f"GPU 0 still holds pid {foreign.pid} (python")
        assert ", 1.5 GiB, not ours) after 1 s (gpus.free_timeout), before the trainer starts; fix: end it" in line
        assert not events.named("gpu.straggler_stopped") and not events.named("gpu.free")
        assert events.named("gpu.wait")[0]["holders"][0]["kind"] == "foreign"
    finally:
        foreign.kill()
        foreign.wait()


def test_a_live_child_of_ours_is_kept_and_does_not_block(tmp_path: Path) -> None:
    """A process of a child that is live now (a parked val server) is neither stopped nor waited for."""
    state_dir = tmp_path / "state"
    env = {**os.environ, CHILD_TAG: f"{state_dir}|val_server", **_nodes(tmp_path)}
    parked = subprocess.Popen([sys.executable, "-c", SLEEP], env=env, start_new_session=True)
    try:
        _wait_holding(parked.pid)
        events = Events()
        assert _free(FakeGpu({parked.pid: GIB}), state_dir, events, timeout=5, live=frozenset({"val_server"})) is None
        assert parked.poll() is None
        [free] = events.named("gpu.free")
        assert free["kept"][0]["pid"] == parked.pid and not events.named("gpu.wait")
    finally:
        parked.kill()
        parked.wait()


def test_no_gpus_to_check_is_silent(tmp_path: Path) -> None:
    """Without a driver or a tool (the demo, CI) the step returns at once and journals nothing."""
    events = Events()
    assert _free(gpus.NoProbe(), tmp_path / "state", events, timeout=5) is None
    assert events.items == []


def _stand_in_smi(path: Path, pids_file: Path) -> Path:
    path.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        "if '--query-gpu=index,uuid' in sys.argv:\n    print('0, GPU-fake0'); sys.exit(0)\n"
        f"for line in open({str(pids_file)!r}):\n"
        "    pid, mib = line.split(',')\n"
        "    try:\n        state = open(f'/proc/{int(pid)}/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "    except OSError:\n        continue\n"
        "    if state == 'Z':\n        continue\n"
        "    print(f'{pid.strip()}, {mib.strip()}, GPU-fake0')\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_daemon_fails_train_with_one_line_when_a_foreign_process_holds_the_gpu(tmp_path: Path) -> None:
    """A demo campaign whose GPU 0 (a stand-in nvidia-smi) is held by a process not ours: TRAIN
    never starts a trainer, retries under its policy, and the daemon exits 6 with the one line."""
    nodes = _nodes(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if k != CHILD_TAG}, **nodes}
    foreign = subprocess.Popen([sys.executable, "-c", SLEEP], env=env, start_new_session=True)
    try:
        _wait_holding(foreign.pid)
        pids = tmp_path / "gpu-pids"
        pids.write_text(f"{foreign.pid}, 1024\n")
        smi = _stand_in_smi(tmp_path / "nvidia-smi", pids)
        campaign = make_tree(tmp_path, rounds=1, edits={
            r'^probe = "none"$': f'probe = "nvidia-smi"\nnvidia_smi = "{smi}"\nfree_timeout = "0.5s"\n'
                                f'devices = "{nodes["DEV_PREFIX"]}"'})
        proc = run_daemon(campaign, timeout=120)
        assert proc.returncode == 6, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("shoprld: TRAIN failed after")
        assert f"GPU 0 still holds pid {foreign.pid} (python" in last and "1.0 GiB, not ours" in last
        assert foreign.poll() is None
        events = journal(tmp_path)
        assert any(e["event"] == "gpu.wait" for e in events)
        assert not any(e["event"] == "stage.spawn" and e.get("role") == "trainer" for e in events)
    finally:
        foreign.kill()
        foreign.wait()
        kill_tree_leftovers(tmp_path)


def test_the_daemon_stops_an_orphan_of_ours_and_completes(tmp_path: Path) -> None:
    """An earlier stage's orphan (this campaign's tag, not a session leader, so no child record
    or stray scan finds it) on GPU 0: TRAIN stops it before the trainer starts, and the 1-round
    campaign completes."""
    state_dir = tmp_path / "state"
    nodes = _nodes(tmp_path)
    env = {**os.environ, CHILD_TAG: f"{state_dir}|val_server", **nodes}
    out = tmp_path / "stage.out"
    with open(out, "w") as fh:  # a file, not a pipe: the orphan keeps its stdout open
        subprocess.run([sys.executable, "-c", STAGE, SLEEP], env=env, start_new_session=True, stdout=fh,
                       timeout=30, check=True)
    orphan = int(out.read_text().split()[-1])
    try:
        _wait_holding(orphan)
        assert pid_alive(orphan) and os.getsid(orphan) != orphan
        pids = tmp_path / "gpu-pids"
        pids.write_text(f"{orphan}, 2048\n")
        smi = _stand_in_smi(tmp_path / "nvidia-smi", pids)
        campaign = make_tree(tmp_path, rounds=1, edits={
            r'^probe = "none"$': f'probe = "nvidia-smi"\nnvidia_smi = "{smi}"\nfree_timeout = "30s"\n'
                                f'devices = "{nodes["DEV_PREFIX"]}"'})
        proc = run_daemon(campaign, timeout=150)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert not pid_alive(orphan)
        events = journal(tmp_path)
        stopped = [e for e in events if e["event"] == "gpu.straggler_stopped"]
        assert [(e["pid"], e["role"], e["signal"]) for e in stopped] == [(orphan, "val_server", "SIGTERM")]
        assert [e["stage"] for e in events if e["event"] == "gpu.free"][0] == "trainer"
    finally:
        if pid_alive(orphan):
            os.kill(orphan, signal.SIGKILL)
        kill_tree_leftovers(tmp_path)
