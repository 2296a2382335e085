"""Campaign config: one TOML file -> frozen, validated pydantic models.

Every error is ONE line: ``<file>: <key>: <problem> (got <value>); fix: <fix>``. The CLI
prints it and exits 3. Relative paths in the file are relative to the file's directory,
so a recipe can be moved together with the tree it describes.

Command templates are argv lists. ``{name}`` placeholders are expanded per round by
:func:`expand` without a shell, one argv element at a time, so a value with spaces stays
one argument. The set of known placeholders is :data:`PLACEHOLDERS` plus the campaign's
own ``[vars]``; an unknown one is a config error, not a run-time surprise at 3 a.m.
"""

from __future__ import annotations

import math
import os
import re
import string
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from shoprld.daemon.foundation.errors import ConfigError
from shoprld.daemon.foundation.paths import special_file

# Placeholders the engine fills in for every stage command (see states/base.py).
PLACEHOLDERS: dict[str, str] = {
    "python": "the interpreter running shoprld",
    "recipe_dir": "the directory holding this campaign file",
    "demo_dir": "the demo stand-ins' directory (run/demo)",
    "repo": "the repo checkout",
    "project_root": "the ShopSimRL project root (its runs/ points into the experiment dir)",
    "runs": "<project_root>/runs",
    "exp_dir": "the experiment dir on the volume",
    "campaign_root": "the campaign root on the volume",
    "cache_root": "the shared cache root",
    "logs_dir": "<exp_dir>/logs",
    "save_dir": "the Megatron save dir (TRAIN_SAVE)",
    "hf_dir": "the one HF export dir the val server reads (SAVE_HF)",
    "hf_tmp_dir": "a fresh temp dir for the converter route",
    "origin_hf_dir": "export.origin_hf_dir (config and tokenizer for the converter)",
    "load": "--load for this round: the save dir once it has a tracker, else train.base_load",
    "base_load": "the converted base model (round 0's --load)",
    "num_rollout": "slime's --num-rollout for this round (absolute end)",
    "end_iteration": "the iteration this round's final save has",
    "save_interval": "slime's --save-interval: train.save_interval, or the launch's adaptive choice ([saves] mode)",
    "round": "the 0-based round index",
    "round_id": "round-%03d",
    "next_round_id": "the next round's id",
    "loop_dir": "<runs>/loop/<round_id>",
    "skillbank": "this round's SkillBank file",
    "curriculum": "this round's curriculum file",
    "history_ledger": "the previous round's proposal ledger ('' for round 0)",
    "selected_skillbank": "the gate's selected_skillbank.json for this round",
    "next_skillbank": "the next round's SkillBank: the gate's selection, or the current one kept",
    "next_curriculum": "<runs>/<next_round_id>/curriculum.json",
    "stop_file": "the analyst sidecar's stop file",
    "shopsim_url": "shopsim.url",
    "shopsim_port": "the port of shopsim.url",
    "slots": "shopsim.slots",
    "episode_concurrency": "shopsim.episode_concurrency",
    "val_url": "val.url",
    "val_host": "the host of val.url",
    "val_port": "the port of val.url",
    "val_concurrency": "val.concurrency",
    "val_tasks": "val.tasks",
    "tp_size": "gpus.tp_size",
    "num_gpus": "the number of visible GPUs",
    "cuda_visible_devices": "the visible GPU ids, comma-separated",
    "wandb_project": "wandb.project",
    "wandb_group": "wandb.group",
    "wandb_mode": "wandb.mode",
    "wandb_dir": "<exp_dir>/wandb",
    "seed": "campaign.seed",
    "checkpoint_dir": "<save_dir>/iter_<end_iteration>",
    "weight_version": "the weight version the val server must report (iter_<end_iteration>)",
    "sequence_parallel": "--sequence-parallel when gpus.tp_size > 1, else left out (as upstream)",
    "wandb_team_flag": "--wandb-team when the .env sets WANDB_ENTITY, else left out (as upstream)",
    "wandb_entity": "the .env's WANDB_ENTITY, else left out",
}
# An argv element that is exactly one of these placeholders is left out when its value is
# empty: upstream's optional flags (run_shopsimrl_slime.sh adds them only when they apply).
OPTIONAL_ARGS = frozenset({"{sequence_parallel}", "{wandb_team_flag}", "{wandb_entity}"})

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024, "ki": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2, "mi": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "gi": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4, "ti": 1024**4,
}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|d|h|m|s)")


