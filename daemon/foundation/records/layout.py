"""The storage etiquette (SPEC §4): where everything lives, derived from the config.

    BREV_ROOT     = <ephemeral_root>/nemo-rl/${USER:-ubuntu}
    CACHE_ROOT    = $BREV_ROOT/cache               (shared across experiments)
    CAMPAIGN_ROOT = $BREV_ROOT/nemo-rl-auto-research/<campaign>
    EXP_DIR       = $CAMPAIGN_ROOT/<experiment>    {logs,checkpoints,artifacts,ray,tmp,wandb,runs}

The repo checkout gets only the ledger and small records. The ShopSimRL tools hard-code
``<project_root>/runs``; :meth:`Layout.ensure` makes that a symlink to ``$EXP_DIR/runs``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.paths import default_state_dir

# Longest TMPDIR handed to children as is; longer ones go through a short /tmp link.
SHORT_PATH_MAX = 48


def short_link(path: Path, kind: str) -> Path:
    """The short /tmp link's name for ``path`` (``shoprld-<kind>-<hash of the path>``)."""
    return Path("/tmp") / f"shoprld-{kind}-{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"


def _short(path: Path, kind: str) -> Path:
    return path if len(str(path)) <= SHORT_PATH_MAX else short_link(path, kind)


EXP_SUBDIRS = ("logs", "checkpoints", "artifacts", "ray", "tmp", "wandb", "runs")
CACHE_SUBDIRS = ("huggingface", "torch", "triton", "uv", "pip", "xdg", "wandb", "torch/inductor", "flashinfer", "cuda")

# Every cache a child may fill, and where shoprld sends it (under the cache root, on the data
# disk): the tools' defaults are under $HOME or /tmp, which on an AutoDL box is the ~30 GB
# system disk. FlashInfer's JIT cache lives in $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer,
# TorchInductor's in /tmp/torchinductor_<user>, CUDA's PTX JIT cache in ~/.nv/ComputeCache.
CACHE_KEYS: dict[str, str] = {
    "HF_HOME": "huggingface",
    "HF_HUB_CACHE": "huggingface/hub",
    "HF_DATASETS_CACHE": "huggingface/datasets",
    "TRANSFORMERS_CACHE": "huggingface/transformers",
    "TORCH_HOME": "torch",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "torch/inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "CUDA_CACHE_PATH": "cuda",
    "UV_CACHE_DIR": "uv",
    "PIP_CACHE_DIR": "pip",
    "XDG_CACHE_HOME": "xdg",
    "WANDB_CACHE_DIR": "wandb",
}
# The tools' own default dirs (under $HOME), reused when they already exist on the data disk:
# key -> (the dir whose existence says "a cache is there", the value that points at it).
USER_CACHE_DEFAULTS: dict[str, tuple[str, str]] = {
    "HF_HOME": (".cache/huggingface", ".cache/huggingface"),
    "TORCH_HOME": (".cache/torch", ".cache/torch"),
    "TRITON_CACHE_DIR": (".triton/cache", ".triton/cache"),
    "FLASHINFER_WORKSPACE_BASE": (".cache/flashinfer", "."),
    "CUDA_CACHE_PATH": (".nv/ComputeCache", ".nv/ComputeCache"),
    "UV_CACHE_DIR": (".cache/uv", ".cache/uv"),
    "PIP_CACHE_DIR": (".cache/pip", ".cache/pip"),
    "WANDB_CACHE_DIR": (".cache/wandb", ".cache/wandb"),
}
# Hugging Face's sub-caches follow a reused HF_HOME (TRANSFORMERS_CACHE wins over the hub
# cache in transformers, so it must point at the same hub dir to find the models there).
_HF_FOLLOWERS = {"HF_HUB_CACHE": "hub", "HF_DATASETS_CACHE": "datasets", "TRANSFORMERS_CACHE": "hub"}


@dataclass(frozen=True)
class CachePlace:
    """Where one cache variable points for the children, and why."""

    key: str
    path: Path
    source: str  # "shoprld" | "your $KEY" | "your existing ~/..." | "follows HF_HOME"


def _same_fs(path: Path, root: Path) -> bool:
    try:
        return path.stat().st_dev == root.stat().st_dev
    except OSError:
        return False


def _user(cfg: Config, environ: dict[str, str] | os._Environ[str]) -> str:
    return cfg.storage.user or environ.get("USER") or "ubuntu"


