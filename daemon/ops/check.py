"""``shoprld check``: validate the config, then print the launch checklist. No side effects.

It reproduces the etiquette's launch checklist: the disk summary of repo and volume, the
chosen campaign root, every cache and output path redirected, the ``.env`` keys present
(names only), and "ready" or the first blocking item.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from shoprld.daemon.services.commands import ANALYST_CONFIG, analyst_config_mismatches, describe_commands, shopsim_exposure_warning
from shoprld.daemon.foundation.records.bundles import py_spy_binary
from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.storage.diskcheck import PreflightProblem
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.statefiles import state_dir_problems
from shoprld.daemon.foundation.system.envinfo import gpu_count_check, gpu_report, list_gpu_indices, stage_env_versions
from shoprld.daemon.services.gpucontainer import mode_line
from shoprld.daemon.services.gpuprobes import nvml_gpu_indices
from shoprld.daemon.services.gpus import build_probe
from shoprld.daemon.services.hygiene import lines, scan_repo
from shoprld.daemon.services.argpaths import argument_problems
from shoprld.daemon.services.boxcheck import box_lines, box_refusals
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.placeholders import PLACEHOLDERS
from shoprld.daemon.foundation.storage.preflight import budget_for, df_text, need_line, volume_problems, real_stack_problems, tmpdir_problems
from shoprld.daemon.round.plan import resolve
from shoprld.daemon.core.startcheck import start_problems
from shoprld.daemon.round import asyncsave
from shoprld.daemon.round.saves import describe as describe_saves
from shoprld.daemon.round.saves import plan as plan_saves
from shoprld.daemon.foundation.config.secrets import Secrets, load_secrets
from shoprld.daemon.services.validate import Problem
from shoprld.daemon.services.validate import problems as validation_problems


def _blocking(cfg: Config, layout: Layout, secrets: Secrets, invalid: list[Problem]) -> list[str]:
    """Everything that would stop `shoprld run` before any work, as one line each: first what
    run and a reload refuse (:func:`start_problems`, from ``invalid``: what
    :func:`validate.problems` found), then a too-long TMPDIR, the state dir and PREFLIGHT_DISK's checks."""
    # What run and a reload refuse (daemon/core/startcheck.py): the validation, the secrets, the
    # notify endpoints (what a page would trip on), the metrics extra.
    problems: list[str] = start_problems(cfg, layout, secrets, invalid)
    templates_ok = not any(p.template for p in invalid)  # else the must_exist paths cannot be read
    values: dict[str, str] = {}
    if templates_ok:
        values = dict(resolve(cfg, layout, 0).values)
    # A too-long TMPDIR early: it is a config error that only shows hours into a round.
    problems.extend(p.line() for p in tmpdir_problems(cfg, layout, values))
    problems.extend(state_dir_problems(layout.state_dir))  # a FIFO or a dir at a state file's name
    problems.extend(p.line() for p in volume_problems(cfg, layout))
    if templates_ok:
        problems.extend(p.line() for p in real_stack_problems(cfg, values))
        if not any(p.key.endswith(".cwd") or p.key == "storage.project_root" for p in invalid):
            # A script, a --config file or a YAML the commands name (not only their program;
            # with no cwd, every relative one would be named again); what [preflight]
            # must_exist names is said once, above.
            named = {Path(t.format_map(values)) for t in cfg.preflight.must_exist.values()}
            problems.extend(p.line() for p in argument_problems(cfg, layout, already=named))
    # The analyst's config is a file of the project, there before any round: judge it now.
    problems.extend(analyst_config_mismatches(cfg, layout.project_root / ANALYST_CONFIG))
    gpu_problem, _ = _gpu_count(cfg)
    if gpu_problem:
        problems.append(gpu_problem)
    # A Ray head on our ports that is not ours (its command line is masked like ours).
    problems.extend(secrets.redact(line) for line in box_refusals(cfg, layout))
    return problems


