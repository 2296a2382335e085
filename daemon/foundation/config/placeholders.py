"""Command templates: the placeholders the engine fills in, and their expansion.

Command templates are argv lists. ``{name}`` placeholders are expanded per round by
:func:`expand` without a shell, one argv element at a time, so a value with spaces stays
one argument. The set of known placeholders is :data:`PLACEHOLDERS` plus the campaign's
own ``[vars]`` (config.py refuses an unknown one at load time). Pure: no disk.
"""

from __future__ import annotations

import re
import string

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
    "save_hf": "--save-hf, left out when the launch saves mid-round and export.command can convert once",
    "save_hf_dir": "hf_dir, left out with {save_hf}",
    "async_save": "--async-save when saves.async_save (the default) and the launch saves mid-round, else left out",
    "async_save_worker": "--use-persistent-ckpt-worker with {async_save}, else left out (without it Megatron disables --async-save)",
    "wandb_team_flag": "--wandb-team when the .env sets WANDB_ENTITY, else left out (as upstream)",
    "wandb_entity": "the .env's WANDB_ENTITY, else left out",
}
# An argv element that is exactly one of these placeholders is left out when its value is
# empty: upstream's optional flags (run_shopsimrl_slime.sh adds them only when they apply).
OPTIONAL_ARGS = frozenset({"{sequence_parallel}", "{wandb_team_flag}", "{wandb_entity}", "{async_save}",
                           "{async_save_worker}", "{save_hf}", "{save_hf_dir}"})
# What a placeholder (and a [vars] name) may be called.
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
            if spec or conversion or not VAR_NAME.match(name):
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
