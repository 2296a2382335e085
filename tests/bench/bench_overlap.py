"""Bench: the compile step (``analyze``) overlapped with serve + bare val, vs the seed's sequence.

A script, not a test (pytest does not collect ``bench_*.py``):

    .venv/bin/python tests/bench/bench_overlap.py [--scale 200] [--trials 3] 2>/dev/null

The seed runs, after TRAIN: compile, then serve, then bare val, then gate. The compile uses the
LLM API and the CPU, serve and val the GPUs, and the gate needs both results, so shoprld starts
the compile alongside serve + val (``gate.overlap_analyze``). Timings come from SHOPSIMRL.md
"Measured" (4xA800), scaled down ``--scale`` times:

- serve + bare val (400) + gate (400): 12-14 min; taken as 13 min = serve 90 s (assumed: an
  SGLang TP=1/DP=4 launch of a 4B model) + val 345 s + gate 345 s (the two 400-episode runs
  at concurrency 32 assumed equal);
- training's end to the compile finishing: 8-14 min, of which the compile alone is taken as
  330 s (assumed: half of the 11-min midpoint; the rest is the final save, the HF export and
  the analyst's drain, which both orders share).

Each phase is a real process through the daemon's ``LocalLauncher``: serve is the demo val
server stand-in (``DEMO_VAL_LOAD_SECONDS`` = scaled serve time; ready = /health 200 and alive),
compile, val and gate are processes that run for their scaled time. Prints ONE JSON line; the
saving is reported both as measured (scaled) and scaled back to the real run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio
import httpx

from shoprld.daemon.services.processes import Child, LocalLauncher, wait_port_free

DEMO = Path(__file__).resolve().parents[2] / "run" / "demo"
sys.path.insert(0, str(DEMO))
import _common

REAL = {"compile_s": 330.0, "serve_s": 90.0, "val_s": 345.0, "gate_s": 345.0}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def phase(launcher: LocalLauncher, root: Path, name: str, seconds: float) -> Child:
    argv = [sys.executable, "-c", f"import time; time.sleep({seconds!r})"]
    return await launcher.start(name, argv, env=dict(os.environ), cwd=None, log=root / f"{name}.log",
                                redacted_argv=argv)


async def serve(launcher: LocalLauncher, root: Path, http: httpx.AsyncClient, hf: Path, load_s: float) -> Child:
    port = free_port()
    argv = [sys.executable, str(DEMO / "valserver.py"), "--model-path", str(hf), "--host", "127.0.0.1",
            "--port", str(port), "--weight-version", "iter_0000020"]
    child = await launcher.start("val_server", argv, env={**os.environ, "DEMO_VAL_LOAD_SECONDS": str(load_s)},
                                 cwd=None, log=root / "valserver.log", redacted_argv=argv)
    child.port = port  # type: ignore[attr-defined]
    with anyio.fail_after(60):
        while True:
            try:
                if (await http.get(f"http://127.0.0.1:{port}/health", timeout=1)).status_code == 200 and child.alive():
                    return child
            except httpx.HTTPError:
                pass
            if not child.alive():
                raise RuntimeError(f"val server stand-in exited; see {root / 'valserver.log'}")
            await anyio.sleep(0.02)


async def one_round(root: Path, hf: Path, t: dict[str, float], *, overlap: bool) -> float:
    launcher = LocalLauncher()
    async with httpx.AsyncClient(trust_env=False) as http:
        start = time.perf_counter()
        compile_child = None
        if overlap:
            compile_child = await phase(launcher, root, "analyze", t["compile_s"])
        else:
            await (await phase(launcher, root, "analyze", t["compile_s"])).wait()
        server = await serve(launcher, root, http, hf, t["serve_s"])
        await (await phase(launcher, root, "val", t["val_s"])).wait()
        if compile_child is not None:
            await compile_child.wait()  # the gate needs the candidate pool
        await (await phase(launcher, root, "gate", t["gate_s"])).wait()
        elapsed = time.perf_counter() - start
        await server.stop(5.0)
        await wait_port_free("127.0.0.1", server.port, 10)  # type: ignore[attr-defined]
        return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=200.0, help="real seconds per bench second")
    p.add_argument("--trials", type=int, default=3)
    a = p.parse_args()
    t = {k: v / a.scale for k, v in REAL.items()}
    with tempfile.TemporaryDirectory(prefix="shoprld-bench-overlap-") as tmp:
        root = Path(tmp)
        hf = root / "hf"
        _common.write_hf_dir(hf, "bench", 64 * 1024, _common.default_hf_config())
        seq, ovl = [], []
        for _ in range(a.trials):  # interleaved, so drift hits both
            seq.append(anyio.run(lambda: one_round(root, hf, t, overlap=False)))
            ovl.append(anyio.run(lambda: one_round(root, hf, t, overlap=True)))
    s, o = statistics.median(seq), statistics.median(ovl)
    ideal = min(REAL["compile_s"], REAL["serve_s"] + REAL["val_s"])
    result: dict[str, Any] = {
        "bench": "overlap_analyze", "scale": a.scale, "trials": a.trials, "cpus": os.cpu_count(),
        "assumed_real_s": REAL,
        "sequential_round_s": round(s, 4), "overlapped_round_s": round(o, 4),
        "saved_per_round_s": round(s - o, 4),
        "saved_per_round_real_s": round((s - o) * a.scale, 1),
        "ideal_saved_per_round_real_s": ideal,
        "saved_per_campaign_real_min": round((s - o) * a.scale * 5 / 60, 1),
        "post_train_real_min": {"sequential": round(s * a.scale / 60, 1), "overlapped": round(o * a.scale / 60, 1)},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
