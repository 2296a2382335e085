"""The reproducibility record: what a campaign needs to be re-run, kept in the repo (issue 9).

:func:`write_record` writes it to ``reports/shoprld/<campaign>/`` in the repo, and ``shoprld
clean`` writes it before it deletes anything: the config (as written and resolved), git
commit and branch, per-round metrics and gate decisions, the exact stage commands with
secrets masked (:func:`stage_commands`), the final checkpoint's iteration and size, the small
result files themselves, and the stage environments' tool versions (:func:`envinfo_doc`,
which the move bundle's manifest carries too). Rewriting a record never loses what an earlier
one had (a second clean finds no checkpoint: the first record's stays).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.system import envinfo
from shoprld.daemon.services.commands import describe_commands
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.ledger import Ledger, format_rows, git_info
from shoprld.daemon.ops.oneshot import Campaign, read_json
from shoprld.daemon.round.plan import RoundPlan, resolve
from shoprld.daemon.foundation.records.store import STATE_FILE, Store

RECORD_ROOT = "reports/shoprld"
# The per-round result files the record keeps (relative to runs/), as tests/demotree reads them.
RESULT_GLOBS = ("round-*-bare-val/summary.json", "round-*-bare-val/manifest.json",
                "round-*-online-gate/online_gate_manifest.json", "round-*-online-gate/selected_skillbank.json",
                "round-*-online-gate/contributions.json", "round-*-online-analysis/analysis_summary.json",
                "round-*/curriculum.json", "round-*/selected_skillbank.json")
RESULT_MAX = 1024**2
RECORD_KINDS = ("round", "export", "gate", "inject")


def record_dir(cfg: Config, layout: Layout) -> Path:
    return layout.repo / RECORD_ROOT / cfg.campaign.name


def _stage_templates(cfg: Config) -> list[tuple[str, Sequence[str], Any]]:
    return [
        ("shopsim", cfg.shopsim.command, cfg.shopsim), ("emit", cfg.train.emit_command, cfg.train),
        ("check", cfg.train.check_command, cfg.train), ("ray-head", cfg.train.ray_head_command, cfg.train),
        ("sidecar", cfg.sidecar.command if cfg.sidecar.enabled else (), cfg.sidecar),
        ("train", cfg.train.command, cfg.train), ("export", cfg.export.command, cfg.export),
        ("val-server", cfg.val.server_command, cfg.val), ("val", cfg.val.command, cfg.val),
        ("analyze", cfg.gate.analyze_command, cfg.gate), ("gate", cfg.gate.command, cfg.gate),
        ("inject", cfg.inject.command, cfg.inject),
    ]


def stage_commands(camp: Campaign) -> dict[str, dict[str, Any]]:
    """Every stage's argv for every round, as the engine expands it, secrets masked."""
    cfg, layout, secrets = camp.cfg, camp.layout, camp.secrets
    red = secrets.redact
    out: dict[str, dict[str, Any]] = {}
    for r in range(cfg.campaign.rounds):
        rv = resolve(cfg, layout, r, secrets, planned=True)
        values = dict(rv.values)
        stages: dict[str, Any] = {}
        for name, template, spec in _stage_templates(cfg):
            if not template:
                continue
            argv = rv.wrap(rv.argv(template), spec)
            env = {k: red(v.format_map(values)) for k, v in spec.env.items()}
            if name == "val-server":
                env.update({k: red(v.format_map(values)) for k, v in cfg.val.server_env.items()})
            stages[name] = {"argv": [red(a) for a in argv], "shell": red(shlex.join(argv)),
                            "cwd": str(spec.cwd or layout.project_root), "env": env,
                            "secrets_from_env_file": list(spec.secrets)}
        out[values["round_id"]] = {"num_rollout": int(values["num_rollout"]),
                                   "end_iteration": int(values["end_iteration"]), "stages": stages}
    return out


def _round_rows(camp: Campaign) -> list[dict[str, Any]]:
    cfg, layout = camp.cfg, camp.layout
    ledger_rows = {r["index"]: r for r in Ledger(layout.ledger, overflow_dir=layout.campaign_root / "ledger").rows()}
    loaded = Store(layout.state_dir).load()
    durations = {str(r["round"]): r.get("duration_seconds") for r in (loaded.rounds if loaded else [])}
    rows = []
    for r in range(cfg.campaign.rounds):
        plan = RoundPlan(cfg, layout, r)
        rid = plan.round_id
        recs = {k: read_json(plan.record_path(k)) for k in RECORD_KINDS}
        summary = read_json(layout.runs / f"{rid}-bare-val" / "summary.json")
        manifest = read_json(layout.runs / f"{rid}-online-gate" / "online_gate_manifest.json")
        if not any(recs.values()) and summary is None and str(r) not in ledger_rows:
            continue
        s = summary if isinstance(summary, dict) else {}
        g = recs["gate"] or {}
        rows.append({
            "round": r, "round_id": rid,
            "val": {k: s.get(k) for k in ("primary", "counts", "weight_version", "weights_fingerprint",
                                          "reward_components", "schema_version")} if s else None,
            "gate": {"decision": g.get("decision"), "policy": g.get("policy"),
                     "analysis_status": g.get("analysis_status"),
                     "manifest_status": (manifest or {}).get("status") if isinstance(manifest, dict) else None},
            "inject": recs["inject"], "export": recs["export"], "started_at": (recs["round"] or {}).get("started_at"),
            "duration_seconds": durations.get(str(r)), "ledger": ledger_rows.get(str(r)),
        })
    return rows


