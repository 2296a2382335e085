"""``shoprld export-campaign``: the first half of moving a campaign to another machine (issue 9).

Moving machines follows the memo's section 6. :func:`export_campaign` writes a tar of the
small state: the state dir's files, the ledger, the config, the decision records under
``artifacts/`` (including the HF export manifests), the small files under ``runs/``
(SkillBanks, curricula, loop configs, summaries), and the cold-start inputs. Beside it, a
``MOVE_CHECKLIST.md`` (also in the tar, with a machine-readable twin in ``manifest.json``)
lists what must be copied separately, with sizes and absolute source paths: the resume
checkpoint with its tracker and data-sampler state, the base model and HF origin dir, the
``.env`` (secrets never go into a bundle), and the heavy parts of ``runs/`` and ``data/``.

This module owns the bundle's format (:data:`BUNDLE_FORMAT`, its top dir, which files count
as small); :mod:`shoprld.daemon.ops.campaignimport` reads it.
"""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.foundation.system.errors import EXIT_OK
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.outputs import Protected, campaign_files, resolve_output, write_output
from shoprld.daemon.ops.oneshot import (
    ROLLOUT_SAMPLES,
    Campaign,
    LifecycleError,
    OneShotLock,
    inside_or_equal,
    open_campaign,
    read_json,
    refuse_if_running,
)
from shoprld.daemon.foundation.records.paths import tree_bytes
from shoprld.daemon.ops.record import envinfo_doc, git_doc
from shoprld.daemon.foundation.records.roundlog import ROUNDS_FILE
from shoprld.daemon.foundation.records.store import JOURNAL_FILE, STATE_FILE, STATUS_FILE

BUNDLE_FORMAT = "shoprld-move-v1"
BUNDLE_TOP = "shoprld-move"
# Files under runs/ and artifacts/ that travel in the bundle: text, and small.
SMALL_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".md", ".txt", ".tsv", ".csv")
SMALL_MAX = 8 * 1024**2


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

    facts = RoundPlan(cfg, layout, 0).save_dir_facts()  # one scan; the resume rule names the final
    scan, final = facts.scan, facts.resume_point
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
    if cfg.storage.project_root is not None and not inside_or_equal(str(layout.project_root), str(layout.repo)):
        add("the ShopSimRL project root", layout.project_root, True, "storage.project_root: keep the same path")
    return [i for i in items if i.src], cdoc


def export_campaign(config_path: Path, out_tar: Path, *, out: TextIO | None = None) -> int:
    """``shoprld export-campaign``: the small state as a tar, plus MOVE_CHECKLIST.md."""
    out = out or sys.stdout
    _check_out_path(out_tar)
    camp = open_campaign(config_path)
    cfg, layout = camp.cfg, camp.layout
    # Never the campaign file, .env, the ledger or a state file (`export-campaign campaign.toml`).
    own = campaign_files(cfg.source, layout)
    resolve_output(out_tar, own, what="bundle")
    beside = out_tar.with_name(out_tar.name + ".MOVE_CHECKLIST.md")
    resolve_output(beside, own, what="move checklist")
    refuse_if_running(layout.state_dir, "export-campaign")
    with OneShotLock(layout.state_dir, "export-campaign", redactor=camp.secrets.redactor):
        state = read_json(layout.state_dir / STATE_FILE)
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
            "checkpoint": cdoc, "git": git_doc(layout.repo), "envinfo": env,
            "copy": [vars(i) for i in items], "files": sources,
        }
        checklist = move_checklist(manifest)
        members["MOVE_CHECKLIST.md"] = checklist.encode()
        members["manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        _write_tar(out_tar, members, own)
        _write_private(beside, lambda fh: fh.write(checklist.encode()), own)
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


def _write_private(path: Path, fill: Any, own: Protected) -> None:
    """Create ``path`` through a 0600 temp file in its own dir (``fill(fileobj)`` writes it), fsync,
    rename, never replacing a non-regular file or one of ``own`` (the output-path opener). On any
    failure the temp file is removed and the error is one line: a bundle holds the campaign's
    state, so no half-written or world-readable copy stays behind."""
    try:
        write_output(path, fill, own, what="bundle", mode=0o600)
    except OSError as exc:
        raise LifecycleError(f"{path}: cannot write ({exc.strerror or exc}); "
                             "fix: choose a writable place with free space") from None


def _write_tar(path: Path, members: Mapping[str, bytes], own: Protected) -> None:
    mode = "w:gz" if path.name.endswith((".tar.gz", ".tgz")) else "w"
    now = time.time()

    def fill(fh: Any) -> None:
        with tarfile.open(fileobj=fh, mode=mode) as tar:  # type: ignore[call-overload]
            for name in sorted(members):
                data = members[name]
                info = tarfile.TarInfo(f"{BUNDLE_TOP}/{name}")
                info.size, info.mtime, info.mode = len(data), int(now), 0o600
                tar.addfile(info, io.BytesIO(data))

    _write_private(path, fill, own)


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
