"""GPU hygiene in a container on a real GPU: NVML lists host pids, and shoprld still tells its own.

Run on a GPU machine (the lent H100/H200) from the repo root, as root (``unshare`` needs it)::

    python3 tests/gpu/hygiene_container.py --out run/gpu-smoke/results/hygiene-container.jsonl

The outer part (the machine's own PID namespace) starts a "foreign" torch process in a PID
namespace of its own (``unshare --pid --fork --mount-proc``) holding ``--foreign-gib`` GiB on
GPU 0, until a release file appears and ``--linger`` seconds more. Then it runs the inner part,
in a second new PID namespace with its own ``/proc`` -- a container as AutoDL's: NVML there
lists pids this ``/proc`` does not have, and its PID 1 (this script) does not reap orphans.
The inner part:

1. prints ``check``'s GPU hygiene line (``shoprld check`` itself when shoprld is installed);
2. starts a stage the way the engine does (tagged ``SHOPRLD_CHILD``, in a session of its own)
   whose torch child allocates ``--gib`` GiB and outlives it (an orphaned SGLang scheduler);
3. runs the stage's wait (:func:`shoprld.daemon.services.gpus.make_free`, NVML) with a short
   ``free_timeout``: ours must be stopped (and, a zombie of PID 1, count as gone), the foreign
   one named by host pid and memory, never touched;
4. releases the foreign process and runs the wait again: free once its memory is gone.

Prints JSON lines (also to ``--out``). Needs torch, anyio and nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hygiene_h200 import ALLOC, STAGE  # noqa: E402  (also loads shoprld from this checkout)

import anyio  # noqa: E402

from shoprld.daemon.services import gpucontainer, gpus  # noqa: E402
from shoprld.daemon.services.processes import CHILD_TAG, LocalLauncher, pid_alive  # noqa: E402

FOREIGN = """
import os, sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
x.fill_(1); torch.cuda.synchronize()
open(sys.argv[2], "w").write(str(os.getpid()))
while not os.path.exists(sys.argv[3]):
    time.sleep(0.2)
time.sleep(float(sys.argv[4]))
"""

# --emulate (a CPU box, to try this script): the "GPU" is a device node pair made in the work dir,
# a holder holds it open (its memory in $GPU_MIB), and a stand-in nvidia-smi lists what a driver
# would: the pids of the machine's own PID namespace (read from the outer /proc) holding the node.
EMU_HOLD = """
import os, sys, time
held = [open(p, "rb") for p in os.environ["GPU_NODES"].split(":")]
open(sys.argv[2], "w").write(str(os.getpid()))
release = sys.argv[3] if len(sys.argv) > 3 else ""
while not (release and os.path.exists(release)):
    time.sleep(0.2)
time.sleep(float(sys.argv[4]))
"""
EMU_SMI = """#!/bin/sh
case "$1" in
  -L) echo "GPU 0: emulated (UUID: GPU-emu0)";;
  --query-gpu=index,uuid) echo "0, GPU-emu0";;
  --query-compute-apps=*) cat {table} 2>/dev/null;;
  *) exit 9;;
esac
"""

# --relay (a GPU box whose driver maps pids into the caller's PID namespace, as seen on the lent
# H200): the real nvidia-smi, run in the machine's own namespace every 0.3 s, is what the inner
# part's stand-in nvidia-smi lists -- the host's view that an AutoDL container gets from NVML.
RELAY_SMI = """#!/bin/sh
case "$1" in
  --query-compute-apps=*) cat {table} 2>/dev/null;;
  *) exec nvidia-smi "$@";;
