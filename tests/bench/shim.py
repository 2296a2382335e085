"""Bench shim: ``python -S shim.py SCRIPT ARGS...`` runs one demo stand-in IN THIS PROCESS
(``runpy``, so the pid, the signals and the start-up cost stay the stand-in's own), after
applying the benchmark's pacing and per-round faults. Both runners of a benchmark (the bash
baseline ``seed_loop.sh`` and shoprld) launch every stand-in through it, so both get exactly
the same timeline and the same faults.

Environment (all optional; absent = the plain stand-in):

- ``BENCH_PACE``: JSON ``{"<role>.before": s, "<role>.after": s}``; sleeps before the stand-in
  starts or after it returns normally (not after a crash). Roles: ``trainer``, ``emit``,
  ``check``, ``sidecar``, ``analyze``, ``val``, ``gate``, ``curriculum``, ``val_server``,
  ``shopsim``, ``export``, ``other``.
- ``BENCH_FAULTS``: JSON ``{"<num_rollout>": {"DEMO_...": "v", ...}}``: extra environment for
  the trainer launched with that ``--num-rollout`` (i.e. that round), e.g. ``DEMO_STALL_AT``.
- ``BENCH_FAULT_DIR``: with ``BENCH_FAULTS``, each round's faults fire once: the trainer gets
  ``DEMO_FAULT_ONCE_DIR=$BENCH_FAULT_DIR/nr-<num_rollout>``.

Stdlib only, like the stand-ins (it runs under ``python -S``).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time


def role_of(script: str, args: list[str]) -> str:
    name = os.path.basename(script)
    if name == "slime_train.py":
        return "trainer"
    if name == "valserver.py":
        return "val_server"
    if name == "shopsim.py":
        return "shopsim"
    if name.startswith("convert_"):
        return "export"
    if name == "shopsimrl.py" and args:
        if args[0] == "training" and len(args) > 1:
            return {"watch-analyze": "sidecar", "analyze": "analyze", "online-gate": "gate",
                    "build-curriculum": "curriculum", "check": "check"}.get(args[1], "other")
        return {"emit": "emit", "run": "val"}.get(args[0], "other")
    return "other"


def main() -> None:
    if len(sys.argv) < 2:
        print("shim: usage: shim.py SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    script, args = sys.argv[1], sys.argv[2:]
    role = role_of(script, args)
    pace = json.loads(os.environ.get("BENCH_PACE") or "{}")
    if role == "trainer" and "--num-rollout" in args and "--init-base" not in args:
        num_rollout = args[args.index("--num-rollout") + 1]
        extra = json.loads(os.environ.get("BENCH_FAULTS") or "{}").get(num_rollout) or {}
        os.environ.update({k: str(v) for k, v in extra.items()})
        if extra and os.environ.get("BENCH_FAULT_DIR"):
            os.environ["DEMO_FAULT_ONCE_DIR"] = os.path.join(os.environ["BENCH_FAULT_DIR"], f"nr-{num_rollout}")
    before = float(pace.get(f"{role}.before", 0) or 0)
    if before > 0:
        time.sleep(before)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    after = float(pace.get(f"{role}.after", 0) or 0)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if after > 0 and exc.code in (0, None):
            sys.stdout.flush()
            time.sleep(after)
        raise
    if after > 0:
        time.sleep(after)


if __name__ == "__main__":
    main()
