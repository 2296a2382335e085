"""PREFLIGHT_DISK's checks, from the config: the volume's checks (:mod:`.diskcheck`) + the real
stack's files + the TMPDIR lengths.

Used by the PREFLIGHT_DISK state (which raises on the first problem, exit 3) and by
``shoprld check`` (which lists them all, with no side effects).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.storage import disk, diskbudget, diskcheck, raysessions
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.paths import tree_bytes


def forecast_for(cfg: Config, last_checkpoint_bytes: int | None, *, present_bytes: int = 0) -> diskbudget.Forecast:
    """The peak of a round: the last checkpoint's measured size (or the configured estimate
    before the first one) times the ``disk.keep_finals`` finals retention keeps plus the one
    being written, plus an HF export, plus margin; ``present_bytes`` of it already on the volume."""
    return diskbudget.forecast(
        last_checkpoint_bytes=last_checkpoint_bytes, estimate_bytes=cfg.disk.checkpoint_estimate,
        keep=cfg.disk.keep_finals + 1, hf_bytes=cfg.disk.hf_estimate, margin_bytes=cfg.disk.margin_bytes,
        present_bytes=present_bytes,
    )


def limits_for(cfg: Config, total_bytes: int, checkpoint_bytes: int) -> diskbudget.Limits:
    """The volume's soft and hard limits for a checkpoint of ``checkpoint_bytes`` (the config's
    overrides win), as the engine's guard derives them."""
    return diskbudget.limits(total_bytes, checkpoint_bytes, soft_override=cfg.disk.soft_limit,
                             hard_override=cfg.disk.hard_limit)


def budget_for(cfg: Config, layout: Layout, *, sample: disk.DiskSample | None = None) -> diskbudget.Budget:
    """THE disk budget of this campaign now (`check`, PREFLIGHT_DISK, the save planner and the
    status plan read it): the newest ``keep_finals`` complete checkpoints and the HF dir already
    on the volume count towards the peak; the last checkpoint's size is the measured one.
    Raises ``OSError`` when the volume cannot be read."""
    s = sample if sample is not None else disk.sample(layout.ephemeral_root)
    scan = ckpt.scan(layout.save_dir)
    complete = [c for c in scan.checkpoints if c.complete]
    kept = sum(c.bytes for c in complete[-cfg.disk.keep_finals:]) if complete else 0
    hf = layout.hf_dir(cfg)
    hf_present = tree_bytes(hf) if hf.is_dir() else 0
    last = complete[-1].bytes if complete else None
    # A campaign of R rounds keeps at most R-1 finals of earlier rounds at its last peak.
    fc = forecast_for(cfg, last, present_bytes=kept + min(hf_present, cfg.disk.hf_estimate))
    fc = diskbudget.Forecast(checkpoint_bytes=fc.checkpoint_bytes,
                             keep=min(fc.keep, cfg.campaign.rounds), hf_bytes=fc.hf_bytes,
                             margin_bytes=fc.margin_bytes, measured=fc.measured, present_bytes=fc.present_bytes,
                             ray_logs_bytes=ray_logs_allowance(cfg, layout, fc.checkpoint_bytes).need_bytes)
    lim = limits_for(cfg, s.total_bytes, fc.checkpoint_bytes)
    return diskbudget.Budget(forecast=fc, limits=lim, free_bytes=s.free_bytes, total_bytes=s.total_bytes,
                             hf_present_bytes=min(hf_present, cfg.disk.hf_estimate))


def ray_logs_allowance(cfg: Config, layout: Layout, checkpoint_bytes: int) -> raysessions.Allowance:
    """What the forecast reserves for Ray's session logs: a head this campaign starts writes them
    under the experiment (``<exp>/ray/ray/session_*``); a cluster elsewhere writes nothing here."""
    if cfg.train.launcher != "ray" or not cfg.train.ray_start_head:
        return raysessions.Allowance(per_session_bytes=0, kept=0, present_bytes=0)
    return raysessions.allowance(layout.ray_tmp, checkpoint_bytes)


def need_line(cfg: Config, b: diskbudget.Budget) -> str:
    """`check`'s line: what an unattended run needs free and what there is."""
    verdict = "ok" if b.ok else ("WILL PARK (exit 4) when a save ends below the soft limit"
                                 if b.next_save_fits else "NOT ENOUGH for the first round")
    fc = b.forecast
    return (f"disk: needs >= {human_bytes(b.need_bytes)} free for {cfg.campaign.rounds} rounds unattended, "
            f"have {human_bytes(b.free_bytes)}: {verdict} (peak {fc.keep} x {human_bytes(fc.checkpoint_bytes)} "
            f"checkpoints + {human_bytes(fc.hf_bytes)} HF, {human_bytes(fc.present_bytes)} of it on the volume, "
            f"+ {human_bytes(fc.margin_bytes)} margin"
            + (f" + {human_bytes(fc.ray_logs_bytes)} Ray session logs" if fc.ray_logs_bytes else "")
            + f" + soft limit {human_bytes(b.limits.soft_bytes)}; "
            f"hard limit {human_bytes(b.limits.hard_bytes)})")