def _checkpoint_doc(camp: Campaign) -> dict[str, Any]:
    cfg, layout = camp.cfg, camp.layout
    facts = RoundPlan(cfg, layout, 0).save_dir_facts()  # one scan; the resume rule names the final
    scan, m, final = facts.scan, facts.mapping, facts.resume_point
    return {
        "save_dir": str(layout.save_dir),
        "tracker": {"kind": scan.tracker.kind, "iteration": scan.tracker.iteration},
        "final": None if final is None else {**final.as_dict(), "round": m.round_of(final.iteration),
                                              "human": human_bytes(final.bytes)},
        "present": [{"iteration": c.iteration, "complete": c.complete, "bytes": c.bytes} for c in scan.checkpoints],
        "mapping": {"steps_per_round": cfg.campaign.steps_per_round, "end_offset": cfg.train.end_offset,
                    "end_iterations": [m.end_iteration(r) for r in range(cfg.campaign.rounds)]},
    }


def git_doc(repo: Path) -> dict[str, Any]:
    """The repo's commit, branch and parent, its origin (credentials stripped) and how many tracked files
    differ from the commit (for the record and the bundle)."""
    doc: dict[str, Any] = dict(git_info(repo))

    def git(*args: str) -> str:
        try:
            res = subprocess.run(["git", "--no-optional-locks", "-C", str(repo), *args], capture_output=True,
                                 text=True, timeout=10,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return ""
        return res.stdout.strip() if res.returncode == 0 else ""

    remote = git("remote", "get-url", "origin")
    doc["remote"] = re.sub(r"://[^/@]+@", "://", remote)  # never a token in userinfo
    doc["dirty_tracked_files"] = len([ln for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()
                                      if ln.strip()])
    return doc


def envinfo_doc(cfg: Config, layout: Layout) -> dict[str, Any]:
    """Stage env versions and the GPU architecture report (for the record and the bundle)."""
    build_sm = getattr(cfg.gpus, "build_sm", None)
    return {"stage_envs": [e.as_dict() for e in envinfo.stage_env_versions(cfg, layout)],
            **envinfo.gpu_report(build_sm, cfg.gpus.visible)}


def write_record(camp: Campaign, *, before_clean: bool = False, dest: Path | None = None) -> tuple[Path, list[str]]:
    """Write the reproducibility record into the repo; returns (its dir, its files).

    Files (all small; secrets masked): README.md, campaign.toml, config.resolved.json,
    git.json, rounds.json, ledger.tsv, commands.json, commands.txt, checkpoint.json,
    envinfo.json, state.json, results/runs/<the per-round result files>; clean adds
    cleanup.json. A file an older record has and this one cannot produce (its source was
    cleaned) is carried over. ``before_clean``: clean is writing it (its README.md says so).
    """
    cfg, layout, secrets = camp.cfg, camp.layout, camp.secrets
    red = secrets.redact
    final_dir = dest or record_dir(cfg, layout)
    files: dict[str, bytes] = {}

    def put_json(name: str, obj: Any) -> None:
        files[name] = red(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()

    try:
        files["campaign.toml"] = red(cfg.source.read_text(encoding="utf-8")).encode()
    except OSError:
        pass
    paths = {k: str(v) for k, v in vars(layout).items()}
    paths.update({"save_dir": str(layout.save_dir), "hf_dir": str(layout.hf_dir(cfg)), "runs": str(layout.runs)})
    put_json("config.resolved.json", {"config": cfg.model_dump(mode="json"), "layout": paths})
    git = git_doc(layout.repo)
    put_json("git.json", git)
    rounds = _round_rows(camp)
    put_json("rounds.json", rounds)
    rows = Ledger(layout.ledger, overflow_dir=layout.campaign_root / "ledger").rows()
    files["ledger.tsv"] = red(format_rows(rows).decode()).encode()
    put_json("commands.json", stage_commands(camp))
    try:
        files["commands.txt"] = red("\n".join(describe_commands(cfg, layout, secrets)) + "\n").encode()
    except Exception as exc:  # a describe bug must not block the record
        files["commands.txt"] = f"(describe_commands failed: {type(exc).__name__}: {exc})\n".encode()
    cdoc = _checkpoint_doc(camp)
    put_json("checkpoint.json", cdoc)
    put_json("envinfo.json", envinfo_doc(cfg, layout))
    state = read_json(layout.state_dir / STATE_FILE)
    if isinstance(state, dict):
        put_json("state.json", {k: v for k, v in state.items() if k != "children"})
    results: list[str] = []
    for pattern in RESULT_GLOBS:
        for p in sorted(layout.runs.glob(pattern)):
            try:
                if p.is_file() and p.stat().st_size <= RESULT_MAX:
                    rel = p.relative_to(layout.runs)
                    files[f"results/runs/{rel}"] = red(p.read_text(encoding="utf-8", errors="replace")).encode()
                    results.append(f"runs/{rel}")
            except OSError:
                continue
    files["README.md"] = red(_readme(camp, git, rounds, cdoc, results, before_clean)).encode()
    _swap_in(final_dir, files, keep_old_checkpoint=cdoc["final"] is None)
    return final_dir, sorted(_list_files(final_dir))


def _readme(camp: Campaign, git: Mapping[str, Any], rounds: list[dict[str, Any]], cdoc: Mapping[str, Any],
            results: list[str], before_clean: bool) -> str:
    cfg = camp.cfg
    final = cdoc.get("final")
    lines = [
        f"# Reproducibility record: {cfg.campaign.name} / {cfg.campaign.experiment}", "",
        f"Written by `shoprld` on {socket.gethostname()} at {datetime.now().astimezone().isoformat(timespec='seconds')}"
        f"{' before `shoprld clean`' if before_clean else ''}.", "",
        "## Reproduce",
        f"1. Check out commit `{git.get('commit') or '?'}` (branch `{git.get('branch') or '?'}`"
        f"{', remote ' + str(git.get('remote')) if git.get('remote') else ''}).",
        "2. Restore the stage environments listed in `envinfo.json` (same tool versions; same GPU arch).",
        f"3. Provide the inputs the config names: base model `{cfg.train.base_load}`, HF origin "
        f"`{cfg.export.origin_hf_dir}`, cold-start SkillBank `{cfg.inject.cold_start_skillbank}` and curriculum "
        f"`{cfg.inject.cold_start_curriculum}`, and the `.env` keys {', '.join(cfg.required_secrets()) or '(none)'}.",
        f"4. `shoprld run -c campaign.toml` with a fresh volume: {cfg.campaign.rounds} rounds x "
        f"{cfg.campaign.steps_per_round} steps, seed {cfg.campaign.seed}. The exact stage commands are in "
        "`commands.json` (every round) and `commands.txt`.",
        "5. Compare with `results/` (the per-round val summaries, gate manifests, SkillBanks and curricula).", "",
        "## Rounds", "",
        "| round | success_rate | reward_mean | coverage | gate | skillbank | weights | duration |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        val = r.get("val") or {}
        prim = val.get("primary") or {}
        counts = val.get("counts") or {}
        dur = r.get("duration_seconds")
        lines.append(f"| {r['round_id']} | {prim.get('success_rate', '-')} | {prim.get('reward_mean', '-')} | "
                     f"{counts.get('coverage', '-')} | {(r.get('gate') or {}).get('decision') or '-'} | "
                     f"{(r.get('inject') or {}).get('branch') or '-'} | {val.get('weight_version') or '-'} | "
                     f"{f'{dur:.0f}s' if isinstance(dur, (int, float)) else '-'} |")
    lines += ["", "## Final checkpoint", ""]
    if final:
        lines.append(f"{ckpt.iter_name(final['iteration'])} (round-{final['round']:03d}), {final['human']} "
                     f"({final['bytes']} bytes), at {final['path']}")
    else:
        lines.append("none on disk when this record was written (see an earlier record's checkpoint.json)")
    lines += ["", "## Files", "", "- " + "\n- ".join(
        ["campaign.toml: the config as written", "config.resolved.json: every setting and path, resolved",
         "git.json, rounds.json, ledger.tsv, checkpoint.json, state.json",
         "commands.json / commands.txt: the stage commands (secrets masked)",
         "envinfo.json: stage env tool versions and the GPU architecture check",
         f"results/: {len(results)} result files"]), ""]
    return "\n".join(lines)


def _list_files(d: Path) -> Iterator[str]:
    for dirpath, _, filenames in os.walk(d):
        for f in filenames:
            yield str((Path(dirpath) / f).relative_to(d))


def _swap_in(final_dir: Path, files: Mapping[str, bytes], *, keep_old_checkpoint: bool) -> None:
    """Write ``files`` as the new record; carry over what the old one has and this one lacks."""
    parent = final_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = parent / f".{final_dir.name}.staging-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    for name, data in files.items():
        p = staging / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    if final_dir.is_dir():
        for rel in _list_files(final_dir):
            src = final_dir / rel
            dst = staging / rel
            carry = not dst.exists() or (rel == "checkpoint.json" and keep_old_checkpoint)
            if carry and src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        old = parent / f".{final_dir.name}.old-{os.getpid()}"
        os.rename(final_dir, old)
        os.rename(staging, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, final_dir)