# Upper bounds on what a campaign can sensibly ask for (README, "Configuration"). Beyond them a
# value is a typo, not a plan, and would overflow somewhere at 3 a.m. (timedelta, fallocate).
MAX_SIZE = 1024**5  # 1 PiB
MAX_DURATION = 366 * 86400.0  # a year
MAX_ROUNDS = 10_000
MAX_STEPS_PER_ROUND = 1_000_000
MAX_COUNT = 1_000_000  # slots, concurrencies, tasks, retries, save_interval's siblings


def _bounded_size(value: int) -> int:
    if value > MAX_SIZE:
        raise ValueError("a size above 1PiB is not plausible; fix: give the size with its unit, e.g. 53GiB")
    return value


def parse_size(value: Any) -> int:
    """``"53GiB"``, ``"500MB"``, ``1048576`` -> bytes (at most :data:`MAX_SIZE`)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 53GiB or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return _bounded_size(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2) is not None and m.group(2).lower() in _SIZE_UNITS:
            number = float(m.group(1))  # 400 digits parse as inf: refused below, never int(inf)
            if math.isfinite(number):
                return _bounded_size(int(number * _SIZE_UNITS[m.group(2).lower()]))
            return _bounded_size(MAX_SIZE + 1)
    raise ValueError("expected a size such as 53GiB, 500MB or a number of bytes")


def parse_duration(value: Any) -> float:
    """``"1h30m"``, ``"45s"``, ``90`` -> seconds (finite, at most :data:`MAX_DURATION`)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30m, 2h or a number of seconds")
    seconds: float | None = None
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        parts = _DURATION_RE.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            scale = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
            seconds = sum(float(n) * scale[u] for n, u in parts)
    if seconds is None:
        raise ValueError("expected a duration such as 30m, 2h or a number of seconds")
    if math.isnan(seconds):
        raise ValueError("a duration must be a number; fix: use e.g. 30m, 2h or a number of seconds")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > MAX_DURATION:
        raise ValueError("a duration above a year is not plausible; fix: use e.g. 30m, 2h or 10d")
    return seconds


Size = Annotated[int, BeforeValidator(parse_size)]
Duration = Annotated[float, BeforeValidator(parse_duration)]
# TOML has real integers, floats and booleans, so the fields take exactly those: in lax mode
# pydantic made `rounds = true` one round and `rounds = 1e9` a billion (issue 15). A float field
# takes an integer (TOML `3` for 3.0), never a bool, NaN or inf.
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Command = tuple[str, ...]


class _Model(BaseModel):
    # Not strict model-wide: paths come as strings and lists become tuples; the scalar types
    # above are strict one by one.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class CampaignSection(_Model):
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


class StorageSection(_Model):
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


class DiskSection(_Model):
    require_mount: Bool = True
    forbid_same_fs: Bool = True
    # 0 would spin the sampler (and asyncio.sleep(nan) never wakes): a real period, > 0.
    interval: Duration = Field(default=5.0, gt=0)
    soft_limit: Size | None = None
    hard_limit: Size | None = None
    hysteresis: Size = 64 * 1024**2
    checkpoint_estimate: Size = 53 * 1024**3
    hf_estimate: Size = 9 * 1024**3
    margin: Size = 2 * 1024**3
    min_inodes: Int = Field(default=10_000, ge=0, le=2**62)
    keep_finals: Int = Field(default=1, ge=1)
    ballast: Size = 256 * 1024**2
    wait_for_space: Bool = False
    settle: Duration = 30.0

    @model_validator(mode="after")
    def _soft_above_hard(self) -> DiskSection:
        if self.soft_limit is not None and self.hard_limit is not None:
            if self.soft_limit <= self.hard_limit:
                raise ValueError(
                    f"soft_limit ({self.soft_limit}) must be above hard_limit ({self.hard_limit})"
                    "; fix: raise disk.soft_limit or lower disk.hard_limit"
                )
        return self


