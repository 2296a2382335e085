"""The shape every state module has, and the context the engine hands it.

Each module in ``states/`` defines exactly::

    STATE: State                         # which state it implements
    ADOPTS: tuple[ChildRole, ...]        # child roles it may adopt after a daemon crash
    def completed(ctx) -> bool           # is this round's output on disk, matching its inputs?
    async def run(ctx) -> Outcome        # do the work through ctx's services; never touch the engine

States never import each other. They talk to the world only through :class:`RoundContext`
(the process launcher, the HTTP client, the checkpoint reader, the clock, the services)
and report back with an :class:`Outcome`; the engine decides what happens next.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configsections import ProcessSpec
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.records.paths import round_id as round_id  # re-exported: stages and commands name it here
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.services.processes import Child, Clock, Launcher, SystemClock
from shoprld.daemon.round.plan import RoundPlan, RoundValues, read_json
from shoprld.daemon.foundation.config.secrets import Secrets

if TYPE_CHECKING:
    import httpx

    from shoprld.daemon.services.shopsim import ShopsimService
    from shoprld.daemon.services.valserver import ValServerService

# Re-exported for the stages and the engine, which name them through this module.
__all__ = ["Clock", "Outcome", "OutcomeKind", "RoundContext", "ServiceWatch", "StageCompleted", "StageRun",
           "SystemClock", "read_json", "round_id"]

OutcomeKind = Literal["done", "retry", "fail", "gate_stop", "disk"]


@dataclass(frozen=True)
class Outcome:
    """What a stage reports. ``done`` advances; ``retry`` re-enters the state (with backoff);
    ``fail`` is final for the campaign (exit 6); ``gate_stop`` exit 5; ``disk`` parks."""

    kind: OutcomeKind
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def done(cls, message: str = "", **data: Any) -> Outcome:
        return cls("done", message, data)

    @classmethod
    def retry(cls, message: str, **data: Any) -> Outcome:
        return cls("retry", message, data)

    @classmethod
    def fail(cls, message: str, **data: Any) -> Outcome:
        return cls("fail", message, data)


@dataclass
class RoundContext:
    """Everything a stage may use for one round: the round's plan plus the services.

    Composed, not subclassed: what the round *is* (ids, paths, template values) lives in
    :class:`~shoprld.daemon.round.plan.RoundPlan`; this adds what the round *does* with it
    (launch, register, emit, the services). Built by the engine, read by stages.
    """

    plan: RoundPlan
    launcher: Launcher
    http: httpx.AsyncClient
    clock: Clock
    shopsim: ShopsimService
    val_server: ValServerService
    emit: Callable[..., None]                   # emit(event_name, **fields): log + engine progress
    register_child: Callable[[Child], None]     # persisted in state.json (pid, pgid, start time)
    unregister_child: Callable[[Child], None]
    # The live child of a role: registered by an earlier stage of this daemon, or adopted
    # from the records a crashed daemon left (pid + start time match), else None.
    find_child: Callable[[str], Child | None]
    attempt: int = 1

    # -- the round's names and files: the plan's ------------------------------------------
    @property
    def cfg(self) -> Config:
        return self.plan.cfg

    @property
    def layout(self) -> Layout:
        return self.plan.layout

    @property
    def secrets(self) -> Secrets:
        return self.plan.secrets

    @property
    def round(self) -> int:
        return self.plan.round

    @property
    def mapping(self) -> ckpt.IterationMapping:
        return self.plan.mapping

    @property
    def round_id(self) -> str:
        return self.plan.round_id

    @property
    def next_round_id(self) -> str:
        return self.plan.next_round_id

    @property
    def end_iteration(self) -> int:
        return self.plan.end_iteration

    @property
    def runs(self) -> Path:
        return self.plan.runs

    @property
    def loop_dir(self) -> Path:
        return self.plan.loop_dir

    @property
    def hf_dir(self) -> Path:
        return self.plan.hf_dir

    @property
    def weight_version(self) -> str:
        return self.plan.weight_version

    def record_path(self, kind: str, rid: str | None = None) -> Path:
        return self.plan.record_path(kind, rid)

    def read_record(self, kind: str, rid: str | None = None) -> dict[str, Any] | None:
        return read_json(self.record_path(kind, rid))

    def log_path(self, state: State | str) -> Path:
        return self.plan.log_path(state.value if isinstance(state, State) else state)

    def for_round(self, index: int) -> RoundContext:
        """This context for another round of the campaign (same services)."""
        return dataclasses.replace(self, plan=self.plan.with_round(index))

    def archive(self, run_dir: Path, why: str) -> Path | None:
        """Move a tool's run dir aside as ``<name>.archived-N`` (kept for the post-mortem, and
        removed by ``shoprld clean``) so that the next attempt starts fresh."""
        if not run_dir.exists():
            return None
        n = 1
        while (dst := run_dir.with_name(f"{run_dir.name}.archived-{n}")).exists():
            n += 1
        run_dir.rename(dst)
        self.emit("run.archived", path=str(dst), reason=why)
        return dst

    def train_end(self) -> float | None:
        """When this round's TRAIN ended (wall clock): the commit of its final checkpoint
        (``common.pt``, else ``metadata.json``'s mtime, as EXPORT_HF judges it), else the EXPORT_HF
        record's mtime (written after it); None when neither is on disk."""
        c = ckpt.scan(self.layout.save_dir).get(self.end_iteration)
        if c is not None:
            try:
                return (Path(c.path) / "common.pt").stat().st_mtime
            except OSError:
                if c.committed_at is not None:
                    return c.committed_at
        try:
            return self.record_path("export").stat().st_mtime
        except OSError:
            return None

    def analysis_summary(self) -> Path | None:
        """This round's ``analysis_summary.json`` when it may be used: written at or after this
        round's TRAIN end. An older one (left by an earlier campaign in a merged ``runs/``, or by
        an earlier training of this round) is renamed aside in its dir (never deleted) and
        journaled, so ``analyze`` runs again. None when there is none to use; one whose TRAIN end
        cannot be found is used (there is nothing to compare it with)."""
        path = self.plan.analysis_dir / "analysis_summary.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        end = self.train_end()
        if end is None or mtime >= end:
            return path
        dst = self.archive(path, "older than this round's TRAIN end")
        self.emit("analysis.stale", path=str(path), archived=str(dst), summary_mtime=mtime, train_end=end,
                  note="analyze runs again")
        return None

    async def await_child(self, role: str, timeout: float | None) -> bool:
        """Let the live child of ``role`` finish (one started by an earlier stage, or left
        running by a crashed daemon and adopted now); False when there is none."""
        child = self.find_child(role)
        if child is None:
            return False
        with anyio.fail_after(timeout or None):
            rc = await child.wait()
        # When it ended, as the daemon saw it: the next spawn's clock starts here, not at the
        # stage's outcome (bench_engine's VAL->GATE hand-off waits for the overlapped analyze).
        self.emit("stage.awaited", role=role, pid=child.pid, returncode=rc)
        self.unregister_child(child)
        return True

    async def build_next_curriculum(self, state: State | str) -> str | None:
        """Run ``inject.command`` for this round: the next round's curriculum. None when it is
        on disk and parses, else the problem."""
        curriculum = self.plan.next_runs_dir / "curriculum.json"
        if self.cfg.inject.command:
            await self.run_tool(ChildRole.CURRICULUM, self.cfg.inject.command, self.cfg.inject, state=state)
        if read_json(curriculum) is None:
            return f"{curriculum}: not written by inject.command"
        return None

    async def ensure_inputs(self, state: State | str) -> str | None:
        """The previous round's INJECT skips the curriculum when it was the campaign's last round,
        as upstream does; when ``campaign.rounds`` was raised since, build it now, as that round
        would have (its own context, so its placeholders). None when the inputs are there."""
        if self.round == 0:
            return None
        prev = self.plan.previous_inject or {}
        if prev.get("curriculum_built") is not False or read_json(Path(str(prev.get("curriculum", "")))) is not None:
            return None
        self.emit("inject.curriculum_late", round_id=self.plan.prev_round_id,
                  reason="the campaign was extended after its last round")
        return await self.for_round(self.round - 1).build_next_curriculum(state)

    def inputs(self) -> dict[str, str]:
        """This round's SkillBank, curriculum and history ledger (from the previous INJECT)."""
        return dict(self.plan.inputs)

    # -- template values: resolved from the plan and the disk, once per use ----------------
    def resolve(self) -> RoundValues:
        """The round's values now (one checkpoint scan, one GATE record read)."""
        return self.plan.resolve()

    def values(self) -> dict[str, str]:
        """Every {placeholder} for this round (placeholders.PLACEHOLDERS documents them)."""
        return dict(self.resolve().values)

    # -- running tools -----------------------------------------------------------
    def argv(self, template: Sequence[str]) -> list[str]:
        return self.resolve().argv(template)

    def env(self, spec: ProcessSpec, extra: Mapping[str, str] | None = None,
            secrets: Sequence[str] | None = None) -> dict[str, str]:
        """The child's environment: base (etiquette) + the spec's env + its secrets only."""
        return self.resolve().env(spec, extra, secrets)

    async def start(self, role: ChildRole, template: Sequence[str], spec: ProcessSpec, *, state: State | str,
                    extra_env: Mapping[str, str] | None = None, secrets: Sequence[str] | None = None) -> Child:
        """Launch a child for this round (own session, log file) and register it. The values
        are resolved once, and the launcher gets them with the round (``round=``)."""
        resolved = self.resolve()
        argv = resolved.argv(template)
        redacted = [self.secrets.redact(a) for a in argv]
        child = await self.launcher.start(
            role, resolved.wrap(argv, spec), env=resolved.env(spec, extra_env, secrets),
            cwd=spec.cwd or self.layout.project_root, log=self.log_path(state),
            redacted_argv=redacted, round=resolved,
        )
        self.register_child(child)
        self.emit("stage.spawn", role=role, pid=child.pid, argv=redacted, started_at=child.record.started_at)
        return child

    async def reattach(self, role: ChildRole, *, state: State | str) -> Child | None:
        """A child of ``role`` for this round that runs without a record of ours (a Ray job that
        outlived its daemon, or that it lost sight of): registered and journaled, or None."""
        child = await self.launcher.live(role, log=self.log_path(state), round=self.resolve())
        if child is not None:
            self.register_child(child)
            self.emit("child.adopted", role=role, pid=child.pid, job_id=child.record.job_id, how="live in Ray")
        return child

    async def spawn(self, plan: RoundPlan, role: ChildRole, template: Sequence[str], spec: ProcessSpec, *,
                    state: str, extra_env: Mapping[str, str] | None = None) -> Child:
        """The services' launch (``ServiceHost.spawn``): :meth:`start` for ``plan``'s round."""
        return await dataclasses.replace(self, plan=plan).start(role, template, spec, state=state,
                                                                extra_env=extra_env)

    def wrap(self, argv: list[str], spec: ProcessSpec) -> list[str]:
        """Run through conda's own activation when the spec names a conda prefix."""
        return RoundValues.wrap(argv, spec)

    async def run_tool(self, role: ChildRole, template: Sequence[str], spec: ProcessSpec, *, state: State | str,
                       timeout: float | None = None, secrets: Sequence[str] | None = None) -> int | None:
        """Run a tool to completion (bounded by the spec's timeout); returns its exit status.

        The exit status is informational: the user's tools exit 0 on failure, so callers
        judge by the artifacts.
        """
        child = await self.start(role, template, spec, state=state, secrets=secrets)
        limit = timeout if timeout is not None else (spec.timeout or None)
        try:
            with anyio.fail_after(limit) if limit else contextlib.nullcontext():
                rc = await child.wait()
        except TimeoutError:
            self.emit("stage.timeout", role=role, pid=child.pid, timeout_s=limit)
            await child.stop(spec.grace)
            rc = None
        finally:
            if child.alive():
                await child.stop(spec.grace)
            self.unregister_child(child)
        self.emit("stage.exit", role=role, pid=child.pid, returncode=rc)
        return rc



@dataclass(frozen=True)
class ServiceWatch:
    """The val server's and ShopSim's processes as a tool starts (VAL's bare val, the gate), to
    ask once it ends whether either died while it ran: the tools exit 0 and still write a
    "complete" result whose episodes failed against a dead service (lost from the summary's
    coverage, dropped from the gate's pairs). An adopted ShopSim's exit is only polled, so its
    own process is asked too, not only the supervisor's restart count."""

    server: Child | None
    shop: Child | None
    restarts: int

    @classmethod
    def now(cls, ctx: RoundContext) -> ServiceWatch:
        return cls(ctx.val_server.child, ctx.shopsim.child, ctx.shopsim.restarts)

    def broken(self, ctx: RoundContext) -> bool:
        """Did the val server or ShopSim die (or get replaced) since :meth:`now`?"""
        server = self.server
        return (ctx.val_server.child is not server or server is None or not server.alive()
                or ctx.shopsim.restarts != self.restarts or (self.shop is not None and not self.shop.alive()))


StageRun = Callable[[RoundContext], Awaitable[Outcome]]
StageCompleted = Callable[[RoundContext], bool]