esac
"""

_out: Any = None


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": round(time.time(), 3), **fields}, default=str)
    print(line, flush=True)
    if _out is not None:
        _out.write(line + "\n")
        _out.flush()


def _sh(argv: list[str], timeout: float = 120) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"


def _nvml_pids(probe: gpus.GpuProbe) -> dict[int, int | None]:
    return {p.pid: None if p.used_bytes is None else round(p.used_bytes / 2**20) for p in probe.compute_apps() or []}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _nspid(pid: int) -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("NSpid:"))
    except (OSError, StopIteration):
        return "?"


def _child_of(ppid: int) -> int:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(ppid):
                    return int(entry.name)
            except (OSError, IndexError):
                continue
    return 0


def _check_line(work: Path, args: argparse.Namespace | None = None) -> str:
    try:
        return _check_line_or_raise(work, args)
    except Exception as exc:  # a report line, never the end of the GPU run
        return f"(shoprld check failed: {type(exc).__name__}: {exc})"


def _probe(args: argparse.Namespace) -> gpus.GpuProbe:
    stand_in = args.emulate or args.relay
    return gpus.SmiProbe(str(Path(stand_in) / "bin" / "nvidia-smi")) if stand_in else gpus.NvmlProbe()


def _relayed_driver(work: Path, stop: Any) -> None:
    while not stop.is_set():
        table = _sh(["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits"])
        tmp = work / "table.tmp"
        tmp.write_text("" if "No running" in table else table + "\n")
        tmp.replace(work / "table")
        stop.wait(0.3)


def _prefix(args: argparse.Namespace) -> str:
    return str(Path(args.emulate) / "dev" / "nvidia") if args.emulate else gpucontainer.DEV_PREFIX


def _emulated_driver(emu: Path, stop: Any) -> None:
    """Every 0.2 s: the pids (of this, the outer, /proc) holding the emulated node, with $GPU_MIB."""
    import threading  # noqa: F401  (runs in a thread of the outer part)

    node = str(emu / "dev" / "nvidia0")
    while not stop.is_set():
        rows = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                if _state(int(entry.name)) == "Z" or not any(
                        os.readlink(f"/proc/{entry.name}/fd/{fd}") == node for fd in os.listdir(f"/proc/{entry.name}/fd")):
                    continue
                env = dict(item.split("=", 1) for item in Path(f"/proc/{entry.name}/environ").read_text().split("\0")
                           if "=" in item)
            except OSError:
                continue
            rows.append(f"{entry.name}, {env.get('GPU_MIB', '1024')}, GPU-emu0\n")
        tmp = emu / "table.tmp"
        tmp.write_text("".join(rows))
        tmp.replace(emu / "table")
        stop.wait(0.2)


def _check_line_or_raise(work: Path, args: argparse.Namespace | None = None) -> str:
    """``shoprld check``'s GPU hygiene line, when shoprld (with its dependencies) is installed here."""
    try:
        from shoprld.daemon.ops.demo import create_tree
    except ImportError as exc:
        return f"(shoprld check not run: {exc})"
    tree = work / f"tree-{time.monotonic_ns()}"
    campaign = create_tree(tree, fast=True, rounds=1)
    probe = 'probe = "nvml"'
    if args is not None and args.relay:
        probe = f'probe = "nvidia-smi"\nnvidia_smi = "{_probe(args).command}"'  # type: ignore[attr-defined]
    if args is not None and args.emulate:
        probe = f'probe = "nvidia-smi"\nnvidia_smi = "{_probe(args).command}"\ndevices = "{_prefix(args)}"'  # type: ignore[attr-defined]
    campaign.write_text(re.sub(r'^probe = "none"$', probe, campaign.read_text(), flags=re.M))
    out = _sh([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(campaign)])
    return next((line.strip() for line in out.splitlines() if "GPU hygiene" in line), out[-400:])


