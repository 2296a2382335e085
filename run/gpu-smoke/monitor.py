#!/usr/bin/env python3
"""The GPU smoke's chaos and measurement companion: runs beside ``shoprld run``.

    python run/gpu-smoke/monitor.py --save-dir D --events OUT.jsonl --torn-dir T \\
        [--kill-at 5,7] [--poll 0.01] [--min-bytes 1] [--daemon-pid P] [--stop-file F]

Every ``--poll`` seconds (10 ms):

- **kill during a save**: for the next target K of ``--kill-at``, once an ``iter_N`` dir with
  N >= K has shard bytes on disk but neither ``.metadata`` nor ``metadata.json`` (dist_checkpointing
  is writing it), SIGKILL every process group running ``train_mcore.py`` (torchrun and its ranks:
  a node crash, no chance to finish), record the files and sizes at the kill, and copy the torn
  dir aside to ``T/iter_N-kill<k>`` (the daemon may prune the original later). Targets are taken in
  order, each once, so ``5,7`` kills the first attempt during iter 5's save and the relaunched
  trainer (its second attempt) during iter 7's save, after it re-saved iter 5.
- **every commit**: when the tracker names a new iteration, run shoprld's ``deep_verify`` on it at
  once (megatron-core's ``check_is_distributed_checkpoint`` + ``load_tensors_metadata``), before
  retention can delete it, and note whether the pre-0.19 rule (``common.pt`` required) would
  have called it complete.
- **trainer census**: each ``train_mcore.py`` process group that appears or goes away.

Events are JSON lines with ``t`` (epoch seconds). Stops when the stop file exists or the daemon
pid is gone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"
ITER_RE = re.compile(r"^iter_(\d{7})$")


def trainer_groups() -> dict[int, list[int]]:
    """pgid -> pids of every process whose argv mentions train_mcore.py."""
    groups: dict[int, list[int]] = {}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"train_mcore.py") for a in argv):
            try:
                groups.setdefault(os.getpgid(int(entry.name)), []).append(int(entry.name))
            except OSError:
                continue
    return groups


def listing(d: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for e in os.scandir(d):
            try:
                out[e.name] = e.stat().st_size
            except OSError:
                pass
    except OSError:
        pass
    return out


def read_tracker(save: Path) -> tuple[str | None, float | None]:
    try:
        p = save / TRACKER
        return p.read_text(), p.stat().st_mtime
    except OSError:
        return None, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save-dir", required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--torn-dir", required=True)
    ap.add_argument("--kill-at", default="5,7")
    ap.add_argument("--poll", type=float, default=0.01)
    ap.add_argument("--min-bytes", type=int, default=1)
    ap.add_argument("--daemon-pid", type=int, default=0)
    ap.add_argument("--stop-file", default="")
    a = ap.parse_args()
    save, torn = Path(a.save_dir), Path(a.torn_dir)
    targets = [int(x) for x in a.kill_at.split(",") if x.strip()]
    out = open(a.events, "a", buffering=1)

    def ev(event: str, **kw: Any) -> None:
        out.write(json.dumps({"t": time.time(), "event": event, **kw}, default=str) + "\n")

    t0 = time.time()
    try:  # warm the imports now, so the first verification does not stall the poll loop
        from shoprld.daemon.foundation.storage.deepverify import deep_verify

        import megatron.core.dist_checkpointing  # noqa: F401
        ev("monitor.ready", import_s=round(time.time() - t0, 3), targets=targets)
    except Exception as exc:  # noqa: BLE001
        deep_verify = None  # type: ignore[assignment]
        ev("monitor.ready", import_error=f"{type(exc).__name__}: {exc}", targets=targets)

    last_raw: str | None = None
    groups: dict[int, list[int]] = {}
    kills = 0
    next_census = 0.0
    while True:
        now = time.time()
        if a.stop_file and os.path.exists(a.stop_file):
            break
        if a.daemon_pid and not os.path.exists(f"/proc/{a.daemon_pid}"):
            ev("monitor.daemon_gone", pid=a.daemon_pid)
            break
        # -- the kill ---------------------------------------------------------------------------
        if targets:
            try:
                names = [e.name for e in os.scandir(save) if ITER_RE.match(e.name)]
            except OSError:
                names = []
            for name in sorted(names):
                n = int(name[5:])
                if n < targets[0]:
                    continue
                d = save / name
                files = listing(d)
                shard_bytes = sum(v for k, v in files.items() if k.endswith(".distcp"))
                if ".metadata" in files or "metadata.json" in files or shard_bytes < a.min_bytes:
                    continue
                pg = trainer_groups()
                t_kill = time.time()
                for pgid in pg:
                    try:
                        os.killpg(pgid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                kills += 1
                tracker_raw, _ = read_tracker(save)
                ev("kill", iteration=n, target=targets[0], kill=kills, pgids=sorted(pg), pids=pg,
                   files_at_kill=files, shard_bytes_at_kill=shard_bytes, tracker_at_kill=tracker_raw,
                   detect_to_kill_ms=round((time.time() - now) * 1000, 2))
                time.sleep(0.3)
                after = listing(d)
                dest = torn / f"{name}-kill{kills}"
                tc = time.time()
                try:
                    shutil.copytree(d, dest)
                    ev("torn.copied", iteration=n, path=str(dest), files_after_kill=after,
                       bytes=sum(after.values()), copy_s=round(time.time() - tc, 3),
                       since_kill_s=round(time.time() - t_kill, 3))
                except OSError as exc:
                    ev("torn.copy_failed", iteration=n, error=str(exc))
                targets.pop(0)
                break
        # -- every commit ---------------------------------------------------------------------
        raw, mtime = read_tracker(save)
        if raw is not None and raw != last_raw:
            last_raw = raw
            m = re.fullmatch(r"\s*(\d+)\s*", raw)
            if m:
                n = int(m.group(1))
                d = save / f"iter_{n:07d}"
                files = listing(d)
                rec: dict[str, Any] = {"iteration": n, "tracker_mtime": mtime,
                                       "seen_after_tracker_ms": round((time.time() - (mtime or now)) * 1000, 2),
                                       "bytes": sum(files.values()), "files": files,
                                       "has_common_pt": "common.pt" in files,
                                       "complete_by_pre_0_19_rule": {"common.pt", ".metadata", "metadata.json"}
                                       <= set(files) and any(k.endswith(".distcp") for k in files)}
                if deep_verify is not None:
                    tv = time.time()
                    v = deep_verify(d)
                    rec.update(deep_verify_ok=v.ok, deep_verify_method=v.method, deep_verify_detail=v.detail,
                               deep_verify_s=round(time.time() - tv, 3))
                ev("commit", **rec)
            else:
                ev("tracker.unparseable", raw=raw)
        # -- trainer census -------------------------------------------------------------------
        if now >= next_census:
            next_census = now + 0.2
            cur = trainer_groups()
            for pgid in cur.keys() - groups.keys():
                ev("trainer.start", pgid=pgid, pids=cur[pgid])
            for pgid in groups.keys() - cur.keys():
                ev("trainer.gone", pgid=pgid)
            groups = cur
        time.sleep(a.poll)
    ev("monitor.stop", kills=kills, pending_targets=targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
