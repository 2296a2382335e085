"""ShopSim, the long-lived service every ShopSim client of a campaign talks to (the val
server, the other one, is in valserver.py).

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

The real ``start.sh`` ``cd``s into its own directory and the service appends every request to
``shop_agent.log`` in that cwd: neither our cwd nor an env var moves it. So the user's checkout is
never touched: ShopSim runs from a copy of the checkout's ``start.sh`` in
``$EXP_DIR/logs/shopsim/`` (:func:`launcher`), pointed back at the checkout through the
variables the real script honours, and the log grows there.

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
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.storage import retention
from shoprld.daemon.foundation.config.configsections import ProcessSpec
from shoprld.daemon.foundation.system.errors import StageFailed
from shoprld.daemon.services.processes import Child, ChildHost, wait_port_free
from shoprld.daemon.foundation.system.retry import Backoff
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.round import resume
from shoprld.daemon.round.plan import RoundPlan, host_port
from shoprld.daemon.foundation.records.store import replace_json


class ServiceHost(ChildHost, Protocol):
    """What the services use of the daemon, besides the round's plan: the clock, events and
    children (:class:`ChildHost`), the HTTP client, and a launch for a round."""

    @property
    def http(self) -> httpx.AsyncClient: ...

    async def spawn(self, plan: RoundPlan, role: ChildRole, template: Sequence[str], spec: ProcessSpec, *,
                    state: str, extra_env: Mapping[str, str] | None = None) -> Child: ...


class PlannedHost(ServiceHost, Protocol):
    """A host that knows the campaign's current round: what the ShopSim supervisor polls."""

    @property
    def plan(self) -> RoundPlan: ...


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


# The campaign's ShopSim clients: while one runs, leased slots are legitimate.
CLIENT_ROLES = (ChildRole.TRAINER, ChildRole.SIDECAR, ChildRole.VAL, ChildRole.GATE, ChildRole.ANALYZE)
# The supervisor's /healthz refresh (status shows free_slots and environment_slots).
HEALTH_INTERVAL = 5.0
# A "ready" answer this recent (s) is not asked again (wait_ready right after recover_leaks).
FRESH_READY_S = 0.5
SHOPSIM_BACKOFF_CAP_S = 30.0  # ShopSim restarts wait at most this long (stages: retry.STAGE_BACKOFF_CAP_S)
# How often the supervisor looks whether ShopSim is alive; it also wakes at once when its
# child exits. A test seam slows the looks down (SHOPRLD_TEST_SUPERVISE_INTERVAL, seconds) and
# turns that wake-up off, to make "the trainer saw the death first" certain (as after a daemon
# restart, where ShopSim is adopted and its exit is only polled).
def _supervise_interval() -> float:
    try:
        return max(0.05, float(os.environ.get("SHOPRLD_TEST_SUPERVISE_INTERVAL") or 1.0))
    except ValueError:
        return 1.0


SUPERVISE_INTERVAL = _supervise_interval()
WAKE_AT_EXIT = not os.environ.get("SHOPRLD_TEST_SUPERVISE_INTERVAL")
# The file the real service appends every request to, in its cwd (start.sh cds into shop_env).
SERVICE_LOG = "shop_agent.log"
# The script a ShopSim checkout is started with, and where shoprld runs its copy ($EXP_DIR/logs/...).
LAUNCHER = "start.sh"
LAUNCHER_DIR = "shopsim"


