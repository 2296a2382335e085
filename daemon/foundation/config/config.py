"""Campaign config: one TOML file -> frozen, validated pydantic models.

Every error is ONE line: ``<file>: <key>: <problem> (got <value>); fix: <fix>``. The CLI
prints it and exits 3. Relative paths in the file are relative to the file's directory,
so a recipe can be moved together with the tree it describes.

This module owns the whole campaign (:class:`Config`, its checks across tables), reading the
file (:func:`load_config`; it only reads) and the one-line error format. The tables' models
are in configsections.py, the scalar types they use in configvalues.py, and the command
templates' placeholders and their expansion in placeholders.py: an unknown placeholder is a
config error here, not a run-time surprise at 3 a.m.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

from shoprld.daemon.foundation.config.configsections import (
    CampaignSection,
    DiskSection,
    ExportSection,
    FrozenModel,
    GateSection,
    GpuSection,
    InjectSection,
    MetricsSection,
    NotifySection,
    PreflightSection,
    SavesSection,
    SecretsSection,
    ShopsimSection,
    SidecarSection,
    StorageSection,
    TrainSection,
    ValSection,
    WandbSection,
)
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.paths import special_file
from shoprld.daemon.foundation.config.placeholders import PLACEHOLDERS, VAR_NAME, placeholders_in


class Config(FrozenModel):
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
            if not VAR_NAME.match(name):
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
