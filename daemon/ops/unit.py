"""``shoprld install-service``: render ``systemd/shoprld@.service`` for this machine.

The template (``systemd/shoprld@.service``) is a unit file with two kinds of holes:

* ``@TOKEN@`` values: the shoprld executable, the campaign file's directory, the repo, the
  ``ReadWritePaths=`` and ``RequiresMountsFor=`` lists, ``User=``/``Group=``;
* lines that start with ``#@<tag> ``: kept (without the tag) when the tag applies, else
  dropped. Tags: ``system`` / ``user`` (the manager), ``protect_home`` / ``home_note``
  (ProtectHome= only when nothing the daemon writes lives under a home directory),
  ``private_tmp`` / ``tmp_note`` (PrivateTmp= only when nothing it needs lives under /tmp),
  ``restart_steps`` / ``restart_plain`` (RestartSteps= needs systemd >= 254), and
  ``template`` (notes for readers of the raw template, never rendered).

The instance name is the campaign file's name without ``.toml``; the unit runs
``shoprld run -c <config dir>/%i.toml``. Rendering reads only the campaign TOML, never the
``.env`` file, and copies nothing from the caller's environment, so no secret can reach the
unit (``systemctl show`` and ``/proc/*/environ`` would expose it).

This module never runs ``systemctl``: it prints the commands for the operator.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.system.errors import EXIT_OK, ConfigError, ShoprldError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.paths import default_state_dir

UNIT_NAME = "shoprld@.service"
# Started by the daemon unit's OnFailure=: the `crashed` page once nothing restarts it.
CRASHED_UNIT_NAME = "shoprld-crashed@.service"
# Characters an instance may hold without systemd-escape (which would make %i differ from
# the file name: "a-b" stays "a-b", but "a b" becomes "a\x20b").
_INSTANCE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
_TOKEN_RE = re.compile(r"@[A-Z_]+@")
_TAG_RE = re.compile(r"^#@([a-z_]+) ?(.*)$")
# Paths systemd's ProtectHome= covers.
_HOME_ROOTS = (Path("/home"), Path("/root"), Path("/run/user"))
_TMP_ROOTS = (Path("/tmp"), Path("/var/tmp"))
RESTART_STEPS_MIN_VERSION = 254


@dataclass(frozen=True)
class Rendered:
    """A rendered unit and what the operator needs to know about it."""

    text: str
    instance: str
    crashed: str        # shoprld-crashed@.service, rendered for the same machine
    config: Path
    user_mode: bool
    state_dir: Path
    warnings: tuple[str, ...]


# -- the template ---------------------------------------------------------------------------


def template_text(name: str = UNIT_NAME) -> str:
    """A unit template: packaged data if shipped, else the source tree's ``systemd/``."""
    candidates: list[Path] = []
    try:
        candidates.append(Path(str(files("shoprld.daemon") / name)))
    except (ImportError, ModuleNotFoundError, TypeError):  # pragma: no cover - always importable here
        pass
    candidates.append(Path(__file__).resolve().parents[2] / "systemd" / name)
    for path in candidates:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise ConfigError(
        f"{candidates[-1]}: the unit template is missing from this install; fix: install shoprld "
        f"from its checkout (pip install -e), or ship systemd/{name} as package data"
    )


# -- quoting (systemd.syntax(7), systemd.service(5) "Command lines") ---------------------------

_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def _specifier_escape(s: str) -> str:
    return s.replace("%", "%%")


def _check_path(p: Path | str) -> str:
    s = str(p)
    if any(c in s for c in "\n\r\0"):
        raise ConfigError(f"{s!r}: a path with a newline or NUL cannot go into a unit file; fix: rename it")
    return s


