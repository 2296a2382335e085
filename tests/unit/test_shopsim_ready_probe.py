"""ShopsimService.wait_ready reuses a "ready" answer only while it is fresh, and the lease-leak
check never reuses one (issue 17, item 5)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import anyio
import httpx

from shoprld.daemon.services.shopsim import ShopsimService

URL = "http://127.0.0.1:5799"


def _ctx(answers: list[bool], seen: list[str], free: list[int] | None = None) -> Any:
    """A context with only what wait_ready, health and recover_leaks use; the HTTP transport is
    the seam. ``free``: the free_slots of each /healthz answer in turn (then 4 of 4)."""
    events: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/api/shop_agent":
            return httpx.Response(200, json={"message": "All environments have been initialized"})
        ready = answers.pop(0) if answers else True
        slots = free.pop(0) if free else 4
        return httpx.Response(200, json={"ready": ready, "free_slots": slots, "environment_slots": 4})

    shopsim = SimpleNamespace(url=URL, health_path="/healthz", start_timeout=0.5, manage=False, command=None,
                              grace=1.0)
    clock = SimpleNamespace(time=time.time, monotonic=time.monotonic)
    return SimpleNamespace(cfg=SimpleNamespace(shopsim=shopsim), clock=clock, events=events,
                           http=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
                           find_child=lambda role: None, emit=lambda event, **_: events.append(event))


def test_wait_ready_right_after_a_ready_answer_asks_no_more() -> None:
    """recover_leaks' probe, then wait_ready at once: one round trip, not two."""
    seen: list[str] = []
    ctx = _ctx([], seen)
    svc = ShopsimService()

    async def go() -> None:
        assert await svc.health(ctx, ctx) is not None
        assert await svc.wait_ready(ctx, ctx, before="before the gate") is None

    anyio.run(go)
    assert seen == ["/healthz"]


def test_a_not_ready_answer_is_never_reused() -> None:
    """After "not ready", wait_ready asks again (and waits until ready)."""
    seen: list[str] = []
    ctx = _ctx([False], seen)
    svc = ShopsimService()

    async def go() -> None:
        assert await svc.health(ctx, ctx) is None
        assert await svc.wait_ready(ctx, ctx, before="before the gate") is None

    anyio.run(go)
    assert seen == ["/healthz", "/healthz"]


def test_a_stopped_shopsim_forgets_its_ready_answer() -> None:
    """stop() clears the cached answer: the next wait_ready probes the service again."""
    seen: list[str] = []
    ctx = _ctx([], seen)
    svc = ShopsimService()

    async def go() -> None:
        assert await svc.health(ctx, ctx) is not None
        await svc.stop(ctx, ctx)
        assert await svc.wait_ready(ctx, ctx, before="before the trainer starts") is None

    anyio.run(go)
    assert seen == ["/healthz", "/healthz"]


def test_the_leak_check_counts_afresh_never_from_a_cached_ready_answer() -> None:
    """A "ready" answer read while the val tool still held 2 of 4 slots (a moment before it
    exited) is no leak: recover_leaks asks again, sees 4 of 4, and sends no release_all. The
    wait_ready right after it still asks no more (found by issue 17's hand-off trace: a
    needless release_all in the VAL->GATE hand-off of a fault-free campaign)."""
    seen: list[str] = []
    ctx = _ctx([], seen, free=[2, 4])
    svc = ShopsimService()

    async def go() -> None:
        assert await svc.health(ctx, ctx) is not None  # while the val tool ran: 2 of 4 free
        assert await svc.recover_leaks(ctx, ctx, reason="before the gate") is None
        assert await svc.wait_ready(ctx, ctx, before="before the gate") is None

    anyio.run(go)
    assert seen == ["/healthz", "/healthz"]
    assert "shopsim.lease_leak" not in ctx.events


def test_a_real_leak_is_still_released() -> None:
    """Slots still short on the fresh count: release_all, then the count again."""
    seen: list[str] = []
    ctx = _ctx([], seen, free=[4, 1, 4])
    svc = ShopsimService()

    async def go() -> None:
        assert await svc.health(ctx, ctx) is not None
        assert await svc.recover_leaks(ctx, ctx, reason="before the trainer starts") is None

    anyio.run(go)
    assert seen == ["/healthz", "/healthz", "/api/shop_agent", "/healthz"]
    assert ctx.events[:1] == ["shopsim.lease_leak"] and "shopsim.leaks_recovered" in ctx.events
