"""The val server (SGLang), the long-lived service of VAL and GATE.

It is ready when ``/health`` is 200 AND its process is alive, and it
must serve this round's ``weight_version``. It is stopped by process group, then its
port must be free before anything else starts. With ``val.reuse_server`` it stays up across
rounds: ``/release_memory_occupation`` during TRAIN, ``/update_weights_from_disk`` at VAL.
"""

from __future__ import annotations

import anyio
import httpx

from shoprld.daemon.services import gpus
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.services.processes import Child, wait_port_free
from shoprld.daemon.round.plan import RoundPlan, host_port
from shoprld.daemon.services.shopsim import ServiceHost, get_json


class ValServerService:
    """The SGLang val server for VAL and GATE: ready = /health 200 AND a live process."""

    def __init__(self) -> None:
        self.child: Child | None = None
        self.serving: str | None = None  # the weight_version it reported
        self.parked = False

    def _url(self, plan: RoundPlan, path: str) -> str:
        return plan.cfg.val.url.rstrip("/") + path

    async def ensure_ready(self, plan: RoundPlan, host: ServiceHost) -> str | None:
        cfg = plan.cfg.val
        if self.child is None:
            self.child = host.find_child(ChildRole.VAL_SERVER)
        if self.child is not None and self.child.alive():
            if await self._serving(plan, host) == plan.weight_version:
                return None
            if cfg.reuse_server:
                return await self._swap_weights(plan, host)
            await self.stop(plan, host)
        if problem := await gpus.ensure_free(plan, host, "val server"):  # no straggler of an earlier stage
            return problem
        addr, port = host_port(cfg.url, 30000)
        if not await wait_port_free(addr, port, timeout=min(60.0, cfg.ready_timeout)):
            return f"{addr}:{port} is still in use; the val server cannot start there"
        self.child = await host.spawn(plan, ChildRole.VAL_SERVER, cfg.server_command, cfg, state="VALSERVER",
                                      extra_env=dict(cfg.server_env))
        deadline = host.clock.monotonic() + cfg.ready_timeout
        while host.clock.monotonic() < deadline:
            if not self.child.alive():
                host.unregister_child(self.child)
                self.child = None
                return f"val server exited during start-up; see {plan.log_path('VALSERVER')}"
            status, _ = await get_json(host.http, self._url(plan, cfg.health_path))
            if status == 200 and self.child.alive():
                version = await self._serving(plan, host)
                if version != plan.weight_version:
                    await self.stop(plan, host)
                    return f"val server serves weight_version {version!r}, expected {plan.weight_version!r}"
                host.emit("val_server.ready", pid=self.child.pid, weight_version=version)
                return None
            await anyio.sleep(0.1)
        await self.stop(plan, host)
        return f"val server not healthy within {cfg.ready_timeout:.0f}s (val.ready_timeout)"

    async def _serving(self, plan: RoundPlan, host: ServiceHost) -> str | None:
        _, info = await get_json(host.http, self._url(plan, "/get_model_info"))
        self.serving = info.get("weight_version") if isinstance(info, dict) else None
        return self.serving

    async def _swap_weights(self, plan: RoundPlan, host: ServiceHost) -> str | None:
        """reuse_server: resume memory, hot-swap to this round's HF dir, check the version."""
        try:
            if self.parked:
                await host.http.post(self._url(plan, "/resume_memory_occupation"), json={}, timeout=60)
                self.parked = False
            r = await host.http.post(self._url(plan, "/update_weights_from_disk"),
                                     json={"model_path": str(plan.hf_dir), "weight_version": plan.weight_version},
                                    timeout=plan.cfg.val.ready_timeout)
            body = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            await self.stop(plan, host)
            return f"update_weights_from_disk failed ({exc}); relaunching"
        if not (isinstance(body, dict) and body.get("success")) or await self._serving(plan, host) != plan.weight_version:
            await self.stop(plan, host)
            return f"update_weights_from_disk refused: {body}; relaunching"
        host.emit("val_server.weights_swapped", weight_version=plan.weight_version)
        return None

    async def after_gate(self, plan: RoundPlan, host: ServiceHost) -> None:
        """Training needs the GPUs: stop the server, or park it (reuse_server)."""
        if plan.cfg.val.reuse_server and self.child is not None and self.child.alive():
            try:
                await host.http.post(self._url(plan, "/release_memory_occupation"), json={}, timeout=60)
                self.parked = True
                host.emit("val_server.parked", pid=self.child.pid)
                return
            except httpx.HTTPError:
                pass
        await self.stop(plan, host)

    async def stop(self, plan: RoundPlan, host: ServiceHost) -> None:
        if self.child is None:
            return
        await self.child.stop(plan.cfg.val.server_grace)
        host.unregister_child(self.child)
        self.child = None
        self.serving = None
        addr, port = host_port(plan.cfg.val.url, 30000)
        await wait_port_free(addr, port, timeout=30)
        host.emit("val_server.stopped")
