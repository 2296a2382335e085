"""The one retry rule and the one backoff curve, for stages and services alike (issue 16).

A stage that failed is retried while its consecutive failures stay within ``retries``
(:func:`may_retry`), after a delay that doubles with each failure (:class:`Backoff`), as
Supervisor's BACKOFF state does. The count itself is kept next to the state it belongs to:
``machine.Counters`` holds a stage's, ``ShopsimService.restarts`` the supervised ShopSim's.
This module only says what a count means, so every caller reads it the same way.

Stdlib only: a foundation that ``machine`` (core), ``services`` and ``states`` import alike.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGE_BACKOFF_CAP_S = 300.0
"""A stage never waits more than five minutes between attempts."""


def may_retry(failures: int, retries: int) -> bool:
    """Whether another attempt follows ``failures`` consecutive failed ones, under ``retries``.

    ``retries`` counts the attempts after the first, so ``retries = 2`` allows three in all.
    A stage that reads its own ``ctx.attempt`` (the gate's retry policy) passes the attempt
    that just failed, which is the same number.
    """
    return failures <= retries


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``base * 2 ** (failures - 1)``, at most ``cap`` seconds.

    ``max_doublings`` stops the doubling early (ShopSim restarts double five times at most).
    No failure yet (or progress since the last one) means no wait.
    """

    base: float
    cap: float = STAGE_BACKOFF_CAP_S
    max_doublings: int | None = None

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        doublings = failures - 1 if self.max_doublings is None else min(failures - 1, self.max_doublings)
        return float(min(self.cap, self.base * 2 ** doublings))
