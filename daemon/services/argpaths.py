"""The files a configured command names in its arguments, and whether they will be there.

``validate`` resolves each command's program (argv[0]); a campaign fails just as surely when a
later element is a script, a ``--config`` file or a YAML that does not exist: ``python3
scripts/run_shopsimrl.py ...`` with a wrong project root starts python fine, and the stage fails
after its retries, hours into the night. ``shoprld check`` refuses those (NOT READY, exit 3)
with :func:`argument_problems`.

Which elements are paths (:func:`path_like`), judged after the round's placeholders are filled
in exactly as a launch fills them (:func:`shoprld.daemon.foundation.config.placeholders.expand`):

- an absolute path, or one that starts with ``./`` or ``../``;
- a relative name that ends in a file suffix tools take as input (``.py``, ``.sh``, ``.yaml``,
  ``.json``, ...: :data:`INPUT_SUFFIXES`), taken against the stage's cwd. A relative name
  without one is not judged: ``Qwen/Qwen3.5-4B`` is a Hub id, ``shop_env.pack_api`` a module;
- ``--option=VALUE``: the value, by the same rules.

Never a path: a URL, anything with whitespace, a shell or glob character, ``$`` (Ray's own
``${VAR}``), or ``:`` (a search path, ``host:port``). Elements after ``-c`` of an interpreter
(``python3 -c CODE``, ``bash -c LINE``) are code.

Which paths need not exist yet: those the campaign makes itself (under the campaign root, the
cache root, ``<project_root>/runs``, the HF dir, the state dir and the short tmp links), and
the value of an output option (``--save``, ``--output-dir``, ``--log-file``, ...:
:data:`OUTPUT_WORDS`). A path under the round's loop dir exists only when ``train.emit_command``
writes it; ``validate`` refuses that case for ``run`` too, so it is skipped here.

Only ``check`` refuses these, not ``run``: a resumed campaign's round 0 inputs (the cold-start
files) may be gone by design, and round N's are written by the campaign before they are read.
Rounds 0 and the last are judged, as ``validate`` judges the templates.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.placeholders import OPTIONAL_ARGS
from shoprld.daemon.round.plan import RoundPlan, resolve
from shoprld.daemon.services.shopsim import start_script
from shoprld.daemon.services.validate import Problem, planned_commands

#: Suffixes of the files tools are handed as input: a relative name with one of these is a file.
INPUT_SUFFIXES = frozenset({
    ".py", ".sh", ".bash", ".yaml", ".yml", ".json", ".jsonl", ".toml", ".cfg", ".ini", ".conf", ".txt",
    ".csv", ".tsv", ".parquet", ".sqlite", ".sqlite3", ".db",
})
#: Words of an option's name (split at - and _) that say its value is written, not read: it
#: need not exist yet (``--save``, ``--output-dir``, ``--log-file``, ``--wandb-dir``, ``--stop-file``).
OUTPUT_WORDS = frozenset({"save", "out", "output", "outdir", "dump", "log", "logs", "dest", "write", "stop",
                          "export", "target", "cache", "tmp", "tmpdir", "wandb"})
_NOT_A_PATH = re.compile(r"[\s*?\[\]{}<>|;&$`'\"():]|://")
_INTERPRETERS = re.compile(r"^(python[0-9.]*|bash|sh|dash|zsh|perl|ruby|node)$")


def path_like(arg: str) -> str | None:
    """The path ``arg`` names (``--opt=VALUE``: the value), or None when it is not one (see the
    module docstring)."""
    if arg.startswith("-"):
        if "=" not in arg:
            return None
        arg = arg.split("=", 1)[1]
    if not arg or len(arg) > 4096 or _NOT_A_PATH.search(arg) or "\x00" in arg:
        return None
    if arg.startswith(("/", "./", "../")):
        return arg if arg.strip("/.") else None  # "/", ".", "./": a dir that is always there
    if arg.startswith(("~", "-")):
        return None
    return arg if PurePosixPath(arg).suffix.lower() in INPUT_SUFFIXES else None


def _output_option(option: str) -> bool:
    words = re.split(r"[-_]", option.lstrip("-").split("=", 1)[0].lower())
    return option.startswith("-") and not OUTPUT_WORDS.isdisjoint(words)


@dataclass(frozen=True)
class ArgPath:
    """One path-like element of a command: where it is in the config, and what it names."""

    key: str          # "gate.command[3]"
    template: str     # the element as configured
    path: Path        # absolute (a relative one taken against the stage's cwd)
    output: bool      # the value of an output option
    relative: bool    # given relative: taken against the stage's cwd


def arg_paths(argv_template: tuple[str, ...], values: dict[str, str], key: str, cwd: Path) -> Iterator[ArgPath]:
    """Every path-like element after the program, expanded with ``values`` as a launch does."""
    prev = ""
    code_next = False
    for i, template in enumerate(argv_template):
        value = template.format_map(values)
        if i == 0:
            code_next = False
            prev = value
            continue
        if not value and template in OPTIONAL_ARGS:
            continue  # left out of the launch
        if code_next:
            code_next = False
            prev = value
            continue
        if value == "-c" and _INTERPRETERS.match(Path(argv_template[0].format_map(values)).name):
            code_next = True
            prev = value
            continue
        path = path_like(value)
        if path is not None:
            full = Path(path) if path.startswith("/") else cwd / path
            output = _output_option(value) if value.startswith("-") else _output_option(prev)
            yield ArgPath(f"{key}[{i}]", template, full, output, not path.startswith("/"))
        prev = value


def created_roots(cfg: Config, layout: Layout) -> list[Path]:
    """The dirs the campaign makes itself: what lies under them need not exist before the night."""
    return [layout.campaign_root, layout.cache_root, layout.project_root / "runs", layout.runs, layout.hf_dir(cfg),
            layout.state_dir, layout.child_tmp, layout.child_ray_tmp]


def _under(path: Path, roots: list[Path]) -> bool:
    p = Path(os.path.normpath(path))
    return any(p == r or r in p.parents for r in (Path(os.path.normpath(r)) for r in roots))


def _exists(path: Path) -> bool:
    """Whether ``path`` is there. One that cannot be looked at for a reason other than its
    absence (no permission on a dir above it) is given the benefit of the doubt: the stage says why."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        return exc.errno != errno.ENAMETOOLONG
    return True


