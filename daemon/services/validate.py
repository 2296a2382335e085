"""The one validation `shoprld check` and `shoprld run` share, beyond the config's own schema.

`load_config` judges the file alone (types, bounds, placeholders). What it cannot see needs
the layout and this machine, and it is judged here, by :func:`problems`, the SAME function at
``check`` (NOT READY, exit 3) and at the start of ``run`` (exit 3, before the state dir is
touched or any child starts). A config that ``check`` calls ready must not crash ``run``:

- every template (argv, env, must_exist) expands for the first and the last round, and the
  result is something ``execve`` takes (no NUL byte, env names without ``=``);
- every command that will run is configured and resolves: an absolute or relative path to an
  executable file, or a name on PATH or in the stage's conda env (``<prefix>/bin``);
- a command that reads the round's loop dir (``{loop_dir}/val.yaml``) has ``train.emit_command``
  to write it (the other arguments' files are ``check``'s alone: :mod:`.argpaths`);
- the layout holds the etiquette: the volume is not the repo nor inside it, no tmpfs is mounted
  inside the checkout, and the state dir is off the volume;
- the state dir (or the dir it will be created in) is writable, not on a read-only filesystem,
  and owned by the user running shoprld. Root can write anywhere, so for root "owned by another
  user" is judged by the owner uid alone: a state dir whose owner is not our effective uid is
  refused, whoever we are (a daemon that writes another user's state dir as root leaves files
  that user can no longer manage).

Every problem is one line: ``<file>: <key>: <problem> (got <value>); fix: <fix>``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from shoprld.daemon.foundation.storage import disk
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configsections import ProcessSpec
from shoprld.daemon.foundation.system.errors import ConfigError, PreflightError, ShoprldError
from shoprld.daemon.foundation.records.identity import has_state
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.foundation.records.layout import RUNS_DIR_PROBLEM, RUNS_OWNER, Layout, runs_aside, runs_dir_fix
from shoprld.daemon.round.plan import resolve
from shoprld.daemon.services.shopsim import start_script

MOUNTINFO = Path("/proc/self/mountinfo")
# RAM-backed filesystems: whatever lands there is gone at the next reboot.
_RAM_FS = frozenset({"tmpfs", "ramfs"})


@dataclass(frozen=True)
class Problem:
    """One reason not to start."""

    file: Path
    key: str
    problem: str
    got: str
    fix: str
    # "config": the campaign file is wrong; "environment": this machine is (layout, state dir).
    kind: str = "config"
    # True when the templates themselves do not expand: nothing that expands them may run.
    template: bool = False

    def line(self) -> str:
        """``<file>: <key>: <problem> (got <value>); fix: <fix>``, on one line."""
        text = f"{self.file}: {self.key}: {self.problem} (got {self.got}); fix: {self.fix}"
        return " ".join(text.replace("\x00", "\\x00").split())

    def error(self) -> ShoprldError:
        """The exception ``run`` raises for it (both exit 3)."""
        return (ConfigError if self.kind == "config" else PreflightError)(self.line())


def problems(cfg: Config, layout: Layout, *, mountinfo: Path = MOUNTINFO) -> list[Problem]:
    """Everything that would make ``run`` fail or misbehave before any work, in a stable order."""
    out = list(_expansion(cfg, layout))
    if not out:  # commands resolve only once their argv expands
        out.extend(_commands(cfg, layout))
        out.extend(_unwritten_configs(cfg, layout))
    out.extend(_layout(cfg, layout, mountinfo))
    out.extend(_disk_floors(cfg, layout))
    out.extend(_state_dir(cfg, layout))
    out.extend(_foreign_runs(cfg, layout))
    seen: set[str] = set()  # several stages share one conda env: say it once
    return [p for p in out if not (p.line() in seen or seen.add(p.line()))]  # type: ignore[func-returns-value]


def validate(cfg: Config, layout: Layout) -> None:
    """Raise the first problem (exit 3); ``shoprld run`` calls this before anything starts."""
    found = problems(cfg, layout)
    if found:
        raise found[0].error()


def _disk_floors(cfg: Config, layout: Layout) -> Iterator[Problem]:
    """A soft or hard limit the volume cannot honour (at or above its size): the campaign would
    park before its first step. Judged before anything is written (issue 25)."""
    try:
        total = disk.sample(layout.ephemeral_root).total_bytes
    except OSError:
        return  # a missing volume is PREFLIGHT_DISK's to name
    for key, value in (("hard_limit", cfg.disk.hard_limit), ("soft_limit", cfg.disk.soft_limit)):
        if value is not None and value >= total:
            yield Problem(cfg.source, f"disk.{key}", f"is not below the size of the volume {layout.ephemeral_root} "
                          f"({human_bytes(total)})", human_bytes(value),
                          "lower it, or remove it (the defaults scale with disk.checkpoint_estimate)")


# -- templates ------------------------------------------------------------------------------------
def _rounds(cfg: Config) -> list[int]:
    return sorted({0, cfg.campaign.rounds - 1})


def _expansion(cfg: Config, layout: Layout) -> Iterator[Problem]:
    src = cfg.source
    for r in _rounds(cfg):
        try:
            values = dict(resolve(cfg, layout, r, planned=True).values)
        except (KeyError, ValueError, IndexError, AttributeError, TypeError) as exc:
            yield Problem(src, "vars", f"the placeholders cannot be computed for round {r}", repr(exc),
                          "check [vars] and train.end_offset (`shoprld check --placeholders`)", template=True)
            return
        for key, template in cfg.templates():
            try:
                text = template.format_map(values)
            except (KeyError, ValueError, IndexError, AttributeError) as exc:
                yield Problem(src, key, f"cannot be expanded for round {r} ({type(exc).__name__}: {exc})",
                              repr(template), "use plain {name} placeholders (`shoprld check --placeholders`)", template=True)
                return
            if "\x00" in text:
                yield Problem(src, key, f"expands to a value with a NUL byte for round {r}", repr(template),
                              "remove the \\u0000 (no program argument or environment value can hold one)", template=True)
                return
    for key, env in _env_tables(cfg):
        for name in env:
            if not name or "=" in name or "\x00" in name:
                yield Problem(src, f"{key}.{name}", "is not a usable environment variable name", repr(name),
                              "use letters, digits and '_' (no '=' and no empty name)", template=True)
                return


def _env_tables(cfg: Config) -> Iterator[tuple[str, Mapping[str, str]]]:
    for sname in ("shopsim", "train", "sidecar", "export", "val", "gate", "inject"):
        sec = getattr(cfg, sname)
        for field in ("env", "server_env", "runtime_env"):
            table = getattr(sec, field, None)
            if table:
                yield f"{sname}.{field}", table


# -- commands -------------------------------------------------------------------------------------
def planned_commands(cfg: Config) -> Iterator[tuple[str, tuple[str, ...], ProcessSpec, str | None]]:
    """(key, template, spec, why it is required or None when optional) for every command that can run."""
    t = cfg.train
    yield "shopsim.command", cfg.shopsim.command, cfg.shopsim, \
        "shopsim.manage = true" if cfg.shopsim.manage else None
    if t.launcher == "ray" and t.ray_start_head:
        yield "train.ray_head_command", t.ray_head_command, ProcessSpec(conda_prefix=t.conda_prefix), \
            "train.ray_start_head = true"
    yield "train.emit_command", t.emit_command, t, None
    yield "train.check_command", t.check_command, t, None
    yield "train.command", t.command, t, "every round trains"
    if cfg.sidecar.enabled:
        yield "sidecar.command", cfg.sidecar.command, cfg.sidecar, "sidecar.enabled = true"
    yield "export.command", cfg.export.command, cfg.export, \
        'export.mode = "convert"' if cfg.export.mode == "convert" else None
    yield "val.server_command", cfg.val.server_command, cfg.val, "VAL serves every round's weights"
    yield "val.command", cfg.val.command, cfg.val, "VAL runs every round"
    yield "gate.analyze_command", cfg.gate.analyze_command, cfg.gate, None
    yield "gate.command", cfg.gate.command, cfg.gate, "GATE runs every round"
    if cfg.campaign.rounds > 1:
        yield "inject.command", cfg.inject.command, cfg.inject, None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _commands(cfg: Config, layout: Layout) -> Iterator[Problem]:
    src = cfg.source
    values = dict(resolve(cfg, layout, 0, planned=True).values)
    base_path = layout.child_env(cfg).get("PATH", os.defpath)
    for key, template, spec, required in planned_commands(cfg):
        if not template:
            if required:
                yield Problem(src, key, f"empty, but {required}", "[]", "give the program's argv as a list of strings")
            continue
        cwd = spec.cwd or layout.project_root
        if not cwd.is_dir():
            yield Problem(src, f"{key.split('.')[0]}.cwd" if spec.cwd else "storage.project_root",
                          f"{key} runs in {cwd}, which is not a directory", str(cwd),
                          "create it, or point the setting at the checkout that holds the tools")
            continue
        prog = template[0].format_map(values)
        if not prog.strip():
            yield Problem(src, f"{key}[0]", "the program name is empty", repr(template[0]),
                          "put the program (a name on PATH or a path) first")
            continue
        env_path = spec.env.get("PATH")
        search = env_path.format_map(values) if env_path is not None else base_path
        prefix = spec.conda_prefix
        section = key.split(".")[0]
        if prefix is not None:
            if not (prefix / "bin").is_dir():
                yield Problem(src, f"{section}.conda_prefix", "is not a conda env (no bin/ in it)", str(prefix),
                              "point it at the env's prefix (e.g. ~/miniconda3/envs/slime), or remove it")
                continue
            if shutil.which("bash", path=search) is None:
                yield Problem(src, f"{section}.conda_prefix", "needs bash on PATH for conda activation", search,
                              "install bash, or remove the conda_prefix")
                continue
            search = f"{prefix / 'bin'}{os.pathsep}{search}"
        if key == "shopsim.command" and cfg.shopsim.manage:
            script = start_script(template, [a.format_map(values) for a in template], cwd)
            if script is not None and not script[1].is_file():
                yield Problem(src, f"{key}[{script[0]}]",
                              f"{script[1]} does not exist (a relative start.sh is taken against shopsim.cwd {cwd})",
                              repr(template[script[0]]),
                              "set shopsim.cwd to the ShopSim checkout's shop_env dir, or give start.sh's full path")
                continue
        if "/" in prog:
            path = Path(prog) if Path(prog).is_absolute() else cwd / prog
            if not _is_executable(path):
                what = "is not an executable file" if path.exists() else "does not exist"
                yield Problem(src, f"{key}[0]", f"{path} {what}", repr(template[0]),
                              "fix the path, or chmod +x it (or run it through its interpreter, e.g. bash or python3)")
        elif shutil.which(prog, path=search) is None:
            where = f"on PATH nor in the conda env {prefix}/bin" if prefix is not None else \
                "on PATH (and the stage has no conda_prefix)"
            yield Problem(src, f"{key}[0]", f"{prog!r} is neither {where}", repr(template[0]),
                          f"install it, give its full path, or set {section}.conda_prefix to the env that has it")


def _unwritten_configs(cfg: Config, layout: Layout) -> Iterator[Problem]:
    """A command that reads a file in the round's loop dir (``{loop_dir}/val.yaml``) when no
    ``train.emit_command`` is set: only the emitter writes there, so the stage would fail after
    its retries, hours in (after TRAIN, for VAL and GATE)."""
    if cfg.train.emit_command:
        return
    plan = resolve(cfg, layout, 0, planned=True)
    loop = f"{plan.plan.loop_dir}/"
    readers: list[str] = []
    files: list[str] = []
    for key, template, _spec, _required in planned_commands(cfg):
        if key == "train.emit_command":
            continue
        for i, arg in enumerate(template):
            value = arg.format_map(dict(plan.values))
            at = value.find(loop)
            if at >= 0 and (at == 0 or value[at - 1] == "="):
                readers.append(f"{key}[{i}]")
                name = value[at + len(loop):]
                if name not in files:
                    files.append(name)
    if readers:
        yield Problem(cfg.source, "train.emit_command",
                      f"is not set, but {', '.join(readers)} read{'s' if len(readers) == 1 else ''} "
                      f"{', '.join(files)} in the round's loop dir ({{loop_dir}}), which only the emitter writes",
                      "[]", "set train.emit_command (ShopSimRL's scripts/emit_training_loop_round.py writes "
                      "slime.yaml, analysis.yaml, val.yaml and gate.yaml there), or point those commands at files "
                      "that exist")


# -- layout ---------------------------------------------------------------------------------------
def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _existing(path: Path) -> Path:
    """The path itself, or its nearest existing ancestor."""
    p = _real(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo (proc(5)).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def ram_mounts(mountinfo: Path = MOUNTINFO) -> list[tuple[Path, str]]:
    """(mount point, fs type) of every tmpfs/ramfs mount this process sees."""
    try:
        text = mountinfo.read_text(errors="replace")
    except OSError:
        return []
    out: list[tuple[Path, str]] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        fstype = right.split()[0]
        if fstype in _RAM_FS:
            out.append((Path(_unescape_mount(fields[4])), fstype))
    return out


def _layout(cfg: Config, layout: Layout, mountinfo: Path) -> Iterator[Problem]:
    src = cfg.source
    eph = _real(layout.ephemeral_root)
    checkouts = {"storage.repo": _real(layout.repo)}
    if _real(layout.project_root) != checkouts["storage.repo"]:
        checkouts["storage.project_root"] = _real(layout.project_root)
    for key, root in checkouts.items():
        # The repo inside the volume is the seed's own layout (AutoDL: the checkout on the data
        # disk), and the per-path device check still guards it; the volume inside the repo is not:
        # checkpoints, caches and logs would land in the checkout.
        if _within(eph, root):
            how = "is the checkout itself" if eph == root else "is inside the checkout"
            yield Problem(src, "storage.ephemeral_root", f"{how} ({key} = {root}), so checkpoints, caches and "
                          "logs would land in the repo", str(layout.ephemeral_root),
                          "point storage.ephemeral_root at the work volume (e.g. /ephemeral), outside the repo",
                          "environment")
        for point, fstype in ram_mounts(mountinfo):
            if _within(point, root) and point != eph:
                yield Problem(src, key, f"a {fstype} is mounted inside the checkout at {point}: what lands there "
                              "(runs/, records) is lost at reboot and hides the files under it", str(root),
                              f"umount {point} (or move the checkout off it)", "environment")
    state = _real(layout.state_dir)
    on_volume = _within(state, eph)
    if not on_volume and os.path.ismount(eph):
        try:
            on_volume = _existing(state).stat().st_dev == eph.stat().st_dev
        except OSError:
            on_volume = False
    if on_volume:
        yield Problem(src, "storage.state_dir", f"is on the volume {layout.ephemeral_root} (a full volume could "
                      "not record why the daemon stopped)", str(layout.state_dir),
                      "put it off the volume (remove storage.state_dir for the default "
                      "$XDG_STATE_HOME/shoprld/<campaign>, or $STATE_DIRECTORY under systemd)", "environment")


# -- the state dir --------------------------------------------------------------------------------
def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _state_dir(cfg: Config, layout: Layout) -> Iterator[Problem]:
    src, key = cfg.source, "storage.state_dir"
    want = layout.state_dir
    fix_other = ("choose a state dir of your own (storage.state_dir), or run shoprld as its owner; "
                 "do not share one state dir between users")
    try:
        st = want.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        yield Problem(src, key, f"cannot be read ({exc.strerror})", str(want), "check its permissions", "environment")
        return
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            yield Problem(src, key, "is not a directory", str(want), "remove it, or choose another state dir",
                          "environment")
            return
        if st.st_uid != os.geteuid():
            yield Problem(src, key, f"is owned by {_owner(st.st_uid)}, not by the user running shoprld "
                          f"({_owner(os.geteuid())})", str(want), fix_other, "environment")
            return
        target = want
    else:
        target = _existing(want)  # mkdir happens under it
        if not target.is_dir():
            yield Problem(src, key, f"cannot be created: {target} is not a directory", str(want),
                          "choose another state dir", "environment")
            return
    if _read_only(target):
        yield Problem(src, key, f"{target} is on a read-only filesystem", str(want),
                      "remount it read-write, or choose a writable state dir (storage.state_dir)", "environment")
    elif not os.access(target, os.W_OK | os.X_OK):
        what = "is not writable" if target == want else f"cannot be created ({target} is not writable)"
        yield Problem(src, key, what, str(want),
                      f"chmod u+rwx {target}, or choose a writable state dir (storage.state_dir)", "environment")


def _foreign_runs(cfg: Config, layout: Layout) -> Iterator[Problem]:
    """A real ``<project_root>/runs`` where the managed link must go (move it aside, never into
    the experiment: see :func:`runs_aside`). And a fresh campaign (no state of its own yet) whose
    ``$EXP_DIR/runs`` already holds files and lacks shoprld's mark (:data:`RUNS_OWNER`):
    a previous campaign's, or a checkout's ``runs/`` moved in. Its round dirs would be taken for
    this campaign's (an old ``analysis_summary.json``, a gate result), so refuse before anything
    is written."""
    link = layout.project_root / "runs"
    if cfg.storage.manage_runs_link and not link.is_symlink() and link.is_dir():
        # Layout.ensure_runs_link refuses it too, but only after the layout exists: say it first.
        yield Problem(cfg.source, "storage.project_root", f"{link} {RUNS_DIR_PROBLEM}", str(link),
                      runs_dir_fix(link), "environment")
    if has_state(layout.state_dir):
        return
    runs = layout.runs
    try:
        if runs.is_symlink() or not runs.is_dir() or (runs / RUNS_OWNER).exists() \
                or next(runs.iterdir(), None) is None:
            return
    except OSError:
        return
    yield Problem(cfg.source, "campaign.experiment",
                  f"{runs} already holds tool output that this campaign did not write (no {RUNS_OWNER} in it, "
                  f"no state in {layout.state_dir}): another campaign's runs/, or a checkout's moved in; its "
                  "round dirs would be read as this campaign's", str(runs),
                  f"move it aside (mv {runs} {runs_aside(runs)}), or give this campaign another "
                  "campaign.experiment", "environment")
