"""One round's room: its ids, its iteration mapping, every path it touches, and its template values.

Theory of operation
-------------------
A :class:`RoundPlan` is built from (config, layout, round index) and is pure: building it
reads nothing, and the only file it ever reads is the previous round's INJECT record (this
round's inputs, read once, when first asked for). Everything else a round needs to *name*
lives here, so that no stage, service, launcher or command rebuilds a round id, a tool dir
or an ``iter_NNNNNNN`` name by hand.

Two facts on disk change while a round runs, and the template values depend on them:

- whether the save dir holds a committed checkpoint (``{load}``: the save dir once it does,
  else ``train.base_load``, round 0's first launch);
- this round's GATE record (``{next_skillbank}``: the gate's selection once it is complete).

They are read together, once, by :meth:`RoundFacts.read`, and :meth:`RoundPlan.resolve` turns
the plan and those facts into :class:`RoundValues`: the values, and the argv and environment
built from them. A launch resolves once and hands the same :class:`RoundValues` to the
launcher (``Launcher.start(..., round=...)``), so the trainer's start scans the checkpoints and
reads the records once, not once per use.

The *planned* mode (``RoundPlan(..., planned=True)``) shows a round as the campaign will run
it from a fresh start, whatever is on disk now: round 0 loads ``train.base_load``, later rounds
the save dir, and a later round's inputs are what a complete gate leaves. ``shoprld check
--print-commands``, ``rehearse`` and the ledger's planned rows read values this way, with no
services and no engine.

The stage context (``states/base.RoundContext``) is this plan plus the services.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import shoprld.recipes.demo

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.round import asyncsave, resume, saves
from shoprld.daemon.foundation.config.condaenv import activation_argv
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configsections import ProcessSpec
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.paths import record_file, round_id
from shoprld.daemon.foundation.config.placeholders import expand, expand_vars
from shoprld.daemon.foundation.config.secrets import Secrets
from shoprld.daemon.foundation.records.store import read_json  # noqa: F401  (re-exported: the stages read records with it)


RECORD_KINDS = ("round", "sidecar", "export", "val", "gate", "inject", "saves")
"""The per-round records, ``<artifacts>/<kind>/<round_id>.json``: :class:`RoundPlan` names each one."""


def read_witness(path: Path) -> resume.Witness | None:
    """The ShopSim witness at ``path``; None when there is none (ShopSim is not our child)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return resume.Witness(None, readable=False)
    return resume.Witness.from_doc(doc)


def demo_dir() -> Path:
    """Where the demo stand-ins live (``{demo_dir}``): run/demo, shipped as shoprld.recipes.demo."""
    return Path(shoprld.recipes.demo.__file__).resolve().parent


def host_port(url: str, default: int) -> tuple[str, int]:
    """(host, port) of a service URL: the round's ``{shopsim_port}``/``{val_host}`` and where a
    service's port must be free before it starts."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default


@dataclass(frozen=True)
class RoundFacts:
    """The facts on disk that a round's values depend on, read together at one moment."""

    committed: bool                                         # the save dir holds a complete checkpoint
    gate: Mapping[str, Any] = field(default_factory=dict)   # this round's GATE record ({} before GATE)
    save_interval: str = ""                                 # {save_interval} (daemon/round/saves.py)

    @classmethod
    def read(cls, plan: RoundPlan) -> RoundFacts:
        """Scan the save dir (not in planned mode: it does not look) and read the GATE record."""
        # The resume rule's answer (round/resume.py): the witness and the export records do not
        # bear on it, so they are not read here.
        committed = not plan.planned and plan.resume_point() is not None
        return cls(committed=committed, gate=read_json(plan.record_path("gate")) or {},
                   save_interval=saves.placeholder_value(plan.cfg, plan.layout, plan.round, planned=plan.planned))


