"""What happens around a campaign rather than inside a round: clean, record, move (issue 9).

Theory of operation
===================

**Clean** (``shoprld clean``, the etiquette's "Nettoyage"). A finished or abandoned campaign
leaves tens of GB per checkpoint on ``/ephemeral``. :func:`plan_clean` lists exactly what
may go, all of it derived from the campaign's :class:`~shoprld.daemon.layout.Layout`:

- the Megatron checkpoints (with ``--keep-final``: all but the newest committed one, whose
  tracker and slime data-sampler state stay with it, so the campaign can still resume);
- the HF export, the rollout samples (``runs/slime-training``), the eval dumps
  (``traces*.jsonl`` and archived val run dirs under ``runs/``), the contents of ``tmp/``,
  ``ray/`` and ``wandb/`` (offline runs), the disk ballast, and the private cache only when
  ``storage.blank_cache`` gave the experiment one.

Every candidate is refused (listed, never touched) unless its realpath lies strictly inside
realpath(campaign root), is not the shared cache (or above or below it), does not contain a
path that must stay (the experiment dir, its logs, artifacts and runs, the state dir, the
repo), and belongs to the campaign root's owner. Deletion goes through
:func:`shoprld.daemon.disk.clear_dir_contents`, which walks by directory fd without
following symlinks and never enters another filesystem. Logs, decision records, the small
``runs/`` files, the ledger and the state dir are kept.

Before anything is deleted, the **reproducibility record** goes into the repo at
``reports/shoprld/<campaign>/`` (see :func:`write_record`): the config (as written and
resolved), git commit and branch, per-round metrics and gate decisions, the exact stage
commands with secrets masked, the final checkpoint's iteration and size, the small result
files themselves, and the stage environments' tool versions. Rewriting a record never loses
what an earlier one had (a second clean finds no checkpoint: the first record's stays).
``--dry-run`` lists what would go, with sizes, and writes nothing.

**Moving machines** (the memo's section 6). :func:`export_campaign` writes a tar of the small
state: the state dir's files, the ledger, the config, the decision records under
``artifacts/`` (including the HF export manifests), the small files under ``runs/`` (SkillBanks,
curricula, loop configs, summaries), and the cold-start inputs. Beside it, a
``MOVE_CHECKLIST.md`` (also in the tar, with a machine-readable twin in ``manifest.json``)
lists what must be copied separately, with sizes and absolute source paths: the resume
checkpoint with its tracker and data-sampler state, the base model and HF origin dir, the
``.env`` (secrets never go into a bundle), and the heavy parts of ``runs/`` and ``data/``.

:func:`import_campaign` re-points every root (repo, ephemeral root, state dir, and the
campaign file's own directory) in the config and in every small file, checks that the
copied checkpoint is complete and consistent with its tracker (and the same size) BEFORE it
writes anything, restores the files into the new layout, forgets the old machine's child
pids, journals ``campaign.imported``, and prints the next command. ``shoprld run`` then
reconciles as after any restart: the first round without a ledger row, skipping what is on
disk.
"""

from __future__ import annotations

import fnmatch
import io
import json
import math
import os
import re
import shlex
import shutil
import socket
import stat
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from datetime import time as dtime
from pathlib import Path
from typing import Any, TextIO

from . import checkpoints as ckpt
from .config import Config, load_config
from .disk import human_bytes
from .errors import EXIT_CONFIG, EXIT_OK, LockError, ShoprldError
from .layout import Layout
from .roundlog import ROUNDS_FILE
from .secrets import Secrets, load_secrets
from .store import JOURNAL_FILE, LOCK_FILE, STATE_FILE, STATUS_FILE, Store, atomic_write

RECORD_ROOT = "reports/shoprld"
BUNDLE_FORMAT = "shoprld-move-v1"
BUNDLE_TOP = "shoprld-move"
# Files under runs/ and artifacts/ that travel in the bundle: text, and small.
SMALL_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".md", ".txt", ".tsv", ".csv")
SMALL_MAX = 8 * 1024**2
# The per-round result files the record keeps (relative to runs/), as tests/demotree reads them.
RESULT_GLOBS = ("round-*-bare-val/summary.json", "round-*-bare-val/manifest.json",
                "round-*-online-gate/online_gate_manifest.json", "round-*-online-gate/selected_skillbank.json",
                "round-*-online-gate/contributions.json", "round-*-online-analysis/analysis_summary.json",
                "round-*/curriculum.json", "round-*/selected_skillbank.json")
RESULT_MAX = 1024**2
ROLLOUT_SAMPLES = "slime-training"
_ITER_DIR = re.compile(r"iter_(\d{7,})")
RECORD_KINDS = ("round", "export", "gate", "inject")


class LifecycleError(ShoprldError):
    """clean / export / import cannot go ahead (one line: what, where, the fix)."""

    exit_code = EXIT_CONFIG


# -- shared ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Campaign:
    cfg: Config
    layout: Layout
    secrets: Secrets


def open_campaign(config_path: Path) -> Campaign:
    cfg = load_config(config_path)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    return Campaign(cfg, layout, secrets)


def daemon_holds(state_dir: Path) -> int | None | bool:
    """False when no daemon holds the campaign's lock; else its pid (or True when unknown)."""
    from .status import probe_lock

    held, pid = probe_lock(state_dir / LOCK_FILE)
    if held:
        return pid if pid is not None else True
    return False


class _Locked:
    """Hold the campaign's lock for the whole operation, so no daemon starts in the middle."""

    def __init__(self, state_dir: Path, action: str) -> None:
        self.store = Store(state_dir)
        self.action = action

    def __enter__(self) -> Store:
        try:
            self.store.acquire_lock(role="oneshot")  # never daemon.pid: `stop` must not see us
        except LockError as exc:
            raise LockError(f"{self.action} refused: {exc}") from None
        return self.store

    def __exit__(self, *_: object) -> None:
        self.store.release_lock()


def _refuse_if_running(state_dir: Path, action: str) -> None:
    holder = daemon_holds(state_dir)
    if holder is not False:
        pid = "" if holder is True else f" (pid {holder})"
        raise LockError(f"{action} refused: a shoprld daemon{pid} runs this campaign ({state_dir}); "
                        "fix: `shoprld stop` it first, then rerun")


def tree_bytes(path: Path) -> int:
    """Apparent size of a file or tree; symlinks are not followed (a link counts as itself)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _inside(child: str, parent: str) -> bool:
    """Strictly inside (both already realpaths)."""
    return child != parent and child.startswith(parent.rstrip("/") + "/")


def _within_or_equal(child: str, parent: str) -> bool:
    return child == parent or _inside(child, parent)


# -- clean: the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doomed:
    """One thing clean deletes: a whole tree, a dir's contents (the dir stays), or a file."""

    path: Path
    what: str
    bytes: int
    mode: str  # "tree" | "contents" | "file" | "checkpoint" (an iter_N dir: checkpoints.py deletes it)


@dataclass
class CleanPlan:
    campaign_root: Path
    items: list[Doomed] = field(default_factory=list)
    refused: list[tuple[Path, str]] = field(default_factory=list)
    kept: list[tuple[str, Path]] = field(default_factory=list)
    final: ckpt.Checkpoint | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)


class _Guard:
    """The refusal rules, computed once from the layout (see the module docstring)."""

    def __init__(self, cfg: Config, layout: Layout) -> None:
        self.root = os.path.realpath(layout.campaign_root)
        self.cache = None if cfg.storage.blank_cache else os.path.realpath(layout.cache_root)
        keep = [layout.campaign_root, layout.exp_dir, layout.logs, layout.artifacts, layout.runs,
                layout.state_dir, layout.repo, layout.project_root]
        self.protected = {os.path.realpath(p) for p in keep}
        try:
            self.owner: int | None = os.stat(self.root).st_uid
        except OSError:
            self.owner = None

    def refusal(self, path: Path) -> str | None:
        real = os.path.realpath(path)
        if not _inside(real, self.root):
            return f"resolves to {real}, outside the campaign root {self.root}"
        if self.cache is not None and (_within_or_equal(real, self.cache) or _inside(self.cache, real)):
            return f"resolves to {real}, which is (or holds) the shared cache {self.cache}"
        for p in self.protected:
            if _within_or_equal(p, real):
                return f"resolves to {real}, which is (or holds) {p}, which clean keeps"
        try:
            uid = os.lstat(real).st_uid
        except OSError:
            return None
        if self.owner is not None and uid != self.owner:
            return f"owned by uid {uid}, not the campaign root's owner (uid {self.owner}): another user's"
        return None


