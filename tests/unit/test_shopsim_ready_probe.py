"""ShopsimService.wait_ready reuses a "ready" answer only while it is fresh (issue 17, item 5)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import anyio
import httpx

from shoprld.daemon.services.shopsim import ShopsimService

URL = "http://127.0.0.1:5799"


def _ctx(answers: list[bool], seen: list[str]) -> Any:
    """A context with only what wait_ready and health read; the HTTP transport is the seam."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        ready = answers.pop(0) if answers else True
        return httpx.Response(200, json={"ready": ready, "free_slots": 4, "environment_slots": 4})

    shopsim = SimpleNamespace(url=URL, health_path="/healthz", start_timeout=0.5, manage=False, command=None,
                              grace=1.0)
    clock = SimpleNamespace(time=time.time, monotonic=time.monotonic)
    return SimpleNamespace(cfg=SimpleNamespace(shopsim=shopsim), clock=clock,
                           http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))


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