def _quote_word(s: str) -> str:
    """One word for a space-separated unit setting (ExecStart=, ReadWritePaths=, ...)."""
    s = _specifier_escape(_check_path(s))
    if _PLAIN.fullmatch(s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _exec_word(s: str) -> str:
    # ExecStart= also expands $VAR and ${VAR}: a literal $ is $$.
    return _quote_word(s.replace("$", "$$"))


# -- facts about this machine ---------------------------------------------------------------


def shoprld_command(argv0: str | None = None, executable: str | None = None) -> list[str]:
    """The absolute command that starts shoprld, for ExecStart=.

    Order: the ``shoprld`` script we were started as; the one beside this interpreter (the
    venv that holds this code); ``shoprld`` on PATH; else ``<python> -m shoprld.daemon.ops.cli``.
    The venv path is kept as is, not resolved: resolving its python symlink would leave the venv.
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    if argv0 and Path(argv0).name == "shoprld" and os.path.isfile(argv0) and os.access(argv0, os.X_OK):
        return [os.path.abspath(argv0)]
    if executable:
        sibling = Path(os.path.abspath(executable)).parent / "shoprld"
        if sibling.is_file() and os.access(sibling, os.X_OK):
            return [str(sibling)]
    found = shutil.which("shoprld")
    if found:
        return [os.path.abspath(found)]
    return [os.path.abspath(executable or "python3"), "-m", "shoprld.daemon.ops.cli"]


def systemd_version() -> int | None:
    """The installed systemd's major version, without talking to any running manager."""
    for binary in ("/usr/lib/systemd/systemd", "/lib/systemd/systemd"):
        if not os.access(binary, os.X_OK):
            continue
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        m = re.match(r"systemd (\d+)", out)
        if m:
            return int(m.group(1))
    return None


def _owner(path: Path) -> tuple[str, str]:
    """User and group names owning ``path`` (numeric when the names are unknown)."""
    st = path.stat()
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return user, group


def _home_of(user: str) -> Path | None:
    try:
        return Path(pwd.getpwnam(user).pw_dir)
    except KeyError:
        return None


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _minimal(paths: Iterable[Path]) -> list[Path]:
    """Unique paths in order, dropping any that lies under another one."""
    uniq: list[Path] = []
    for p in paths:
        if p not in uniq:
            uniq.append(p)
    return [p for p in uniq if not any(q != p and _under(p, q) for q in uniq)]


# Dirs a campaign's output may not open up for writing: under ProtectSystem=strict, a
# ReadWritePaths= of one of these undoes the protection for the whole tree.
_SYSTEM_DIRS = tuple(Path(p) for p in ("/", "/usr", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib64", "/var",
                                       "/dev", "/proc", "/sys", "/run"))


def _output_dirs(cfg: Config, config: Path) -> list[Path]:
    """The dirs outside the campaign's roots that the daemon writes to (the metrics textfile's
    dir: written by temp file + rename, so the dir, not the file); refused in one line when
    that would open a system dir to writing."""
    out: list[Path] = []
    if cfg.metrics.textfile is not None:
        d = Path(os.path.normpath(os.path.join(config.parent, cfg.metrics.textfile))).parent
        if d in _SYSTEM_DIRS:
            raise ConfigError(f"metrics.textfile = {cfg.metrics.textfile}: the unit would have to make {d} writable "
                              "(ProtectSystem=strict); fix: put the textfile in a dir of its own, e.g. "
                              "/var/lib/node_exporter/textfile/shoprld.prom")
        out.append(d)
    return out


def instance_name(config_path: Path) -> str:
    name = config_path.name
    if not name.endswith(".toml"):
        raise ConfigError(f"{config_path}: the campaign file must end in .toml (the unit runs <dir>/%i.toml); "
                          f"fix: rename it to {config_path.stem}.toml")
    inst = name[: -len(".toml")]
    if not _INSTANCE_RE.fullmatch(inst):
        raise ConfigError(f"{config_path}: {inst!r} cannot be a systemd instance name as is; fix: rename the "
                          f"campaign file to letters, digits and . _ : - only")
    return inst


# -- rendering --------------------------------------------------------------------------------


def render(config_path: str | os.PathLike[str], *, user: bool, version: int | None = None,
           environ: Mapping[str, str] = os.environ, command: list[str] | None = None) -> Rendered:
    """Render the unit for one campaign file (its ``.text`` is the ``shoprld@.service`` file)."""
    # absolute, NOT resolved: a symlinked /etc/shoprld/NAME.toml keeps its name and dir.
    config = Path(os.path.abspath(os.fspath(config_path)))
    inst = instance_name(config)
    cfg = load_config(config)
    # The state dir the daemon will use under the unit: StateDirectory=, unless the config
    # pins one. Passing the unit's STATE_DIRECTORY keeps Layout from using the caller's XDG dirs.
    if user:
        xdg = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
        unit_state = Path(xdg) / "shoprld" / inst
    else:
        unit_state = Path("/var/lib/shoprld") / inst
    env = {k: v for k, v in environ.items() if k in ("USER", "HOME", "XDG_STATE_HOME")}
    env["STATE_DIRECTORY"] = str(unit_state)
    layout = Layout.from_config(cfg, env)
    version = systemd_version() if version is None else version
    command = shoprld_command() if command is None else command

    writable = [layout.repo, layout.project_root, layout.ephemeral_root]
    if cfg.storage.state_dir is not None:
        writable.append(layout.state_dir)
    if not _under(layout.ledger, layout.repo):
        writable.append(layout.ledger.parent)
    for spec in (cfg.shopsim, cfg.train, cfg.sidecar, cfg.export, cfg.val, cfg.gate, cfg.inject):
        if spec.cwd is not None:
            writable.append(spec.cwd)
    writable.extend(_output_dirs(cfg, config))
    writable = _minimal(writable)
    mounts = _minimal([layout.repo, layout.ephemeral_root] +
                      ([layout.state_dir] if cfg.storage.state_dir is not None else []))

    warnings: list[str] = []
    if user:
        run_user, run_group = pwd.getpwuid(os.getuid()).pw_name, ""
    else:
        run_user, run_group = _owner(layout.repo) if layout.repo.exists() else ("root", "root")
    home = _home_of(run_user)
    home_roots = list(_HOME_ROOTS) + ([home] if home and home != Path("/") else [])
    in_home = [p for p in writable if any(_under(p, h) for h in home_roots)]
    protect_home = not in_home

    # PrivateTmp= would hide a campaign that lives under /tmp (tests, demos).
    needed = writable + [config.parent, layout.env_file, *(Path(w) for w in command if w.startswith("/"))]
    in_tmp = any(_under(p, t) for p in needed for t in _TMP_ROOTS)
    tags = {
        "template": False,
        "system": not user,
        "private_tmp": (not user) and not in_tmp,
        "tmp_note": (not user) and in_tmp,
        "user": user,
        "protect_home": (not user) and protect_home,
        "home_note": (not user) and not protect_home,
        "restart_steps": version is not None and version >= RESTART_STEPS_MIN_VERSION,
        "restart_plain": not (version is not None and version >= RESTART_STEPS_MIN_VERSION),
    }
    values = {
        "@SHOPRLD@": " ".join(_exec_word(w) for w in command),
        "@CONFIG_DIR@": _specifier_escape(_check_path(config.parent)),
        "@REPO@": _specifier_escape(_check_path(layout.repo)),
        "@READ_WRITE_PATHS@": " ".join(_quote_word("-" + str(p)) for p in writable),
        "@MOUNTS@": " ".join(_quote_word(str(p)) for p in mounts),
        "@USER@": run_user,
        "@GROUP@": run_group,
    }
    # ExecStart='s "<dir>/%i.toml" is one word: quoted as a whole when the dir needs quotes.
    exec_config = _exec_word(str(config.parent / "X"))
    exec_config = exec_config[:-1] + "%i.toml" if not exec_config.endswith('"') else exec_config[:-2] + '%i.toml"'

    def fill(name: str) -> str:
        out: list[str] = [
            f"# Rendered by `shoprld install-service{' --user' if user else ''}` from {name}",
            f"# for {config} (systemd {version if version is not None else 'version unknown'}).",
        ]
        for line in template_text(name).splitlines():
            m = _TAG_RE.match(line)
            if m:
                if m.group(1) not in tags:
                    raise ConfigError(f"{name}: unknown template tag #@{m.group(1)}")
                if not tags[m.group(1)]:
                    continue
                line = m.group(2)
            if line.startswith(("ExecStart=", "ExecStopPost=")):
                line = line.replace("@CONFIG_DIR@/%i.toml", exec_config)
            for token, value in values.items():
                line = line.replace(token, value)
            leftover = None if line.startswith("#") else _TOKEN_RE.search(line)
            if leftover:
                raise ConfigError(f"{name}: unknown template token {leftover.group(0)}")
            out.append(line)
        return "\n".join(out).rstrip("\n") + "\n"

    text = fill(UNIT_NAME)
    crashed = fill(CRASHED_UNIT_NAME)

    if not user and in_home:
        warnings.append(f"{in_home[0]} is under a home directory: the unit leaves out ProtectHome=")
    if cfg.storage.state_dir is None:
        by_hand = default_state_dir(cfg.campaign.name, {k: v for k, v in environ.items() if k != "STATE_DIRECTORY"})
        if by_hand != unit_state:
            warnings.append(
                f"under the unit the state dir is {unit_state} ($STATE_DIRECTORY), but `shoprld status/stop "
                f"-c {config}` run by hand looks in {by_hand}; set storage.state_dir = \"{unit_state}\" in "
                f"{config}, or prefix those commands with STATE_DIRECTORY={unit_state}")
    if cfg.campaign.name != inst:
        warnings.append(f"the campaign is named {cfg.campaign.name!r} but the unit instance is {inst!r} "
                        f"(from the file name); name the file {cfg.campaign.name}.toml so that they agree")
    if not cfg.storage.user:
        here = Layout.from_config(cfg, dict(environ)).brev_root
        there = Layout.from_config(cfg, {**env, "USER": run_user}).brev_root
        if here != there:
            warnings.append(f"storage.user is unset: under the unit (USER={run_user}) the campaign lives in "
                            f"{there}, by hand in {here}; set storage.user in {config} to pin it")
    return Rendered(text=text, instance=inst, crashed=crashed, config=config, user_mode=user, state_dir=unit_state,
                    warnings=tuple(warnings))


def unit_path(user: bool, environ: Mapping[str, str] = os.environ, name: str = UNIT_NAME) -> Path:
    if user:
        base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".config")
        return Path(base) / "systemd" / "user" / name
    return Path("/etc/systemd/system") / name


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def commands(r: Rendered) -> list[str]:
    """What the operator runs after the unit file is in place."""
    sc = "systemctl --user" if r.user_mode else "systemctl"
    jc = "journalctl --user" if r.user_mode else "journalctl"
    unit = f"shoprld@{r.instance}"
    cmds = [f"{sc} daemon-reload", f"{sc} enable --now {unit}"]
    if r.user_mode:
        cmds.append(f"loginctl enable-linger {pwd.getpwuid(os.getuid()).pw_name}   # keep it running after logout")
    cmds += [f"{sc} status {unit}", f"{jc} -u {unit} -f"]
    return cmds