def volume_problems(cfg: Config, layout: Layout) -> list[diskcheck.PreflightProblem]:
    heavy = layout.heavy_paths(cfg)
    link = layout.project_root / "runs"
    if cfg.storage.manage_runs_link and not link.is_symlink() and not link.exists():
        # Not created yet (check, or the first preflight pass): judge where it will point.
        heavy["<project_root>/runs"] = layout.runs
    need_bytes = 0
    if layout.ephemeral_root.is_dir():
        try:
            b = budget_for(cfg, layout)
        except OSError:
            b = None
        if b is not None:
            # Refused: a first save that would cross the hard floor (the round could not end).
            # Less than an unattended run needs is `check`'s warning and the guard's park.
            need_bytes = b.next_save_bytes + b.limits.hard_bytes
    return diskcheck.check_volume(
        ephemeral_root=layout.ephemeral_root, repo=layout.repo, heavy_paths=heavy,
        need_bytes=need_bytes, need_inodes=cfg.disk.min_inodes, require_mount=cfg.disk.require_mount,
        forbid_same_fs=cfg.disk.forbid_same_fs,
    )


def real_stack_problems(cfg: Config, values: Mapping[str, str]) -> list[diskcheck.PreflightProblem]:
    """The files the real stack needs before any GPU work (``[preflight] must_exist``)."""
    out: list[diskcheck.PreflightProblem] = []
    for what, template in cfg.preflight.must_exist.items():
        path = Path(template.format_map(dict(values)))
        if not path.exists():
            fix = cfg.preflight.convert_hint if what == "ref_load" and cfg.preflight.convert_hint else \
                f"create it, or set the path in {cfg.source} [vars]/[preflight]"
            out.append(diskcheck.PreflightProblem(f"{what} is missing", str(path), fix))
    return out


# Variables that name a directory children create unix sockets under: Megatron's async
# checkpoint writer starts a spawn-context multiprocessing.Manager() whose socket is
# <TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX (about 32 characters more), Ray puts its session
# sockets under RAY_TMPDIR, and an AF_UNIX path holds at most 107 bytes. A value that leaves
# less than 40 characters of room fails the first save, hours into a round (issue 14).
TMPDIR_KEYS = ("TMPDIR", "TMP", "TEMP", "RAY_TMPDIR")
AF_UNIX_PATH_MAX = 107
SOCKET_ROOM = 40


def tmpdir_too_long(value: str) -> bool:
    """Whether a TMPDIR-like ``value`` leaves too little room for a unix socket under it."""
    return len(value) + SOCKET_ROOM > AF_UNIX_PATH_MAX


def tmpdir_problems(cfg: Config, layout: Layout, values: Mapping[str, str]) -> list[diskcheck.PreflightProblem]:
    """Every configured TMPDIR/TMP/TEMP/RAY_TMPDIR a child would get that is too long for an
    AF_UNIX socket under it: the layout's child environment, and each stage's ``env``,
    ``server_env`` and the Ray job's ``runtime_env`` (which override the layout's short link)."""
    out: list[diskcheck.PreflightProblem] = []
    limit = AF_UNIX_PATH_MAX - SOCKET_ROOM
    for key, value in layout.child_env(cfg, base={}).items():
        if key in TMPDIR_KEYS and tmpdir_too_long(value):
            out.append(diskcheck.PreflightProblem(
                f"{key} for every child is {len(value)} characters, too long for a unix socket under it "
                f"(at most {limit})", value,
                f"shorten storage.ephemeral_root or campaign.name/experiment in {cfg.source}"))
    for dotted, template in cfg.templates():
        parts = dotted.split(".")
        if len(parts) != 3 or parts[1] not in ("env", "server_env", "runtime_env") or parts[2] not in TMPDIR_KEYS:
            continue
        try:
            value = template.format_map(dict(values))
        except (KeyError, IndexError, ValueError):
            value = template
        if tmpdir_too_long(value):
            out.append(diskcheck.PreflightProblem(
                f"{dotted} is too long for a unix socket under it ({len(value)} characters, at most {limit}; "
                "Megatron's checkpoint save would fail with 'AF_UNIX path too long')",
                f"{cfg.source}:{dotted} = {value}",
                f"remove it, and children get shoprld's short /tmp link to the experiment's tmp dir; "
                f"or set a path of at most {limit} characters"))
    return out


def df_text(cfg: Config, layout: Layout) -> str:
    paths = {"repo": layout.repo}
    if layout.ephemeral_root.exists():
        paths["volume"] = layout.ephemeral_root
    return diskcheck.df_summary(paths)