@dataclass(frozen=True)
class RoundPlan:
    """One round, named: ids, mapping, paths and template values (see the module docstring)."""

    cfg: Config
    layout: Layout
    round: int
    secrets: Secrets = field(default_factory=Secrets)
    python: str = sys.executable
    demo_dir: Path = field(default_factory=demo_dir)
    # The children's base environment (the etiquette); None: ``layout.child_env(cfg)``.
    base_env: Mapping[str, str] | None = None
    planned: bool = False

    # -- ids and the iteration mapping ---------------------------------------------------------
    @property
    def mapping(self) -> ckpt.IterationMapping:
        return ckpt.IterationMapping(self.cfg.campaign.steps_per_round, self.cfg.train.end_offset)

    @property
    def round_id(self) -> str:
        return round_id(self.round)

    @property
    def prev_round_id(self) -> str:
        return round_id(self.round - 1)

    @property
    def next_round_id(self) -> str:
        return round_id(self.round + 1)

    @property
    def start_iteration(self) -> int:
        """Where the round's iteration window opens: the previous round's end (0 for round 0).
        The round trains ``(start_iteration, end_iteration]``."""
        return self.mapping.end_iteration(self.round - 1) if self.round > 0 else 0

    @property
    def end_iteration(self) -> int:
        """Where the round's window closes: its final save's iteration."""
        return self.mapping.end_iteration(self.round)

    @property
    def checkpoint_name(self) -> str:
        """The round's final checkpoint's name, ``iter_NNNNNNN``."""
        return ckpt.iter_name(self.end_iteration)

    @property
    def weight_version(self) -> str:
        """What the val server must report for this round's weights (never a fixed per-round id):
        the name of the checkpoint they were exported from."""
        return self.checkpoint_name

    # -- paths -----------------------------------------------------------------------------------
    @property
    def runs(self) -> Path:
        """``<project_root>/runs``: the ShopSimRL tools hard-code it (a symlink into the exp dir)."""
        return self.layout.project_root / "runs"

    @property
    def loop_dir(self) -> Path:
        """The round's emitted configs (slime.yaml, analysis.yaml, val.yaml, gate.yaml)."""
        return self.runs / "loop" / self.round_id

    @property
    def bare_val_dir(self) -> Path:
        return self.runs / f"{self.round_id}-bare-val"

    @property
    def analysis_dir(self) -> Path:
        return self.runs / f"{self.round_id}-online-analysis"

    @property
    def gate_dir(self) -> Path:
        return self.runs / f"{self.round_id}-online-gate"

    @property
    def next_runs_dir(self) -> Path:
        """Where INJECT puts the next round's inputs (curriculum, selected SkillBank)."""
        return self.runs / self.next_round_id

    @property
    def stop_file(self) -> Path:
        """The analyst sidecar's stop file."""
        return self.runs / "analyst.stop"

    @property
    def hf_dir(self) -> Path:
        return self.layout.hf_dir(self.cfg)

    @property
    def hf_tmp_dir(self) -> Path:
        """Where an export writes before it is moved into ``hf_dir``."""
        return self.layout.tmp / f"hf-{self.round_id}"

    @property
    def checkpoint_dir(self) -> Path:
        """The round's final checkpoint, ``<save>/iter_NNNNNNN``."""
        return ckpt.iter_dir(self.layout.save_dir, self.end_iteration)

    def record_path(self, kind: str, rid: str | None = None) -> Path:
        """shoprld's own small per-round decision records, under the experiment's artifacts
        (``kind``: one of :data:`RECORD_KINDS`; the properties below name each)."""
        if kind not in RECORD_KINDS:
            raise ValueError(f"unknown record kind {kind!r}; one of {', '.join(RECORD_KINDS)}")
        return record_file(self.layout.artifacts, kind, rid or self.round_id)

    @property
    def round_record(self) -> Path:
        """The round's start (job id, start time): written when TRAIN first launches."""
        return self.record_path("round")

    @property
    def sidecar_record(self) -> Path:
        """The analyst sidecar drained (TRAIN)."""
        return self.record_path("sidecar")

    @property
    def export_record(self) -> Path:
        """EXPORT_HF's manifest: the iteration it read and the files it checked."""
        return self.record_path("export")

    @property
    def saves_record(self) -> Path:
        """The round's last ``--save-interval`` choice (``daemon/round/saves.py``)."""
        return self.record_path("saves")

    @property
    def witness_path(self) -> Path:
        """The campaign's ShopSim witness (services/shopsim.py writes it; not per round)."""
        return self.layout.shopsim_witness

    # -- the save dir and its records, read once for round/resume.py ------------------------------
    def resume_point(self) -> ckpt.Checkpoint | None:
        """Where a launch resumes now (round/resume.py's rule on one scan), without the records."""
        return resume.SaveDir(ckpt.scan(self.layout.save_dir), self.mapping, self.round).resume_point

    def save_dir_facts(self, scan: ckpt.Scan | None = None) -> resume.SaveDir:
        """One scan of the save dir (``scan`` when the caller has one) and the records every
        checkpoint decision reads: the witness, and which rounds' end saves an export read."""
        found = ckpt.scan(self.layout.save_dir) if scan is None else scan
        m = self.mapping
        rounds = {m.round_of(c.iteration) for c in found.checkpoints if c.complete}
        exported = [r for r in sorted(rounds) if self.with_round(r).export_record.exists()]
        return resume.SaveDir(found, m, self.round, witness=read_witness(self.witness_path),
                              exported=resume.exported_ends(m, exported))

    def log_path(self, state: str) -> Path:
        """The stage log of ``state`` (a State's value, or a service's name) in this round."""
        return self.layout.stage_log(self.round, state)

    # -- inputs: the previous round's INJECT record (the plan's only read) -------------------
    @functools.cached_property
    def inputs(self) -> Mapping[str, str]:
        """This round's SkillBank, curriculum and history ledger (from the previous INJECT).

        Planned, a round whose previous INJECT has not run yet gets what a complete gate leaves.
        """
        if self.round == 0:
            return {
                "skillbank": str(self.cfg.inject.cold_start_skillbank or ""),
                "curriculum": str(self.cfg.inject.cold_start_curriculum or ""),
                "history_ledger": "",
            }
        prev = read_json(self.record_path("inject", self.prev_round_id))
        if not prev and self.planned:
            return {"skillbank": str(self.runs / self.round_id / "selected_skillbank.json"),
                    "curriculum": str(self.runs / self.round_id / "curriculum.json"),
                    "history_ledger": str(self.runs / f"{self.prev_round_id}-online-gate" / "proposal_ledger.jsonl")}
        prev = prev or {}
        return {
            "skillbank": str(prev.get("skillbank", "")),
            "curriculum": str(prev.get("curriculum", "")),
            "history_ledger": str(prev.get("history_ledger", "")),
        }

    @property
    def previous_inject(self) -> Mapping[str, Any] | None:
        """The previous round's INJECT record (None in round 0, or before it ran)."""
        return None if self.round == 0 else read_json(self.record_path("inject", self.prev_round_id))

    # -- template values -------------------------------------------------------------------------
    def load(self, facts: RoundFacts) -> Path:
        """``--load``: the save dir once it holds a committed checkpoint (slime resumes at
        tracker+1 by itself), else the converted base model (round 0's first launch). Planned:
        round 0 loads the base model, every later round the save dir."""
        base = self.cfg.train.base_load
        if self.planned:
            return base if self.round == 0 and base is not None else self.layout.save_dir
        return self.layout.save_dir if facts.committed or base is None else base

    def next_skillbank(self, current: str, facts: RoundFacts) -> str:
        """The gate's selection (copied under the next round's dir) when the gate was
        complete, else the current SkillBank: the seed's inject rule."""
        if facts.gate.get("decision") == "complete" and facts.gate.get("selected_skillbank"):
            return str(self.next_runs_dir / "selected_skillbank.json")
        return current

    def _hf_at_every_save(self, facts: RoundFacts) -> bool:
        interval = facts.save_interval or str(self.cfg.train.save_interval)
        return saves.hf_at_every_save(self.cfg, int(interval)) if interval.isdigit() else True

    def _async_saves(self, facts: RoundFacts) -> bool:
        interval = facts.save_interval or str(self.cfg.train.save_interval)
        return asyncsave.pays_off(self.cfg.saves.async_save, int(interval) if interval.isdigit() else 0,
                                  self.cfg.campaign.steps_per_round)

    def values(self, facts: RoundFacts) -> dict[str, str]:
        """Every {placeholder} for this round (placeholders.PLACEHOLDERS documents them)."""
        cfg, lay = self.cfg, self.layout
        shop_host, shop_port = host_port(cfg.shopsim.url, 5700)
        val_host, val_port = host_port(cfg.val.url, 30000)
        v = {
            "python": self.python, "recipe_dir": str(cfg.source.parent), "demo_dir": str(self.demo_dir),
            "repo": str(lay.repo), "project_root": str(lay.project_root), "runs": str(self.runs),
            "exp_dir": str(lay.exp_dir), "campaign_root": str(lay.campaign_root), "cache_root": str(lay.cache_root),
            "logs_dir": str(lay.logs), "save_dir": str(lay.save_dir), "hf_dir": str(self.hf_dir),
            "hf_tmp_dir": str(self.hf_tmp_dir),
            "origin_hf_dir": str(cfg.export.origin_hf_dir or ""),
            "load": str(self.load(facts)), "base_load": str(cfg.train.base_load or ""),
            "num_rollout": str(self.mapping.num_rollout(self.round)),
            "end_iteration": str(self.end_iteration), "save_interval": facts.save_interval or str(cfg.train.save_interval),
            "round": str(self.round), "round_id": self.round_id, "next_round_id": self.next_round_id,
            "loop_dir": str(self.loop_dir),
            "selected_skillbank": str(self.gate_dir / "selected_skillbank.json"),
            "next_curriculum": str(self.next_runs_dir / "curriculum.json"),
            "stop_file": str(self.stop_file),
            "shopsim_url": cfg.shopsim.url, "shopsim_port": str(shop_port), "slots": str(cfg.shopsim.slots),
            "episode_concurrency": str(cfg.shopsim.episode_concurrency),
            "val_url": cfg.val.url, "val_host": val_host, "val_port": str(val_port),
            "val_concurrency": str(cfg.val.concurrency), "val_tasks": str(cfg.val.tasks),
            "tp_size": str(cfg.gpus.tp_size), "num_gpus": str(cfg.num_gpus),
            "cuda_visible_devices": ",".join(str(g) for g in cfg.gpus.visible),
            "wandb_project": cfg.wandb.project, "wandb_group": cfg.wandb.group, "wandb_mode": cfg.wandb.mode,
            "wandb_dir": str(lay.wandb_dir), "seed": str(cfg.campaign.seed),
            "checkpoint_dir": str(self.checkpoint_dir),
            "weight_version": self.weight_version,
            "sequence_parallel": "--sequence-parallel" if cfg.gpus.tp_size > 1 else "",
            "save_hf": "--save-hf" if self._hf_at_every_save(facts) else "",
            "save_hf_dir": str(self.hf_dir) if self._hf_at_every_save(facts) else "",
            "async_save": asyncsave.ASYNC_FLAG if self._async_saves(facts) else "",
            "async_save_worker": asyncsave.WORKER_FLAG if self._async_saves(facts) else "",
            **self._wandb_team(),
            **self.inputs,
        }
        v["next_skillbank"] = self.next_skillbank(v["skillbank"], facts)
        expand_vars(cfg.vars, v)  # in order: a var may use the vars above it
        return v

    def _wandb_team(self) -> dict[str, str]:
        entity = self.secrets.values.get("WANDB_ENTITY", "") if self.cfg.wandb.enabled else ""
        return {"wandb_team_flag": "--wandb-team" if entity else "", "wandb_entity": entity}

    def resolve(self, facts: RoundFacts | None = None) -> RoundValues:
        """The values at this moment (``facts`` read now when not given), ready for a launch."""
        return RoundValues(self, self.values(facts if facts is not None else RoundFacts.read(self)))

    def with_round(self, index: int) -> RoundPlan:
        """The same campaign's plan for another round (same secrets, interpreter, environment)."""
        return RoundPlan(self.cfg, self.layout, index, self.secrets, self.python, self.demo_dir,
                         self.base_env, self.planned)