def normalize_sm(value: str | int | float | None) -> str | None:
    """A compute capability, normalized (``gpus.build_sm``; envinfo compares the GPUs' with it):
    ``80``, ``"sm_80"``, ``"SM80"``, ``"8.0"``, ``8.0`` -> ``"SM80"``; None for blank or junk."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip().lower().replace("sm_", "").replace("sm", "").replace("compute_", "")
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    if m:
        return f"SM{int(m.group(1))}{int(m.group(2))}"
    m = re.fullmatch(r"(\d{2,3})([a-z]?)", text)
    if m:
        return f"SM{m.group(1)}{m.group(2)}"
    return None


class GpuSection(_Model):
    visible: tuple[Annotated[int, Strict(), Field(ge=0, le=1023)], ...] = (0, 1, 2, 3)
    tp_size: Int = Field(default=1, ge=1, le=1024)
    # The arch the stage envs (TE, apex) were built for ("80": the memo's A800); check warns on others.
    build_sm: Annotated[str, BeforeValidator(lambda v: v if isinstance(v, str) else str(v))] = ""
    # GPU hygiene before a GPU stage (trainer, val server; daemon/services/gpus.py): how long to wait for
    # the visible GPUs to hold no process left by an earlier stage, the TERM -> KILL grace for
    # the stragglers that are ours, and how to look (auto: NVML, else nvidia-smi, else nothing).
    free_timeout: Duration = 120.0
    straggler_grace: Duration = 10.0
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


class ProcessSpec(_Model):
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


def _http_url(v: str) -> str:
    """An http(s) URL with a host and a valid port (urlsplit raises on ``http://[::1``)."""
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc}); fix: e.g. http://127.0.0.1:5700") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host; fix: e.g. http://127.0.0.1:5700")
    return v


Url = Annotated[str, AfterValidator(_http_url)]


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
    # slime-style progress lines; anchored so the launch header (--num-rollout N) never matches.
    progress_pattern: str = r"(?m)^rollout (\d+)\b"
    # Ray Jobs launcher.
    ray_address: Url = "http://127.0.0.1:8265"
    ray_start_head: Bool = False
    ray_head_command: Command = ()
    runtime_env: dict[str, str] = {}

    @field_validator("progress_pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        try:
            if re.compile(v).groups < 1:
                raise ValueError("needs one group capturing the rollout id")
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc})") from None
        return v


class SavesSection(_Model):
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


class WandbSection(_Model):
    enabled: Bool = True
    mode: Literal["online", "offline", "disabled"] = "online"
    project: str = "shopsimrl"
    group: str = ""
    # .env keys every child (and the Ray job's runtime_env) gets when the .env sets them, as
    # upstream passes WANDB_* "when set"; never required. WANDB_ENTITY also becomes
    # `--wandb-team` through {wandb_team_flag} {wandb_entity}.
    pass_env: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], ...] = ("WANDB_ENTITY", "WANDB_BASE_URL")


class SecretsSection(_Model):
    required: tuple[str, ...] = ()


class PreflightSection(_Model):
    # Paths (templates allowed) the real stack needs before any GPU work.
    must_exist: dict[str, str] = {}
    # When the torch_dist copy is missing, the command that creates it (for the message).
    convert_hint: str = ""


NOTIFY_EVENTS = ("done", "failed", "parked", "stopped", "stalled", "gate_stop", "round_done", "recovered", "digest")
_ENV_KEY = r"^[A-Za-z_][A-Za-z0-9_]*$"


class NotifyEndpoint(_Model):
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


class NotifySection(_Model):
    endpoints: tuple[NotifyEndpoint, ...] = ()
    # A daily summary at this local time ("08:00"); "" for none.
    digest_at: str = Field(default="", pattern=r"^$|^([01][0-9]|2[0-3]):[0-5][0-9]$")
    # The same event (kind, round, state, cause) is sent once per window, across restarts.
    dedupe_window: Duration = 3600.0
    timeout: Duration = 10.0
    retries: Int = Field(default=3, ge=0, le=1000)
    backoff: Duration = 2.0
    queue: Int = Field(default=100, ge=1, le=MAX_COUNT)


class MetricsSection(_Model):
    # A node_exporter textfile (e.g. /var/lib/node_exporter/textfile/shoprld.prom); None: off.
    textfile: Path | None = None