def plan_clean(cfg: Config, layout: Layout, *, keep_final: bool) -> CleanPlan:
    """What ``clean`` would delete, refuse and keep. Reads the disk; changes nothing."""
    plan = CleanPlan(layout.campaign_root)
    guard = _Guard(cfg, layout)

    def add(path: Path, what: str, mode: str) -> None:
        if not os.path.lexists(path):
            return
        why = guard.refusal(path)
        if why is not None:
            plan.refused.append((path, why))
            return
        real = Path(os.path.realpath(path))
        if mode == "contents":
            try:
                with os.scandir(real) as it:
                    if next(it, None) is None:
                        return  # nothing to free
            except OSError:
                return
        plan.items.append(Doomed(path, what, tree_bytes(real), mode))

    # Checkpoints.
    save = layout.save_dir
    scan = ckpt.scan(save)
    final = scan.latest_complete
    plan.final = final
    m = ckpt.IterationMapping(cfg.campaign.steps_per_round, cfg.train.end_offset)
    try:
        entries = sorted(os.scandir(save), key=lambda e: e.name)
    except OSError:
        entries = []
    for e in entries:
        p = Path(e.path)
        im = _ITER_DIR.fullmatch(e.name)
        it = int(im.group(1)) if im else None
        if it is not None:
            is_final = final is not None and it == final.iteration
            if keep_final and is_final:
                plan.kept.append((f"final checkpoint {ckpt.iter_name(it)} (--keep-final)", p))
                continue
            state = "final, " if is_final else ""
            c = scan.get(it)
            state += "complete" if c is not None and c.complete else "partial"
            add(p, f"checkpoint {ckpt.iter_name(it)} ({state}, round-{m.round_of(it):03d})", "checkpoint")
        elif e.name == ckpt.TRACKER_NAME:
            if keep_final and final is not None:
                plan.kept.append(("checkpoint tracker", p))
            else:
                add(p, "checkpoint tracker", "file")
        elif e.name == "rollout" and e.is_dir(follow_symlinks=False):
            if keep_final and final is not None:
                for f in sorted(os.scandir(p), key=lambda x: x.name):
                    if re.search(rf"_{final.iteration}\.pt$", f.name):
                        plan.kept.append((f"slime data state of {ckpt.iter_name(final.iteration)}", Path(f.path)))
                    else:
                        add(Path(f.path), "slime data state (older iteration)", "file")
            else:
                add(p, "slime data-sampler states", "tree")
        elif e.name.startswith(".deleting."):
            add(p, "checkpoint left half-deleted", "tree")
    # The HF export, the rollout samples, the eval dumps.
    add(layout.hf_dir(cfg), "HF export (safetensors)", "tree")
    add(layout.runs / ROLLOUT_SAMPLES, "rollout samples (runs/slime-training)", "tree")
    for p in _eval_dumps(layout.runs):
        add(p, "eval dump" + (" (archived val run)" if p.is_dir() else ""), "tree" if p.is_dir() else "file")
    # tmp, ray, wandb (contents only: the daemon recreates the dirs anyway).
    add(layout.tmp, "tmp dir contents", "contents")
    add(layout.ray_tmp, "ray dir contents", "contents")
    wandb_before = len(plan.items)
    add(layout.wandb_dir, "wandb offline files", "contents")
    if len(plan.items) > wandb_before and cfg.wandb.mode == "offline":
        plan.notes.append(f"wandb offline runs in {layout.wandb_dir} are deleted: `wandb sync` them first "
                          "if they were never synced")
    add(layout.ballast, "disk ballast (recreated at the next start)", "file")
    if cfg.storage.blank_cache:
        add(layout.cache_root, "private cache (storage.blank_cache)", "tree")
    else:
        plan.kept.append(("shared cache (never cleaned)", layout.cache_root))
    plan.kept += [("logs", layout.logs), ("decision records", layout.artifacts),
                  ("small runs/ files (SkillBanks, curricula, summaries)", layout.runs),
                  ("state dir", layout.state_dir), ("ledger", layout.ledger)]
    return plan


def _eval_dumps(runs: Path) -> list[Path]:
    """Per-episode traces and archived val run dirs under runs/ (not the rollout samples)."""
    out: list[Path] = []
    try:
        tops = sorted(os.scandir(runs), key=lambda e: e.name)
    except OSError:
        return out
    for e in tops:
        if e.name == ROLLOUT_SAMPLES or e.name == "loop" or not e.is_dir(follow_symlinks=False):
            continue
        if ".archived-" in e.name:
            out.append(Path(e.path))
            continue
        for dirpath, dirnames, filenames in os.walk(e.path, followlinks=False):
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for f in sorted(filenames):
                if fnmatch.fnmatch(f, "traces*.jsonl"):
                    out.append(Path(dirpath) / f)
    return out


def execute(plan: CleanPlan, guard_root: Path) -> tuple[int, list[str]]:
    """Delete the plan's items (each re-checked just before). Returns (bytes freed, errors)."""
    from .disk import clear_dir_contents

    freed, errors = 0, []
    for item in plan.items:
        real = Path(os.path.realpath(item.path))
        try:
            if item.mode == "checkpoint":  # checkpoints.py alone deletes checkpoints (trash-renamed first)
                if not _inside(str(real), os.path.realpath(guard_root)):
                    raise ValueError(f"{item.path}: resolves outside the campaign root")
                if not os.path.lexists(item.path):
                    continue
                ckpt.delete_iter_dir(item.path)
                if os.path.lexists(item.path):
                    raise OSError("still there (see checkpoint.delete_refused/delete_failed in the log)")
                freed += item.bytes
            elif item.mode == "file":
                if os.path.realpath(item.path) != str(real) or not _inside(str(real), os.path.realpath(guard_root)):
                    raise ValueError(f"{item.path}: moved outside the campaign root since the plan")
                os.unlink(real)
                freed += item.bytes
            else:
                clear_dir_contents(real, within=guard_root)
                if item.mode == "tree":
                    os.rmdir(real)
                freed += item.bytes
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            errors.append(f"{item.path}: {exc}")
    return freed, errors


# -- clean: the command -------------------------------------------------------------------------------


def clean(config_path: Path, dry_run: bool = False, keep_final: bool = False, *, out: TextIO | None = None) -> int:
    """``shoprld clean``: write the reproducibility record, then delete this campaign's heavy dirs."""
    out = out or sys.stdout
    camp = open_campaign(config_path)
    cfg, layout = camp.cfg, camp.layout
    _refuse_if_running(layout.state_dir, "clean")
    if dry_run:
        plan = plan_clean(cfg, layout, keep_final=keep_final)
        _print_plan(plan, cfg, layout, out, dry_run=True)
        out.write(f"would write the reproducibility record to {record_dir(cfg, layout)}/\n")
        return EXIT_OK
    with _Locked(layout.state_dir, "clean") as store:
        plan = plan_clean(cfg, layout, keep_final=keep_final)
        _print_plan(plan, cfg, layout, out, dry_run=False)
        rec, files = write_record(camp, plan=plan)
        freed, errors = execute(plan, layout.campaign_root)
        _write_cleanup(rec, plan, freed, errors, keep_final, camp.secrets)
        out.write(f"reproducibility record: {rec}/ ({len(files) + ('cleanup.json' not in files)} files)\n")
        store.append({"event": "campaign.cleaned", "freed_bytes": freed, "keep_final": keep_final,
                      "deleted": [str(i.path) for i in plan.items], "record": str(rec),
                      "refused": [str(p) for p, _ in plan.refused]})
    for e in errors:
        out.write(f"  could not delete: {e}\n")
    out.write(f"freed {human_bytes(freed)} ({len(plan.items) - len(errors)} of {len(plan.items)} paths)\n")
    return EXIT_OK