def install_service(config_path: str | os.PathLike[str], user: bool, write: bool) -> int:
    """Print the rendered unit (or write it with ``write``) and the systemctl commands to run.

    Never runs systemctl. Raises :class:`ConfigError` (exit 3) on a bad campaign file or
    an unwritable destination.
    """
    r = render(config_path, user=user)
    dest = unit_path(user)
    crashed = unit_path(user, name=CRASHED_UNIT_NAME)
    if write:
        # The OnFailure= unit first: a daemon unit that names a missing one would page nobody.
        for path, text in ((crashed, r.crashed), (dest, r.text)):
            try:
                _write_atomic(path, text)
            except PermissionError:
                raise ConfigError(f"{path}: permission denied; fix: rerun as root (sudo), or use --user") from None
            except OSError as exc:
                raise ConfigError(f"{path}: cannot write ({exc.strerror})") from None
            print(f"wrote {path}")
        print("now run:")
        for c in commands(r):
            print(f"  {c}")
        stream = sys.stdout
    else:
        sys.stdout.write(r.text)
        sys.stdout.flush()
        stream = sys.stderr
        print(f"# to install: shoprld install-service -c {r.config}{' --user' if user else ''} --write"
              f"   (or save the text above as {dest}; --write also installs {crashed}, the OnFailure= unit "
              "that pages when the daemon has failed for good)", file=stream)
        print("# then run:", file=stream)
        for c in commands(r):
            print(f"#   {c}", file=stream)
    for w in r.warnings:
        print(f"shoprld: warning: {w}", file=stream)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``python -m shoprld.daemon.ops.unit -c FILE [--user] [--write]`` (same as install-service)."""
    p = argparse.ArgumentParser(prog="python -m shoprld.daemon.ops.unit")
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--user", action="store_true")
    p.add_argument("--write", action="store_true")
    a = p.parse_args(argv)
    try:
        return install_service(a.config, a.user, a.write)
    except ShoprldError as exc:
        print(f"shoprld: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
