"""PREFLIGHT_DISK: is the volume fit for the next round? Create the layout. Never skipped.

Refuses (exit 3) on a TMPDIR-like value too long for a unix socket under it, a missing root, a root that is not a mount point (when required),
a repo on the same filesystem, a read-only volume, too few bytes or inodes for the
forecast, or a heavy output path that a symlink takes off the volume. Then it creates
the campaign and cache layout, the managed ``runs/`` link and the ballast file.
"""

from __future__ import annotations

from shoprld.daemon.foundation.storage.ballast import Ballast
from shoprld.daemon.foundation.system.errors import PreflightError
from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.storage.preflight import budget_for, need_line, volume_problems, real_stack_problems, tmpdir_problems
from shoprld.daemon.foundation.config.roles import ChildRole

from .base import Outcome, RoundContext

STATE = State.PREFLIGHT_DISK
ADOPTS: tuple[ChildRole, ...] = ()


def completed(ctx: RoundContext) -> bool:
    """Never skipped: the disk can change between two starts."""
    return False


async def run(ctx: RoundContext) -> Outcome:
    # A TMPDIR too long for a unix socket fails Megatron's first save hours in: refuse now.
    tmp = tmpdir_problems(ctx.cfg, ctx.layout, ctx.values())
    if tmp:
        raise PreflightError(tmp[0].line())
    problems = volume_problems(ctx.cfg, ctx.layout)
    if problems:
        raise PreflightError(problems[0].line())
    ctx.layout.ensure(ctx.cfg)
    problems = volume_problems(ctx.cfg, ctx.layout)
    problems += real_stack_problems(ctx.cfg, ctx.values())
    if problems:
        raise PreflightError(problems[0].line())
    b = budget_for(ctx.cfg, ctx.layout)
    ctx.emit("disk.budget", need_bytes=b.need_bytes, free_bytes=b.free_bytes, ok=b.ok,
             soft_limit_bytes=b.limits.soft_bytes, hard_limit_bytes=b.limits.hard_bytes,
             line=need_line(ctx.cfg, b))
    ballast = Ballast(ctx.layout.ballast, ctx.cfg.disk.ballast_bytes)
    if ctx.cfg.disk.ballast_bytes and not ballast.ensure():
        ctx.emit("disk.ballast_failed", path=str(ctx.layout.ballast), bytes=ctx.cfg.disk.ballast_bytes)
    return Outcome.done("volume ok")
