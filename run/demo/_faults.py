"""Contract-deviation knobs of the ShopSimRL tools stand-in, for `shoprld rehearse`'s tests.

Each knob is inactive unless its env var is set; COMMAND is a subcommand name as typed
(`check`, `watch-analyze`, `analyze`, `online-gate`, `build-curriculum`, `run`, `emit`):

- DEMO_FAULT_ONE_LINE=COMMAND            its JSON payload is printed on one line, not indented;
- DEMO_FAULT_DROP_KEY=COMMAND:KEY        its printed payload lacks KEY;
- DEMO_FAULT_FILE_DROP=FILENAME:A.B      every FILENAME this process wrote under runs/ lacks A.B;
- DEMO_FAULT_EXIT=COMMAND:CODE           it exits CODE instead of its own exit code.

The trainer stand-in (`slime_train.py`) reads its own fault knobs, listed here for the benches
(tests/bench/bench_timeline.py) and the tests that replay faults. Each is inert unless set; with
DEMO_FAULT_ONCE_DIR=DIR each fires once, while DIR/<marker> is absent, and creates the marker:

- DEMO_CRASH_AT=K              exit 1 at the start of rollout K (marker `crash_at`);
- DEMO_STALL_AT=K              alive forever at rollout K, no progress (`stall_at`);
- DEMO_DIE_MID_SAVE_AT=N       exit 1 inside the save of iteration N: a partial iter dir (`die_mid_save`);
- DEMO_HANG_ON_START=1         alive forever before the first rollout (`hang_on_start`);
- DEMO_LEAK_LEASES=1           lease ShopSim slots and never release them: at DEMO_CRASH_AT, or
                               after the last rollout with exit 0 (`crash_at`, `leak_leases`);
- DEMO_TOUCH_ON_CRASH=FILE     at DEMO_CRASH_AT, first append a comment to --custom-config-path
                               (the emitted slime.yaml: an input edited before the relaunch) and
                               create FILE;
- DEMO_HANG_AFTER_ENGINES_AT=K slime#1484: the launch starting at rollout K prints the engines'
                               ready line, then hangs before any rollout (`hang_after_engines`);
- DEMO_HANG_IN_TRAIN_AT=K      slime#1487: rollout K completes, `Timer actor_train start`, then
                               no trainer line (`hang_in_train`);
- DEMO_SLOW_AT=K:F             rollout K's generations and training F times slower, signals moving;
- DEMO_FAULT_RESUME_AT_ZERO=1  slime#1558: after `--load` of a numbered checkpoint (not the
                               converted base's `release`), the weights load but the rollout count
                               restarts at 0 instead of tracker + 1 (`resume_at_zero`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def _knob(name: str, command: str) -> str | None:
    """The knob's argument when it names ``command`` ('' when it takes none), else None."""
    raw = os.environ.get(name, "")
    head, _, rest = raw.partition(":")
    return rest if raw and head == command else None


def payload_text(command: str, payload: dict[str, Any]) -> str:
    """How ``command`` prints ``payload``: indented (the real tools), unless a knob says otherwise."""
    drop = _knob("DEMO_FAULT_DROP_KEY", command)
    if drop:
        payload = {k: v for k, v in payload.items() if k != drop}
    if _knob("DEMO_FAULT_ONE_LINE", command) is not None:
        return json.dumps(payload, ensure_ascii=False, default=str)
    return json.dumps(payload, ensure_ascii=False, indent=2, default=str)


def after(command: str, rc: int, started: float) -> int:
    """Apply DEMO_FAULT_FILE_DROP and DEMO_FAULT_EXIT once ``command`` has finished."""
    spec = os.environ.get("DEMO_FAULT_FILE_DROP", "")
    if spec and ":" in spec:
        name, dotted = spec.split(":", 1)
        root = Path(os.environ.get("SHOPSIMRL_PROJECT_ROOT") or ".") / "runs"
        for path in root.rglob(name) if root.is_dir() else ():
            if path.stat().st_mtime < started:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            cur, *parts = dotted.split(".")
            node = data
            for part in parts:
                node, cur = node.get(cur, {}), part
            if isinstance(node, dict):
                node.pop(cur, None)
            path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    code = _knob("DEMO_FAULT_EXIT", command)
    return int(code) if code else rc


def now() -> float:
    return time.time() - 1.0  # mtime granularity: a file written in this second counts
