"""Campaign config sections: the frozen pydantic models of campaign.toml's tables.

One model per table (``[campaign]``, ``[storage]``, ``[disk]``, ...), each with its defaults,
bounds and the checks that need only that table; checks across tables live on
:class:`~shoprld.daemon.foundation.config.config.Config`. A validator raises ``ValueError`` with the
one-line problem and ``; fix: ...``. Pure: no disk.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, field_validator, model_validator

from shoprld.daemon.foundation.storage.diskbudget import floor_unit
from shoprld.daemon.foundation.config.configvalues import (
    MAX_COUNT,
    MAX_ROUNDS,
    MAX_STEPS_PER_ROUND,
    Bool,
    Command,
    Duration,
    Float,
    Int,
    Size,
    Url,
    deadline_seconds_or_time,
    normalize_sm,
)


class FrozenModel(BaseModel):
    # Not strict model-wide: paths come as strings and lists become tuples; the scalar types
    # (configvalues.py) are strict one by one.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class CampaignSection(FrozenModel):
    # Path components (and the unit's instance name): bounded well below NAME_MAX (255).
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100)
    experiment: str = Field(default="main", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100)
    rounds: Int = Field(ge=1, le=MAX_ROUNDS)
    steps_per_round: Int = Field(ge=1, le=MAX_STEPS_PER_ROUND)
    seed: Int = 0
    # An absolute time (ISO 8601) or a duration from the first start; "" means none.
    deadline: str = ""

    @field_validator("deadline")
    @classmethod
    def _deadline(cls, v: str) -> str:
        if v:
            deadline_seconds_or_time(v)
        return v


class StorageSection(FrozenModel):
    repo: Path = Path(".")
    ephemeral_root: Path = Path("/ephemeral")
    # ${USER:-ubuntu}: USER is often unset under systemd.
    user: str = ""
    state_dir: Path | None = None
    env_file: Path = Path(".env")
    project_root: Path | None = None
    ledger: str = "reports/shoprld/{campaign}.tsv"
    blank_cache: Bool = False
    # The tools hard-code <project_root>/runs; the daemon makes it a symlink into the
    # experiment dir so generated output never lands in the checkout.
    manage_runs_link: Bool = True
    repo_hygiene_max: Size = 50 * 1024**2

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        # One path component of BREV_ROOT: "../x" or "a/b" would move the whole tree.
        if v and (v in (".", "..") or not re.match(r"^[A-Za-z0-9._-]{1,64}$", v)):
            raise ValueError("not a user name (one path component); fix: use the login name, e.g. ubuntu, or leave it empty")
        return v

    @field_validator("ledger")
    @classmethod
    def _ledger(cls, v: str) -> str:
        try:
            path = v.format(campaign="x")
        except (KeyError, IndexError, ValueError, AttributeError):
            raise ValueError("only the placeholder {campaign} is allowed here; fix: e.g. reports/shoprld/{campaign}.tsv") from None
        if not path.strip() or path.endswith("/"):
            raise ValueError("not a file path; fix: e.g. reports/shoprld/{campaign}.tsv")
        return v


class DiskSection(FrozenModel):
    require_mount: Bool = True
    forbid_same_fs: Bool = True
    # 0 would spin the sampler (and asyncio.sleep(nan) never wakes): a real period, > 0.
    interval: Duration = Field(default=5.0, gt=0)
    # Unset sizes derive from checkpoint_estimate (diskbudget.floor_unit, 1/64 of it), so a
    # campaign scaled down 1024x behaves the same: floors 1 and 2 units, margin 2 units,
    # hysteresis and ballast a quarter unit (for 53 GiB: 0.83/1.66 GiB floors, 1.66 GiB margin,
    # 212 MiB hysteresis and ballast).
    soft_limit: Size | None = None
    hard_limit: Size | None = None
    hysteresis: Size | None = None
    checkpoint_estimate: Size = 53 * 1024**3
    hf_estimate: Size = 9 * 1024**3
    margin: Size | None = None
    min_inodes: Int = Field(default=10_000, ge=0, le=2**62)
    keep_finals: Int = Field(default=1, ge=1)
    # Crash bundles with all their files, per cause (older ones keep only bundle.json).
    keep_bundles: Int = Field(default=3, ge=1)
    ballast: Size | None = None
    wait_for_space: Bool = False
    settle: Duration = 30.0

    @property
    def margin_bytes(self) -> int:
        """``margin``, else two floor units of the checkpoint estimate."""
        return self.margin if self.margin is not None else 2 * floor_unit(self.checkpoint_estimate)

    @property
    def hysteresis_bytes(self) -> int:
        """``hysteresis``, else a quarter floor unit."""
        return self.hysteresis if self.hysteresis is not None else max(1, floor_unit(self.checkpoint_estimate) // 4)

    @property
    def ballast_bytes(self) -> int:
        """``ballast`` (0: none), else a quarter floor unit."""
        return self.ballast if self.ballast is not None else max(1, floor_unit(self.checkpoint_estimate) // 4)

    @model_validator(mode="after")
    def _soft_above_hard(self) -> DiskSection:
        if self.soft_limit is not None and self.hard_limit is not None:
            if self.soft_limit <= self.hard_limit:
                raise ValueError(
                    f"soft_limit ({self.soft_limit}) must be above hard_limit ({self.hard_limit})"
                    "; fix: raise disk.soft_limit or lower disk.hard_limit"
                )
        return self



class GpuSection(FrozenModel):
    visible: tuple[Annotated[int, Strict(), Field(ge=0, le=1023)], ...] = (0, 1, 2, 3)
    tp_size: Int = Field(default=1, ge=1, le=1024)
    # The arch the stage envs (TE, apex) were built for ("80": the memo's A800); check warns on others.
    build_sm: Annotated[str, BeforeValidator(lambda v: v if isinstance(v, str) else str(v))] = ""
    # GPU hygiene before a GPU stage (trainer, val server; daemon/services/gpus.py): how long to wait for
    # the visible GPUs to hold no process left by an earlier stage, the TERM -> KILL grace for
    # the stragglers that are ours, and how to look (auto: NVML, else nvidia-smi, else nothing).
    free_timeout: Duration = 120.0
    straggler_grace: Duration = 10.0
    # Container mode (NVML lists host pids): the GPU memory that processes not ours may hold on
    # the visible GPUs without blocking a stage.
    free_memory: Size = 0
    # The GPU device files' prefix (<prefix>N, <prefix>-uvm): how container mode finds our
    # holders. Tests point it at nodes made in a temp dir.
    devices: str = "/dev/nvidia"
    probe: Literal["auto", "nvml", "nvidia-smi", "none"] = "auto"
    nvidia_smi: str = "nvidia-smi"

    @field_validator("build_sm")
    @classmethod
    def _build_sm(cls, v: str) -> str:
        if v and normalize_sm(v) is None:
            raise ValueError("expected a compute capability such as 80, sm_80 or 8.0")
        return v

    @model_validator(mode="after")
    def _tp_divides(self) -> GpuSection:
        if not self.visible:
            raise ValueError("gpus.visible is empty; fix: list at least one GPU id")
        if len(set(self.visible)) != len(self.visible):
            raise ValueError(f"gpus.visible has duplicates {list(self.visible)}; fix: list each id once")
        if len(self.visible) % self.tp_size:
            raise ValueError(
                f"NUM_GPUS={len(self.visible)} is not divisible by tp_size={self.tp_size}"
                "; fix: change gpus.tp_size or gpus.visible"
            )
        return self


class ProcessSpec(FrozenModel):
    """What every launched program shares: argv template, env, conda env, timeouts, retries."""

    command: Command = ()
    env: dict[str, str] = {}
    # Secrets (names from .env) this child gets in its environment, never in argv.
    secrets: tuple[str, ...] = ()
    # Run through conda's own activation (activate.d hooks run), e.g. the slime env.
    conda_prefix: Path | None = None
    cwd: Path | None = None
    timeout: Duration = 0.0  # 0: no timeout
    retries: Int = Field(default=2, ge=0, le=1000)
    backoff: Duration = 1.0
    grace: Duration = 10.0



class ShopsimSection(ProcessSpec):
    url: Url = "http://127.0.0.1:5700"
    health_path: str = "/healthz"
    slots: Int = Field(default=48, ge=1, le=MAX_COUNT)
    episode_concurrency: Int = Field(default=32, ge=1, le=MAX_COUNT)
    start_timeout: Duration = Field(default=300.0, gt=0)
    manage: Bool = True

    @model_validator(mode="after")
    def _slots(self) -> ShopsimSection:
        if self.slots < self.episode_concurrency:
            raise ValueError(
                f"slots={self.slots} is below episode_concurrency={self.episode_concurrency}"
                "; fix: raise shopsim.slots (the seed uses 48 for 32)"
            )
        return self


class TrainSection(ProcessSpec):
    launcher: Literal["local", "ray"] = "local"
    # emit_training_loop_round.py: writes <runs>/loop/<round>/{slime,analysis,val,gate}.yaml.
    emit_command: Command = ()
    # `run_shopsimrl.py training check CFG --task-data F`: exit 0 and an indented JSON payload
    # (the last top-level object of its output) with "status": "ready".
    check_command: Command = ()
    save_interval: Int = Field(default=10_000, ge=1, le=10**9)
    # Round r ends at iteration (r+1)*steps_per_round + end_offset (seed: 0; slime's plain
    # 0-based numbering: -1). --num-rollout is that end + 1.
    end_offset: Int = Field(default=0, ge=-MAX_STEPS_PER_ROUND, le=MAX_STEPS_PER_ROUND)
    base_load: Path | None = None
    watch: Literal["auto", "inotify", "poll"] = "auto"
    poll_interval: Duration = Field(default=1.0, gt=0)
    rescan_interval: Duration = Field(default=30.0, gt=0)
    stall_factor: Float = Field(default=3.0, gt=0, le=1000)
    stall_min: Duration = 1800.0
    stall_policy: Literal["restart", "alert"] = "restart"
    # The stall verdict (issue 30; daemon/round/stall.py): "phases" watches each phase's own
    # signals and learns its bound from this campaign's steps; "steps" is the older rule, no
    # progress line for max(stall_factor x median step, stall_min).
    stall_verdict: Literal["phases", "steps"] = "phases"
    # x the p95 of a phase's longest still gap: at 3, a phase 3x slower than usual never fires.
    stall_phase_factor: Float = Field(default=3.0, gt=1, le=1000)
    stall_quiet_min: Duration = 300.0   # no learned bound is shorter
    stall_min_samples: Int = Field(default=3, ge=1, le=1000)  # finished phases before a bound is learned
    # How often TRAIN reads the trainer's new log lines and the stall signals. A phase's still
    # gaps are measured at this grain: a bench that scales time down 1000x sets it lower.
    follow_interval: Duration = Field(default=0.25, gt=0)
    # A trainer line that is a sign of life (slime's logger: "[time] file.py:N - msg"), and the
    # lines that are not even when they match (SGLang's access lines: slime#1487 printed them for
    # hours while training hung).
    stall_line_pattern: str = r"\] \S+\.py:\d+ - "
    stall_noise_pattern: str = r'"(GET|POST) /(metrics|health|health_generate|get_model_info)\b'
    # SGLang's Prometheus /metrics (the router's or one engine's, started with
    # --enable-metrics): generated tokens move the rollout phase through a long generation.
    engine_metrics_url: Url | None = None
    # slime-style progress lines; anchored so the launch header (--num-rollout N) never matches.
    progress_pattern: str = r"(?m)^rollout (\d+)\b"
    # Ray Jobs launcher.
    ray_address: Url = "http://127.0.0.1:8265"
    ray_start_head: Bool = False
    ray_head_command: Command = ()
    # A head shoprld started is stopped when TRAIN's job is done (upstream stops Ray around
    # every round: its memory, session logs and orphans do not live 25 hours); true keeps it.
    ray_keep_head: Bool = False
    # A cluster of several nodes (one shoprld did not start: ray_start_head = false): the job's
    # driver goes to a node with these custom resources, e.g. {trainer_node = 1}.
    ray_entrypoint_resources: dict[str, float] = {}
    runtime_env: dict[str, str] = {}

    @field_validator("stall_line_pattern", "stall_noise_pattern")
    @classmethod
    def _any_regex(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
        return v

    @field_validator("progress_pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            if re.compile(v).groups < 1:
                raise ValueError("needs one group capturing the rollout id")
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
        return v


class SavesSection(FrozenModel):
    """How often the trainer saves (issue 17; daemon/round/saves.py owns the choice).

    ``fixed`` passes ``train.save_interval`` as it is (the seed's 10000: one save per round, at
    its last rollout). ``adaptive`` picks the interval before every trainer launch from the
    Young/Daly optimum ``sqrt(2 * save_cost * MTBF)``, in steps, when the disk has room for one
    more checkpoint; otherwise it falls back to one save per round and says so. The guesses
    stand in until the campaign has measured its own: a save's cost (slime's ``Timer save_model``
    line), a step's time (TRAIN's median), and failures (trainer crashes and stalls).
    """

    mode: Literal["fixed", "adaptive"] = "fixed"
    # A 53 GB torch_dist save plus the 9 GB --save-hf export: minutes on a data disk.
    cost_guess: Duration = Field(default=180.0, gt=0)
    # A slime step on the seed's 4xA800: 750-920 s on average (shared/SHOPSIMRL.md).
    step_guess: Duration = Field(default=850.0, gt=0)
    # The MTBF prior as pseudo-observations: the seed's night had two faults in 25 h. The
    # campaign's own trainer failures and training hours are added to them.
    prior_faults: Float = Field(default=2.0, gt=0, le=MAX_COUNT)
    prior_window: Duration = Field(default=25 * 3600.0, gt=0)
    # Megatron's async save ({async_save} {async_save_worker} in train.command): a mid-round save
    # blocks training only for its planning and device-to-host copy, and its tracker lands when
    # the next save starts (one interval of lag in what a crash loses; daemon/round/saves.py).
    async_save: Bool = True


class SidecarSection(ProcessSpec):
    enabled: Bool = True
    # The real watch-analyze has no forced exit: on stop it waits for every in-flight analysis,
    # each a live ShopSim audit of up to 20 LLM turns with a 300 s timeout per turn
    # (shopsimrl-tools.md 3.1), two at a time. 20 x 300 s = 6000 s, plus margin.
    drain_timeout: Duration = 7200.0


class ExportSection(ProcessSpec):
    mode: Literal["save_hf", "convert"] = "save_hf"
    hf_dir: Path | None = None
    origin_hf_dir: Path | None = None


class ValSection(ProcessSpec):
    server_command: Command = ()
    server_env: dict[str, str] = {}
    url: Url = "http://127.0.0.1:30000"
    health_path: str = "/health"
    ready_timeout: Duration = Field(default=600.0, gt=0)
    concurrency: Int = Field(default=32, ge=1, le=MAX_COUNT)
    tasks: Int = Field(default=400, ge=1, le=MAX_COUNT)
    # The real loop never checks coverage (the gate drops unpaired episodes); a few episodes
    # that exhaust their 3 attempts must not rerun the whole split. Below this: rerun fresh.
    min_coverage: Float = Field(default=0.95, gt=0, le=1)
    reuse_server: Bool = False
    server_grace: Duration = 30.0


class GateSection(ProcessSpec):
    analyze_command: Command = ()
    analyze_secrets: tuple[str, ...] = ()
    overlap_analyze: Bool = True
    policy: Literal["continue", "retry", "stop"] = "continue"
    # A "silent empty" analysis (success-shaped, 0 candidates, every card an ANALYST_ERROR: no
    # analyst key, or a wrong ShopSim URL in the analyst's config): continue (the seed's loop
    # does; the round still trains, the gate then only re-weighs the current skills), retry
    # the analysis (up to gate.retries), or stop (exit 5). Always journaled, shown and ledgered.
    empty_analysis: Literal["continue", "retry", "stop"] = "continue"


class InjectSection(ProcessSpec):
    on_incomplete: Literal["keep"] = "keep"
    # Build the next curriculum after the campaign's last round too. Upstream does not (nor does
    # shoprld by default); `shoprld rehearse` does, so that its one round checks build-curriculum.
    after_last_round: Bool = False
    cold_start_skillbank: Path | None = None
    cold_start_curriculum: Path | None = None


class WandbSection(FrozenModel):
    enabled: Bool = True
    mode: Literal["online", "offline", "disabled"] = "online"
    project: str = "shopsimrl"
    group: str = ""
    # .env keys every child (and the Ray job's runtime_env) gets when the .env sets them, as
    # upstream passes WANDB_* "when set"; never required. WANDB_ENTITY also becomes
    # `--wandb-team` through {wandb_team_flag} {wandb_entity}.
    pass_env: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], ...] = ("WANDB_ENTITY", "WANDB_BASE_URL")


class SecretsSection(FrozenModel):
    required: tuple[str, ...] = ()


class PreflightSection(FrozenModel):
    # Paths (templates allowed) the real stack needs before any GPU work.
    must_exist: dict[str, str] = {}
    # When the torch_dist copy is missing, the command that creates it (for the message).
    convert_hint: str = ""


NOTIFY_EVENTS = ("done", "failed", "parked", "stopped", "stalled", "gate_stop", "round_done", "recovered", "digest",
                 "crashed")
_ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]*$"


class NotifyEndpoint(FrozenModel):
    """One receiver of operator notifications (daemon/core/alerts.py). The URL and the token are
    names of .env keys: their values never appear in a file of ours or in any argv."""

    kind: Literal["webhook", "slack", "ntfy"]
    url_env: str = Field(pattern=_ENV_KEY)
    # ntfy: an access token sent as "Authorization: Bearer ..." (optional).
    token_env: str = Field(default="", pattern=r"^$|^[A-Za-z_][A-Za-z0-9_]*$")
    events: tuple[str, ...] = NOTIFY_EVENTS

    @field_validator("events")
    @classmethod
    def _events(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [e for e in v if e not in NOTIFY_EVENTS]
        if bad:
            raise ValueError(f"unknown event {bad[0]!r}; fix: use some of {', '.join(NOTIFY_EVENTS)}")
        return v


class NotifySection(FrozenModel):
    endpoints: tuple[NotifyEndpoint, ...] = ()
    # A daily summary at this local time ("08:00"); "" for none.
    digest_at: str = Field(default="", pattern=r"^$|^([01][0-9]|2[0-3]):[0-5][0-9]$")
    # The same event (kind, round, state, cause) is sent once per window, across restarts.
    dedupe_window: Duration = 3600.0
    timeout: Duration = 10.0
    retries: Int = Field(default=3, ge=0, le=1000)
    backoff: Duration = 2.0
    queue: Int = Field(default=100, ge=1, le=MAX_COUNT)


class MetricsSection(FrozenModel):
    # A node_exporter textfile (e.g. /var/lib/node_exporter/textfile/shoprld.prom); None: off.
    textfile: Path | None = None