def _print_plan(plan: CleanPlan, cfg: Config, layout: Layout, out: TextIO, *, dry_run: bool) -> None:
    state = _read_json(layout.state_dir / STATE_FILE) or {}
    st, rnd = state.get("state"), state.get("round")
    out.write(f"shoprld clean{' --dry-run' if dry_run else ''}: campaign {cfg.campaign.name} / "
              f"{cfg.campaign.experiment} (state {st or 'never started'}"
              f"{f', round-{rnd:03d}' if isinstance(rnd, int) else ''})\n")
    out.write(f"campaign root  {layout.campaign_root}\n")
    if st not in (None, "DONE") and not any("final" in k for k, _ in plan.kept):
        out.write(f"note: the campaign is not DONE ({st}); without --keep-final it cannot resume after this\n")
    out.write(("would delete:\n" if dry_run else "deleting:\n") if plan.items else "nothing to delete\n")
    width = max((len(i.what) for i in plan.items), default=0)
    for i in plan.items:
        out.write(f"  {human_bytes(i.bytes):>10}  {i.what:<{width}}  {_short(i.path, layout.campaign_root)}\n")
    if plan.items:
        out.write(f"  {human_bytes(plan.total):>10}  total, {len(plan.items)} paths\n")
    for p, why in plan.refused:
        out.write(f"  refused     {p}: {why}\n")
    out.write("keeping:\n")
    for what, p in plan.kept:
        out.write(f"  {what}: {p}\n")
    for n in plan.notes:
        out.write(f"note: {n}\n")


def _short(path: Path, root: Path) -> str:
    """``<campaign root>/...`` for paths inside it: the listing stays readable."""
    try:
        return f"<campaign root>/{path.relative_to(root)}"
    except ValueError:
        return str(path)


def _write_cleanup(rec: Path, plan: CleanPlan, freed: int, errors: list[str], keep_final: bool,
                   secrets: Secrets) -> None:
    doc = {
        "cleaned_at": time.time(), "host": socket.gethostname(), "keep_final": keep_final, "freed_bytes": freed,
        "deleted": [{"path": str(i.path), "what": i.what, "bytes": i.bytes} for i in plan.items],
        "refused": [{"path": str(p), "reason": r} for p, r in plan.refused],
        "kept": [{"what": w, "path": str(p)} for w, p in plan.kept], "errors": errors,
    }
    atomic_write(rec / "cleanup.json", secrets.redact(json.dumps(doc, indent=2) + "\n").encode())


# -- the reproducibility record ---------------------------------------------------------------------


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
    from .roundplan import resolve

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
    from .ledger import Ledger

    cfg, layout = camp.cfg, camp.layout
    ledger_rows = {r["index"]: r for r in Ledger(layout.ledger, overflow_dir=layout.campaign_root / "ledger").rows()}
    loaded = Store(layout.state_dir).load()
    durations = {str(r["round"]): r.get("duration_seconds") for r in (loaded.rounds if loaded else [])}
    rows = []
    for r in range(cfg.campaign.rounds):
        rid = f"round-{r:03d}"
        recs = {k: _read_json(layout.artifacts / k / f"{rid}.json") for k in RECORD_KINDS}
        summary = _read_json(layout.runs / f"{rid}-bare-val" / "summary.json")
        manifest = _read_json(layout.runs / f"{rid}-online-gate" / "online_gate_manifest.json")
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
    scan = ckpt.scan(layout.save_dir)
    m = ckpt.IterationMapping(cfg.campaign.steps_per_round, cfg.train.end_offset)
    final = scan.latest_complete
    return {
        "save_dir": str(layout.save_dir),
        "tracker": {"kind": scan.tracker.kind, "iteration": scan.tracker.iteration},
        "final": None if final is None else {**final.as_dict(), "round": m.round_of(final.iteration),
                                              "human": human_bytes(final.bytes)},
        "present": [{"iteration": c.iteration, "complete": c.complete, "bytes": c.bytes} for c in scan.checkpoints],
        "mapping": {"steps_per_round": cfg.campaign.steps_per_round, "end_offset": cfg.train.end_offset,
                    "end_iterations": [m.end_iteration(r) for r in range(cfg.campaign.rounds)]},
    }


def _git_doc(repo: Path) -> dict[str, Any]:
    import subprocess

    from .ledger import git_info

    doc: dict[str, Any] = dict(git_info(repo))

    def git(*args: str) -> str:
        try:
            res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10,
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
    from . import envinfo

    build_sm = getattr(cfg.gpus, "build_sm", None)
    return {"stage_envs": [e.as_dict() for e in envinfo.stage_env_versions(cfg, layout)],
            **envinfo.gpu_report(build_sm, cfg.gpus.visible)}


def write_record(camp: Campaign, *, plan: CleanPlan | None = None, dest: Path | None = None) -> tuple[Path, list[str]]:
    """Write the reproducibility record into the repo; returns (its dir, its files).

    Files (all small; secrets masked): README.md, campaign.toml, config.resolved.json,
    git.json, rounds.json, ledger.tsv, commands.json, commands.txt, checkpoint.json,
    envinfo.json, state.json, results/runs/<the per-round result files>; clean adds
    cleanup.json. A file an older record has and this one cannot produce (its source was
    cleaned) is carried over.
    """
    from .commands import describe_commands
    from .ledger import COLUMNS, Ledger

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
    git = _git_doc(layout.repo)
    put_json("git.json", git)
    rounds = _round_rows(camp)
    put_json("rounds.json", rounds)
    rows = Ledger(layout.ledger, overflow_dir=layout.campaign_root / "ledger").rows()
    files["ledger.tsv"] = red("\n".join(["\t".join(COLUMNS)] + ["\t".join(r[c] for c in COLUMNS) for r in rows])
                              + "\n").encode()
    put_json("commands.json", stage_commands(camp))
    try:
        files["commands.txt"] = red("\n".join(describe_commands(cfg, layout, secrets)) + "\n").encode()
    except Exception as exc:  # a describe bug must not block the record
        files["commands.txt"] = f"(describe_commands failed: {type(exc).__name__}: {exc})\n".encode()
    cdoc = _checkpoint_doc(camp)
    put_json("checkpoint.json", cdoc)
    put_json("envinfo.json", envinfo_doc(cfg, layout))
    state = _read_json(layout.state_dir / STATE_FILE)
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
    files["README.md"] = red(_readme(camp, git, rounds, cdoc, results, plan)).encode()
    _swap_in(final_dir, files, keep_old_checkpoint=cdoc["final"] is None)
    return final_dir, sorted(_list_files(final_dir))


