"""The two long-lived services a campaign talks to: ShopSim and the val server.

ShopSim is started once, adopted when it already answers ``ready`` (never started twice),
and supervised for the whole campaign: when it dies it is restarted with backoff, and the
event is logged. The supervisor also reads ``/healthz`` at a bounded interval, so ``status``
shows the live ``free_slots`` and ``environment_slots``. No stage starts a ShopSim client (the
trainer, the sidecar, val, analyze, the gate) before :meth:`ShopsimService.wait_ready` has seen
it answer ``ready`` (the real service refuses connections until every slot is built).

Its leases never expire, so after a client crash slots stay taken and the next ``reset``
would block forever; :meth:`ShopsimService.recover_leaks` notices (``free_slots`` short while
none of the campaign's clients runs) and sends ``release_all``. A reset whose client gave up
stays queued on the server (a ghost waiter) and takes a slot at that ``release_all``; a second
one frees it. If slots are still short, ShopSim is restarted when it is ours; an adopted one
fails the campaign with a line that says what to do.

The real ``start.sh`` ``cd``s into its checkout and the service appends every request to
``shop_agent.log`` there: like ``runs/``, that name is made a symlink into ``$EXP_DIR/logs``.

ShopSim also vouches for checkpoints. A rollout that ran while ShopSim was dead scores only
some of its groups, and the trainer (like slime, which aborts only after 8 unscored groups in
a row) may save that step before anyone notices. So while our ShopSim child is alive, the
newest checkpoint the tracker names is recorded in ``<state_dir>/shopsim.witness`` (read
before the liveness check: it was trained against this live process). A death found by the
supervisor or at start-up marks an outage there, which freezes the witness. The outage is
settled where no stage can be using the checkpoints: at start-up, before a trainer starts,
and when TRAIN ends (which checks ShopSim once more, so no round leaves TRAIN on an
unwitnessed checkpoint). Settling deletes the checkpoints saved after the witnessed one and
points the tracker back, so TRAIN retrains them against a live ShopSim.

The val server (SGLang) is ready when ``/health`` is 200 AND its process is alive, and it
must serve this round's ``weight_version``. It is stopped by process group, then its
port must be free before anything else starts. With ``val.reuse_server`` it stays up across
rounds: ``/release_memory_occupation`` during TRAIN, ``/update_weights_from_disk`` at VAL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from . import checkpoints as ckpt
from . import gpus
from .errors import StageFailed
from .processes import Child, wait_port_free
from .store import replace_json

if TYPE_CHECKING:
    from shoprld.states.base import RoundContext


async def get_json(http: httpx.AsyncClient, url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """(status, parsed JSON or None); (0, None) when nothing answers."""
    try:
        r = await http.get(url, timeout=timeout)
    except (httpx.HTTPError, OSError):
        return 0, None
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, None


def _host_port(url: str, default: int) -> tuple[str, int]:
    parts = httpx.URL(url)
    return parts.host or "127.0.0.1", parts.port or default


# The campaign's ShopSim clients: while one runs, leased slots are legitimate.
CLIENT_ROLES = ("trainer", "sidecar", "val", "gate", "analyze")
# The supervisor's /healthz refresh (status shows free_slots and environment_slots).
HEALTH_INTERVAL = 5.0
# How often the supervisor looks whether ShopSim is alive. A test seam may slow it down
# (SHOPRLD_TEST_SUPERVISE_INTERVAL, seconds), to make "the trainer saw the death first" certain.
def _supervise_interval() -> float:
    try:
        return max(0.05, float(os.environ.get("SHOPRLD_TEST_SUPERVISE_INTERVAL") or 1.0))
    except ValueError:
        return 1.0


SUPERVISE_INTERVAL = _supervise_interval()
# The file the real service appends every request to, in its cwd (start.sh cds into shop_env).
SERVICE_LOG = "shop_agent.log"


class ShopsimService:
    """Start or adopt ShopSim, wait for ready, supervise, recover leaked leases."""

    def __init__(self, witness: Path | None = None) -> None:
        self.child: Child | None = None
        self.healthy: bool | None = None
        self.free_slots: int | None = None
        self.environment_slots: int | None = None  # as the service reports it
        self.checked_at: float | None = None
        self.restarts = 0
        self.external = False  # healthy before we started anything: not ours to stop
        self.closing = False  # the daemon is shutting down: a stopped ShopSim is not a death
        self.witness = witness
        self._witnessed: object = object()  # the last iteration written (a sentinel at first)
        # ShopSim died since the witness was written (maybe under a previous daemon): freeze it.
        self._outage = bool((_read_witness(witness) or {}).get("outage"))
        # One start or restart at a time: the supervisor and a stage may both want one.
        self._lock = anyio.Lock()

    async def health(self, ctx: RoundContext) -> dict[str, Any] | None:
        cfg = ctx.cfg.shopsim
        status, body = await get_json(ctx.http, cfg.url.rstrip("/") + cfg.health_path)
        result = body.get("result", body) if isinstance(body, dict) else None
        ok = status == 200 and isinstance(result, dict) and bool(result.get("ready"))
        self.healthy, self.checked_at = ok, ctx.clock.time()
        self.free_slots = _int(result.get("free_slots")) if ok else None
        self.environment_slots = _int(result.get("environment_slots")) if ok else self.environment_slots
        return result if ok else None

    async def release_all(self, ctx: RoundContext) -> bool:
        """``POST /api/shop_agent {"action": "release_all"}``: every slot free, every lease stale.
        True when the service answered 200."""
        url = ctx.cfg.shopsim.url.rstrip("/") + "/api/shop_agent"
        try:
            r = await ctx.http.post(url, json={"action": "release_all"}, timeout=10.0)
        except (httpx.HTTPError, OSError):
            return False
        return r.status_code == 200

    async def wait_ready(self, ctx: RoundContext, *, before: str) -> str | None:
        """A bounded wait (``shopsim.start_timeout``) until ShopSim answers ``ready``; called
        before every trainer, val and gate start, so no stage runs against a dead or restarting
        service. A ShopSim of ours that nobody is restarting is started here. None once ready."""
        cfg = ctx.cfg.shopsim
        deadline = ctx.clock.monotonic() + cfg.start_timeout
        waited = False
        while True:
            restarting = self._lock.locked()
            dead = self.child is not None and not self.child.alive()
            if not restarting and not dead and await self.health(ctx) is not None:
                if waited:
                    ctx.emit("shopsim.waited", before=before, free_slots=self.free_slots)
                return None
            if not restarting and not dead and self.child is None and not self.external and cfg.manage \
                    and cfg.command:
                problem = await self.ensure_ready(ctx, settle=False)  # nobody restarts it: we do
                if problem is None:
                    continue
            if ctx.clock.monotonic() >= deadline:
                return (f"shopsim at {cfg.url} did not answer ready {before} within {cfg.start_timeout:.0f}s "
                        "(shopsim.start_timeout); a stage never starts against a dead or restarting ShopSim")
            waited = True
            await anyio.sleep(0.2)

    def vouch(self, ctx: RoundContext) -> None:
        """While our ShopSim child is alive: every checkpoint the tracker names now was trained
        against it. Not fsynced (a daemon crash keeps the page cache; after a host crash an
        older witness only makes the rollback below more cautious)."""
        if self.witness is None or self.child is None or self._outage:
            return
        iteration = ckpt.read_tracker(ctx.layout.save_dir).iteration  # read BEFORE the liveness check
        if not self.child.alive():
            self.mark_outage()
            return
        # None: no tracker, or one caught mid-write (Megatron writes it in place): keep the last.
        if iteration is not None and iteration != self._witnessed:
            self._witness(iteration)

    def _witness(self, iteration: int | None) -> None:
        if self.witness is not None:
            replace_json(self.witness, {"iteration": iteration, "outage": self._outage})
            self._witnessed = iteration

    def mark_outage(self) -> None:
        """Our ShopSim died: freeze the witness until :meth:`settle_outage` has run."""
        witness = _read_witness(self.witness)
        if witness is not None and not self._outage:
            self._outage = True
            self._witness(witness.get("iteration"))

    async def settle_outage(self, ctx: RoundContext) -> bool:
        """Retrain what was saved after the last witnessed checkpoint, if ShopSim died since.
        Only called where no stage uses checkpoints (start-up, TRAIN). True if it rolled back."""
        witness = _read_witness(self.witness)
        if witness is None or not witness.get("outage"):
            return False
        trainer = ctx.find_child("trainer")
        if trainer is not None:
            await trainer.stop(ctx.cfg.train.grace)
            ctx.unregister_child(trainer)
        save = ctx.layout.save_dir
        safe = witness.get("iteration")
        scan = ckpt.scan(save)
        doomed = ckpt.outage_suspects(scan, safe)
        used = [c.iteration for c in doomed if _export_used(ctx, c.iteration)]
        self._outage = False
        if used:
            ctx.emit("shopsim.outage_after_use", iterations=used, witnessed=safe,
                     note="a later stage already used these weights; not retrained")
            self._witness(scan.tracker.iteration)
            return False
        if not doomed:
            self._witness(safe)
            return False
        ctx.emit("checkpoint.rollback", iterations=[c.iteration for c in doomed], witnessed=safe,
                 reason="saved after ShopSim was last seen alive: may hold a partial rollout")
        done = ckpt.roll_back_to(save, safe, now=ctx.clock.time())  # checkpoints.py deletes, not us
        # What is retrained from here must be witnessed again, by the next live ShopSim.
        self._witness(done.resume)
        return True

    async def ensure_ready(self, ctx: RoundContext, *, settle: bool = True) -> str | None:
        """None once ready; else a one-line problem (the stage retries). ``settle``: at start-up,
        a ShopSim of ours that is gone died unwatched (or was stopped; then nothing is undone)."""
        async with self._lock:
            return await self._ensure_ready(ctx, settle=settle)

    async def _ensure_ready(self, ctx: RoundContext, *, settle: bool) -> str | None:
        cfg = ctx.cfg.shopsim
        if self.child is None:
            self.child = ctx.find_child("shopsim")
            if self.child is not None:
                ctx.emit("shopsim.adopted", pid=self.child.pid)
            elif settle and not self.external:
                self.mark_outage()
                await self.settle_outage(ctx)
        if self.child is None and await self.health(ctx) is not None:
            self.external = True
            ctx.emit("shopsim.adopted", pid=None, url=cfg.url, note="already healthy; not started twice")
            return None
        if self.child is None:
            if not cfg.manage or not cfg.command:
                return f"shopsim at {cfg.url} is not ready and shopsim.command is not set; start it or configure it"
            host, port = _host_port(cfg.url, 5700)
            if not await wait_port_free(host, port, timeout=min(30.0, cfg.start_timeout)):
                return f"{host}:{port} is held by something that is not a ready ShopSim; free the port"
            _redirect_service_log(ctx)
            self.child = await ctx.start("shopsim", cfg.command, cfg, state="SHOPSIM")
        deadline = ctx.clock.monotonic() + cfg.start_timeout
        while ctx.clock.monotonic() < deadline:
            if await self.health(ctx) is not None:
                ctx.emit("shopsim.ready", pid=self.child.pid, free_slots=self.free_slots)
                if not _read_witness(self.witness):  # a first start: what is on disk predates it
                    self._witness(ckpt.read_tracker(ctx.layout.save_dir).iteration)
                return None
            if not self.child.alive():
                ctx.unregister_child(self.child)
                self.child = None
                return f"shopsim exited during start-up; see {ctx.layout.stage_log(ctx.round, 'SHOPSIM')}"
            await anyio.sleep(0.1)
        await self.stop(ctx)
        return f"shopsim not ready within {cfg.start_timeout:.0f}s (shopsim.start_timeout)"

    async def stop(self, ctx: RoundContext) -> None:
        if self.child is not None:
            await self.child.stop(ctx.cfg.shopsim.grace)
            ctx.unregister_child(self.child)
            self.child = None
        self.healthy = None

    async def restart(self, ctx: RoundContext, why: str) -> str | None:
        async with self._lock:
            self.restarts += 1
            ctx.emit("shopsim.restart", reason=why, restarts=self.restarts)
            if self.external:
                return f"shopsim at {ctx.cfg.shopsim.url} is not ours to restart ({why}); restart it by hand"
            await self.stop(ctx)
            await anyio.sleep(min(30.0, ctx.cfg.shopsim.backoff * 2 ** min(self.restarts - 1, 5)))
            return await self._ensure_ready(ctx, settle=False)

    async def recover_leaks(self, ctx: RoundContext, *, reason: str) -> str | None:
        """Slots still leased while no client of ours runs are leaks: ``release_all`` (twice if a
        ghost waiter took a slot at the first), then a restart of a ShopSim of ours. None once
        every slot is free (or a client of ours runs, whose leases are legitimate); else a
        one-line problem (the stage retries). An adopted ShopSim that stays short raises
        :class:`StageFailed`: it is not ours to restart, and retrying cannot fix it."""
        if any(ctx.find_child(r) is not None for r in CLIENT_ROLES):
            return None
        problem = await self.wait_ready(ctx, before=reason)
        if problem:
            return problem
        cfg = ctx.cfg.shopsim
        free, slots = self.free_slots, self.environment_slots
        if free is None or slots is None or free >= slots:
            return None
        ctx.emit("shopsim.lease_leak", free_slots=free, slots=slots, reason=reason)
        for attempt in (1, 2):  # the second frees what ghost waiters took at the first
            sent = await self.release_all(ctx)
            health = await self.health(ctx)
            ctx.emit("shopsim.release_all", attempt=attempt, answered=sent, free_slots=self.free_slots,
                     slots=self.environment_slots)
            if health is not None and self.free_slots is not None and self.environment_slots is not None \
                    and self.free_slots >= self.environment_slots:
                ctx.emit("shopsim.leaks_recovered", how="release_all", attempts=attempt)
                return None
        short = f"{(self.environment_slots or slots) - (self.free_slots or 0)} of {self.environment_slots or slots}"
        if self.external:
            raise StageFailed(
                f"shopsim at {cfg.url} (adopted: shoprld did not start it) still has {short} slots leased "
                f"{reason} after two release_all, while no client of this campaign runs; another client "
                f"holds them or queued resets wait there: stop those clients or restart ShopSim by hand, "
                f"then run shoprld again")
        return await self.restart(ctx, f"{short} slots still leased after two release_all {reason}")

    async def supervise(self, ctx_factory: Any, interval: float = SUPERVISE_INTERVAL,
                        health_interval: float = HEALTH_INTERVAL) -> None:
        """Restart ShopSim with backoff whenever the child we started dies; refresh the health
        (``free_slots``, ``environment_slots``) every ``health_interval`` seconds for ``status``."""
        last_health = -float("inf")
        while True:
            await anyio.sleep(interval)
            child = self.child
            if self.closing:
                return
            ctx = ctx_factory()
            self.vouch(ctx)
            now = ctx.clock.monotonic()
            if not self._lock.locked() and now - last_health >= health_interval:
                last_health = now
                await self.health(ctx)
                child = self.child
            if child is not None and not child.alive():
                ctx.emit("shopsim.died", pid=child.pid, returncode=child.returncode)
                self.mark_outage()
                ctx.unregister_child(child)
                self.child = None
                # A trainer that lost ShopSim mid-rollout either aborts (8 unscored groups) or
                # trains a step on a partial rollout: stop it now; TRAIN settles the outage
                # (retrains what was saved since ShopSim was last seen alive) and relaunches it.
                trainer = ctx.find_child("trainer")
                if trainer is not None:
                    ctx.emit("shopsim.died_during_train", trainer_pid=trainer.pid)
                    await trainer.stop(ctx.cfg.train.grace)
                problem = await self.restart(ctx, "died")
                if problem:
                    ctx.emit("shopsim.restart_failed", problem=problem)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def service_dir(ctx: RoundContext) -> Path | None:
    """The directory the service runs in (and writes ``shop_agent.log`` to): the directory of a
    ``start.sh`` in the command (it ``cd``s there), else ``shopsim.cwd``."""
    cfg = ctx.cfg.shopsim
    for arg in ctx.argv(cfg.command):
        if Path(arg).name == "start.sh":
            return Path(arg).resolve().parent
    return cfg.cwd


def _redirect_service_log(ctx: RoundContext) -> None:
    """Make ``<service dir>/shop_agent.log`` a symlink to ``$EXP_DIR/logs/shop_agent.log`` (as
    ``runs/`` is redirected), so the request log never grows inside the checkout. A real file
    already there is moved next to the target first. Best effort: a read-only checkout is
    logged, not fatal."""
    import os
    import shutil

    where = service_dir(ctx)
    if where is None or not where.is_dir():
        return
    link = where / SERVICE_LOG
    target = ctx.layout.logs / SERVICE_LOG
    try:
        if link.is_symlink():
            if Path(os.readlink(link)) == target:
                return
            link.unlink()
        elif link.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(link), str(target.with_name(f"{SERVICE_LOG}.moved-{int(ctx.clock.time())}")))
        target.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        ctx.emit("shopsim.log_redirected", link=str(link), target=str(target))
    except OSError as exc:
        ctx.emit("shopsim.log_redirect_failed", link=str(link), error=str(exc))


def _read_witness(path: Path | None) -> dict[str, Any] | None:
    import json

    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "iteration" in doc else None


def _export_used(ctx: RoundContext, iteration: int) -> bool:
    """A later stage already used this checkpoint: it is a round's end and EXPORT_HF recorded it."""
    from shoprld.states.base import round_id

    mapping = ctx.mapping
    r = mapping.round_of(iteration)
    return iteration == mapping.end_iteration(r) and ctx.read_record("export", round_id(r)) is not None


