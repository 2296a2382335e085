"""PREFLIGHT_DISK: is the volume fit for the next round? Create the layout. Never skipped.

Refuses (exit 3) on a TMPDIR-like value too long for a unix socket under it, a missing root, a root that is not a mount point (when required),
a repo on the same filesystem, a read-only volume, too few bytes or inodes for the
forecast, or a heavy output path that a symlink takes off the volume. Then it creates
the campaign and cache layout, the managed ``runs/`` link and the ballast file.
"""

from __future__ import annotations

from shoprld.daemon.foundation import checkpoints as ckpt
from shoprld.daemon.foundation.ballast import Ballast
from shoprld.daemon.foundation.errors import PreflightError
from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.preflight import preflight_problems, real_stack_problems, tmpdir_problems
from shoprld.daemon.foundation.roles import ChildRole

from .base import Outcome, RoundContext

STATE = State.PREFLIGHT_DISK
ADOPTS: tuple[ChildRole, ...] = ()


def completed(ctx: RoundContext) -> bool:
    """Never skipped: the disk can change between two starts."""
    return False


async def run(ctx: RoundContext) -> Outcome:
    last = ckpt.scan(ctx.layout.save_dir).latest_complete
    # A TMPDIR too long for a unix socket fails Megatron's first save hours in: refuse now.
    tmp = tmpdir_problems(ctx.cfg, ctx.layout, ctx.values())
    if tmp:
        raise PreflightError(tmp[0].line())
    problems = preflight_problems(ctx.cfg, ctx.layout, last_checkpoint_bytes=last.bytes if last else None)
    if problems:
        raise PreflightError(problems[0].line())
    ctx.layout.ensure(ctx.cfg)
    problems = preflight_problems(ctx.cfg, ctx.layout, last_checkpoint_bytes=last.bytes if last else None)
    problems += real_stack_problems(ctx.cfg, ctx.values())
    if problems:
        raise PreflightError(problems[0].line())
    ballast = Ballast(ctx.layout.ballast, ctx.cfg.disk.ballast)
    if ctx.cfg.disk.ballast and not ballast.ensure():
        ctx.emit("disk.ballast_failed", path=str(ctx.layout.ballast), bytes=ctx.cfg.disk.ballast)
    return Outcome.done("volume ok")
