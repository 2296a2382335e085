"""Bench: following a Ray job's log, by byte offset vs the Jobs API's whole-log GET (issue 27).

A script, not a test:

    .venv/bin/python tests/bench/bench_raylog.py [--mib 60] 2>/dev/null

Each mode runs in a fresh interpreter (so its peak RSS is its own): the daemon's RayLauncher
against the Jobs API stand-in (``run/demo/rayjobs_standin.py``, which writes
``job-driver-<id>.log`` as Ray does), a trainer job printing ``--mib`` MiB of SGLang-like
request lines, followed to its end with ``RayJobChild.wait``. ``offset`` follows the driver log
on disk (a head of ours); ``api`` fetches the whole log per poll (a cluster elsewhere). Prints
ONE JSON line: each mode's peak RSS (MiB), wall time, and the bytes that reached the stage log.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "run" / "demo" / "rayjobs_standin.py"
LINE = ("[2026-12-05 03:12:09 DP0 TP0] INFO:     127.0.0.1:51234 - \"POST /generate HTTP/1.1\" 200 OK "
        "#running-req: 61, #token: 412345, token usage: 0.43, gen throughput (token/s): 5123.4 " + "x" * 80)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(mode: str, mib: int) -> dict[str, object]:
    import anyio

    from shoprld.daemon.foundation.config.config import config_from_dict
    from shoprld.daemon.foundation.records.layout import Layout
    from shoprld.daemon.round.plan import resolve
    from shoprld.daemon.services.ray import RayLauncher

    tmp = Path(tempfile.mkdtemp(prefix="bench-raylog-"))
    port = _free_port()
    logs = tmp / "logs"
    standin = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port), "--logs-dir", str(logs)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        cfg = config_from_dict({
            "campaign": {"name": "b", "experiment": "e", "rounds": 1, "steps_per_round": 2},
            "storage": {"repo": str(tmp / "repo"), "ephemeral_root": str(tmp / "eph"), "state_dir": str(tmp / "st"),
                        "user": "u"},
            "wandb": {"enabled": False},
            "train": {"launcher": "ray", "ray_address": f"http://127.0.0.1:{port}", "command": ["true"]},
        }, tmp / "c.toml")
        layout = Layout.from_config(cfg, environ={})
        layout.logs.mkdir(parents=True)
        (tmp / "repo").mkdir()
        lines = mib * (1 << 20) // (len(LINE) + 1)
        code = f"import sys\nline = {LINE!r}\nfor i in range({lines}):\n    sys.stdout.write(line + '\\n')\n"
        launcher = RayLauncher(cfg, layout, poll=0.2, driver_logs=logs if mode == "offset" else None)

        async def main() -> float:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if await launcher.client.reachable():
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("stand-in did not start")
                await anyio.sleep(0.1)
            t0 = time.monotonic()
            child = await launcher.start("trainer", [sys.executable, "-c", code], env={}, cwd=None,
                                         log=layout.stage_log(0, "TRAIN"), redacted_argv=["python"],
                                         round=resolve(cfg, layout, 0))
            rc = await child.wait()
            assert rc == 0, rc
            await launcher.client.aclose()
            return time.monotonic() - t0

        wall = anyio.run(main)
        size = layout.stage_log(0, "TRAIN").stat().st_size
        return {"mode": mode, "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "wall_s": round(wall, 2), "stage_log_mib": round(size / (1 << 20), 1)}
    finally:
        os.killpg(standin.pid, signal.SIGTERM)
        standin.wait(10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=60)
    p.add_argument("--one", choices=["offset", "api"])
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.mib)))
        return
    results = {}
    for mode in ("offset", "api"):
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--mib", str(a.mib)],
                             capture_output=True, text=True, timeout=1200)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-500:]}
    print(json.dumps({"bench": "raylog", "job_log_mib": a.mib, **results}))


if __name__ == "__main__":
    main()