class ValServerService:
    """The SGLang val server for VAL and GATE: ready = /health 200 AND a live process."""

    def __init__(self) -> None:
        self.child: Child | None = None
        self.serving: str | None = None  # the weight_version it reported
        self.parked = False

    def _url(self, ctx: RoundContext, path: str) -> str:
        return ctx.cfg.val.url.rstrip("/") + path

    async def ensure_ready(self, ctx: RoundContext) -> str | None:
        cfg = ctx.cfg.val
        if self.child is None:
            self.child = ctx.find_child("val_server")
        if self.child is not None and self.child.alive():
            if await self._serving(ctx) == ctx.weight_version:
                return None
            if cfg.reuse_server:
                return await self._swap_weights(ctx)
            await self.stop(ctx)
        if problem := await gpus.ensure_free(ctx, "val server"):  # no straggler of an earlier stage
            return problem
        host, port = _host_port(cfg.url, 30000)
        if not await wait_port_free(host, port, timeout=min(60.0, cfg.ready_timeout)):
            return f"{host}:{port} is still in use; the val server cannot start there"
        self.child = await ctx.start("val_server", cfg.server_command, cfg, state="VALSERVER",
                                     extra_env=dict(cfg.server_env))
        deadline = ctx.clock.monotonic() + cfg.ready_timeout
        while ctx.clock.monotonic() < deadline:
            if not self.child.alive():
                ctx.unregister_child(self.child)
                self.child = None
                return f"val server exited during start-up; see {ctx.layout.stage_log(ctx.round, 'VALSERVER')}"
            status, _ = await get_json(ctx.http, self._url(ctx, cfg.health_path))
            if status == 200 and self.child.alive():
                version = await self._serving(ctx)
                if version != ctx.weight_version:
                    await self.stop(ctx)
                    return f"val server serves weight_version {version!r}, expected {ctx.weight_version!r}"
                ctx.emit("val_server.ready", pid=self.child.pid, weight_version=version)
                return None
            await anyio.sleep(0.1)
        await self.stop(ctx)
        return f"val server not healthy within {cfg.ready_timeout:.0f}s (val.ready_timeout)"

    async def _serving(self, ctx: RoundContext) -> str | None:
        _, info = await get_json(ctx.http, self._url(ctx, "/get_model_info"))
        self.serving = info.get("weight_version") if isinstance(info, dict) else None
        return self.serving

    async def _swap_weights(self, ctx: RoundContext) -> str | None:
        """reuse_server: resume memory, hot-swap to this round's HF dir, check the version."""
        try:
            if self.parked:
                await ctx.http.post(self._url(ctx, "/resume_memory_occupation"), json={}, timeout=60)
                self.parked = False
            r = await ctx.http.post(self._url(ctx, "/update_weights_from_disk"),
                                    json={"model_path": str(ctx.hf_dir), "weight_version": ctx.weight_version},
                                    timeout=ctx.cfg.val.ready_timeout)
            body = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            await self.stop(ctx)
            return f"update_weights_from_disk failed ({exc}); relaunching"
        if not (isinstance(body, dict) and body.get("success")) or await self._serving(ctx) != ctx.weight_version:
            await self.stop(ctx)
            return f"update_weights_from_disk refused: {body}; relaunching"
        ctx.emit("val_server.weights_swapped", weight_version=ctx.weight_version)
        return None

    async def after_gate(self, ctx: RoundContext) -> None:
        """Training needs the GPUs: stop the server, or park it (reuse_server)."""
        if ctx.cfg.val.reuse_server and self.child is not None and self.child.alive():
            try:
                await ctx.http.post(self._url(ctx, "/release_memory_occupation"), json={}, timeout=60)
                self.parked = True
                ctx.emit("val_server.parked", pid=self.child.pid)
                return
            except httpx.HTTPError:
                pass
        await self.stop(ctx)

    async def stop(self, ctx: RoundContext) -> None:
        if self.child is None:
            return
        await self.child.stop(ctx.cfg.val.server_grace)
        ctx.unregister_child(self.child)
        self.child = None
        self.serving = None
        host, port = _host_port(ctx.cfg.val.url, 30000)
        await wait_port_free(host, port, timeout=30)
        ctx.emit("val_server.stopped")
