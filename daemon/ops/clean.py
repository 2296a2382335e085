"""``shoprld clean`` (the etiquette's "Nettoyage"): free a finished or abandoned campaign's disk.

A finished or abandoned campaign leaves tens of GB per checkpoint on ``/ephemeral``.
:func:`cleanup_for` lists exactly what may go, all of it derived from the campaign's
:class:`~shoprld.daemon.foundation.records.layout.Layout`:

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
:func:`shoprld.daemon.foundation.storage.reclaim.clear_dir_contents`, which walks by directory fd without
following symlinks and never enters another filesystem. Logs, decision records, the small
``runs/`` files, the ledger and the state dir are kept.

Before anything is deleted, the reproducibility record goes into the repo
(:mod:`shoprld.daemon.ops.record`); clean adds its ``cleanup.json`` (what went, what was refused,
what stayed). ``--dry-run`` lists what would go, with sizes, and writes nothing.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.foundation.storage import retention
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.foundation.storage.reclaim import clear_dir_contents
from shoprld.daemon.foundation.system.errors import EXIT_OK
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.ops.oneshot import (
    ROLLOUT_SAMPLES,
    OneShotLock,
    inside_or_equal,
    open_campaign,
    read_json,
    refuse_if_running,
    strictly_inside,
)
from shoprld.daemon.foundation.records.paths import tree_bytes
from shoprld.daemon.ops.record import record_dir, write_record
from shoprld.daemon.foundation.config.secrets import RedactingStream, Secrets
from shoprld.daemon.foundation.records.store import STATE_FILE, atomic_write

_ITER_DIR = re.compile(r"iter_(\d{7,})")


@dataclass(frozen=True)
class Doomed:
    """One thing clean deletes: a whole tree, a dir's contents (the dir stays), or a file."""

    path: Path
    what: str
    bytes: int
    mode: str  # "tree" | "contents" | "file" | "checkpoint" (an iter_N dir: retention.py deletes it)


@dataclass
class Cleanup:
    """What ``shoprld clean`` would delete, what it refuses and what it keeps, listed before any deletion."""

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
        if not strictly_inside(real, self.root):
            return f"resolves to {real}, outside the campaign root {self.root}"
        if self.cache is not None and (inside_or_equal(real, self.cache) or strictly_inside(self.cache, real)):
            return f"resolves to {real}, which is (or holds) the shared cache {self.cache}"
        for p in self.protected:
            if inside_or_equal(p, real):
                return f"resolves to {real}, which is (or holds) {p}, which clean keeps"
        try:
            uid = os.lstat(real).st_uid
        except OSError:
            return None
        if self.owner is not None and uid != self.owner:
            return f"owned by uid {uid}, not the campaign root's owner (uid {self.owner}): another user's"
        return None


def cleanup_for(cfg: Config, layout: Layout, *, keep_final: bool) -> Cleanup:
    """What ``clean`` would delete, refuse and keep. Reads the disk; changes nothing."""
    todo = Cleanup(layout.campaign_root)
    guard = _Guard(cfg, layout)

    def add(path: Path, what: str, mode: str) -> None:
        if not os.path.lexists(path):
            return
        why = guard.refusal(path)
        if why is not None:
            todo.refused.append((path, why))
            return
        real = Path(os.path.realpath(path))
        if mode == "contents":
            try:
                with os.scandir(real) as it:
                    if next(it, None) is None:
                        return  # nothing to free
            except OSError:
                return
        todo.items.append(Doomed(path, what, tree_bytes(real), mode))

    # Checkpoints.
    save = layout.save_dir
    facts = RoundPlan(cfg, layout, 0).save_dir_facts()  # one scan; the resume rule names the final
    scan, m, final = facts.scan, facts.mapping, facts.resume_point
    todo.final = final
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
                todo.kept.append((f"final checkpoint {ckpt.iter_name(it)} (--keep-final)", p))
                continue
            state = "final, " if is_final else ""
            c = scan.get(it)
            state += "complete" if c is not None and c.complete else "partial"
            add(p, f"checkpoint {ckpt.iter_name(it)} ({state}, round-{m.round_of(it):03d})", "checkpoint")
        elif e.name == ckpt.TRACKER_NAME:
            if keep_final and final is not None:
                todo.kept.append(("checkpoint tracker", p))
            else:
                add(p, "checkpoint tracker", "file")
        elif e.name == "rollout" and e.is_dir(follow_symlinks=False):
            if keep_final and final is not None:
                for f in sorted(os.scandir(p), key=lambda x: x.name):
                    if re.search(rf"_{final.iteration}\.pt$", f.name):
                        todo.kept.append((f"slime data state of {ckpt.iter_name(final.iteration)}", Path(f.path)))
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
    wandb_before = len(todo.items)
    add(layout.wandb_dir, "wandb offline files", "contents")
    if len(todo.items) > wandb_before and cfg.wandb.mode == "offline":
        todo.notes.append(f"wandb offline runs in {layout.wandb_dir} are deleted: `wandb sync` them first "
                          "if they were never synced")
    add(layout.ballast, "disk ballast (recreated at the next start)", "file")
    if cfg.storage.blank_cache:
        add(layout.cache_root, "private cache (storage.blank_cache)", "tree")
    else:
        todo.kept.append(("shared cache (never cleaned)", layout.cache_root))
    todo.kept += [("logs", layout.logs), ("decision records", layout.artifacts),
                  ("small runs/ files (SkillBanks, curricula, summaries)", layout.runs),
                  ("state dir", layout.state_dir), ("ledger", layout.ledger)]
    return todo


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


