#!/usr/bin/env python3
"""Assemble the GPU smoke's results into ``smoke_report.json`` (+ ``train_logs.txt``).

    python run/gpu-smoke/report.py --tree W --events monitor.jsonl --out OUT \\
        [--daemon-rc N] [--daemon-s S] [--preflight FILE] [--env FILE] [--patched 0|1]

Reads the campaign tree (state/journal.jsonl, state/status.json, the stage logs), the monitor's
events and the preflight record; runs a last deep verification over every iter dir still on disk
and over the torn copies; checks the resume after each kill from the trainers' own log lines.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

KEEP = re.compile(r"^(=== shoprld|rollout \d|saving checkpoint|saved checkpoint|loaded checkpoint|no tracker|"
                  r"ready in|done:|train_mcore|parameters:|optimizer:|accepted slime|\[rank\d+\].*(Error|error)|"
                  r"Traceback|.*Error:|.*ERROR|WARNING: TMPDIR|.*Overwriting|.*FAILED|.*exitcode|.*Signal)")


def jl(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    return out


def stats(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "min": round(min(xs), 3), "median": round(statistics.median(xs), 3),
            "mean": round(statistics.mean(xs), 3), "max": round(max(xs), 3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True)
    ap.add_argument("--events", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--daemon-rc", type=int, default=None)
    ap.add_argument("--daemon-s", type=float, default=None)
    ap.add_argument("--preflight", default="")
    ap.add_argument("--env", default="")
    ap.add_argument("--patched", default="1")
    a = ap.parse_args()
    tree, out = Path(a.tree), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    journal = jl(tree / "state" / "journal.jsonl")
    events = jl(Path(a.events))
    try:
        status = json.loads((tree / "state" / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    logs_dirs = glob.glob(str(tree / "ephemeral" / "**" / "logs"), recursive=True)
    logs = Path(logs_dirs[0]) if logs_dirs else tree
    save_dirs = glob.glob(str(tree / "ephemeral" / "**" / "checkpoints" / "megatron"), recursive=True)
    save = Path(save_dirs[0]) if save_dirs else None

    # -- the trainers' own lines, one segment per launch ("=== shoprld <ts> start trainer: ...") --
    launches: list[dict[str, Any]] = []
    saves, loads = [], []
    train_text = []
    for log in sorted(logs.glob("r*-train.log")):
        rnd = log.name.split("-")[0]
        cur: dict[str, Any] | None = None
        kept = []
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("=== shoprld"):
                cur = None
                if " start trainer:" in line:
                    cur = {"round": rnd, "header": line[12:40], "load_iteration": None, "start_rollout_id": None,
                           "saves": [], "last_rollout": None}
                    launches.append(cur)
            if KEEP.match(line):
                kept.append(line[:400])
            if cur is None:
                continue
            m = re.match(r"saved checkpoint iter (\d+) in ([\d.]+) s \((\d+) bytes\)", line)
            if m:
                rec = {"round": rnd, "launch": len(launches), "iteration": int(m.group(1)),
                       "save_s": float(m.group(2)), "bytes": int(m.group(3))}
                saves.append(rec)
                cur["saves"].append(int(m.group(1)))
            m = re.match(r"loaded checkpoint iter (\d+) .* in ([\d.]+) s; resume: tracker=(\d+) start_rollout_id=(\d+)",
                         line)
            if m:
                cur.update(load_iteration=int(m.group(1)), load_s=float(m.group(2)),
                           start_rollout_id=int(m.group(4)))
                loads.append({"round": rnd, "launch": len(launches), "iteration": int(m.group(1)),
                              "load_s": float(m.group(2)), "start_rollout_id": int(m.group(4))})
            if line.startswith("no tracker under"):
                cur.update(load_iteration=None, start_rollout_id=0)
            m = re.match(r"rollout (\d+)/", line)
            if m:
                cur["last_rollout"] = int(m.group(1))
        train_text.append(f"##### {log.name} ({log.stat().st_size} bytes; filtered lines)\n" + "\n".join(kept[-400:]))
    spawns = sorted(j["t"] for j in journal if j.get("event") == "stage.spawn" and j.get("role") == "trainer")
    for i, ln in enumerate(launches):
        ln["spawned_t"] = spawns[i] if i < len(spawns) else None
    attempts = launches
    exporter_lines = []
    for log in sorted(logs.glob("r*-*.log")):
        if "export" in log.name:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("export_dcp_to_hf") or line.startswith("==="):
                    exporter_lines.append(f"{log.name}: {line[:300]}")
    (out / "train_logs.txt").write_text("\n\n".join(train_text) + "\n\n##### exporter\n" + "\n".join(exporter_lines)
                                        + "\n")

    # -- checkpoints committed (journal) ------------------------------------------------------
    committed = [{"iteration": j.get("iteration"), "bytes": j.get("bytes"), "latency_ms": j.get("latency_ms"),
                  "round": j.get("round"), "t": j.get("t")} for j in journal if j.get("event") == "checkpoint.committed"]
    lat = [c["latency_ms"] for c in committed if isinstance(c["latency_ms"], (int, float))]

    # -- kills and resumes ----------------------------------------------------------------------
    kills = [e for e in events if e.get("event") == "kill"]
    commits = [e for e in events if e.get("event") == "commit"]
    resume_checks = []
    for k in kills:
        tk = k.get("tracker_at_kill")
        expected = int(tk) if tk and tk.strip().isdigit() else None
        idx = max((i for i, ln in enumerate(launches) if ln.get("spawned_t") and ln["spawned_t"] < k["t"]), default=None)
        killed = launches[idx] if idx is not None else None
        nxt = launches[idx + 1] if idx is not None and idx + 1 < len(launches) else None
        resume_checks.append({
            "killed_during_save_of": k.get("iteration"), "tracker_at_kill": expected,
            "files_at_kill": k.get("files_at_kill"), "shard_bytes_at_kill": k.get("shard_bytes_at_kill"),
            "killed_pgids": k.get("pgids"), "killed_launch": idx + 1 if idx is not None else None,
            "killed_launch_last_rollout": killed.get("last_rollout") if killed else None,
            "relaunch_after_s": round(nxt["spawned_t"] - k["t"], 3) if nxt and nxt.get("spawned_t") else None,
            "resumed_from": nxt.get("load_iteration") if nxt else None,
            "resumed_start_rollout_id": nxt.get("start_rollout_id") if nxt else None,
            "resumed_launch_saves": nxt.get("saves") if nxt else None,
            "resume_ok": bool(nxt) and expected is not None and nxt.get("load_iteration") == expected
            and nxt.get("start_rollout_id") == expected + 1,
        })

    # -- deep verification ---------------------------------------------------------------------
    final_verify = []
    try:
        from shoprld.daemon.foundation.storage.checkpoints import scan
        from shoprld.daemon.foundation.storage.deepverify import deep_verify

        if save is not None:
            sc = scan(save)
            for c in sc.checkpoints:
                v = deep_verify(c.path)
                final_verify.append({"path": str(c.path), "iteration": c.iteration, "engine_complete": c.complete,
                                     "bytes": c.bytes, "ok": v.ok, "method": v.method, "detail": v.detail[-300:]})
        for d in sorted(glob.glob(str(tree / "torn" / "*"))):
            v = deep_verify(Path(d))
            files = {e.name: e.stat().st_size for e in os.scandir(d)}
            final_verify.append({"path": d, "torn_copy": True, "files": files, "ok": v.ok, "method": v.method,
                                 "detail": v.detail[-300:]})
    except Exception as exc:  # noqa: BLE001
        final_verify.append({"error": f"{type(exc).__name__}: {exc}"})

    def pick(e: dict[str, Any]) -> dict[str, Any]:
        return {k: e.get(k) for k in ("t", "event", "iteration", "pgid", "pgids", "kill", "path", "bytes",
                                      "deep_verify_ok", "copy_s") if k in e}

    timeline = [pick(e) for e in events if e.get("event") in ("trainer.start", "trainer.gone", "kill", "torn.copied",
                                                               "commit")]
    timeline += [{"t": j.get("t"), "event": "journal:" + str(j.get("event")), "state": j.get("state") or j.get("dst"),
                  "round": j.get("round"), "attempt": j.get("attempt"), "kind": j.get("kind"),
                  "message": (j.get("message") or "")[:200], "iteration": j.get("iteration")}
                 for j in journal if j.get("event") in ("stage.outcome", "checkpoint.committed", "checkpoint.partial",
                                                        "checkpoint.tracker_repaired", "train.stall")
                 or (j.get("event") == "stage.spawn" and j.get("role") == "trainer")]
    timeline.sort(key=lambda e: e.get("t") or 0)
    t0 = timeline[0]["t"] if timeline else 0
    for e in timeline:
        e["t_rel_s"] = round((e.get("t") or t0) - t0, 3)

    report: dict[str, Any] = {
        "generated_at": time.time(),
        "engine_patched_for_megatron_core_0_19": a.patched == "1",
        "daemon": {"rc": a.daemon_rc, "seconds": a.daemon_s, "state": status.get("state"),
                   "stop_reason": status.get("stop_reason"), "rounds_done": status.get("rounds_done"),
                   "last_error": status.get("last_error")},
        "campaign_completed": status.get("state") == "DONE" and len(status.get("rounds_done") or []) == 3,
        "checkpoints_committed": committed,
        "detection_latency_ms": stats(lat),
        "saves": saves,
        "save_seconds": stats([s["save_s"] for s in saves]),
        "checkpoint_bytes": stats([float(s["bytes"]) for s in saves]),
        "loads": loads,
        "trainer_attempts": attempts,
        "kills_and_resumes": resume_checks,
        "deep_verify_at_commit": [{k: c.get(k) for k in ("iteration", "bytes", "has_common_pt",
                                                         "complete_by_pre_0_19_rule", "deep_verify_ok",
                                                         "deep_verify_method", "deep_verify_s", "deep_verify_detail",
                                                         "seen_after_tracker_ms")} for c in commits],
        "deep_verify_final": final_verify,
        "exporter": exporter_lines,
        "timeline": timeline,
    }
    for name, key in ((a.preflight, "preflight"), (a.env, "env")):
        if name:
            try:
                report[key] = json.loads(Path(name).read_text())
            except (OSError, ValueError) as exc:
                report[key] = {"unreadable": str(exc)}
    checks = {
        "campaign_completed": report["campaign_completed"],
        "kills": len(kills),
        "all_resumes_ok": bool(resume_checks) and all(r["resume_ok"] for r in resume_checks),
        "all_commits_deep_verified": bool(commits) and all(c.get("deep_verify_ok") for c in commits),
        "torn_copies_flagged": [v.get("ok") is False for v in final_verify if v.get("torn_copy")],
        "min_checkpoint_gib": round(min((s["bytes"] for s in saves), default=0) / 2**30, 3),
    }
    report["checks"] = checks
    (out / "smoke_report.json").write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(checks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