@dataclass(frozen=True)
class Layout:
    """Every path shoprld reads or writes for one campaign."""

    repo: Path
    project_root: Path
    ephemeral_root: Path
    brev_root: Path
    cache_root: Path
    campaign_root: Path
    exp_dir: Path
    state_dir: Path
    env_file: Path
    ledger: Path

    @classmethod
    def from_config(cls, cfg: Config, environ: dict[str, str] | os._Environ[str] = os.environ) -> Layout:
        brev = cfg.storage.ephemeral_root / "nemo-rl" / _user(cfg, environ)
        campaign_root = brev / "nemo-rl-auto-research" / cfg.campaign.name
        exp = campaign_root / cfg.campaign.experiment
        cache = exp / "cache" if cfg.storage.blank_cache else brev / "cache"
        repo = cfg.storage.repo
        env_file = cfg.storage.env_file if cfg.storage.env_file.is_absolute() else repo / cfg.storage.env_file
        ledger = Path(cfg.storage.ledger.format(campaign=cfg.campaign.name))
        return cls(
            repo=repo,
            project_root=cfg.storage.project_root or repo,
            ephemeral_root=cfg.storage.ephemeral_root,
            brev_root=brev,
            cache_root=cache,
            campaign_root=campaign_root,
            exp_dir=exp,
            state_dir=cfg.storage.state_dir or default_state_dir(cfg.campaign.name, environ,
                                                                 instance=Path(cfg.source).name.removesuffix(".toml")),
            env_file=env_file,
            ledger=ledger if ledger.is_absolute() else repo / ledger,
        )

    # -- the experiment tree -------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.exp_dir / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.exp_dir / "checkpoints"

    @property
    def artifacts(self) -> Path:
        return self.exp_dir / "artifacts"

    @property
    def tmp(self) -> Path:
        return self.exp_dir / "tmp"

    @property
    def ray_tmp(self) -> Path:
        return self.exp_dir / "ray"

    @property
    def child_tmp(self) -> Path:
        """TMPDIR for children: the experiment's tmp, through a short /tmp link when its path is
        long. Megatron's save and Ray create unix sockets under it, and an AF_UNIX path is at most
        107 bytes (seen on the GPU smoke run). The data still lands on the volume."""
        return _short(self.tmp, "tmp")

    @property
    def child_ray_tmp(self) -> Path:
        return _short(self.ray_tmp, "ray")

    def remove_short_links(self) -> list[Path]:
        """Remove this experiment's short /tmp links (tmp and ray; services/ray.py names its
        RAY_TMPDIR link the same way): each only when it is a symlink to exactly our dir, so a
        link of another campaign (or anything else) is never touched. For the campaign's end and
        ``clean``: a child still running under one would lose its sockets' path."""
        removed: list[Path] = []
        for link, target in ((short_link(self.tmp, "tmp"), self.tmp), (short_link(self.ray_tmp, "ray"), self.ray_tmp)):
            try:
                if link.is_symlink() and Path(os.readlink(link)) == target:
                    link.unlink()
                    removed.append(link)
            except OSError:
                continue
        return removed

    @property
    def wandb_dir(self) -> Path:
        return self.exp_dir / "wandb"

    @property
    def runs(self) -> Path:
        """Where the tools' ``runs/`` really lives (on the volume)."""
        return self.exp_dir / "runs"

    @property
    def save_dir(self) -> Path:
        """TRAIN_SAVE: the Megatron checkpoints and the tracker."""
        return self.checkpoints / "megatron"

    @property
    def shopsim_witness(self) -> Path:
        """The newest checkpoint our live ShopSim vouched for (services/shopsim.py writes it)."""
        return self.state_dir / "shopsim.witness"

    @property
    def stall_learned(self) -> Path:
        """Each trainer phase's longest still gaps in this campaign (daemon/round/stall.py)."""
        return self.state_dir / "stall.learned"

    @property
    def ballast(self) -> Path:
        return self.campaign_root / ".shoprld-ballast"

    def hf_dir(self, cfg: Config) -> Path:
        return cfg.export.hf_dir or self.checkpoints / "hf"

    def stage_log(self, round_index: int, state: str) -> Path:
        return self.logs / f"r{round_index:03d}-{state.lower()}.log"

    def heavy_paths(self, cfg: Config) -> dict[str, Path]:
        """Every heavy output path, which must really live on the volume."""
        paths = {
            "save dir": self.save_dir, "HF export": self.hf_dir(cfg), "logs": self.logs,
            "ray tmp": self.ray_tmp, "tmp": self.tmp, "wandb": self.wandb_dir, "runs": self.runs,
            "cache root": self.cache_root,
        }
        if cfg.storage.manage_runs_link:
            paths["<project_root>/runs"] = self.project_root / "runs"
        return paths

    def cache_places(self, cfg: Config, base: Mapping[str, str] | None = None,
                     home: Path | None = None) -> list[CachePlace]:
        """Where each cache of :data:`CACHE_KEYS` goes for the children: a value the user set in
        ``base`` (the daemon's environment) is kept; else the tool's default dir under ``home``
        when it already exists on the data disk (``storage.ephemeral_root``'s filesystem); else
        shoprld's dir under the cache root. ``storage.blank_cache`` asks for a fresh cache, so
        then nothing of the user's is reused."""
        base = {} if base is None else base
        reuse = not cfg.storage.blank_cache
        if home is None:
            home = Path(base["HOME"]) if base.get("HOME") else None
        places: dict[str, CachePlace] = {}
        for key, sub in CACHE_KEYS.items():
            place = CachePlace(key, self.cache_root / sub, "shoprld")
            if reuse and base.get(key):
                place = CachePlace(key, Path(base[key]), f"your ${key}")
            elif reuse and key in _HF_FOLLOWERS and places["HF_HOME"].source != "shoprld":
                place = CachePlace(key, places["HF_HOME"].path / _HF_FOLLOWERS[key], "follows HF_HOME")
            elif reuse and home is not None and key in USER_CACHE_DEFAULTS:
                marker, value = USER_CACHE_DEFAULTS[key]
                if (home / marker).is_dir() and _same_fs(home / marker, self.ephemeral_root):
                    place = CachePlace(key, (home / value) if value != "." else home, f"your existing ~/{marker}")
            places[key] = place
        return list(places.values())

    def cache_env(self, cfg: Config | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The cache variables every child gets (see :meth:`cache_places`; without ``cfg``:
        shoprld's own dirs)."""
        if cfg is None:
            return {key: str(self.cache_root / sub) for key, sub in CACHE_KEYS.items()}
        return {p.key: str(p.path) for p in self.cache_places(cfg, base)}

    def child_env(self, cfg: Config, base: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
        """The environment every child gets (secrets are added per stage, elsewhere)."""
        env = {k: v for k, v in base.items() if not k.startswith("NOTIFY_SOCKET") and k != "WATCHDOG_USEC"}
        env.update(self.cache_env(cfg, base))
        env.update({
            "RAY_TMPDIR": str(self.child_ray_tmp),
            # All three: Python's tempfile honours TMPDIR, TEMP and TMP (in that order), and the
            # seed's setup_sys_cache.sh exports all three; a long one left over from the daemon's
            # own environment must not reach a child (AF_UNIX paths, see child_tmp).
            "TMPDIR": str(self.child_tmp),
            "TEMP": str(self.child_tmp),
            "TMP": str(self.child_tmp),
            "WANDB_DIR": str(self.wandb_dir),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in cfg.gpus.visible),
            "SHOPSIMRL_PROJECT_ROOT": str(self.project_root),
            "PYTHONUNBUFFERED": "1",
        })
        if cfg.wandb.enabled:
            env["WANDB_MODE"] = cfg.wandb.mode
            env["WANDB_PROJECT"] = cfg.wandb.project
            if cfg.wandb.group:
                env["WANDB_RUN_GROUP"] = cfg.wandb.group
        return env

    def ensure(self, cfg: Config) -> None:
        """Create the campaign, experiment and cache trees, and the managed runs/ link."""
        for sub in EXP_SUBDIRS:
            (self.exp_dir / sub).mkdir(parents=True, exist_ok=True)
        owner = self.runs / RUNS_OWNER
        if not owner.exists():  # validation refused a foreign runs/ before this point: it is ours
            owner.write_text(f"{cfg.campaign.name}/{cfg.campaign.experiment}\n")
        for sub in CACHE_SUBDIRS:
            (self.cache_root / sub).mkdir(parents=True, exist_ok=True)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for link, target in ((self.child_tmp, self.tmp), (self.child_ray_tmp, self.ray_tmp)):
            if link != target and not (link.is_symlink() and Path(os.readlink(link)) == target):
                link.unlink(missing_ok=True)
                link.symlink_to(target, target_is_directory=True)
        if cfg.storage.manage_runs_link:
            self.ensure_runs_link()

    def ensure_runs_link(self) -> None:
        """Make ``<project_root>/runs`` a symlink to ``$EXP_DIR/runs``; never delete a real dir."""
        link = self.project_root / "runs"
        target = self.runs
        if link.is_symlink():
            if Path(os.readlink(link)) == target:
                return
            link.unlink()
        elif link.exists():
            raise ConfigError(runs_dir_message(link))
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)


def runs_aside(link: Path, when: float | None = None) -> Path:
    """Where a real ``<project_root>/runs`` goes out of the way: ``runs.pre-shoprld-<date>`` beside
    it. Never into the experiment: a previous campaign's checkpoints nested in ``$EXP_DIR`` are
    out of retention's sight, and its round dirs would be read as this campaign's."""
    return link.with_name(f"{link.name}.pre-shoprld-{time.strftime('%Y%m%d', time.localtime(when))}")


# Written into $EXP_DIR/runs when shoprld makes (or first uses) it: a runs/ without it that already
# holds files was put there by hand (a previous campaign's), not written by this campaign.
RUNS_OWNER = ".shoprld-campaign"

RUNS_DIR_PROBLEM = "is a real directory in the checkout, so the tools' output would land in the repo"


def runs_dir_fix(link: Path) -> str:
    """The fix for a real ``runs/`` directory where shoprld's link must go."""
    return f"move it aside (mv {link} {runs_aside(link)}) and rerun, or set storage.manage_runs_link = false"


def runs_dir_message(link: Path) -> str:
    """The one line for a real ``runs/`` directory where shoprld's link must go."""
    return f"{link}: {RUNS_DIR_PROBLEM}; fix: {runs_dir_fix(link)}"