@dataclass(frozen=True)
class RoundValues:
    """A round's template values resolved once, and the argv and environment built from them.

    What ``Launcher.start`` receives as ``round``: a launcher reads the round and its values
    here, never from a log file's name, and never resolves them again.
    """

    plan: RoundPlan
    values: Mapping[str, str]

    @property
    def round(self) -> int:
        return self.plan.round

    @property
    def round_id(self) -> str:
        return self.plan.round_id

    def argv(self, template: Sequence[str]) -> list[str]:
        return expand(list(template), dict(self.values))

    def env(self, spec: ProcessSpec, extra: Mapping[str, str] | None = None,
            secrets: Sequence[str] | None = None) -> dict[str, str]:
        """The child's environment: base (etiquette) + the spec's env + its secrets only."""
        plan = self.plan
        base = plan.layout.child_env(plan.cfg) if plan.base_env is None else plan.base_env
        env = dict(base)
        env.update({k: v.format_map(dict(self.values)) for k, v in spec.env.items()})
        if extra:
            env.update(extra)
        env.update(plan.secrets.for_child(spec.secrets if secrets is None else secrets))
        if plan.cfg.wandb.enabled:  # WANDB_ENTITY, WANDB_BASE_URL: only when the .env sets them
            env.update(plan.secrets.for_child(plan.cfg.wandb.pass_env))
        return env

    @staticmethod
    def wrap(argv: list[str], spec: ProcessSpec) -> list[str]:
        """Run through conda's own activation when the spec names a conda prefix."""
        return argv if spec.conda_prefix is None else activation_argv(spec.conda_prefix, argv)


def resolve(cfg: Config, layout: Layout, round_index: int, secrets: Secrets | None = None, *,
            base_env: Mapping[str, str] | None = None, planned: bool = False) -> RoundValues:
    """One round's values without an engine (``check``, ``rehearse``, the ledger, tools)."""
    return RoundPlan(cfg, layout, round_index, secrets or Secrets(), base_env=base_env, planned=planned).resolve()