def _readme(camp: Campaign, git: Mapping[str, Any], rounds: list[dict[str, Any]], cdoc: Mapping[str, Any],
            results: list[str], plan: CleanPlan | None) -> str:
    cfg = camp.cfg
    final = cdoc.get("final")
    lines = [
        f"# Reproducibility record: {cfg.campaign.name} / {cfg.campaign.experiment}", "",
        f"Written by `shoprld` on {socket.gethostname()} at {datetime.now().astimezone().isoformat(timespec='seconds')}"
        f"{' before `shoprld clean`' if plan is not None else ''}.", "",
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


# -- moving machines: the root re-pointer ---------------------------------------------------------------


class Repointer:
    """Rewrites absolute paths under old roots to the new roots (longest old root first).

    A root matches only as a whole path prefix: not preceded by a path character, and
    followed by ``/``, the end, or a delimiter (quote, whitespace, comma, bracket...).
    """

    def __init__(self, mapping: Sequence[tuple[str, str]]) -> None:
        pairs = {os.path.normpath(o): os.path.normpath(n) for o, n in mapping if o and n and o != n}
        self.pairs = sorted(pairs.items(), key=lambda p: len(p[0]), reverse=True)
        self.count = 0
        if self.pairs:
            alt = "|".join(re.escape(o) for o, _ in self.pairs)
            self._re: re.Pattern[str] | None = re.compile(
                rf"(?<![\w.~/-])({alt})(?=$|[/\s\"'`,;:=)\]}}>|\\])", re.M)
        else:
            self._re = None

    def text(self, s: str) -> str:
        if self._re is None:
            return s
        lookup = dict(self.pairs)

        def sub(m: re.Match[str]) -> str:
            self.count += 1
            return lookup[m.group(1)]

        return self._re.sub(sub, s)

    def path(self, p: Path | str) -> Path:
        return Path(self.text(str(p)))

    def obj(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.obj(x) for x in v]
        if isinstance(v, dict):
            return {k: self.obj(x) for k, x in v.items()}
        return v


# -- a minimal TOML writer (tomllib reads only; the config has no exotic types) ---------------------


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k, ensure_ascii=False)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (datetime, date, dtime)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dump_toml(data: Mapping[str, Any], header: str = "") -> str:
    """Tables of scalars, arrays and inline tables: what a campaign file holds."""
    lines = [f"# {ln}" if ln else "#" for ln in header.splitlines()]
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, dict)]
    for k, v in scalars:
        lines.append(f"{_toml_key(k)} = {_toml_value(v)}")

    def table(prefix: str, tbl: Mapping[str, Any]) -> None:
        lines.append("")
        lines.append(f"[{prefix}]")
        subs = []
        for k, v in tbl.items():
            if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
                subs.append((k, v))
            else:
                lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in subs:
            table(f"{prefix}.{_toml_key(k)}", v)

    for k, v in data.items():
        if isinstance(v, dict):
            table(_toml_key(k), v)
    return "\n".join(lines) + "\n"


# -- moving machines: export ----------------------------------------------------------------------------


def _small_files(root: Path, *, skip_top: Sequence[str] = ()) -> tuple[list[Path], list[tuple[Path, int]]]:
    """(small text files to bundle, big/other files left out with their sizes) under ``root``."""
    small: list[Path] = []
    left: list[tuple[Path, int]] = []
    if not root.is_dir():
        return small, left
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in skip_top]
        dirnames.sort()
        for f in sorted(filenames):
            p = Path(dirpath) / f
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if p.suffix in SMALL_SUFFIXES and st.st_size <= SMALL_MAX:
                small.append(p)
            else:
                left.append((p, st.st_size))
    return small, left


@dataclass(frozen=True)
class CopyItem:
    """One thing the bundle does not carry: copy ``src`` to ``<new root>/<rel>`` yourself."""

    what: str
    src: str
    root: str       # a name in the manifest's "roots", or "" for "the same absolute path"
    rel: str
    bytes: int
    kind: str       # "dir" | "file"
    required: bool
    why: str = ""


def _root_of(path: Path, roots: Mapping[str, str]) -> tuple[str, str]:
    """(root name, relative path) of the longest root holding ``path``; ("", abs) when none."""
    best = ("", str(path))
    best_len = -1
    for name, r in roots.items():
        rp = os.path.normpath(r)
        sp = os.path.normpath(str(path))
        if (sp == rp or sp.startswith(rp.rstrip("/") + "/")) and len(rp) > best_len:
            best, best_len = (name, os.path.relpath(sp, rp)), len(rp)
    return best


def _old_roots(cfg: Config, layout: Layout) -> dict[str, str]:
    return {
        "config_dir": str(cfg.source.parent), "repo": str(layout.repo), "project_root": str(layout.project_root),
        "ephemeral_root": str(layout.ephemeral_root), "state_dir": str(layout.state_dir),
        "exp_dir": str(layout.exp_dir), "campaign_root": str(layout.campaign_root),
    }


def _copy_items(camp: Campaign, roots: Mapping[str, str], state: Mapping[str, Any],
                left_out: Sequence[tuple[Path, int]]) -> tuple[list[CopyItem], dict[str, Any] | None]:
    cfg, layout = camp.cfg, camp.layout
    items: list[CopyItem] = []

    def add(what: str, p: Path | None, required: bool, why: str = "") -> None:
        if p is None:
            return
        exists = os.path.lexists(p)
        root, rel = _root_of(p, roots)
        items.append(CopyItem(what, str(p), root, rel, tree_bytes(p) if exists else 0,
                              "dir" if p.is_dir() else "file", required and exists,
                              why if exists else f"{why} (not found on this machine)".strip()))

    scan = ckpt.scan(layout.save_dir)
    final = scan.latest_complete
    cdoc = None
    if final is not None:
        cdoc = {**final.as_dict(), "tracker": scan.tracker.iteration, "save_dir": str(layout.save_dir)}
        add(f"resume checkpoint {ckpt.iter_name(final.iteration)}", final.path, True, "the resume point (--load)")
        add("checkpoint tracker", layout.save_dir / ckpt.TRACKER_NAME, True, "names the resume point")
        for f in sorted((layout.save_dir / "rollout").glob(f"*_{final.iteration}.pt")):
            add(f"slime data-sampler state of {ckpt.iter_name(final.iteration)}", f, True, "slime resumes its data order")
        for c in scan.committed[:-1]:
            add(f"older checkpoint {ckpt.iter_name(c.iteration)}", c.path, False, "not needed to resume")
    add("base model (train.base_load)", cfg.train.base_load, True, "round 0's --load; --hf-checkpoint")
    add("HF origin dir (export.origin_hf_dir)", cfg.export.origin_hf_dir, True, "config/tokenizer for the export")
    add(".env (secrets: never bundled)", layout.env_file, True, "the keys " + ", ".join(cfg.required_secrets()))
    st = state.get("state")
    hf = layout.hf_dir(cfg)
    if st in ("EXPORT_HF", "VAL", "GATE") and hf.exists():
        need = not cfg.export.command
        add("HF export", hf, need, "the val server serves it" +
            ("; no export.command to rebuild it" if need else "; else rebuilt from the checkpoint"))
    add("rollout samples (runs/slime-training)", layout.runs / ROLLOUT_SAMPLES, False,
        "evidence of finished rounds; the current round's are rewritten on resume")
    for p, size in left_out:
        root, rel = _root_of(p, roots)
        items.append(CopyItem("runs/ file too big or not text for the bundle", str(p), root, rel, size, "file",
                              False, "copy it if you want the evidence"))
    data = layout.project_root / "data"
    add("<project_root>/data (not in git)", data if data.exists() else None, False,
        "copy it, or rebuild the task jsonl per training.md")
    if cfg.storage.project_root is not None and not _within_or_equal(str(layout.project_root), str(layout.repo)):
        add("the ShopSimRL project root", layout.project_root, True, "storage.project_root: keep the same path")
    return [i for i in items if i.src], cdoc


