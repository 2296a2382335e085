"""START_SHOPSIM: ShopSim is up and ``/healthz`` says ``ready``; adopted when already healthy.

The service itself (start, adopt, health, lease-leak recovery, supervision with backoff
for the whole campaign) lives in :class:`shoprld.daemon.services.shopsim.ShopsimService`; this
state only waits for it to be ready, within ``shopsim.start_timeout``.
"""

from __future__ import annotations

from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.config.roles import ChildRole

from .base import Outcome, RoundContext

STATE = State.START_SHOPSIM
ADOPTS: tuple[ChildRole, ...] = (ChildRole.SHOPSIM,)


def completed(ctx: RoundContext) -> bool:
    """Never skipped: health is a fact about now, not about the disk."""
    return False


async def run(ctx: RoundContext) -> Outcome:
    problem = await ctx.shopsim.ensure_ready(ctx.plan, ctx)
    if problem:
        return Outcome.retry(problem)
    return Outcome.done("shopsim ready")
