"""Bench: the val server per round, relaunched vs kept (``val.reuse_server``), on the demo stand-in.

A script, not a test (pytest does not collect ``bench_*.py``):

    .venv/bin/python tests/bench/bench_reuse_server.py [--rounds 6] [--load-seconds 0.3] 2>/dev/null

Both modes run the daemon's own code (``ValServerService`` through a ``RoundContext`` and the
``LocalLauncher``) against ``run/demo/valserver.py`` (an SGLang stand-in with a child
"scheduler"), for the same rounds, each with a fresh HF export in the one HF dir:

- relaunch: GATE's ``after_gate`` stops the server (SIGTERM to the group, grace, port free),
  and the next VAL's ``ensure_ready`` launches it again and waits for ``/health`` 200 with a
  live process and this round's ``weight_version``;
- reuse: ``after_gate`` parks it (``/release_memory_occupation``), and ``ensure_ready``
  resumes it, ``/update_weights_from_disk`` with this round's ``weight_version``, and checks
  ``/get_model_info``.

Round 0 launches in both modes; rounds 1.. are the per-round cost. The stand-in loads weights in
``--load-seconds`` at start but swaps them without that wait (it validates the dir only), so the
saving here is the relaunch's process, import and health overhead plus the load time: on SGLang
(CUDA graphs, DP=4 schedulers) the launch costs far more, and a swap of 4B weights from disk is
not free either. Prints ONE JSON line on stdout.
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
import structlog

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.ops.demo import create_tree
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.services.valserver import ValServerService
from tests.roundctx import standalone_context

DEMO = Path(__file__).resolve().parents[2] / "run" / "demo"
sys.path.insert(0, str(DEMO))
import _common


async def run_mode(root: Path, *, reuse: bool, rounds: int, load_s: float) -> list[dict[str, float]]:
    campaign = create_tree(root, fast=True, rounds=rounds)
    cfg = load_config(campaign)
    cfg = cfg.model_copy(update={"val": cfg.val.model_copy(update={"reuse_server": reuse})})
    layout = Layout.from_config(cfg)
    layout.ensure(cfg)
    base_env = {**layout.child_env(cfg), "DEMO_VAL_LOAD_SECONDS": str(load_s)}
    service = ValServerService()
    out: list[dict[str, float]] = []
    async with httpx.AsyncClient(trust_env=False) as http:
        ctx = None
        try:
            for r in range(rounds):
                ctx = standalone_context(RoundPlan(cfg, layout, r, base_env=base_env), http=http, val_server=service)
                # EXPORT_HF: this round's weights land in the one HF dir.
                _common.write_hf_dir(layout.hf_dir(cfg), f"round-{r}", 64 * 1024, _common.default_hf_config())
                t0 = time.perf_counter()
                problem = await service.ensure_ready(ctx.plan, ctx)
                t1 = time.perf_counter()
                assert problem is None, problem
                assert service.serving == ctx.weight_version, (service.serving, ctx.weight_version)
                await service.after_gate(ctx.plan, ctx)  # (VAL and GATE would run in between)
                t2 = time.perf_counter()
                out.append({"round": r, "ready_s": t1 - t0, "after_gate_s": t2 - t1, "total_s": t2 - t0})
        finally:
            if ctx is not None:
                await service.stop(ctx.plan, ctx)
    return out


def summarize(rows: list[dict[str, float]]) -> dict[str, Any]:
    later = [row["total_s"] for row in rows[1:]]
    return {
        "first_round_s": round(rows[0]["total_s"], 4),
        "per_round_s_median": round(statistics.median(later), 4),
        "per_round_s_p95": round(sorted(later)[max(0, int(0.95 * len(later)) - 1)], 4),
        "ready_s_median": round(statistics.median(r["ready_s"] for r in rows[1:]), 4),
        "after_gate_s_median": round(statistics.median(r["after_gate_s"] for r in rows[1:]), 4),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--load-seconds", type=float, default=0.3, help="the stand-in's weight-load time at start")
    a = p.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    with tempfile.TemporaryDirectory(prefix="shoprld-bench-reuse-") as tmp:
        relaunch = anyio.run(lambda: run_mode(Path(tmp) / "relaunch", reuse=False, rounds=a.rounds,
                                              load_s=a.load_seconds))
        reuse = anyio.run(lambda: run_mode(Path(tmp) / "reuse", reuse=True, rounds=a.rounds,
                                           load_s=a.load_seconds))
    rel, reu = summarize(relaunch), summarize(reuse)
    print(json.dumps({
        "bench": "reuse_server", "stand_in": "run/demo/valserver.py", "rounds": a.rounds,
        "stand_in_load_seconds": a.load_seconds, "cpus": os.cpu_count(),
        "relaunch": rel, "reuse_server": reu,
        "saved_per_round_s": round(rel["per_round_s_median"] - reu["per_round_s_median"], 4),
        "note": "stand-in figures: relaunch = stop(group, port free) + spawn + /health + weight_version; reuse = "
                "release_memory + resume + update_weights_from_disk + weight_version. The stand-in's swap skips "
                "the load wait, so on SGLang the saving is the launch time minus the disk swap time.",
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
