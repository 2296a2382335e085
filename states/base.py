"""The shape every state module has, and the context the engine hands it.

Each module in ``states/`` defines exactly::

    STATE: State                         # which state it implements
    ADOPTS: tuple[str, ...]              # child roles it may adopt after a daemon crash
    def completed(ctx) -> bool           # is this round's output on disk, matching its inputs?
    async def run(ctx) -> Outcome        # do the work through ctx's services; never touch the engine

States never import each other. They talk to the world only through :class:`RoundContext`
(the process launcher, the HTTP client, the checkpoint reader, the clock, the services)
and report back with an :class:`Outcome`; the engine decides what happens next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from shoprld.daemon import checkpoints as ckpt
from shoprld.daemon.config import Config, ProcessSpec, expand, expand_vars
from shoprld.daemon.layout import Layout
from shoprld.daemon.machine import State
from shoprld.daemon.paths import round_id as round_id  # re-exported: stages and commands name it here
from shoprld.daemon.processes import Child, Launcher
from shoprld.daemon.secrets import Secrets

if TYPE_CHECKING:
    import httpx

    from shoprld.daemon.services import ShopsimService, ValServerService

OutcomeKind = Literal["done", "retry", "fail", "gate_stop", "disk", "stopped"]


@dataclass(frozen=True)
class Outcome:
    """What a stage reports. ``done`` advances; ``retry`` re-enters the state (with backoff);
    ``fail`` is final for the campaign (exit 6); ``gate_stop`` exit 5; ``disk`` parks;
    ``stopped`` means the stage honoured a stop request after a safe point."""

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


class Clock(Protocol):
    def time(self) -> float: ...
    def monotonic(self) -> float: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class StopFlags(Protocol):
    """What the operator asked for; stages check it at their safe points."""

    @property
    def at_checkpoint(self) -> bool: ...


@dataclass
class RoundContext:
    """Everything a stage may use for one round. Built by the engine, read by stages."""

    cfg: Config
    layout: Layout
    secrets: Secrets
    round: int
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
    stop: StopFlags
    base_env: Mapping[str, str]
    python: str
    demo_dir: Path
    attempt: int = 1

    # -- the round's names and files ---------------------------------------------
    @property
    def mapping(self) -> ckpt.IterationMapping:
        return ckpt.IterationMapping(self.cfg.campaign.steps_per_round, self.cfg.train.end_offset)

    @property
    def round_id(self) -> str:
        return round_id(self.round)

    @property
    def next_round_id(self) -> str:
        return round_id(self.round + 1)

    @property
    def end_iteration(self) -> int:
        return self.mapping.end_iteration(self.round)

    @property
    def runs(self) -> Path:
        return self.layout.project_root / "runs"

    @property
    def loop_dir(self) -> Path:
        return self.runs / "loop" / self.round_id

    @property
    def hf_dir(self) -> Path:
        return self.layout.hf_dir(self.cfg)

    @property
    def weight_version(self) -> str:
        """What the val server must report for this round's weights (never a fixed per-round id)."""
        return f"iter_{self.end_iteration:07d}"

    def record_path(self, kind: str, rid: str | None = None) -> Path:
        """shoprld's own small per-round decision records, under the experiment's artifacts."""
        return self.layout.artifacts / kind / f"{rid or self.round_id}.json"

    def read_record(self, kind: str, rid: str | None = None) -> dict[str, Any] | None:
        return read_json(self.record_path(kind, rid))

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

    async def await_child(self, role: str, timeout: float | None) -> bool:
        """Let the live child of ``role`` finish (one started by an earlier stage, or left
        running by a crashed daemon and adopted now); False when there is none."""
        import anyio

        child = self.find_child(role)
        if child is None:
            return False
        with anyio.fail_after(timeout or None):
            await child.wait()
        self.unregister_child(child)
        return True

    async def build_next_curriculum(self, state: State | str) -> str | None:
        """Run ``inject.command`` for this round: the next round's curriculum. None when it is
        on disk and parses, else the problem."""
        curriculum = Path(self.values()["next_curriculum"])
        if self.cfg.inject.command:
            await self.run_tool("curriculum", self.cfg.inject.command, self.cfg.inject, state=state)
        if read_json(curriculum) is None:
            return f"{curriculum}: not written by inject.command"
        return None

    async def ensure_inputs(self, state: State | str) -> str | None:
        """The previous round's INJECT skips the curriculum when it was the campaign's last round,
        as upstream does; when ``campaign.rounds`` was raised since, build it now, as that round
        would have (its own context, so its placeholders). None when the inputs are there."""
        if self.round == 0:
            return None
        prev = self.read_record("inject", round_id(self.round - 1)) or {}
        if prev.get("curriculum_built") is not False or read_json(Path(str(prev.get("curriculum", "")))) is not None:
            return None
        self.emit("inject.curriculum_late", round_id=round_id(self.round - 1),
                  reason="the campaign was extended after its last round")
        return await dataclasses.replace(self, round=self.round - 1).build_next_curriculum(state)

    def inputs(self) -> dict[str, str]:
        """This round's SkillBank, curriculum and history ledger (from the previous INJECT)."""
        if self.round == 0:
            return {
                "skillbank": str(self.cfg.inject.cold_start_skillbank or ""),
                "curriculum": str(self.cfg.inject.cold_start_curriculum or ""),
                "history_ledger": "",
            }
        prev = self.read_record("inject", round_id(self.round - 1)) or {}
        return {
            "skillbank": str(prev.get("skillbank", "")),
            "curriculum": str(prev.get("curriculum", "")),
            "history_ledger": str(prev.get("history_ledger", "")),
        }

    def values(self) -> dict[str, str]:
        """Every {placeholder} for this round (config.PLACEHOLDERS documents them)."""
        cfg, lay = self.cfg, self.layout
        # --load is the save dir once it holds a committed checkpoint (slime resumes at
        # tracker+1 by itself), else the converted base model (round 0's first launch).
        has_ckpt = ckpt.scan(lay.save_dir).latest_complete is not None
        load = lay.save_dir if has_ckpt or cfg.train.base_load is None else cfg.train.base_load
        shop_host, shop_port = _host_port(cfg.shopsim.url, 5700)
        val_host, val_port = _host_port(cfg.val.url, 30000)
        v = {
            "python": self.python, "recipe_dir": str(cfg.source.parent), "demo_dir": str(self.demo_dir),
            "repo": str(lay.repo), "project_root": str(lay.project_root), "runs": str(self.runs),
            "exp_dir": str(lay.exp_dir), "campaign_root": str(lay.campaign_root), "cache_root": str(lay.cache_root),
            "logs_dir": str(lay.logs), "save_dir": str(lay.save_dir), "hf_dir": str(self.hf_dir),
            "hf_tmp_dir": str(lay.tmp / f"hf-{self.round_id}"),
            "origin_hf_dir": str(cfg.export.origin_hf_dir or ""),
            "load": str(load), "base_load": str(cfg.train.base_load or ""),
            "num_rollout": str(self.mapping.num_rollout(self.round)),
            "end_iteration": str(self.end_iteration), "save_interval": str(cfg.train.save_interval),
            "round": str(self.round), "round_id": self.round_id, "next_round_id": self.next_round_id,
            "loop_dir": str(self.loop_dir),
            "selected_skillbank": str(self.runs / f"{self.round_id}-online-gate" / "selected_skillbank.json"),
            "next_curriculum": str(self.runs / self.next_round_id / "curriculum.json"),
            "stop_file": str(self.runs / "analyst.stop"),
            "shopsim_url": cfg.shopsim.url, "shopsim_port": str(shop_port), "slots": str(cfg.shopsim.slots),
            "episode_concurrency": str(cfg.shopsim.episode_concurrency),
            "val_url": cfg.val.url, "val_host": val_host, "val_port": str(val_port),
            "val_concurrency": str(cfg.val.concurrency), "val_tasks": str(cfg.val.tasks),
            "tp_size": str(cfg.gpus.tp_size), "num_gpus": str(cfg.num_gpus),
            "cuda_visible_devices": ",".join(str(g) for g in cfg.gpus.visible),
            "wandb_project": cfg.wandb.project, "wandb_group": cfg.wandb.group, "wandb_mode": cfg.wandb.mode,
            "wandb_dir": str(lay.wandb_dir), "seed": str(cfg.campaign.seed),
            "checkpoint_dir": str(lay.save_dir / f"iter_{self.end_iteration:07d}"),
            "weight_version": self.weight_version,
            "sequence_parallel": "--sequence-parallel" if cfg.gpus.tp_size > 1 else "",
            **self._wandb_team(),
            **self.inputs(),
        }
        v["next_skillbank"] = self._next_skillbank(v["skillbank"])
        expand_vars(cfg.vars, v)  # in order: a var may use the vars above it
        return v

    def _wandb_team(self) -> dict[str, str]:
        entity = self.secrets.values.get("WANDB_ENTITY", "") if self.cfg.wandb.enabled else ""
        return {"wandb_team_flag": "--wandb-team" if entity else "", "wandb_entity": entity}

    def _next_skillbank(self, current: str) -> str:
        """The gate's selection (copied under the next round's dir) when the gate was
        complete, else the current SkillBank: the seed's inject rule."""
        gate = self.read_record("gate") or {}
        if gate.get("decision") == "complete" and gate.get("selected_skillbank"):
            return str(self.runs / self.next_round_id / "selected_skillbank.json")
        return current

    # -- running tools -----------------------------------------------------------
    def argv(self, template: Sequence[str]) -> list[str]:
        return expand(list(template), self.values())

    def env(self, spec: ProcessSpec, extra: Mapping[str, str] | None = None,
            secrets: Sequence[str] | None = None) -> dict[str, str]:
        """The child's environment: base (etiquette) + the spec's env + its secrets only."""
        values = self.values()
        env = dict(self.base_env)
        env.update({k: v.format_map(values) for k, v in spec.env.items()})
        if extra:
            env.update(extra)
        env.update(self.secrets.for_child(spec.secrets if secrets is None else secrets))
        if self.cfg.wandb.enabled:  # WANDB_ENTITY, WANDB_BASE_URL: only when the .env sets them
            env.update(self.secrets.for_child(self.cfg.wandb.pass_env))
        return env

    def log_path(self, state: State | str) -> Path:
        name = state.value if isinstance(state, State) else state
        return self.layout.stage_log(self.round, name)

    async def start(self, role: str, template: Sequence[str], spec: ProcessSpec, *, state: State | str,
                    extra_env: Mapping[str, str] | None = None, secrets: Sequence[str] | None = None) -> Child:
        """Launch a child for this round (own session, log file) and register it."""
        argv = self.argv(template)
        child = await self.launcher.start(
            role, self.wrap(argv, spec), env=self.env(spec, extra_env, secrets),
            cwd=spec.cwd or self.layout.project_root, log=self.log_path(state),
            redacted_argv=[self.secrets.redact(a) for a in argv],
        )
        self.register_child(child)
        self.emit("stage.spawn", role=role, pid=child.pid, argv=[self.secrets.redact(a) for a in argv])
        return child

    def wrap(self, argv: list[str], spec: ProcessSpec) -> list[str]:
        """Run through conda's own activation when the spec names a conda prefix."""
        if spec.conda_prefix is None:
            return argv
        from shoprld.daemon.condaenv import activation_argv

        return activation_argv(spec.conda_prefix, argv)

    async def run_tool(self, role: str, template: Sequence[str], spec: ProcessSpec, *, state: State | str,
                       timeout: float | None = None, secrets: Sequence[str] | None = None) -> int | None:
        """Run a tool to completion (bounded by the spec's timeout); returns its exit status.

        The exit status is informational: the user's tools exit 0 on failure, so callers
        judge by the artifacts.
        """
        import anyio

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


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from disk, or None when missing, torn or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _host_port(url: str, default: int) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default


StageRun = Callable[[RoundContext], Awaitable[Outcome]]
StageCompleted = Callable[[RoundContext], bool]