class ShopsimService:
    """Start or adopt ShopSim, wait for ready, supervise, recover leaked leases."""

    def __init__(self, witness: Path | None = None) -> None:
        self.child: Child | None = None
        self.healthy: bool | None = None
        self.free_slots: int | None = None
        self.environment_slots: int | None = None  # as the service reports it
        self.checked_at: float | None = None
        self.restarts = 0  # this service's count for the one backoff rule (daemon/foundation/system/retry.py)
        self.external = False  # healthy before we started anything: not ours to stop
        self.closing = False  # the daemon is shutting down: a stopped ShopSim is not a death
        self.witness = witness
        self._witnessed: object = object()  # the last iteration written (a sentinel at first)
        # ShopSim died since the witness was written (maybe under a previous daemon): freeze it.
        self._outage = bool((_read_witness(witness) or {}).get("outage"))
        # One start or restart at a time: the supervisor and a stage may both want one.
        self._lock = anyio.Lock()
        self._ready_seen: float | None = None  # time.monotonic() of the last "ready" answer

    async def health(self, plan: RoundPlan, host: ServiceHost) -> dict[str, Any] | None:
        cfg = plan.cfg.shopsim
        status, body = await get_json(host.http, cfg.url.rstrip("/") + cfg.health_path)
        result = body.get("result", body) if isinstance(body, dict) else None
        ok = status == 200 and isinstance(result, dict) and bool(result.get("ready"))
        self.healthy, self.checked_at = ok, host.clock.time()
        self._ready_seen = time.monotonic() if ok else None
        self.free_slots = _int(result.get("free_slots")) if ok else None
        self.environment_slots = _int(result.get("environment_slots")) if ok else self.environment_slots
        return result if ok else None

    async def release_all(self, plan: RoundPlan, host: ServiceHost) -> bool:
        """``POST /api/shop_agent {"action": "release_all"}``: every slot free, every lease stale.
        True when the service answered 200."""
        url = plan.cfg.shopsim.url.rstrip("/") + "/api/shop_agent"
        try:
            r = await host.http.post(url, json={"action": "release_all"}, timeout=10.0)
        except (httpx.HTTPError, OSError):
            return False
        return r.status_code == 200

    async def wait_ready(self, plan: RoundPlan, host: ServiceHost, *, before: str) -> str | None:
        """A bounded wait (``shopsim.start_timeout``) until ShopSim answers ``ready``; called
        before every trainer, val and gate start, so no stage runs against a dead or restarting
        service. A ShopSim of ours that nobody is restarting is started here. None once ready."""
        cfg = plan.cfg.shopsim
        deadline = host.clock.monotonic() + cfg.start_timeout
        waited = False
        while True:
            restarting = self._lock.locked()
            dead = self.child is not None and not self.child.alive()
            if not restarting and not dead and (self._just_ready() or await self.health(plan, host) is not None):
                if waited:
                    host.emit("shopsim.waited", before=before, free_slots=self.free_slots)
                return None
            if not restarting and not dead and self.child is None and not self.external and cfg.manage \
                    and cfg.command:
                problem = await self.ensure_ready(plan, host, settle=False)  # nobody restarts it: we do
                if problem is None:
                    continue
            if host.clock.monotonic() >= deadline:
                return (f"shopsim at {cfg.url} did not answer ready {before} within {cfg.start_timeout:.0f}s "
                        "(shopsim.start_timeout); a stage never starts against a dead or restarting ShopSim")
            waited = True
            await anyio.sleep(0.2)

    def _just_ready(self) -> bool:
        """ShopSim answered "ready" within the last FRESH_READY_S (real seconds, not the clock
        seam: this is the age of an HTTP answer). Stages ask twice back to back (recover_leaks,
        then wait_ready): the second probe added a round trip to every trainer, val and gate
        start without telling anything new (issue 17)."""
        return self._ready_seen is not None and time.monotonic() - self._ready_seen < FRESH_READY_S

    def vouch(self, save_dir: Path) -> None:
        """While our ShopSim child is alive: every checkpoint the tracker names now was trained
        against it. Not fsynced (a daemon crash keeps the page cache; after a host crash an
        older witness only makes the rollback below more cautious)."""
        if self.witness is None or self.child is None or self._outage:
            return
        iteration = ckpt.read_tracker(save_dir).iteration  # read BEFORE the liveness check
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

    async def settle_outage(self, plan: RoundPlan, host: ServiceHost) -> bool:
        """Retrain what was saved after the last witnessed checkpoint, if ShopSim died since.
        Only called where no stage uses checkpoints (start-up, TRAIN). True if it rolled back."""
        witness = _read_witness(self.witness)
        if witness is None or not witness.get("outage"):
            return False
        trainer = host.find_child(ChildRole.TRAINER)
        if trainer is not None:
            await trainer.stop(plan.cfg.train.grace)
            host.unregister_child(trainer)
        facts = replace(plan.save_dir_facts(), witness=resume.Witness.from_doc(witness))
        decided = resume.outage_rollback(facts)  # round/resume.py decides; retention.py deletes
        self._outage = False
        if decided is None:
            return False
        if decided.used:
            host.emit("shopsim.outage_after_use", iterations=list(decided.used), witnessed=decided.witnessed,
                      note="a later stage already used these weights; not retrained")
        elif decided.rolls_back:
            host.emit("checkpoint.rollback", **decided.as_event(),
                      reason="saved after ShopSim was last seen alive: may hold a partial rollout")
            retention.delete_checkpoints(decided.delete, save_dir=plan.layout.save_dir)
            retention.point_tracker(plan.layout.save_dir, decided.tracker,
                                    set_aside_as=f"rolled-back-{int(host.clock.time())}")
        # What is retrained from here must be witnessed again, by the next live ShopSim.
        self._witness(decided.witness)
        return decided.rolls_back

    async def ensure_ready(self, plan: RoundPlan, host: ServiceHost, *, settle: bool = True) -> str | None:
        """None once ready; else a one-line problem (the stage retries). ``settle``: at start-up,
        a ShopSim of ours that is gone died unwatched (or was stopped; then nothing is undone)."""
        async with self._lock:
            return await self._ensure_ready(plan, host, settle=settle)

    async def _ensure_ready(self, plan: RoundPlan, host: ServiceHost, *, settle: bool) -> str | None:
        cfg = plan.cfg.shopsim
        if self.child is None:
            self.child = host.find_child(ChildRole.SHOPSIM)
            if self.child is not None:
                host.emit("shopsim.adopted", pid=self.child.pid)
            elif settle and not self.external:
                self.mark_outage()
                await self.settle_outage(plan, host)
        if self.child is None and await self.health(plan, host) is not None:
            self.external = True
            host.emit("shopsim.adopted", pid=None, url=cfg.url, note="already healthy; not started twice")
            return None
        if self.child is None:
            if not cfg.manage or not cfg.command:
                return f"shopsim at {cfg.url} is not ready and shopsim.command is not set; start it or configure it"
            addr, port = host_port(cfg.url, 5700)
            if not await wait_port_free(addr, port, timeout=min(30.0, cfg.start_timeout)):
                return f"{addr}:{port} is held by something that is not a ready ShopSim; free the port"
            try:
                launch = launcher(plan)
            except OSError as exc:
                return f"cannot copy ShopSim's start.sh into {plan.layout.logs / LAUNCHER_DIR}: {exc}"
            if launch.copied_from is not None:
                host.emit("shopsim.launcher", copy=str(launch.copied_from), log=str(launch.log))
            self.child = await host.spawn(plan, ChildRole.SHOPSIM, launch.template, cfg, state="SHOPSIM",
                                          extra_env=launch.env)
        deadline = host.clock.monotonic() + cfg.start_timeout
        while host.clock.monotonic() < deadline:
            if await self.health(plan, host) is not None:
                host.emit("shopsim.ready", pid=self.child.pid, free_slots=self.free_slots)
                if not _read_witness(self.witness):  # a first start: what is on disk predates it
                    self._witness(ckpt.read_tracker(plan.layout.save_dir).iteration)
                return None
            if not self.child.alive():
                host.unregister_child(self.child)
                self.child = None
                return f"shopsim exited during start-up; see {plan.log_path('SHOPSIM')}"
            await anyio.sleep(0.1)
        await self.stop(plan, host)
        return f"shopsim not ready within {cfg.start_timeout:.0f}s (shopsim.start_timeout)"

    async def stop(self, plan: RoundPlan, host: ServiceHost) -> None:
        if self.child is not None:
            await self.child.stop(plan.cfg.shopsim.grace)
            host.unregister_child(self.child)
            self.child = None
        self.healthy, self._ready_seen = None, None

    async def restart(self, plan: RoundPlan, host: ServiceHost, why: str) -> str | None:
        async with self._lock:
            self.restarts += 1
            host.emit("shopsim.restart", reason=why, restarts=self.restarts)
            if self.external:
                return f"shopsim at {plan.cfg.shopsim.url} is not ours to restart ({why}); restart it by hand"
            await self.stop(plan, host)
            await anyio.sleep(Backoff(plan.cfg.shopsim.backoff, SHOPSIM_BACKOFF_CAP_S, max_doublings=5).delay(self.restarts))
            return await self._ensure_ready(plan, host, settle=False)

    async def recover_leaks(self, plan: RoundPlan, host: ServiceHost, *, reason: str) -> str | None:
        """Slots still leased while no client of ours runs are leaks: ``release_all`` (twice if a
        ghost waiter took a slot at the first), then a restart of a ShopSim of ours. None once
        every slot is free (or a client of ours runs, whose leases are legitimate); else a
        one-line problem (the stage retries). An adopted ShopSim that stays short raises
        :class:`StageFailed`: it is not ours to restart, and retrying cannot fix it."""
        if any(host.find_child(r) is not None for r in CLIENT_ROLES):
            return None
        # A fresh count, never the cached "ready" answer: one read while a client still ran (the
        # val tool, a moment ago) counts its leases, and a needless release_all followed.
        if self._lock.locked() or await self.health(plan, host) is None:
            problem = await self.wait_ready(plan, host, before=reason)
            if problem:
                return problem
        cfg = plan.cfg.shopsim
        free, slots = self.free_slots, self.environment_slots
        if free is None or slots is None or free >= slots:
            return None
        host.emit("shopsim.lease_leak", free_slots=free, slots=slots, reason=reason)
        for attempt in (1, 2):  # the second frees what ghost waiters took at the first
            sent = await self.release_all(plan, host)
            health = await self.health(plan, host)
            host.emit("shopsim.release_all", attempt=attempt, answered=sent, free_slots=self.free_slots,
                      slots=self.environment_slots)
            if health is not None and self.free_slots is not None and self.environment_slots is not None \
                    and self.free_slots >= self.environment_slots:
                host.emit("shopsim.leaks_recovered", how="release_all", attempts=attempt)
                return None
        short = f"{(self.environment_slots or slots) - (self.free_slots or 0)} of {self.environment_slots or slots}"
        if self.external:
            raise StageFailed(
                f"shopsim at {cfg.url} (adopted: shoprld did not start it) still has {short} slots leased "
                f"{reason} after two release_all, while no client of this campaign runs; another client "
                f"holds them or queued resets wait there: stop those clients or restart ShopSim by hand, "
                f"then run shoprld again")
        return await self.restart(plan, host, f"{short} slots still leased after two release_all {reason}")

    async def supervise(self, host_factory: Callable[[], PlannedHost], interval: float = SUPERVISE_INTERVAL,
                        health_interval: float = HEALTH_INTERVAL) -> None:
        """Restart ShopSim with backoff whenever the child we started dies; refresh the health
        (``free_slots``, ``environment_slots``) every ``health_interval`` seconds for ``status``."""
        last_health = -float("inf")
        while True:
            await self._tick(interval)
            if self.closing:
                return
            if self._lock.locked():  # a stage is (re)starting it: its stop is not a death
                async with self._lock:
                    pass
                continue
            child = self.child
            host = host_factory()
            plan = host.plan
            self.vouch(plan.layout.save_dir)
            now = host.clock.monotonic()
            if not self._lock.locked() and now - last_health >= health_interval:
                last_health = now
                await self.health(plan, host)
                child = self.child
            if child is not None and not child.alive():
                host.emit("shopsim.died", pid=child.pid, returncode=child.returncode)
                self.mark_outage()
                host.unregister_child(child)
                self.child = None
                # A trainer that lost ShopSim mid-rollout either aborts (8 unscored groups) or
                # trains a step on a partial rollout: stop it now; TRAIN settles the outage
                # (retrains what was saved since ShopSim was last seen alive) and relaunches it.
                trainer = host.find_child(ChildRole.TRAINER)
                if trainer is not None:
                    host.emit("shopsim.died_during_train", trainer_pid=trainer.pid)
                    await trainer.stop(plan.cfg.train.grace)
                problem = await self.restart(plan, host, "died")
                if problem:
                    host.emit("shopsim.restart_failed", problem=problem)

    async def _tick(self, interval: float) -> None:
        """Wait ``interval``, or less: until the ShopSim child we supervise exits. Its death is
        acted on at once (the trainer stopped, the witness frozen), not at the next look: until
        then the trainer's rollouts fail against it and may still be saved (issue 17)."""
        child = self.child
        with anyio.move_on_after(interval):
            if WAKE_AT_EXIT and child is not None and child.alive():
                await child.wait()
                return
            await anyio.sleep(interval)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def start_script(cfg_command: Sequence[str], argv: Sequence[str], cwd: Path) -> tuple[int, Path] | None:
    """(template index, path) of the ``start.sh`` a ShopSim command runs, a relative one taken
    against ``cwd`` (``shopsim.cwd``: the child's cwd), never shoprld's own. ``argv`` is the
    command expanded element by element (same length as ``cfg_command``). A bare ``start.sh``
    as the program is a PATH lookup, not a file here; a shell line (``bash -c "... start.sh"``)
    is not a path either, and runs as configured."""
    for i, arg in enumerate(argv):
        if Path(arg).name == LAUNCHER and (i > 0 or "/" in arg) and not any(ch in arg for ch in _SHELL):
            path = Path(arg)
            return i, path if path.is_absolute() else cwd / path
    return None