def _budget_line(cfg: Config, layout: Layout) -> str:
    """What an unattended run needs free on the volume, from the daemon's own budget."""
    try:
        return need_line(cfg, budget_for(cfg, layout))
    except OSError as exc:
        return f"disk: the volume {layout.ephemeral_root} cannot be read ({exc.strerror or exc}): need not judged"


NOT_CHECKED = ": the GPU count was not checked"


def _gpu_count(cfg: Config) -> tuple[str | None, str]:
    """(blocking line, note) for gpus.visible against the GPUs this machine has: ``nvidia-smi
    -L``, else NVML (``gpus.probe`` auto or nvml). A machine where neither shows a GPU cannot
    run a campaign that names some: refused. Skipped with a note when the recipe looks at no
    GPU, ``gpus.probe = "none"``, as the demo's stand-ins do."""
    if cfg.gpus.probe == "none":
        return None, 'GPU count not checked (gpus.probe = "none")'
    where = f"{cfg.source}:gpus.visible"
    listed = list_gpu_indices(cfg.gpus.nvidia_smi)
    source = None
    if listed[0] is None and cfg.gpus.probe in ("auto", "nvml"):
        have, why = nvml_gpu_indices()
        if have is not None:
            listed, source = (have, None), "NVML"
        else:
            listed = (None, f"{(listed[1] or '').removesuffix(NOT_CHECKED)}; {why}")
    if listed[0] is None:
        visible = list(cfg.gpus.visible)
        problem = (f"gpus.visible names {len(visible)} GPU(s) {visible}, but this machine shows no GPU "
                   f"({(listed[1] or '').removesuffix(NOT_CHECKED)})")
        fix = ("run it on the GPU box (with its NVIDIA driver; gpus.nvidia_smi names nvidia-smi if it is off PATH); "
               'a stack that uses no GPU, as the demo\'s stand-ins, sets gpus.probe = "none"')
        return PreflightProblem(problem, where, fix).line(), problem
    problem, note = gpu_count_check(cfg.gpus.visible, smi=cfg.gpus.nvidia_smi, listed=listed, source=source)
    if problem is None:
        return None, note or ""
    fix = "list only GPUs this machine has in gpus.visible (and keep tp_size dividing their number)"
    return PreflightProblem(problem, where, fix).line(), problem


def _gpu_mode(cfg: Config) -> str:
    """Which GPU hygiene mode applies here: host pids match, or container (NVML's are host pids)."""
    if cfg.gpus.probe == "none":
        return 'GPU hygiene: not checked (gpus.probe = "none")'
    try:
        probe = build_probe(cfg.gpus.probe, cfg.gpus.nvidia_smi)
    except ConfigError as exc:  # nvml without nvidia-ml-py: validation reports it too
        return f"GPU hygiene: {exc}"
    return mode_line(probe, cfg.gpus.devices)