def export_campaign(config_path: Path, out_tar: Path, *, out: TextIO | None = None) -> int:
    """``shoprld export-campaign``: the small state as a tar, plus MOVE_CHECKLIST.md."""
    out = out or sys.stdout
    _check_out_path(out_tar)
    camp = open_campaign(config_path)
    cfg, layout = camp.cfg, camp.layout
    _refuse_if_running(layout.state_dir, "export-campaign")
    with _Locked(layout.state_dir, "export-campaign"):
        state = _read_json(layout.state_dir / STATE_FILE)
        if not isinstance(state, dict):
            raise LifecycleError(f"{layout.state_dir / STATE_FILE}: no campaign state to export; "
                                 f"fix: run the campaign first (shoprld run -c {cfg.source})")
        roots = _old_roots(cfg, layout)
        members: dict[str, bytes] = {}
        sources: dict[str, str] = {}

        def put(name: str, p: Path) -> None:
            try:
                members[name] = p.read_bytes()
                sources[name] = str(p)
            except OSError:
                pass

        put("config/campaign.toml", cfg.source)
        for f in (STATE_FILE, JOURNAL_FILE, STATUS_FILE, ROUNDS_FILE):
            put(f"state/{f}", layout.state_dir / f)
        put("ledger/repo.tsv", layout.ledger)
        overflow = layout.campaign_root / "ledger" / f"{layout.ledger.stem}.tsv"
        put("ledger/overflow.tsv", overflow)
        small, _ = _small_files(layout.artifacts)
        for p in small:
            put(f"exp/artifacts/{p.relative_to(layout.artifacts)}", p)
        small, left_out = _small_files(layout.runs, skip_top=(ROLLOUT_SAMPLES,))
        for p in small:
            put(f"exp/runs/{p.relative_to(layout.runs)}", p)
        for key in ("cold_start_skillbank", "cold_start_curriculum"):
            p = getattr(cfg.inject, key)
            if p is not None and p.is_file() and p.stat().st_size <= SMALL_MAX:
                put(f"inputs/{key}/{p.name}", p)
        items, cdoc = _copy_items(camp, roots, state, left_out)
        env = envinfo_doc(cfg, layout)
        manifest = {
            "format": BUNDLE_FORMAT, "campaign": cfg.campaign.name, "experiment": cfg.campaign.experiment,
            "exported_at": time.time(), "host": socket.gethostname(), "user": layout.brev_root.name,
            "config_file": str(cfg.source), "roots": roots,
            "layout": {"ledger": str(layout.ledger), "save_dir": str(layout.save_dir),
                       "cache_root": str(layout.cache_root), "hf_dir": str(layout.hf_dir(cfg))},
            "state": {"state": state.get("state"), "round": state.get("round"), "rounds": cfg.campaign.rounds},
            "checkpoint": cdoc, "git": _git_doc(layout.repo), "envinfo": env,
            "copy": [vars(i) for i in items], "files": sources,
        }
        checklist = move_checklist(manifest)
        members["MOVE_CHECKLIST.md"] = checklist.encode()
        members["manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        _write_tar(out_tar, members)
        beside = out_tar.with_name(out_tar.name + ".MOVE_CHECKLIST.md")
        _write_private(beside, lambda fh: fh.write(checklist.encode()))
    size = out_tar.stat().st_size
    need = [i for i in items if i.required]
    out.write(f"exported {cfg.campaign.name} / {cfg.campaign.experiment} (state {state.get('state')}, "
              f"round-{int(state.get('round') or 0):03d}) to {out_tar} ({human_bytes(size)}, {len(members)} files)\n")
    out.write(f"copy separately ({len(need)} required, {human_bytes(sum(i.bytes for i in need))}): see {beside}\n")
    for i in need:
        out.write(f"  {human_bytes(i.bytes):>10}  {i.what}: {i.src}\n")
    out.write(f"then on the new machine: shoprld import-campaign {out_tar.name} --repo R --ephemeral-root E\n")
    return EXIT_OK


def _check_out_path(out_tar: Path) -> None:
    """Refuse, before any work, a destination that can never take the bundle (one line each)."""
    try:
        st: os.stat_result | None = os.stat(out_tar)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise LifecycleError(f"{out_tar}: cannot use as the bundle ({exc.strerror}); "
                             "fix: pass a file path in a writable dir") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise LifecycleError(f"{out_tar}: is a directory; fix: name the bundle file, e.g. {out_tar / 'campaign.tar'}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise LifecycleError(f"{out_tar}: exists and is not a regular file; fix: pass a path for a new .tar file")
    parent = out_tar.parent
    if not parent.is_dir():
        raise LifecycleError(f"{parent}: no such directory for the bundle {out_tar.name}; "
                             f"fix: `mkdir -p {parent}` or pass another path")


def _write_private(path: Path, fill: Any) -> None:
    """Create ``path`` through a 0600 temp file in its own dir (``fill(fileobj)`` writes it), fsync,
    rename. On any failure the temp file is removed and the error is one line (a LifecycleError):
    a bundle holds the campaign's state, so no half-written or world-readable copy stays behind."""
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # 0600
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise LifecycleError(f"{path}: cannot write ({exc.strerror or exc}); "
                             "fix: choose a writable place with free space") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _write_tar(path: Path, members: Mapping[str, bytes]) -> None:
    mode = "w:gz" if path.name.endswith((".tar.gz", ".tgz")) else "w"
    now = time.time()

    def fill(fh: Any) -> None:
        with tarfile.open(fileobj=fh, mode=mode) as tar:  # type: ignore[call-overload]
            for name in sorted(members):
                data = members[name]
                info = tarfile.TarInfo(f"{BUNDLE_TOP}/{name}")
                info.size, info.mtime, info.mode = len(data), int(now), 0o600
                tar.addfile(info, io.BytesIO(data))

    _write_private(path, fill)


def move_checklist(manifest: Mapping[str, Any]) -> str:
    """MOVE_CHECKLIST.md: what the bundle does not carry, with sizes and absolute paths."""
    roots = manifest["roots"]
    st = manifest["state"]
    ck = manifest.get("checkpoint")
    git = manifest.get("git") or {}
    when = datetime.fromtimestamp(manifest["exported_at"]).astimezone().isoformat(timespec="seconds")
    lines = [
        f"# Moving campaign {manifest['campaign']} / {manifest['experiment']}", "",
        f"Exported from {manifest['host']} at {when}, in state {st['state']} at round-{int(st['round'] or 0):03d} "
        f"({st['rounds']} rounds). Resume point: "
        + (f"{ckpt.iter_name(ck['iteration'])} ({human_bytes(ck['bytes'])})." if ck else "none (no checkpoint yet)."), "",
        "The bundle holds the small state (state dir, journal, ledger, config, decision records, SkillBanks,",
        "curricula, the small runs/ files). Everything below is NOT in it.", "",
        "## 1. On the new machine, before copying",
        "- Restore the system image or the stage environments (slime, shopsim, sglang, Megatron): versions below.",
        f"- Check out the repo at commit `{git.get('commit') or '?'}` (branch `{git.get('branch') or '?'}`"
        f"{', ' + str(git.get('remote')) if git.get('remote') else ''}) as the new `--repo`.",
        "- Choose the new roots: `--repo R`, `--ephemeral-root E` (and `--state-dir S`).", "",
        "## 2. Copy these (destinations relative to the new roots)", "",
        "Old roots: " + ", ".join(f"`{k}` = `{v}`" for k, v in roots.items()), "",
        "| | what | size | source (old machine) | destination (new machine) | why |",
        "|---|---|---:|---|---|---|",
    ]
    for item in manifest["copy"]:
        dst = f"<new {item['root']}>/{item['rel']}" if item["root"] else f"{item['rel']} (same path)"
        mark = "**required**" if item["required"] else "optional"
        lines.append(f"| {mark} | {item['what']} | {human_bytes(item['bytes'])} | `{item['src']}` | `{dst}` | "
                     f"{item['why']} |")
    req = [i for i in manifest["copy"] if i["required"]]
    lines += ["", f"Required in all: {human_bytes(sum(i['bytes'] for i in req))}. Copy directories whole "
              "(`rsync -a SRC/ DST/`) and the tracker last; the import checks that the checkpoint is complete,",
              "consistent with its tracker, and of the same size.", "",
              "The new experiment dir is `<new ephemeral_root>/" +
              os.path.relpath(roots["exp_dir"], roots["ephemeral_root"]) + "` "
              f"(user `{manifest['user']}` is kept in the new config). Put runs/ files into the experiment dir's "
              "`runs/`, never into the repo (the daemon links `<repo>/runs` there).", "",
              "## 3. Import and resume", "",
              "    shoprld import-campaign BUNDLE.tar --repo R --ephemeral-root E [--state-dir S]",
              "    shoprld run -c <the config it prints>", "",
              "## Stage environments on the old machine", ""]
    env = manifest.get("envinfo") or {}
    for e in env.get("stage_envs", []):
        v = e.get("versions") or {}
        where = e.get("conda_prefix") or e.get("python")
        lines.append(f"- {'+'.join(e.get('stages', []))} ({where}): " +
                     (e["error"] if e.get("error") else ", ".join(f"{k} {val}" for k, val in v.items())))
    gpus = ", ".join("{} {} {}".format(g["index"], g["name"], g["sm"]) for g in env.get("gpus") or [])
    built = "; envs built for {}".format(env["expected_sm"]) if env.get("expected_sm") else ""
    lines.append(f"- GPUs: {gpus or env.get('problem')}{built}")
    return "\n".join(lines) + "\n"


# -- moving machines: import ----------------------------------------------------------------------------


def _read_bundle(bundle: Path) -> dict[str, bytes]:
    try:
        tar = tarfile.open(bundle, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise LifecycleError(f"{bundle}: not a readable bundle ({exc}); fix: pass the tar export-campaign wrote") \
            from None
    out: dict[str, bytes] = {}
    with tar:
        for m in tar.getmembers():
            name = m.name
            parts = Path(name).parts
            if not m.isfile() or name.startswith("/") or ".." in parts or not parts or parts[0] != BUNDLE_TOP:
                continue  # only plain files inside the bundle's own top dir: no links, no escapes
            fh = tar.extractfile(m)
            if fh is not None:
                out["/".join(parts[1:])] = fh.read()
    if "manifest.json" not in out:
        raise LifecycleError(f"{bundle}: no {BUNDLE_TOP}/manifest.json; fix: pass the tar export-campaign wrote")
    return out


def _default_config_out(old_config: Path, old_repo: Path, new_repo: Path) -> Path | None:
    """The campaign file keeps its place relative to the repo (inside it, or beside it); None
    when it lived elsewhere (then it goes into the new state dir)."""
    for old_base, new_base in ((old_repo, new_repo), (old_repo.parent, new_repo.parent)):
        if _inside(os.path.normpath(old_config), os.path.normpath(old_base)):
            return new_base / os.path.relpath(old_config, old_base)
    return None


def _rewrite_config(text: str, old_dir: Path, rp: Repointer, *, repo: Path, ephemeral: Path, state_dir: Path,
                    user: str) -> dict[str, Any]:
    from .config import _PATH_KEYS

    data = tomllib.loads(text)
    for section, keys in (*_PATH_KEYS.items(), ("storage", ("env_file",))):
        sec = data.get(section)
        if not isinstance(sec, dict):
            continue
        for key in keys:
            val = sec.get(key)
            if isinstance(val, str) and val and "{" not in val:
                p = Path(os.path.expandvars(val)).expanduser()
                if section == "storage" and key == "env_file" and not p.is_absolute():
                    continue  # relative to the repo, which moves with it
                sec[key] = str(p if p.is_absolute() else old_dir / p)
    data = rp.obj(data)
    storage = data.setdefault("storage", {})
    storage.update({"repo": str(repo), "ephemeral_root": str(ephemeral), "state_dir": str(state_dir), "user": user})
    return dict(data)


def _verify_checkpoint(save_dir: Path, want: Mapping[str, Any]) -> str | None:
    """None when ``iter_<want>`` is complete in ``save_dir``, the tracker names it, and its size matches."""
    n = int(want["iteration"])
    path = ckpt.iter_dir(save_dir, n)
    scan = ckpt.scan(save_dir)
    c = scan.get(n)
    if c is None:
        return f"{path}: missing"
    if not c.complete:
        have = sorted(os.listdir(path)) if path.is_dir() else []
        return f"{path}: incomplete (has {', '.join(have) or 'nothing'}; needs .metadata, metadata.json, *.distcp)"
    if scan.tracker.iteration != n:
        return (f"{save_dir / ckpt.TRACKER_NAME}: tracker is {scan.tracker.kind} "
                f"{scan.tracker.iteration if scan.tracker.iteration is not None else ''}, expected {n}".rstrip())
    if want.get("bytes") and c.bytes != int(want["bytes"]):
        return f"{path}: {c.bytes} bytes, but the original has {want['bytes']} (a truncated copy?)"
    return None


# The only inputs/<key>/ members a bundle may carry: export writes exactly these, and each maps to
# the config attribute of the same name (never an arbitrary attribute of [inject]).
INPUT_KEYS = ("cold_start_skillbank", "cold_start_curriculum")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NAME_MAX = 255  # bytes in one path component (ext4, xfs, tmpfs)
_PATH_MAX = 4000


class _Fence:
    """The new roots an import may write under: ``--repo``, ``--ephemeral-root``, the state dir.

    Every destination that comes from a bundle (the bundled config's paths, member names, the
    manifest's roots) is checked by its realpath, so a symlink already in the new tree, a ``..``
    or an absolute path cannot lead a write elsewhere. An existing file that is not a regular
    file is refused too (a device, a FIFO, a dir where a file goes).
    """

    def __init__(self, roots: Mapping[str, Path]) -> None:
        self.roots = {k: os.path.realpath(v) for k, v in roots.items()}

    def refusal(self, dst: Path, *, directory: bool = False) -> str | None:
        raw = os.fsencode(str(dst))
        if len(raw) >= _PATH_MAX or any(len(c) > _NAME_MAX for c in raw.split(b"/")):
            return "has a name too long for the filesystem"
        real = os.path.realpath(dst)
        if not any(_within_or_equal(real, r) for r in self.roots.values()):
            where = ", ".join(f"--{k} {v}" for k, v in self.roots.items())
            return f"resolves to {real}, outside the roots given ({where})"
        try:
            st = os.lstat(real)
        except OSError:
            return None
        if directory and not stat.S_ISDIR(st.st_mode):
            return "exists and is not a directory"
        if not directory and not stat.S_ISREG(st.st_mode):
            return "exists and is not a regular file"
        return None

    def check(self, dst: Path, what: str, *, directory: bool = False) -> None:
        why = self.refusal(dst, directory=directory)
        if why is not None:
            raise LifecycleError(f"{dst} ({what}, from the bundle) {why}; import-campaign writes nothing outside "
                                 "the new roots; fix: re-export with that path under the repo or the ephemeral root, "
                                 "or pass roots that hold it")


@dataclass
class _Plan:
    """Everything an import will write, checked before the first write."""

    writes: list[tuple[Path, bytes, str]] = field(default_factory=list)  # (dst, data, kind)
    ledger: bytes | None = None
    skipped: list[str] = field(default_factory=list)


def _bad_bundle(bundle: Path, what: str) -> LifecycleError:
    return LifecycleError(f"{bundle}: {what}; fix: pass the tar `shoprld export-campaign` wrote (export again)")


def _check_manifest(bundle: Path, manifest: Any) -> None:
    """The manifest fields import relies on, with the types it relies on (a hostile bundle is one line)."""
    if not isinstance(manifest, dict):
        raise _bad_bundle(bundle, "manifest.json is not an object")
    if manifest.get("format") != BUNDLE_FORMAT:
        raise LifecycleError(f"{bundle}: format {manifest.get('format')!r}, expected {BUNDLE_FORMAT}; "
                             "fix: export with the same shoprld version")
    roots = manifest.get("roots")
    if not isinstance(roots, dict) or not all(isinstance(roots.get(k), str) and os.path.isabs(roots[k])
                                              for k in ("repo", "ephemeral_root", "state_dir", "config_dir")):
        raise _bad_bundle(bundle, "manifest.json:roots must name absolute repo, ephemeral_root, state_dir, config_dir")
    if not all(isinstance(v, str) for v in roots.values()):
        raise _bad_bundle(bundle, "manifest.json:roots holds a value that is not a path")
    for key in ("campaign", "user"):
        if not isinstance(manifest.get(key), str) or not _SAFE_NAME.fullmatch(manifest[key]):
            raise _bad_bundle(bundle, f"manifest.json:{key} {manifest.get(key)!r} is not a plain name")
    for key in ("config_file", "host", "experiment"):
        if not isinstance(manifest.get(key), str):
            raise _bad_bundle(bundle, f"manifest.json:{key} missing or not a string")
    if not os.path.isabs(manifest["config_file"]) or Path(manifest["config_file"]).name in ("", ".", ".."):
        raise _bad_bundle(bundle, f"manifest.json:config_file {manifest['config_file']!r} is not an absolute file path")
    st = manifest.get("state")
    if not isinstance(st, dict) or not (st.get("round") is None or type(st.get("round")) is int):
        raise _bad_bundle(bundle, "manifest.json:state must hold an integer round")
    copy = manifest.get("copy")
    if not isinstance(copy, list) or not all(
            isinstance(i, dict) and isinstance(i.get("what"), str) and isinstance(i.get("src"), str)
            and isinstance(i.get("rel"), str) and isinstance(i.get("required"), bool)
            and (i.get("root") == "" or i.get("root") in roots) for i in copy):
        raise _bad_bundle(bundle, "manifest.json:copy is not a list of copy items")
    ck = manifest.get("checkpoint")
    if ck is not None and not (isinstance(ck, dict) and type(ck.get("iteration")) is int and ck["iteration"] >= 0
                               and type(ck.get("bytes", 0)) is int and isinstance(ck.get("path"), str)
                               and isinstance(ck.get("save_dir"), str)):
        raise _bad_bundle(bundle, "manifest.json:checkpoint is malformed")


def import_campaign(bundle: Path, repo: Path, ephemeral_root: Path, state_dir: Path | None = None, *,
                    config_out: Path | None = None, out: TextIO | None = None) -> int:
    """``shoprld import-campaign``: re-point the roots, verify the copied checkpoint, restore the state.

    Nothing is written outside ``repo``, ``ephemeral_root`` and the state dir (plus the campaign
    file: ``--config-out``, or its old place relative to the repo), and no existing file outside
    them changes; see :class:`_Fence`. Every refusal is one line, exit 3, before the first write.
    """
    out = out or sys.stdout
    if not bundle.is_file():  # never open a FIFO or a device: that blocks or reads forever
        raise LifecycleError(f"{bundle}: not a regular file; fix: pass the tar export-campaign wrote")
    files = _read_bundle(bundle)
    try:
        manifest = json.loads(files["manifest.json"])
    except ValueError:
        raise LifecycleError(f"{bundle}: manifest.json is not JSON; fix: export again") from None
    _check_manifest(bundle, manifest)
    try:
        return _import(bundle, files, manifest, repo, ephemeral_root, state_dir, config_out, out)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # The manifest's shape is checked above; this is the backstop for the bundled config's
        # and state files' contents (a hostile or damaged bundle must not crash with exit 1).
        raise _bad_bundle(bundle, f"malformed content ({type(exc).__name__}: {exc})") from None


def _import(bundle: Path, files: dict[str, bytes], manifest: dict[str, Any], repo: Path, ephemeral_root: Path,
            state_dir: Path | None, config_out: Path | None, out: TextIO) -> int:
    old = {k: Path(v) for k, v in manifest["roots"].items()}
    old_config = Path(manifest["config_file"])
    repo = Path(os.path.normpath(repo.expanduser().absolute()))
    ephemeral_root = Path(os.path.normpath(ephemeral_root.expanduser().absolute()))
    cfg_guess = config_out.expanduser().absolute() if config_out else _default_config_out(old_config, old["repo"], repo)
    if state_dir is not None:
        new_state = Path(os.path.normpath(state_dir.expanduser().absolute()))
    else:
        guess = [(str(old["repo"]), str(repo)), (str(old["ephemeral_root"]), str(ephemeral_root))]
        if cfg_guess is not None:
            guess.append((str(old["config_dir"]), str(cfg_guess.parent)))
        mapped = Path(os.path.normpath(Repointer(guess).path(old["state_dir"])))
        default = _default_state_dir(manifest["campaign"])
        new_state = mapped if mapped != Path(os.path.normpath(old["state_dir"])) else default
        homes = [repo, ephemeral_root, default] + ([cfg_guess.parent] if cfg_guess is not None else [])
        if _Fence({str(i): h for i, h in enumerate(homes)}).refusal(new_state, directory=True) is not None:
            raise LifecycleError(f"{new_state}: the state dir the bundle implies lies outside --repo {repo} and "
                                 f"--ephemeral-root {ephemeral_root}; fix: pass --state-dir S")
    fence = _Fence({"repo": repo, "ephemeral-root": ephemeral_root, "state-dir": new_state})
    cfg_out = cfg_guess or new_state / old_config.name
    if config_out is None:
        # The campaign file goes where it was relative to the repo (inside it or beside it), or into the
        # state dir: a path the bundle chose, so it is fenced too (beside the repo counts for a NEW file).
        why = _Fence({"repo's parent": repo.parent, "ephemeral-root": ephemeral_root,
                      "state-dir": new_state}).refusal(cfg_out)
        if why is not None:
            raise LifecycleError(f"{cfg_out} (the campaign file, placed as in the bundle) {why}; "
                                 "fix: pass --config-out NEW.toml")
    rp = Repointer([(str(old["repo"]), str(repo)), (str(old["ephemeral_root"]), str(ephemeral_root)),
                    (str(old["state_dir"]), str(new_state)), (str(old["config_dir"]), str(cfg_out.parent))])
    if "config/campaign.toml" not in files:
        raise LifecycleError(f"{bundle}: no config/campaign.toml in the bundle; fix: export again")
    try:
        raw_cfg = files["config/campaign.toml"].decode("utf-8")
        data = _rewrite_config(raw_cfg, old["config_dir"], rp, repo=repo, ephemeral=ephemeral_root,
                               state_dir=new_state, user=manifest["user"])
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _bad_bundle(bundle, f"config/campaign.toml is not valid UTF-8 TOML ({exc})") from None
    header = (f"Imported by `shoprld import-campaign` from {bundle.name} at "
              f"{datetime.now().astimezone().isoformat(timespec='seconds')}.\nOriginal: {manifest['config_file']} "
              f"on {manifest['host']}. Roots re-pointed; storage.user pinned to {manifest['user']!r}.")
    text = dump_toml(data, header)
    # --- checks: nothing is written until they pass -----------------------------------------------
    _refuse_if_running(new_state, "import-campaign")
    for f in (STATE_FILE, JOURNAL_FILE):
        if (new_state / f).exists():
            raise LifecycleError(f"{new_state / f}: the state dir already holds a campaign; "
                                 "fix: pass an empty --state-dir, or remove that one")
    cfg_same = False
    if os.path.lexists(cfg_out):
        if not cfg_out.is_file() or cfg_out.read_text(encoding="utf-8", errors="replace") != text:
            raise LifecycleError(f"{cfg_out}: exists; fix: pass --config-out NEW.toml (or move it away)")
        cfg_same = True  # the same text: left as it is, never rewritten
    from .config import config_from_dict

    cfg = config_from_dict(tomllib.loads(text), cfg_out)
    layout = Layout.from_config(cfg)
    # Where the campaign itself will write (now, and once it runs) must lie under the new roots too:
    # an absolute storage.ledger or export.hf_dir in a bundle would otherwise aim at any file.
    fence.check(layout.ledger, "storage.ledger")
    fence.check(layout.exp_dir, "the experiment dir (storage.user, campaign.name, campaign.experiment)", directory=True)
    fence.check(layout.hf_dir(cfg), "export.hf_dir", directory=True)
    plan = _plan_restore(files, rp, layout, cfg, fence)
    ck = manifest.get("checkpoint")
    if ck:
        problem = _verify_checkpoint(layout.save_dir, ck)
        if problem:
            raise LifecycleError(f"checkpoint not ready: {problem}; fix: copy {ck['path']} and "
                                 f"{Path(ck['save_dir']) / ckpt.TRACKER_NAME} into {layout.save_dir}/ "
                                 "(MOVE_CHECKLIST.md section 2), then rerun import-campaign")
    for item in manifest["copy"]:  # the rest of the resume point (slime's data-sampler state)
        dst = _dest(item, old, rp)
        if item["required"] and item["root"] == "exp_dir" and not os.path.lexists(dst):
            raise LifecycleError(f"{dst}: missing ({item['what']}); fix: copy {item['src']} there "
                                 "(MOVE_CHECKLIST.md section 2), then rerun import-campaign")
    # --- restore ----------------------------------------------------------------------------------
    try:
        with _Locked(new_state, "import-campaign") as store:
            if not cfg_same:
                cfg_out.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(cfg_out, text.encode())
            counts = _restore(files, rp, layout, plan)
            # The explicit adoption (issue 15): the restored state now belongs to the re-pointed campaign.
            from .identity import expected, write as write_identity

            write_identity(layout.state_dir, expected(cfg.campaign.name, cfg.campaign.experiment, layout.repo,
                                                      layout.ephemeral_root), imported_from=str(bundle))
            store.append({"event": "campaign.imported", "bundle": str(bundle), "from_host": manifest["host"],
                          "roots": {k: [str(v), str(rp.path(v))] for k, v in old.items()},
                          "config": str(cfg_out), "checkpoint": ck and ck["iteration"]})
    except OSError as exc:
        raise LifecycleError(f"{exc.filename or new_state}: import-campaign cannot write ({exc.strerror or exc}); "
                             "fix: make the new roots writable, then rerun with an empty --state-dir") from None
    missing = [i for i in manifest["copy"] if i["required"] and not os.path.lexists(_dest(i, old, rp))]
    st = manifest["state"]
    out.write(f"imported {manifest['campaign']} / {manifest['experiment']} from {bundle} "
              f"(exported on {manifest['host']} at {st.get('state')}, round-{int(st.get('round') or 0):03d})\n")
    for k, v in old.items():
        if k in ("repo", "ephemeral_root", "state_dir", "config_dir"):
            out.write(f"  {k:<15} {v} -> {rp.path(v)}\n")
    if ck:
        out.write(f"  checkpoint      {ckpt.iter_name(int(ck['iteration']))} complete in {layout.save_dir} "
                  f"({human_bytes(int(ck.get('bytes') or 0))})\n")
    out.write(f"  restored        {sum(counts.values())} files ({', '.join(f'{k} {v}' for k, v in counts.items())}); "
              f"{rp.count} paths re-pointed\n")
    for note in plan.skipped:
        out.write(f"  not restored    {note}\n")
    for i in missing:
        out.write(f"  still missing   {i['what']}: copy {i['src']} to {_dest(i, old, rp)}\n")
    out.write(f"  config          {cfg_out}\n")
    out.write(f"next: shoprld run -c {cfg_out}\n")
    return EXIT_OK


def _dest(item: Mapping[str, Any], old: Mapping[str, Path], rp: Repointer) -> Path:
    if not item["root"]:
        return rp.path(item["rel"])
    return rp.path(old[item["root"]] / item["rel"])


def _default_state_dir(campaign: str) -> Path:
    from .paths import default_state_dir

    return default_state_dir(campaign)


_TEXT_SUFFIXES = (*SMALL_SUFFIXES, ".toml")


def _plan_restore(files: Mapping[str, bytes], rp: Repointer, layout: Layout, cfg: Config, fence: _Fence) -> _Plan:
    """Map each bundle member to its destination and check it (see :class:`_Fence`); writes nothing."""
    plan = _Plan()

    def text(data: bytes) -> bytes:
        return rp.text(data.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")

    def add(dst: Path, data: bytes, kind: str, what: str) -> None:
        fence.check(dst, what)
        plan.writes.append((dst, text(data) if dst.suffix in _TEXT_SUFFIXES else data, kind))

    if "ledger/overflow.tsv" in files:
        add(layout.campaign_root / "ledger" / f"{layout.ledger.stem}.tsv", files["ledger/overflow.tsv"], "ledger",
            "the full ledger")
    if "ledger/repo.tsv" in files:
        plan.ledger = text(files["ledger/repo.tsv"])
    for name, data in files.items():
        if name.startswith("exp/artifacts/"):
            add(layout.artifacts / name[len("exp/artifacts/"):], data, "artifacts", f"member {name}")
        elif name.startswith("exp/runs/"):
            add(layout.runs / name[len("exp/runs/"):], data, "runs", f"member {name}")
        elif name.startswith("inputs/"):
            key = name.split("/")[1]
            if key not in INPUT_KEYS:
                raise LifecycleError(f"member {BUNDLE_TOP}/{name}: inputs/{key}/ is not one of the inputs a bundle "
                                     f"carries ({', '.join(INPUT_KEYS)}); fix: pass the tar export-campaign wrote")
            dst = getattr(cfg.inject, key)
            if not isinstance(dst, Path) or os.path.lexists(dst):
                continue  # the user's own copy (in git, say) wins: an input is never overwritten
            why = fence.refusal(dst)
            if why is not None:
                plan.skipped.append(f"inject.{key} ({dst} {why}): take it from the bundle's {name} yourself")
                continue
            plan.writes.append((dst, text(data) if dst.suffix in _TEXT_SUFFIXES else data, "inputs"))
    return plan


def _restore(files: Mapping[str, bytes], rp: Repointer, layout: Layout, plan: _Plan) -> dict[str, int]:
    counts: dict[str, int] = {}

    # The state dir: state.json and status.json forget the old machine's processes.
    state_dir = layout.state_dir
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in (STATE_FILE, STATUS_FILE):
        raw = files.get(f"state/{name}")
        if raw is None:
            continue
        try:
            doc = rp.obj(json.loads(raw))
        except ValueError:
            continue
        doc = _forget_processes(doc)
        atomic_write(state_dir / name, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(), mode=0o600)
        counts["state"] = counts.get("state", 0) + 1
    for name in (JOURNAL_FILE, ROUNDS_FILE):  # the JSON-lines files
        raw = files.get(f"state/{name}")
        if raw is None:
            continue
        lines = []
        for line in raw.decode("utf-8", errors="replace").splitlines():
            try:
                rec = rp.obj(json.loads(line))
            except ValueError:
                continue  # a torn line stays behind
            if isinstance(rec, dict) and isinstance(rec.get("snapshot"), dict):
                rec["snapshot"] = _forget_processes(rec["snapshot"])
            lines.append(json.dumps(rec, sort_keys=True))
        atomic_write(state_dir / name, ("\n".join(lines) + "\n").encode() if lines else b"", mode=0o600)
        counts["state"] = counts.get("state", 0) + 1
    # The ledger: merged with whatever the new checkout already has (by round index).
    for dst, data, kind in plan.writes:
        if kind == "inputs" and os.path.lexists(dst):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dst, data)
        counts[kind] = counts.get(kind, 0) + 1
    if plan.ledger is not None:
        _merge_ledger(layout.ledger, plan.ledger)
        counts["ledger"] = counts.get("ledger", 0) + 1
    return counts


def _forget_processes(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return doc
    doc = dict(doc)
    if isinstance(doc.get("children"), dict):
        doc["children"] = {}
    elif isinstance(doc.get("children"), list):
        doc["children"] = []
    if isinstance(doc.get("daemon"), dict):
        doc["daemon"] = {**doc["daemon"], "pid": None}
    return doc


def _merge_ledger(path: Path, bundled: bytes) -> None:
    from .ledger import COLUMNS, _format, _parse

    have = _parse(path.read_text(encoding="utf-8", errors="replace")) if path.exists() else []
    text = bundled.decode("utf-8", errors="replace")
    if text.startswith("# full ledger: "):  # an overflow pointer: the full file was restored beside it
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, bundled)
        return
    rows = {r["index"]: r for r in _parse(text)}
    for r in have:
        rows.setdefault(r["index"], r)
    ordered = sorted(rows.values(), key=lambda r: int(r["index"]) if r["index"].isdigit() else 10**9)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, _format([{c: r.get(c, "") for c in COLUMNS} for r in ordered]))