def execute(todo: Cleanup, guard_root: Path) -> tuple[int, list[str]]:
    """Delete the cleanup's items (each re-checked just before). Returns (bytes freed, errors)."""
    freed, errors = 0, []
    for item in todo.items:
        real = Path(os.path.realpath(item.path))
        try:
            if item.mode == "checkpoint":  # retention.py alone deletes checkpoints (trash-renamed first)
                if not strictly_inside(str(real), os.path.realpath(guard_root)):
                    raise ValueError(f"{item.path}: resolves outside the campaign root")
                if not os.path.lexists(item.path):
                    continue
                retention.delete_iter_dir(item.path)
                if os.path.lexists(item.path):
                    raise OSError("still there (see checkpoint.delete_refused/delete_failed in the log)")
                freed += item.bytes
            elif item.mode == "file":
                moved = os.path.realpath(item.path) != str(real)
                if moved or not strictly_inside(str(real), os.path.realpath(guard_root)):
                    raise ValueError(f"{item.path}: moved outside the campaign root since it was listed")
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


# -- the command ------------------------------------------------------------------------------------


def clean(config_path: Path, dry_run: bool = False, keep_final: bool = False, *, out: TextIO | None = None) -> int:
    """``shoprld clean``: write the reproducibility record, then delete this campaign's heavy dirs."""
    camp = open_campaign(config_path)
    out = RedactingStream(out or sys.stdout, camp.secrets.redactor)  # type: ignore[assignment]  # its paths may hold anything
    cfg, layout = camp.cfg, camp.layout
    refuse_if_running(layout.state_dir, "clean")
    if dry_run:
        todo = cleanup_for(cfg, layout, keep_final=keep_final)
        _print_cleanup(todo, cfg, layout, out, dry_run=True)
        out.write(f"would write the reproducibility record to {record_dir(cfg, layout)}/\n")
        return EXIT_OK
    with OneShotLock(layout.state_dir, "clean", redactor=camp.secrets.redactor) as store:
        todo = cleanup_for(cfg, layout, keep_final=keep_final)
        _print_cleanup(todo, cfg, layout, out, dry_run=False)
        rec, files = write_record(camp, before_clean=True)
        freed, errors = execute(todo, layout.campaign_root)
        for link in layout.remove_short_links():  # no daemon runs (refused above): no child uses them
            out.write(f"removed the short link {link}\n")
        _write_cleanup(rec, todo, freed, errors, keep_final, camp.secrets)
        out.write(f"reproducibility record: {rec}/ ({len(files) + ('cleanup.json' not in files)} files)\n")
        store.append({"event": "campaign.cleaned", "freed_bytes": freed, "keep_final": keep_final,
                      "deleted": [str(i.path) for i in todo.items], "record": str(rec),
                      "refused": [str(p) for p, _ in todo.refused]})
    for e in errors:
        out.write(f"  could not delete: {e}\n")
    out.write(f"freed {human_bytes(freed)} ({len(todo.items) - len(errors)} of {len(todo.items)} paths)\n")
    return EXIT_OK


def _print_cleanup(todo: Cleanup, cfg: Config, layout: Layout, out: TextIO, *, dry_run: bool) -> None:
    state = read_json(layout.state_dir / STATE_FILE) or {}
    st, rnd = state.get("state"), state.get("round")
    out.write(f"shoprld clean{' --dry-run' if dry_run else ''}: campaign {cfg.campaign.name} / "
              f"{cfg.campaign.experiment} (state {st or 'never started'}"
              f"{f', round-{rnd:03d}' if isinstance(rnd, int) else ''})\n")
    out.write(f"campaign root  {layout.campaign_root}\n")
    if st not in (None, "DONE") and not any("final" in k for k, _ in todo.kept):
        out.write(f"note: the campaign is not DONE ({st}); without --keep-final it cannot resume after this\n")
    out.write(("would delete:\n" if dry_run else "deleting:\n") if todo.items else "nothing to delete\n")
    width = max((len(i.what) for i in todo.items), default=0)
    for i in todo.items:
        out.write(f"  {human_bytes(i.bytes):>10}  {i.what:<{width}}  {_short(i.path, layout.campaign_root)}\n")
    if todo.items:
        out.write(f"  {human_bytes(todo.total):>10}  total, {len(todo.items)} paths\n")
    for p, why in todo.refused:
        out.write(f"  refused     {p}: {why}\n")
    out.write("keeping:\n")
    for what, p in todo.kept:
        out.write(f"  {what}: {p}\n")
    for n in todo.notes:
        out.write(f"note: {n}\n")


def _short(path: Path, root: Path) -> str:
    """``<campaign root>/...`` for paths inside it: the listing stays readable."""
    try:
        return f"<campaign root>/{path.relative_to(root)}"
    except ValueError:
        return str(path)


def _write_cleanup(rec: Path, todo: Cleanup, freed: int, errors: list[str], keep_final: bool,
                   secrets: Secrets) -> None:
    doc = {
        "cleaned_at": time.time(), "host": socket.gethostname(), "keep_final": keep_final, "freed_bytes": freed,
        "deleted": [{"path": str(i.path), "what": i.what, "bytes": i.bytes} for i in todo.items],
        "refused": [{"path": str(p), "reason": r} for p, r in todo.refused],
        "kept": [{"what": w, "path": str(p)} for w, p in todo.kept], "errors": errors,
    }
    atomic_write(rec / "cleanup.json", secrets.redact(json.dumps(doc, indent=2) + "\n").encode())
