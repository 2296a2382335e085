"""GPU hygiene on a real GPU: an orphaned torch process of ours is found and stopped; one that is
not ours is refused and named in one line. Prints JSON lines (also to ``--out``).

Run on a GPU machine (the lent H200: see run/gpu-smoke/README.md) from the repo root::

    python3 tests/gpu/hygiene_h200.py --out run/gpu-smoke/results/hygiene-h200.json

1. **Ours.** A "stage" is started the way the engine starts every child: by
   :class:`~shoprld.daemon.services.processes.LocalLauncher` in a session of its own, with the campaign
   tag ``SHOPRLD_CHILD=<state_dir>|trainer`` in its environment (what ``children.TaggingLauncher``
   adds). The stage starts a torch process that allocates ``--gib`` GiB on GPU 0, then exits: the
   torch process is orphaned, like an SGLang scheduler that outlives its job. The hygiene step
   (:func:`shoprld.daemon.services.gpus.make_free`, the real NVML probe) must find it, stop it and report
   the wait.
2. **Not ours.** A torch process started outside our sessions, without the tag: the hygiene step
   must leave it alone and fail with one line naming its pid and memory.

Needs only the standard library, anyio, torch and (for NVML) nvidia-ml-py: the daemon's modules
are loaded from this checkout without installing shoprld (the GPU image has no pydantic).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _import_shoprld() -> None:
    try:
        import shoprld.daemon.services.gpus  # noqa: F401  (installed)
        return
    except ImportError:
        pass
    pkg = types.ModuleType("shoprld")
    pkg.__path__ = [str(ROOT / "daemon" / "_root")]
    sub = types.ModuleType("shoprld.daemon")
    sub.__path__ = [str(ROOT / "daemon")]
    sys.modules["shoprld"], sys.modules["shoprld.daemon"] = pkg, sub


_import_shoprld()

import anyio  # noqa: E402

from shoprld.daemon.services import gpus  # noqa: E402
from shoprld.daemon.services.processes import CHILD_TAG, LocalLauncher, pid_alive  # noqa: E402

ALLOC = """
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
x.fill_(1); torch.cuda.synchronize()
open(sys.argv[2], "w").write("ready")
time.sleep(600)
"""
# The stage: start the GPU process, wait until it holds its memory, print its pid, exit.
STAGE = """
import os, subprocess, sys, time
ready = sys.argv[3]
p = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], ready])
while not os.path.exists(ready):
    if p.poll() is not None:
        sys.exit("the GPU process died: %s" % p.returncode)
    time.sleep(0.2)
print("gpu process", p.pid, flush=True)
"""

_out: Any = None


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": round(time.time(), 3), **fields}, default=str)
    print(line, flush=True)
    if _out is not None:
        _out.write(line + "\n")
        _out.flush()


def _sh(argv: list[str]) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"


async def _seen(probe: gpus.GpuProbe, pid: int, timeout: float) -> gpus.GpuProcess | None:
    with anyio.move_on_after(timeout):
        while True:
            for p in await anyio.to_thread.run_sync(probe.compute_apps) or []:
                if p.pid == pid:
                    return p
            await anyio.sleep(0.5)
    return None


def _probe() -> gpus.GpuProbe:
    try:
        return gpus.NvmlProbe()
    except ImportError:
        emit("probe.fallback", why="nvidia-ml-py is not installed; using nvidia-smi")
        return gpus.SmiProbe()


async def main(args: argparse.Namespace) -> int:
    emit("env", python=sys.version.split()[0], nvidia_smi_L=_sh(["nvidia-smi", "-L"]),
         uname=_sh(["uname", "-srm"]), torch=_sh([sys.executable, "-c", "import torch; print(torch.__version__)"]),
         nvml=_sh([sys.executable, "-c", "import pynvml; print(pynvml.__file__)"]))
    probe = _probe()
    work = Path(tempfile.mkdtemp(prefix="hyg-"))
    state_dir = work / "state"
    owners = gpus.Owners.of(state_dir)
    ok = True

    # -- 1. ours: an orphan of a stage ------------------------------------------------------
    env = {**os.environ, CHILD_TAG: f"{state_dir}|trainer"}
    ready = work / "ours.ready"
    t_start = time.monotonic()
    stage = await LocalLauncher().start("trainer", [sys.executable, "-c", STAGE, ALLOC, str(args.gib), str(ready)],
                                        env=env, cwd=work, log=work / "stage.log", redacted_argv=["stage"])
    rc = await stage.wait()
    log = (work / "stage.log").read_text()
    orphan = int(log.split("gpu process")[-1].split()[0]) if "gpu process" in log else 0
    emit("stage.exited", stage_pid=stage.pid, returncode=rc, orphan_pid=orphan, orphan_alive=pid_alive(orphan),
         orphan_sid=os.getsid(orphan) if pid_alive(orphan) else None, stage_s=round(time.monotonic() - t_start, 1))
    seen = await _seen(probe, orphan, 60) if orphan else None
    emit("probe.sees_orphan", probe=probe.name, seen=seen is not None,
         used_mib=None if seen is None or seen.used_bytes is None else round(seen.used_bytes / 2**20),
         smi=_sh(["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits"]))
    t0 = time.monotonic()
    problem = await gpus.make_free(probe, visible=[0], owners=owners, is_live=lambda role: False,
                                   timeout=args.timeout, grace=args.grace, emit=emit, monotonic=time.monotonic,
                                   stage="trainer")
    gone = not pid_alive(orphan)
    emit("case.ours", problem=problem, orphan_stopped=gone, hygiene_s=round(time.monotonic() - t0, 3),
         passed=problem is None and gone and seen is not None)
    ok &= problem is None and gone and seen is not None

    # -- 2. not ours: started outside our sessions, no tag ----------------------------------
    foreign_env = {k: v for k, v in os.environ.items() if k != CHILD_TAG}
    ready2 = work / "foreign.ready"
    foreign = subprocess.Popen([sys.executable, "-c", ALLOC, str(args.gib / 2), str(ready2)], env=foreign_env,
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not ready2.exists() and foreign.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        seen2 = await _seen(probe, foreign.pid, 60)
        emit("probe.sees_foreign", probe=probe.name, pid=foreign.pid, seen=seen2 is not None)
        problem = await gpus.make_free(probe, visible=[0], owners=owners, is_live=lambda role: False,
                                       timeout=args.foreign_timeout, grace=args.grace, emit=emit,
                                       monotonic=time.monotonic, stage="trainer")
        untouched = foreign.poll() is None
        passed = bool(problem) and str(foreign.pid) in (problem or "") and "not ours" in (problem or "") and untouched
        emit("case.not_ours", line=problem, foreign_untouched=untouched, passed=passed)
        ok &= passed
    finally:
        foreign.kill()  # ours to end: this script started it
        foreign.wait()
    shutil.rmtree(work, ignore_errors=True)
    emit("result", passed=ok)
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--timeout", type=float, default=120.0, help="gpus.free_timeout for the orphan case")
    ap.add_argument("--foreign-timeout", type=float, default=10.0, help="gpus.free_timeout for the foreign case")
    ap.add_argument("--grace", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        _out = open(a.out, "w")  # noqa: SIM115
    sys.exit(anyio.run(main, a))