class Config(_Model):
    """A whole campaign, frozen. ``source`` is the file it came from."""

    campaign: CampaignSection
    storage: StorageSection = StorageSection()
    disk: DiskSection = DiskSection()
    gpus: GpuSection = GpuSection()
    shopsim: ShopsimSection = ShopsimSection()
    train: TrainSection
    saves: SavesSection = SavesSection()
    sidecar: SidecarSection = SidecarSection(enabled=False)
    export: ExportSection = ExportSection()
    val: ValSection = ValSection()
    gate: GateSection = GateSection()
    inject: InjectSection = InjectSection()
    wandb: WandbSection = WandbSection()
    secrets: SecretsSection = SecretsSection()
    preflight: PreflightSection = PreflightSection()
    notify: NotifySection = NotifySection()
    metrics: MetricsSection = MetricsSection()
    vars: dict[str, str] = {}
    source: Path = Path("campaign.toml")

    @model_validator(mode="after")
    def _templates(self) -> Config:
        self._check_vars()
        known = set(PLACEHOLDERS) | set(self.vars)
        for key, template in self.templates():
            if key.startswith("vars."):
                continue  # checked in order by _check_vars
            for name in placeholders_in(template, key):
                if name not in known:
                    raise ValueError(
                        f"@{key}: unknown placeholder {{{name}}}; fix: use one of "
                        f"{', '.join(sorted(known)[:8])}, ... (see `shoprld check --placeholders`) or define it in [vars]"
                    )
        if not self.train.command:
            raise ValueError("@train.command: empty; fix: give slime's argv as a list of strings")
        if self.train.end_offset < -self.campaign.steps_per_round:
            raise ValueError(
                f"@train.end_offset: makes round 0 end before iteration 0 (steps_per_round="
                f"{self.campaign.steps_per_round}) (got {self.train.end_offset}); fix: use 0 (the seed) or -1"
            )
        return self

    def _check_vars(self) -> None:
        """``[vars]`` are expanded in order over the built-in values: each may use the built-in
        placeholders and the vars above it. A var named like a built-in would replace it in every
        command (``save_dir = "/etc"`` gave the trainer ``--save /etc`` while the daemon watched
        the real dir), so that is refused, as are self and forward references."""
        seen: set[str] = set(PLACEHOLDERS)
        for name, template in self.vars.items():
            key = f"vars.{name}"
            if name in PLACEHOLDERS:
                raise ValueError(
                    f"@{key}: shadows the built-in placeholder {{{name}}} ({PLACEHOLDERS[name]}) (got {template!r})"
                    f"; fix: rename it (e.g. my_{name}); built-ins are set by the daemon"
                )
            if not _VAR_NAME.match(name):
                raise ValueError(f"@{key}: not a usable placeholder name; fix: use letters, digits and '_' "
                                 "(starting with a letter or '_')")
            for ref in placeholders_in(template, key):
                if ref == name:
                    raise ValueError(f"@{key}: refers to itself ({{{ref}}}) (got {template!r}); "
                                     f"fix: write the value out")
                if ref not in seen:
                    where = "is defined after it" if ref in self.vars else "is not a placeholder"
                    raise ValueError(f"@{key}: {{{ref}}} {where} (got {template!r}); fix: define vars.{ref} "
                                     f"above vars.{name} ([vars] expand in order), or use a built-in placeholder")
            seen.add(name)

    def templates(self) -> list[tuple[str, str]]:
        """Every template string in the config, with its dotted key."""
        out: list[tuple[str, str]] = []
        sections: dict[str, BaseModel] = {
            "shopsim": self.shopsim, "train": self.train, "sidecar": self.sidecar,
            "export": self.export, "val": self.val, "gate": self.gate, "inject": self.inject,
        }
        for sname, sec in sections.items():
            for field in ("command", "server_command", "analyze_command", "ray_head_command",
                          "emit_command", "check_command"):
                for i, arg in enumerate(getattr(sec, field, ()) or ()):
                    out.append((f"{sname}.{field}[{i}]", arg))
            for field in ("env", "server_env", "runtime_env"):
                for k, v in (getattr(sec, field, None) or {}).items():
                    out.append((f"{sname}.{field}.{k}", v))
        for k, v in self.preflight.must_exist.items():
            out.append((f"preflight.must_exist.{k}", v))
        for k, v in self.vars.items():
            out.append((f"vars.{k}", v))
        return out

    @property
    def num_gpus(self) -> int:
        return len(self.gpus.visible)

    def required_secrets(self) -> dict[str, str]:
        """Secret name -> the feature that needs it (for the error message)."""
        need: dict[str, str] = {k: "secrets.required" for k in self.secrets.required}
        if self.wandb.enabled and self.wandb.mode != "disabled":
            need.setdefault("WANDB_API_KEY", f"wandb.mode={self.wandb.mode}")
        for sec_name, names in (
            ("train", self.train.secrets), ("sidecar", self.sidecar.secrets if self.sidecar.enabled else ()),
            ("val", self.val.secrets), ("gate", self.gate.secrets + self.gate.analyze_secrets),
            ("inject", self.inject.secrets), ("shopsim", self.shopsim.secrets),
        ):
            for k in names:
                need.setdefault(k, f"{sec_name}.secrets")
        for i, ep in enumerate(self.notify.endpoints):
            need.setdefault(ep.url_env, f"notify.endpoints[{i}].url_env")
            if ep.token_env:
                need.setdefault(ep.token_env, f"notify.endpoints[{i}].token_env")
        return need