def argument_problems(cfg: Config, layout: Layout, *, already: set[Path] | None = None) -> list[Problem]:
    """One line per path-like argument that must exist and does not (``check``'s refusal).

    ``already``: paths another check names (``[preflight] must_exist``): not said twice."""
    src = cfg.source
    skip = set(already or ())
    roots = created_roots(cfg, layout)
    out: list[Problem] = []
    seen: set[str] = set()
    for r in sorted({0, cfg.campaign.rounds - 1}):
        plan = RoundPlan(cfg, layout, r, planned=True)
        values = dict(resolve(cfg, layout, r, planned=True).values)
        for key, template, spec, _required in planned_commands(cfg):
            if not template:
                continue
            if key == "train.command" and cfg.train.launcher == "ray" and not cfg.train.ray_start_head:
                continue  # a cluster shoprld did not start: its driver may run on another node
            cwd = spec.cwd or layout.project_root
            script = None
            if key == "shopsim.command" and cfg.shopsim.manage:
                script = start_script(template, [a.format_map(values) for a in template], cwd)
            for arg in arg_paths(template, values, key, cwd):
                if arg.key in seen or arg.output or _under(arg.path, roots) or _under(arg.path, [plan.loop_dir]):
                    continue
                if script is not None and arg.key == f"{key}[{script[0]}]":
                    continue  # validate names a missing start.sh, with its own fix
                if arg.path in skip or _exists(arg.path):
                    continue
                seen.add(arg.key)
                where = f", taken against the stage's cwd {cwd}" if arg.relative else ""
                out.append(Problem(
                    src, arg.key, f"{arg.path} does not exist (as {plan.round_id} runs it{where})", repr(arg.template),
                    "create it, or fix the path in the command (or the [vars] it is built from)"))
    return out