def run_check(path: Path, *, print_commands: bool = False, placeholders: bool = False) -> int:
    if placeholders:
        for name, what in sorted(PLACEHOLDERS.items()):
            print(f"{{{name}}}\t{what}")
        return 0
    cfg = load_config(path)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    # The same validation `shoprld run` does at its start (issue 15): what it refuses, check
    # reports as NOT READY.
    invalid = validation_problems(cfg, layout)
    out = sys.stdout.write
    out(f"campaign      {cfg.campaign.name} / {cfg.campaign.experiment}: "
        f"{cfg.campaign.rounds} rounds x {cfg.campaign.steps_per_round} steps\n")
    out(f"config        {cfg.source}\n")
    rows = {
        "repo": layout.repo, "project root": layout.project_root, "ephemeral root": layout.ephemeral_root,
        "brev root": layout.brev_root, "cache root": layout.cache_root, "campaign root": layout.campaign_root,
        "exp dir": layout.exp_dir, "state dir": layout.state_dir, "ledger": layout.ledger,
        "env file": layout.env_file,
    }
    rows.update(layout.heavy_paths(cfg))
    out("\npaths\n")
    for k, v in rows.items():
        out(f"  {k:<22} {v}\n")
    out("\nchild environment (every stage)\n")
    env = layout.child_env(cfg, base={})
    links = {str(layout.child_tmp): layout.tmp, str(layout.child_ray_tmp): layout.ray_tmp}
    for k in sorted(env):
        via = f"  (-> {links[env[k]]})" if env[k] in links and Path(env[k]) != links[env[k]] else ""
        out(f"  {k}={secrets.redact(env[k])}{via}\n")
    present = sorted(k for k, v in secrets.values.items() if v)
    out(f"\n.env keys present ({layout.env_file}): {', '.join(present) if present else 'none'}\n")
    need = cfg.required_secrets()
    out(f".env keys required: {', '.join(f'{k} ({why})' for k, why in need.items()) or 'none'}\n")
    out("\nstage environments (tool versions, read in each env)\n")
    for env_versions in stage_env_versions(cfg, layout):
        out(f"  {env_versions.line()}\n")
    gpu = gpu_report(cfg.gpus.build_sm or None, cfg.gpus.visible)
    shown = ", ".join(f"{g['index']} {g['name']} {g['sm']}" for g in gpu["gpus"]) or gpu["problem"]
    out(f"  GPUs: {shown}; envs built for {gpu['expected_sm'] or '? (gpus.build_sm)'}\n")
    out(f"  GPU count: {_gpu_count(cfg)[1]}\n")
    out(f"  {_gpu_mode(cfg)}\n")
    spy = py_spy_binary()
    out(f"  py-spy: {spy} (a stall's bundle gets the trainer's stacks)\n" if spy else
        "  py-spy: not installed: a stall's bundle will have no stack dump; fix: pip install 'shoprld[debug]'\n")
    for w in [*gpu["warnings"], *lines(scan_repo(layout.repo, cfg.storage.repo_hygiene_max))]:
        out(f"  WARNING: {w}\n")
    if print_commands and any(p.template for p in invalid):
        out("\nstage commands: not shown until the config is valid (see NOT READY below)\n")
    elif print_commands:
        out("\nstage commands (round 0 and round 1; secrets masked)\n")
        for line in describe_commands(cfg, layout, secrets):
            out(f"{line}\n")
    if cfg.train.launcher == "ray" and not cfg.train.ray_start_head:
        # A cluster shoprld did not start (issue 27): it submits there and never starts, stops
        # or signals it; what it cannot see from here is whether every node sees the save dir.
        out(f"  Ray: an existing cluster at {cfg.train.ray_address} (shoprld never starts, stops or signals it); "
            f"WARNING: the save dir {layout.save_dir}, the experiment dir and .env's secrets file under "
            f"{layout.tmp} must be on storage every Ray node sees: not provable from here\n")
    warning = shopsim_exposure_warning(cfg.shopsim.url)
    if warning:
        out(f"\nwarning: {warning}\n")
    out("\n" + df_text(cfg, layout) + "\n")
    out(f"{_budget_line(cfg, layout)}\n")
    out(f"saves: {describe_saves(plan_saves(cfg, layout, 0, now=time.time(), planned=True))}\n")
    out(f"{asyncsave.command_line(cfg.train.command, cfg.saves.async_save)}\n")
    out("\nthe box (/dev/shm, ports, caches)\n")
    for box in box_lines(cfg, layout):
        out(f"  {secrets.redact(box.shown())}\n")  # a foreign command line may quote a key
    problems = _blocking(cfg, layout, secrets, invalid)
    if problems:
        out(f"\nNOT READY: {problems[0]}\n")
        for extra in problems[1:]:
            out(f"  also: {extra}\n")
        sys.stdout.flush()
        # Every non-zero exit has its one line on stderr, as `run` would print it.
        print(f"shoprld: NOT READY: {problems[0]}", file=sys.stderr)
        return 3
    out("\nready\n")
    # The config is valid; whether the campaign's own tools do what the daemon expects is only
    # known by running them: a tiny round before the first night costs minutes, not a night.
    out(f"next: shoprld rehearse -c {cfg.source}   (one tiny round of the real tools, ~minutes; "
        "do it before a first campaign)\n")
    return 0