_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def placeholders_in(template: str, key: str = "") -> list[str]:
    """Names of ``{placeholders}`` in one template string (``{{`` escapes a brace).

    Only plain ``{name}`` is allowed: every value is a string, so a format spec
    (``{round:03d}``) fails at run time, a nested one (``{save_dir:{x}}``) reads another
    value, and an index or attribute (``{save_dir[0]}``, ``{repo.upper}``) silently yields
    something no one meant.
    """
    names: list[str] = []
    try:
        for _, name, spec, conversion in string.Formatter().parse(template):
            if name is None:
                continue
            if spec or conversion or not _VAR_NAME.match(name):
                shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                raise ValueError(
                    f"@{key}: {shown} is not a plain placeholder (got {template!r}); fix: write "
                    f"{{name}} without a format spec, conversion, index or attribute, or double a literal "
                    "brace ({{ and }})"
                )
            names.append(name)
    except ValueError as exc:
        if str(exc).startswith("@"):
            raise
        raise ValueError(f"@{key}: malformed template {template!r} ({exc}); fix: balance the braces or double them") from None
    return names


def expand_vars(cfg_vars: dict[str, str], values: dict[str, str]) -> None:
    """Add ``[vars]`` to ``values`` in order: each var sees the built-ins and the vars above it."""
    for name, template in cfg_vars.items():
        values[name] = template.format_map(values)


def expand(template: tuple[str, ...] | list[str], values: dict[str, str]) -> list[str]:
    """Expand an argv template, one element at a time (never through a shell). An element that
    is exactly an optional placeholder (:data:`OPTIONAL_ARGS`) is left out when it is empty."""
    out = []
    for arg in template:
        value = arg.format_map(values)
        if value or arg not in OPTIONAL_ARGS:
            out.append(value)
    return out


def deadline_seconds_or_time(value: str) -> datetime | float:
    """An ISO time (with a zone, or UTC) -> datetime; a duration -> seconds."""
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    except ValueError:
        pass
    try:
        return parse_duration(value)
    except ValueError:
        raise ValueError(
            "expected an ISO time (2026-12-01T08:00:00Z) or a duration (10h)"
        ) from None


def resolve_deadline(value: str, first_start: float) -> float | None:
    """The absolute deadline (epoch seconds) for ``campaign.deadline``."""
    if not value:
        return None
    parsed = deadline_seconds_or_time(value)
    if isinstance(parsed, datetime):
        return parsed.timestamp()
    return first_start + timedelta(seconds=parsed).total_seconds()