# -- inside: the "container" ------------------------------------------------------------------
async def inside(args: argparse.Namespace) -> int:
    probe = _probe(args)
    prefix = _prefix(args)
    work = Path(args.work)
    state_dir = work / "state"
    owners = gpus.Owners.of(state_dir)
    listed = _nvml_pids(probe)
    emit("inside.start", my_pid=os.getpid(), procs_here=sum(e.name.isdigit() for e in os.scandir("/proc")),
         nvml_pids=listed, foreign_host_pid=args.foreign_pid,
         foreign_host_pid_here=pid_alive(args.foreign_pid))
    emit("check.before", mode_line=gpucontainer.mode_line(probe, prefix), shoprld_check=_check_line(work, args))

    env = {**os.environ, CHILD_TAG: f"{state_dir}|trainer", "GPU_MIB": str(round(args.gib * 1024))}
    if args.emulate:
        env["GPU_NODES"] = f"{prefix}0:{prefix}-uvm"
    ready = work / "ours.ready"
    stage = await LocalLauncher().start("trainer", [sys.executable, "-c", STAGE, EMU_HOLD if args.emulate else ALLOC,
                                                    str(args.gib), str(ready)],
                                        env=env, cwd=work, log=work / "stage.log", redacted_argv=["stage"])
    rc = await stage.wait()
    log = (work / "stage.log").read_text()
    orphan = int(log.split("gpu process")[-1].split()[0]) if "gpu process" in log else 0
    host_pid = None
    for _ in range(120):
        new = set(_nvml_pids(probe)) - set(listed)
        if new:
            host_pid = new.pop()
            break
        time.sleep(0.5)
    now = _nvml_pids(probe)
    fds = gpucontainer.device_fds(orphan, prefix) if orphan else None
    emit("stage.exited", stage_pid=stage.pid, returncode=rc, orphan_pid_here=orphan, orphan_alive=pid_alive(orphan),
         orphan_ppid=_sh(["ps", "-o", "ppid=", "-p", str(orphan)]),
         orphan_fds=None if fds is None else {"minors": sorted(fds.minors), "uvm": fds.uvm},
         orphan_host_pid=host_pid, nvml_pids=now)
    emit("check.with_holders", mode_line=gpucontainer.mode_line(probe, prefix), shoprld_check=_check_line(work, args))

    # -- case 1: ours is stopped, the foreign one blocks and is named -------------------------
    t0 = time.monotonic()
    line = await gpus.make_free(probe, visible=[0], owners=owners, is_live=lambda role: False,
                                timeout=args.timeout, grace=args.grace, emit=emit, monotonic=time.monotonic,
                                stage="trainer", dev_prefix=prefix)
    after = _nvml_pids(probe)
    passed1 = (line is not None and f"host pid {args.foreign_pid} " in line and not pid_alive(orphan)
               and args.foreign_pid in after and host_pid not in after)
    emit("case.container_blocked", line=line, wait_s=round(time.monotonic() - t0, 3),
         orphan_state=_state(orphan), orphan_gone=not pid_alive(orphan), foreign_still_listed=args.foreign_pid in after,
         nvml_pids=after, passed=passed1)

    # -- case 2: the foreign one ends (by its owner); the wait sees the memory go -------------
    (work / "release").write_text("")
    t0 = time.monotonic()
    line2 = await gpus.make_free(probe, visible=[0], owners=owners, is_live=lambda role: False,
                                 timeout=args.free_timeout, grace=args.grace, emit=emit, monotonic=time.monotonic,
                                 stage="trainer", dev_prefix=prefix)
    emit("case.container_free", line=line2, wait_s=round(time.monotonic() - t0, 3), linger_s=args.linger,
         nvml_pids=_nvml_pids(probe), passed=line2 is None)
    emit("check.after", mode_line=gpucontainer.mode_line(probe, prefix))
    return 0 if passed1 and line2 is None else 1


