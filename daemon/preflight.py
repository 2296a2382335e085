"""PREFLIGHT_DISK's checks, from the config: the disk module's checks + the real stack's files.

Used by the PREFLIGHT_DISK state (which raises on the first problem, exit 3) and by
``shoprld check`` (which lists them all, with no side effects).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from . import disk
from .config import Config
from .layout import Layout


def forecast_for(cfg: Config, last_checkpoint_bytes: int | None) -> disk.Forecast:
    """What the next round needs: the last checkpoint's measured size (or the configured
    estimate before the first one) times what retention keeps, plus an HF export, plus margin."""
    return disk.forecast(
        last_checkpoint_bytes=last_checkpoint_bytes, estimate_bytes=cfg.disk.checkpoint_estimate,
        keep=2, hf_bytes=cfg.disk.hf_estimate, margin_bytes=cfg.disk.margin,
    )


def preflight_problems(cfg: Config, layout: Layout, *, last_checkpoint_bytes: int | None) -> list[disk.PreflightProblem]:
    fc = forecast_for(cfg, last_checkpoint_bytes)
    heavy = layout.heavy_paths(cfg)
    link = layout.project_root / "runs"
    if cfg.storage.manage_runs_link and not link.is_symlink() and not link.exists():
        # Not created yet (check, or the first preflight pass): judge where it will point.
        heavy["<project_root>/runs"] = layout.runs
    return disk.preflight(
        ephemeral_root=layout.ephemeral_root, repo=layout.repo, heavy_paths=heavy,
        need_bytes=fc.total, need_inodes=cfg.disk.min_inodes, require_mount=cfg.disk.require_mount,
        forbid_same_fs=cfg.disk.forbid_same_fs,
    )


def real_stack_problems(cfg: Config, values: Mapping[str, str]) -> list[disk.PreflightProblem]:
    """The files the real stack needs before any GPU work (``[preflight] must_exist``)."""
    out: list[disk.PreflightProblem] = []
    for what, template in cfg.preflight.must_exist.items():
        path = Path(template.format_map(dict(values)))
        if not path.exists():
            fix = cfg.preflight.convert_hint if what == "ref_load" and cfg.preflight.convert_hint else \
                f"create it, or set the path in {cfg.source} [vars]/[preflight]"
            out.append(disk.PreflightProblem(f"{what} is missing", str(path), fix))
    return out


def df_text(cfg: Config, layout: Layout) -> str:
    paths = {"repo": layout.repo}
    if layout.ephemeral_root.exists():
        paths["volume"] = layout.ephemeral_root
    return disk.df_summary(paths)