_FIXES = {
    "extra_forbidden": "remove it or check its spelling",
    "missing": "add it",
    "int_parsing": "use a whole number",
    "int_type": "use a whole number",
    "float_parsing": "use a number",
    "bool_parsing": "use true or false",
    "bool_type": "use true or false",
    "string_type": "use a quoted string",
    "tuple_type": "use a list",
    "list_type": "use a list",
    "dict_type": "use a table",
    "model_type": "use a table",
    "greater_than_equal": "use a larger value",
    "greater_than": "use a larger value",
    "less_than_equal": "use a smaller value",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "use letters, digits, '.', '_' and '-' only",
    "path_type": "use a path string",
    "string_too_long": "use a shorter value",
    "float_type": "use a number (not a boolean or a string)",
    "finite_number": "use a finite number (not nan or inf)",
}


def _format_error(file: Path, exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err["loc"]).replace(".[", "[")
    msg = str(err.get("msg", "invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    # Model-level validators name their own key with a leading "@key: ".
    if msg.startswith("@"):
        key, _, msg = msg[1:].partition(": ")
        loc = key
    fix = ""
    if "; fix: " in msg:
        msg, _, fix = msg.partition("; fix: ")
    fix = fix or _FIXES.get(err["type"], "see `shoprld init` for a commented template")
    got = ""
    if err["type"] not in ("missing",) and "input" in err and not isinstance(err["input"], dict):
        got = f" (got {err['input']!r})"
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{file}: {loc or '<top>'}: {msg}{got}; fix: {fix}"


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a campaign file. Raises :class:`ConfigError` (one line)."""
    file = Path(path).expanduser()
    kind = special_file(file)
    if kind is not None:  # never open it: a FIFO blocks, a device never ends
        raise ConfigError(f"{file}: is {kind}, not a campaign file; fix: pass the campaign's .toml file")
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such campaign file; fix: pass -c FILE, or write one with `shoprld init`") from None
    except IsADirectoryError:
        raise ConfigError(f"{file}: is a directory; fix: pass the campaign's .toml file") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read ({exc.strerror}); fix: check the path and its permissions") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{file}: not UTF-8 text; fix: save the campaign file as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML ({exc}); fix: correct the syntax at that line") from None
    return config_from_dict(data, file)


def config_from_dict(data: dict[str, Any], file: Path) -> Config:
    """Validate an already parsed mapping; paths are made absolute against the file's dir."""
    nul = _find_nul(data)
    if nul is not None:
        raise ConfigError(f"{file}: {nul}: contains a NUL byte (\\u0000); fix: remove it (no path, argument or "
                          "environment value can hold one)")
    base = file.resolve().parent
    data = _absolutize(data, base)
    data["source"] = str(file.resolve())
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(file, exc)) from None


def _find_nul(data: Any, key: str = "") -> str | None:
    """The dotted key of the first string (key or value) holding a NUL byte, else None."""
    if isinstance(data, str):
        return key if "\x00" in data else None
    if isinstance(data, dict):
        for k, v in data.items():
            sub = f"{key}.{k}" if key else str(k)
            if "\x00" in str(k):
                return sub.replace("\x00", "\\x00")
            found = _find_nul(v, sub)
            if found is not None:
                return found
    if isinstance(data, list):
        for i, v in enumerate(data):
            found = _find_nul(v, f"{key}[{i}]")
            if found is not None:
                return found
    return None


# The keys that hold paths, by section: relative ones are resolved against the campaign file's dir
# (_absolutize), and import-campaign re-points them to the new machine's roots.
PATH_KEYS = {
    "storage": ("repo", "ephemeral_root", "state_dir", "project_root"),
    "train": ("base_load", "cwd", "conda_prefix"),
    "export": ("hf_dir", "origin_hf_dir", "cwd", "conda_prefix"),
    "inject": ("cold_start_skillbank", "cold_start_curriculum", "cwd", "conda_prefix"),
    "shopsim": ("cwd", "conda_prefix"),
    "sidecar": ("cwd", "conda_prefix"),
    "val": ("cwd", "conda_prefix"),
    "gate": ("cwd", "conda_prefix"),
    "metrics": ("textfile",),
}


def _absolutize(data: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(data)
    for section, keys in PATH_KEYS.items():
        sec = out.get(section)
        if not isinstance(sec, dict):
            continue
        sec = dict(sec)
        for key in keys:
            val = sec.get(key)
            if isinstance(val, str) and val and "{" not in val:
                p = Path(os.path.expandvars(val)).expanduser()
                sec[key] = str(p if p.is_absolute() else (base / p))
        out[section] = sec
    return out