_SHELL = frozenset(" \t\n;&|$`<>()")


def _expanded(plan: RoundPlan) -> list[str]:
    values = plan.resolve().values
    return [arg.format_map(dict(values)) for arg in plan.cfg.shopsim.command]


def service_cwd(plan: RoundPlan) -> Path:
    """The directory the ShopSim child is started in (as every child: its ``cwd`` or the project root)."""
    return plan.cfg.shopsim.cwd or plan.layout.project_root


@dataclass(frozen=True)
class Launch:
    """How ShopSim is started: the argv template, the extra environment, where its log grows."""

    template: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None  # where the service writes shop_agent.log (read it there)
    copied_from: Path | None = None  # the user's start.sh that was copied (None: run as configured)


def launcher(plan: RoundPlan) -> Launch:
    """Run a ``start.sh`` command from a copy of the script in ``$EXP_DIR/logs/shopsim/``.

    The real script sets ``SHOP_ENV_ROOT`` to its own directory, ``cd``s there and runs ``python
    -m shop_env.pack_api``, which opens ``shop_agent.log`` relative to that cwd. A copy elsewhere
    keeps the user's own edits (conda activation, defaults) while the log lands in the copy's
    directory. The copy is pointed back at the checkout with what the script honours:
    ``SHOP_SEARCH_INDEX`` and ``SHOP_ENV_CONFIG`` (unless the recipe sets them), ``PYTHONPATH``
    (so ``-m shop_env.pack_api`` imports from the checkout; pack_api finds the rest from its
    ``__file__``), and ``PYTHONDONTWRITEBYTECODE`` so no ``__pycache__`` is written into the
    checkout. Copied at every start, so an edit of the user's script is picked up. A command
    without a ``start.sh`` runs as configured (its log is wherever that program writes it)."""
    cfg = plan.cfg.shopsim
    cwd = service_cwd(plan)
    found = start_script(cfg.command, _expanded(plan), cwd)
    if found is None:
        return Launch(tuple(cfg.command), log=cwd / SERVICE_LOG)
    index, script = found
    checkout = script.resolve().parent
    dest_dir = plan.layout.logs / LAUNCHER_DIR
    dest_dir.mkdir(parents=True, exist_ok=True)
    copy = dest_dir / LAUNCHER
    tmp = dest_dir / f".{LAUNCHER}.tmp"
    shutil.copy2(script, tmp)  # mode too: the copy runs as the original does
    tmp.replace(copy)
    template = list(cfg.command)
    template[index] = str(copy).replace("{", "{{").replace("}", "}}")  # a literal through format_map
    child_env = plan.resolve().env(cfg)
    env: dict[str, str] = {}
    for key, default in (("SHOP_SEARCH_INDEX", checkout / "search_engine" / "products.sqlite3"),
                         ("SHOP_ENV_CONFIG", checkout / "configs" / "environment.json")):
        if key not in child_env:
            env[key] = str(default)
    before = child_env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(checkout) + (os.pathsep + before if before else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return Launch(tuple(template), env, dest_dir / SERVICE_LOG, script)


def request_log(plan: RoundPlan) -> Path:
    """Where the service appends a line per request (``shop_agent.log`` in its cwd): the rollout
    phase's request signal (issue 30). Where :func:`launcher` runs it, without copying anything."""
    cfg = plan.cfg.shopsim
    cwd = service_cwd(plan)
    try:
        found = start_script(cfg.command, _expanded(plan), cwd)
    except (KeyError, ValueError, IndexError):
        found = None
    return plan.layout.logs / LAUNCHER_DIR / SERVICE_LOG if found is not None else cwd / SERVICE_LOG


def _read_witness(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "iteration" in doc else None