# -- outside: the machine, the foreign process ------------------------------------------------
def outside(args: argparse.Namespace) -> int:
    emit("env", nvidia_smi_L=_sh(["nvidia-smi", "-L"]), uname=_sh(["uname", "-srm"]),
         driver=_sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
         torch=_sh([sys.executable, "-c", "import torch; print(torch.__version__)"]),
         unshare=_sh(["unshare", "--version"]))
    work = Path(tempfile.mkdtemp(prefix="hygc-"))
    ready = work / "foreign.ready"
    fenv = dict(os.environ)
    if args.emulate:
        import threading

        sys.path.insert(0, str(ROOT))
        from tests.gpunodes import make_nodes  # the nodes, as the CI tests make them

        args.emulate = str(work)
        _, fenv["GPU_NODES"] = make_nodes(work / "dev")
        fenv["GPU_MIB"] = str(round(args.foreign_gib * 1024))
        (work / "bin").mkdir()
        smi = work / "bin" / "nvidia-smi"
        smi.write_text(EMU_SMI.format(table=work / "table"))
        smi.chmod(0o755)
        stop = threading.Event()
        threading.Thread(target=_emulated_driver, args=(work, stop), daemon=True).start()
    if args.relay:
        import threading

        args.relay = str(work)
        (work / "bin").mkdir()
        smi = work / "bin" / "nvidia-smi"
        smi.write_text(RELAY_SMI.format(table=work / "table"))
        smi.chmod(0o755)
        stop_relay = threading.Event()
        threading.Thread(target=_relayed_driver, args=(work, stop_relay), daemon=True).start()
    foreign = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                                EMU_HOLD if args.emulate else FOREIGN,
                                str(args.foreign_gib), str(ready), str(work / "release"), str(args.linger)],
                               start_new_session=True, env=fenv)
    ok = False
    try:
        deadline = time.monotonic() + 180
        while not ready.exists() and foreign.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        gpid = _child_of(foreign.pid)
        time.sleep(0.5 if args.emulate or args.relay else 0)  # the emulated driver's next table
        probe = _probe(args)
        emit("foreign.started", unshare_pid=foreign.pid, host_pid=gpid, pid_in_its_ns=ready.read_text(),
             nspid=_nspid(gpid), nvml_pids_from_host=_nvml_pids(probe),
             host_mode_line=gpucontainer.mode_line(probe, _prefix(args)), host_shoprld_check=_check_line(work, args))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, __file__, "--inside",
                            "--work", str(work), "--foreign-pid", str(gpid), "--gib", str(args.gib),
                            "--timeout", str(args.timeout), "--free-timeout", str(args.free_timeout),
                            "--grace", str(args.grace), "--linger", str(args.linger),
                            *(["--emulate", args.emulate] if args.emulate else []),
                            *(["--relay", args.relay] if args.relay else []),
                            *(["--out", str(args.out)] if args.out else []), "--append"],
                           env=env, timeout=400, check=False)
        ok = r.returncode == 0
        emit("inside.exited", returncode=r.returncode, foreign_exited=foreign.poll())
    finally:
        if foreign.poll() is None:
            os.killpg(foreign.pid, signal.SIGKILL)  # ours: this script started it
        foreign.wait()
        shutil.rmtree(work, ignore_errors=True)
    emit("result", passed=ok)
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inside", action="store_true")
    ap.add_argument("--work")
    ap.add_argument("--foreign-pid", type=int, default=0)
    ap.add_argument("--gib", type=float, default=3.0)
    ap.add_argument("--foreign-gib", type=float, default=2.0)
    ap.add_argument("--timeout", type=float, default=8.0, help="gpus.free_timeout while the foreign one holds")
    ap.add_argument("--free-timeout", type=float, default=60.0, help="gpus.free_timeout once it is released")
    ap.add_argument("--linger", type=float, default=5.0, help="seconds the foreign one holds after its release")
    ap.add_argument("--grace", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--relay", nargs="?", const="1", default="",
                    help="the inner part sees the machine namespace's nvidia-smi list (host pids), relayed")
    ap.add_argument("--emulate", nargs="?", const="1", default="",
                    help="no GPU: emulated device nodes and a stand-in nvidia-smi (a CPU box; the inner part gets the dir)")
    a = ap.parse_args()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        if not a.append:
            a.out.write_text("")
        _out = open(a.out, "a")  # noqa: SIM115  (the inner part appends to the same file)
    sys.exit(anyio.run(inside, a) if a.inside else outside(a))
