"""``shoprld import-campaign``: the second half of moving a campaign to another machine (issue 9).

:func:`import_campaign` reads a bundle written by :mod:`shoprld.daemon.ops.campaignexport`,
re-points every root (repo, ephemeral root, state dir, and the campaign file's own directory)
in the config and in every small file (:class:`Repointer`), checks that the copied checkpoint
is complete and consistent with its tracker (and the same size) BEFORE it writes anything,
restores the files into the new layout, never outside the new roots (:class:`_Fence`),
forgets the old machine's child pids, journals ``campaign.imported``, and prints the next
command. ``shoprld run`` then reconciles as after any restart: the first round without a
ledger row, skipping what is on disk.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tarfile
import tomllib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.records import identity
from shoprld.daemon.ops.campaignexport import BUNDLE_FORMAT, BUNDLE_TOP, SMALL_SUFFIXES
from shoprld.daemon.foundation.config.config import PATH_KEYS, Config, config_from_dict
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.foundation.system.errors import EXIT_OK
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.ledger import COLUMNS, format_rows, parse_rows
from shoprld.daemon.foundation.records.outputs import write_output
from shoprld.daemon.ops.oneshot import LifecycleError, OneShotLock, inside_or_equal, refuse_if_running, strictly_inside
from shoprld.daemon.foundation.records.paths import default_state_dir
from shoprld.daemon.foundation.records.roundlog import ROUNDS_FILE
from shoprld.daemon.foundation.records.store import JOURNAL_FILE, STATE_FILE, STATUS_FILE, atomic_write
from shoprld.daemon.foundation.config.tomlwrite import dump_toml


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


# Caps on what a bundle may make this process hold (a bundle is outside data: a 7 MB .tar.gz can
# declare a 1.5 GiB member of zeros). export-campaign writes small files (each file it bundles
# from the experiment dir is at most 8 MiB; the journal is the big one), so these are generous
# for a real bundle and refuse a bomb at its header, before a byte of it is decompressed.
MEMBER_MAX = 256 * 1024**2  # any one member
TOTAL_MAX = 512 * 1024**2  # all members together, as their headers declare them
MEMBERS_MAX = 50_000  # members, counted as their headers are read (each costs a TarInfo)
_USED = ("manifest.json", "MOVE_CHECKLIST.md", "config/", "state/", "ledger/", "exp/", "inputs/")


def _read_bundle(bundle: Path) -> dict[str, bytes]:
    """The members import uses, read one at a time (streamed, each within its declared size),
    refusing in one line (exit 3) a bundle over a cap or truncated or corrupt (tar, tar.gz,
    tar.bz2, tar.xz; a zip is not a bundle)."""
    try:
        tar = tarfile.open(bundle, "r:*")
    except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
        raise LifecycleError(f"{bundle}: not a readable bundle ({exc}); fix: pass the tar export-campaign wrote") \
            from None
    out: dict[str, bytes] = {}
    total = count = 0
    with tar:
        try:
            while (m := tar.next()) is not None:
                count += 1
                if count > MEMBERS_MAX:
                    raise _bad_bundle(bundle, f"more than {MEMBERS_MAX} members")
                if not m.isfile():
                    continue
                if m.size > MEMBER_MAX:
                    raise _bad_bundle(bundle, f"member {m.name[:200]!r} declares {human_bytes(m.size)}, over the "
                                              f"{human_bytes(MEMBER_MAX)} a bundle member may hold")
                total += m.size
                if total > TOTAL_MAX:
                    raise _bad_bundle(bundle, f"members declare more than {human_bytes(TOTAL_MAX)} in all")
                name = m.name
                parts = Path(name).parts
                if name.startswith("/") or ".." in parts or len(parts) < 2 or parts[0] != BUNDLE_TOP:
                    continue  # only plain files inside the bundle's own top dir: no links, no escapes
                rel = "/".join(parts[1:])
                if not rel.startswith(_USED):
                    continue  # never read a member import does not use
                fh = tar.extractfile(m)
                if fh is not None:
                    data = fh.read(m.size + 1)
                    if len(data) != m.size:
                        raise _bad_bundle(bundle, f"member {name[:200]!r} is cut short (truncated bundle)")
                    out[rel] = data
            # tarfile stops quietly at a header cut short after the first: a whole archive
            # ends in a zero block where the next header would be, a truncated one does not.
            tar.fileobj.seek(tar.offset)  # type: ignore[union-attr]
            if tar.fileobj.read(tarfile.BLOCKSIZE) != tarfile.NUL * tarfile.BLOCKSIZE:  # type: ignore[union-attr]
                raise _bad_bundle(bundle, "truncated archive (no end-of-archive block)")
        except (OSError, EOFError, zlib.error, tarfile.TarError) as exc:
            raise _bad_bundle(bundle, f"truncated or corrupt archive ({type(exc).__name__}: {exc})") from None
    if "manifest.json" not in out:
        raise LifecycleError(f"{bundle}: no {BUNDLE_TOP}/manifest.json; fix: pass the tar export-campaign wrote")
    return out


def _default_config_out(old_config: Path, old_repo: Path, new_repo: Path) -> Path | None:
    """The campaign file keeps its place relative to the repo (inside it, or beside it); None
    when it lived elsewhere (then it goes into the new state dir)."""
    for old_base, new_base in ((old_repo, new_repo), (old_repo.parent, new_repo.parent)):
        if strictly_inside(os.path.normpath(old_config), os.path.normpath(old_base)):
            return new_base / os.path.relpath(old_config, old_base)
    return None


def _rewrite_config(text: str, old_dir: Path, rp: Repointer, *, repo: Path, ephemeral: Path, state_dir: Path,
                    user: str) -> dict[str, Any]:
    data = tomllib.loads(text)
    for section, keys in (*PATH_KEYS.items(), ("storage", ("env_file",))):
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
        if not any(inside_or_equal(real, r) for r in self.roots.values()):
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
class _Writes:
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
        default = default_state_dir(manifest["campaign"])
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
    refuse_if_running(new_state, "import-campaign")
    for f in (STATE_FILE, JOURNAL_FILE):
        if (new_state / f).exists():
            raise LifecycleError(f"{new_state / f}: the state dir already holds a campaign; "
                                 "fix: pass an empty --state-dir, or remove that one")
    cfg_same = False
    if os.path.lexists(cfg_out):
        if not cfg_out.is_file() or cfg_out.read_text(encoding="utf-8", errors="replace") != text:
            raise LifecycleError(f"{cfg_out}: exists; fix: pass --config-out NEW.toml (or move it away)")
        cfg_same = True  # the same text: left as it is, never rewritten
    cfg = config_from_dict(tomllib.loads(text), cfg_out)
    layout = Layout.from_config(cfg)
    # Where the campaign itself will write (now, and once it runs) must lie under the new roots too:
    # an absolute storage.ledger or export.hf_dir in a bundle would otherwise aim at any file.
    fence.check(layout.ledger, "storage.ledger")
    fence.check(layout.exp_dir, "the experiment dir (storage.user, campaign.name, campaign.experiment)", directory=True)
    fence.check(layout.hf_dir(cfg), "export.hf_dir", directory=True)
    todo = _writes_for(files, rp, layout, cfg, fence)
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
        with OneShotLock(new_state, "import-campaign") as store:
            if not cfg_same:
                cfg_out.parent.mkdir(parents=True, exist_ok=True)
                # re-checked at the rename: a FIFO or device put there since is never replaced
                write_output(cfg_out, text.encode(), what="campaign file")
            counts = _restore(files, rp, layout, todo)
            # The explicit adoption (issue 15): the restored state now belongs to the re-pointed campaign.
            identity.write(layout.state_dir, identity.expected(cfg.campaign.name, cfg.campaign.experiment,
                                                               layout.repo, layout.ephemeral_root),
                           imported_from=str(bundle))
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
    for note in todo.skipped:
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


_TEXT_SUFFIXES = (*SMALL_SUFFIXES, ".toml")


def _writes_for(files: Mapping[str, bytes], rp: Repointer, layout: Layout, cfg: Config, fence: _Fence) -> _Writes:
    """Map each bundle member to its destination and check it (see :class:`_Fence`); writes nothing."""
    todo = _Writes()

    def text(data: bytes) -> bytes:
        return rp.text(data.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")

    def add(dst: Path, data: bytes, kind: str, what: str) -> None:
        fence.check(dst, what)
        todo.writes.append((dst, text(data) if dst.suffix in _TEXT_SUFFIXES else data, kind))

    if "ledger/overflow.tsv" in files:
        add(layout.campaign_root / "ledger" / f"{layout.ledger.stem}.tsv", files["ledger/overflow.tsv"], "ledger",
            "the full ledger")
    if "ledger/repo.tsv" in files:
        todo.ledger = text(files["ledger/repo.tsv"])
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
                todo.skipped.append(f"inject.{key} ({dst} {why}): take it from the bundle's {name} yourself")
                continue
            todo.writes.append((dst, text(data) if dst.suffix in _TEXT_SUFFIXES else data, "inputs"))
    return todo


def _restore(files: Mapping[str, bytes], rp: Repointer, layout: Layout, todo: _Writes) -> dict[str, int]:
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
    for dst, data, kind in todo.writes:
        if kind == "inputs" and os.path.lexists(dst):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dst, data)
        counts[kind] = counts.get(kind, 0) + 1
    if todo.ledger is not None:
        _merge_ledger(layout.ledger, todo.ledger)
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
    have = parse_rows(path.read_text(encoding="utf-8", errors="replace")) if path.exists() else []
    text = bundled.decode("utf-8", errors="replace")
    if text.startswith("# full ledger: "):  # an overflow pointer: the full file was restored beside it
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, bundled)
        return
    rows = {r["index"]: r for r in parse_rows(text)}
    for r in have:
        rows.setdefault(r["index"], r)
    ordered = sorted(rows.values(), key=lambda r: int(r["index"]) if r["index"].isdigit() else 10**9)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, format_rows([{c: r.get(c, "") for c in COLUMNS} for r in ordered]))
