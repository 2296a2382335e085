"""Every stage's resolved command, for a person to read before the first overnight run.

``shoprld check --print-commands`` prints :func:`describe_commands`: the argv of each stage
for round 0 and round 1, exactly as the engine will expand it (placeholders, ``[vars]``,
conda activation), with the secrets masked, plus the Ray job's entrypoint and runtime env
(secret values as ``***``). Round 1 is shown as planned: its ``--load`` is the save dir
(round 0 will have committed its checkpoint) and its inputs are what INJECT writes when the
gate is complete.

Two checks live here too, because they read the same resolved values:

- :func:`port_mismatches`: the ShopSimRL emitter (and the analyst's own config, named by
  analysis.yaml, see :func:`analyst_config_mismatches`) hard-code ``127.0.0.1:5700`` and
  ``127.0.0.1:30000`` (and the two concurrencies) in the round YAMLs, so a recipe that moves
  a port breaks the loop silently. TRAIN calls it right after ``train.emit_command`` and
  fails the round with its lines.
- :func:`shopsim_exposure_warning`: ShopSim binds 0.0.0.0 with no authentication, so anyone
  who reaches its port can ``release_all`` mid-training. It connects to this host's own
  non-loopback addresses only, never to another host.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import re
import shlex
import socket
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configsections import ProcessSpec
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.services.ray import RayLauncher, entrypoint_of, job_env, ray_tmpdir_path
from shoprld.daemon.round.plan import RoundValues, resolve
from shoprld.daemon.foundation.config.secrets import KNOWN_SECRET_KEYS, MASK, Secrets


# -- the trainer as a Ray job --------------------------------------------------------------------
@dataclass(frozen=True)
class TrainJob:
    """What TRAIN submits for one round: argv, the Ray entrypoint and its runtime env."""

    argv: list[str]                 # the trainer's argv, as the recipe expands it
    launched: list[str]             # what is actually run (through conda activation when set)
    entrypoint: str                 # Ray's shell string
    env_vars: dict[str, str]        # runtime_env.env_vars (secrets in clear: never print these)
    submission_id: str              # the first attempt's id
    cwd: Path


def train_job(cfg: Config, layout: Layout, secrets: Secrets, round_index: int, *, planned: bool = True,
              base_env: Mapping[str, str] | None = None) -> TrainJob:
    """The trainer's submission for a round, built the way RayLauncher builds it."""
    rv = resolve(cfg, layout, round_index, secrets, planned=planned,
                 base_env=layout.child_env(cfg, base={}) if base_env is None else base_env)
    argv = rv.argv(cfg.train.command)
    launched = rv.wrap(argv, cfg.train)
    cwd = cfg.train.cwd or layout.project_root
    env = rv.env(cfg.train)
    sid = RayLauncher(cfg, layout).submission_id(rv.round_id, 1)
    return TrainJob(argv, launched, entrypoint_of(launched, cwd), job_env(cfg, layout, env, rv.values), sid, cwd)


# -- describe ------------------------------------------------------------------------------------------
def _stage(name: str, argv: Sequence[str], spec: ProcessSpec, secrets: Secrets, values: Mapping[str, str],
           *, extra_env: Mapping[str, str] | None = None, secret_names: Sequence[str] | None = None,
           cwd: Path | None = None) -> list[str]:
    if not argv:
        return [f"  {name:<11} (not configured)"]
    red = secrets.redact
    lines = [f"  {name:<11} $ {red(shlex.join(argv))}"]
    notes = []
    if spec.conda_prefix is not None:
        notes.append(f"conda-activate {spec.conda_prefix}")
    notes.append(f"cwd {cwd}")
    lines.append(f"  {'':<11}   ({'; '.join(notes)})")
    env = {k: v.format_map(dict(values)) for k, v in spec.env.items()}
    env.update(extra_env or {})
    if env:
        lines.append(f"  {'':<11}   env: {red(' '.join(f'{k}={shlex.quote(v)}' for k, v in env.items()))}")
    names = list(spec.secrets if secret_names is None else secret_names)
    if names:
        lines.append(f"  {'':<11}   secrets (env only): "
                     + " ".join(f"{k}={MASK if secrets.values.get(k) else '<missing from .env>'}" for k in names))
    return lines


def describe_commands(cfg: Config, layout: Layout, secrets: Secrets) -> list[str]:
    """Every stage's resolved command for round 0 and round 1, secrets masked."""
    red = secrets.redact
    out: list[str] = []
    secretish = set(KNOWN_SECRET_KEYS) | set(cfg.required_secrets()) | set(cfg.train.secrets)
    for r in range(min(2, cfg.campaign.rounds)):
        rv = resolve(cfg, layout, r, secrets, planned=True)
        v = rv.values
        home = layout.project_root

        def argv(template: Sequence[str], rv: RoundValues = rv) -> list[str]:
            return rv.argv(template) if template else []

        out.append(f"round {r} ({v['round_id']}): --num-rollout {v['num_rollout']} (ends at "
                   f"{rv.plan.checkpoint_name}), --load {v['load']}")
        if r == 0:
            out += _stage("shopsim", argv(cfg.shopsim.command), cfg.shopsim, secrets, v,
                          cwd=cfg.shopsim.cwd or home)
            if cfg.train.launcher == "ray" and cfg.train.ray_start_head:
                tmp = ray_tmpdir_path(layout)
                shown = f"{tmp} -> {layout.ray_tmp}" if tmp != layout.ray_tmp else str(tmp)
                out += _stage("ray-head", argv(cfg.train.ray_head_command),
                              ProcessSpec(conda_prefix=cfg.train.conda_prefix), secrets, v, cwd=home,
                              extra_env={"RAY_TMPDIR": shown})
                out.append(f"  {'':<11}   (only when nothing answers at {cfg.train.ray_address})")
        out += _stage("emit", argv(cfg.train.emit_command), cfg.train, secrets, v, secret_names=(),
                      cwd=cfg.train.cwd or home)
        out += _stage("check", argv(cfg.train.check_command), cfg.train, secrets, v, secret_names=(),
                      cwd=cfg.train.cwd or home)
        if cfg.sidecar.enabled:
            out += _stage("sidecar", argv(cfg.sidecar.command), cfg.sidecar, secrets, v,
                          cwd=cfg.sidecar.cwd or home)
        if cfg.train.launcher == "ray":
            job = train_job(cfg, layout, secrets, r)
            out.append(f"  {'train':<11} ray job {job.submission_id} at {cfg.train.ray_address}")
            out.append(f"  {'':<11}   entrypoint: {red(job.entrypoint)}")
            env_shown = " ".join(f"{k}={MASK if k in secretish else shlex.quote(red(val))}"
                                 for k, val in sorted(job.env_vars.items()))
            out.append(f"  {'':<11}   runtime_env.env_vars: {env_shown}")
            missing = [k for k in cfg.train.secrets if k not in job.env_vars]
            if missing:
                out.append(f"  {'':<11}   secrets missing from .env: {', '.join(missing)}")
        else:
            out += _stage("train", argv(cfg.train.command), cfg.train, secrets, v, cwd=cfg.train.cwd or home)
        exp = cfg.export
        label = "export" if exp.mode == "convert" else "export*"
        out += _stage(label, argv(exp.command), exp, secrets, v, cwd=exp.cwd or home)
        if exp.mode == "save_hf":
            out.append(f"  {'':<11}   (*only when slime's --save-hf output in {v['hf_dir']} is stale or torn)")
        out += _stage("val-server", argv(cfg.val.server_command), cfg.val, secrets, v,
                      extra_env=dict(cfg.val.server_env), cwd=cfg.val.cwd or home)
        out += _stage("val", argv(cfg.val.command), cfg.val, secrets, v, cwd=cfg.val.cwd or home)
        out += _stage("analyze", argv(cfg.gate.analyze_command), cfg.gate, secrets, v,
                      secret_names=cfg.gate.analyze_secrets or cfg.gate.secrets, cwd=cfg.gate.cwd or home)
        out += _stage("gate", argv(cfg.gate.command), cfg.gate, secrets, v, cwd=cfg.gate.cwd or home)
        if r + 1 < cfg.campaign.rounds:
            out += _stage("inject", argv(cfg.inject.command), cfg.inject, secrets, v, cwd=cfg.inject.cwd or home)
    return out


# -- the emitted YAMLs agree with the recipe --------------------------------------------------------
_YAML_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_.\-]+):(?:\s+(?P<value>.*?))?\s*$")


def _scalar(text: str) -> Any:
    t = text.strip()
    if not t or t in ("null", "~", "None"):
        return None
    if t[0] in "'\"" and t[-1] == t[0] and len(t) >= 2:
        return t[1:-1]
    if t in ("true", "True"):
        return True
    if t in ("false", "False"):
        return False
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


def _mini_yaml(text: str) -> dict[str, Any]:
    """Block mappings of scalars, which is what ``yaml.safe_dump`` writes for these files."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "- ")):
            continue
        m = _YAML_LINE.match(line)
        if not m:
            continue  # a folded continuation or a list item: no key/URL we check lives there
        indent = len(m.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else root
        value = m.group("value")
        if value is None or value == "":
            child: dict[str, Any] = {}
            parent[m.group("key")] = child
            stack.append((indent, child))
        else:
            parent[m.group("key")] = _scalar(value)
    return root


def _load_config_file(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # a directory, unreadable, or not text: unreadable as a config
        return None
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else None
    except ValueError:
        pass
    try:
        import yaml  # type: ignore[import-untyped, import-not-found, unused-ignore]  # PyYAML, where installed

        data = yaml.safe_load(text)
        return data if isinstance(data, dict) else None
    except ImportError:
        return _mini_yaml(text)
    except Exception:  # yaml.YAMLError and friends: unreadable as a config  # noqa: BLE001
        return None


def _walk(data: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _walk(v, (*path, str(k)))
    else:
        yield path, data


_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def _endpoint(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    return ("127.0.0.1" if host in _LOOPBACK else host), port


def port_mismatches(cfg: Config, loop_dir: Path) -> list[str]:
    """Where the round's emitted configs disagree with the recipe: ShopSim and val server
    host:port, and the two concurrencies the emitter also hard-codes. One line each."""
    want = {"shopsim": (_endpoint(cfg.shopsim.url), "shopsim.url", cfg.shopsim.url),
            "val": (_endpoint(cfg.val.url), "val.url", cfg.val.url)}
    out: list[str] = []
    files = sorted(p for p in Path(loop_dir).glob("*") if p.suffix in (".yaml", ".yml", ".json"))
    for f in files:
        data = _load_config_file(f)
        if data is None:
            out.append(f"{f}: unreadable; fix: rerun train.emit_command")
            continue
        for path, value in _walk(data):
            key = ".".join(path)
            leaf = path[-1].lower() if path else ""
            low = [p.lower() for p in path]
            if isinstance(value, str) and re.match(r"^[a-z][a-z0-9+.-]*://", value):
                if "model" in low or leaf in ("val_url", "model_url"):
                    kind = "val"
                elif "shopsim" in leaf or "environment" in low or leaf == "shopsim_url":
                    kind = "shopsim"
                else:
                    continue
                got = _endpoint(value)
                expect, name, url = want[kind]
                if got is not None and expect is not None and got != expect:
                    out.append(f"{f}: {key}: {value} does not match {name} = {url}; fix: make them agree "
                               f"(the seed's emit_training_loop_round.py hard-codes 127.0.0.1:5700 and :30000)")
            elif isinstance(value, int) and not isinstance(value, bool):
                if leaf == "shopsim_episode_concurrency" and value != cfg.shopsim.episode_concurrency:
                    out.append(f"{f}: {key}: {value} != shopsim.episode_concurrency = "
                               f"{cfg.shopsim.episode_concurrency}; fix: make them agree")
                elif low[-2:] == ["experiment", "concurrency"] and value != cfg.val.concurrency:
                    out.append(f"{f}: {key}: {value} != val.concurrency = {cfg.val.concurrency}; fix: make them agree")
        if isinstance(data, dict) and f.stem == "analysis":
            ref = (data.get("online_analysis") or {}).get("trace2skill_config") \
                if isinstance(data.get("online_analysis"), dict) else None
            if isinstance(ref, str) and ref:
                out.extend(analyst_config_mismatches(cfg, Path(ref), referenced_by=f"{f}: online_analysis."
                                                                                 "trace2skill_config"))
    return out


ANALYST_CONFIG = "configs/trace2skill_cold_start.yaml"


def analyst_config_mismatches(cfg: Config, path: Path, *, referenced_by: str | None = None) -> list[str]:
    """The analyst's own config (``configs/trace2skill_cold_start.yaml``, named by analysis.yaml)
    against the recipe. It carries its own ShopSim URL (``environment.base_url``, hard-coded
    5700 upstream), and a wrong one gives a *success-shaped* analysis with 0 candidates. Its
    ``experiment.concurrency`` analyst threads each hold a ShopSim slot while the trainer's
    episodes (TRAIN) or the bare val's (VAL) hold theirs, so both sums must fit ``shopsim.slots``.
    Its model URLs are the LLM endpoint's, not ours: not checked. A missing file is the
    analysis's own error (it exits 1), reported there (the demo's stand-in analyst reads none)."""
    if not path.is_file():
        return []  # the analysis's own error (a traceback, exit 1); the demo's stand-ins have none
    data = _load_config_file(path)
    if data is None:
        where = f" ({referenced_by})" if referenced_by else ""
        return [f"{path}: unreadable as YAML{where}; fix: repair the analyst's config"]
    out: list[str] = []
    env = data.get("environment")
    url = env.get("base_url") if isinstance(env, dict) else None
    want = _endpoint(cfg.shopsim.url)
    if isinstance(url, str) and want is not None:
        got = _endpoint(url)
        if got is not None and got != want:
            out.append(f"{path}: environment.base_url: {url} does not match shopsim.url = {cfg.shopsim.url}; fix: "
                       "make them agree (the analyst would audit a dead port and write 0 candidates, silently)")
    exp = data.get("experiment")
    threads = exp.get("concurrency") if isinstance(exp, dict) else None
    if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0:
        for who, n, key in (("the trainer's", cfg.shopsim.episode_concurrency, "shopsim.episode_concurrency"),
                            ("the bare val's", cfg.val.concurrency, "val.concurrency")):
            if n + threads > cfg.shopsim.slots:
                out.append(f"{path}: experiment.concurrency: {threads} analyst threads plus {who} {n} episodes "
                           f"({key}) need {n + threads} ShopSim slots > shopsim.slots = {cfg.shopsim.slots}; fix: "
                           "raise shopsim.slots (and the service's SHOPSIM_ENV_SLOTS) or lower one of them")
    return out


# -- ShopSim's open port --------------------------------------------------------------------------
_SIOCGIFADDR = 0x8915


def local_addresses() -> list[str]:
    """This host's own interface addresses (IPv4 by ioctl, global IPv6 from /proc)."""
    out: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out.append(socket.inet_ntoa(packed[20:24]))
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            addr = ipaddress.IPv6Address(bytes.fromhex(raw))
            if addr.is_global or addr.is_private and not addr.is_link_local:
                out.append(str(addr))
    except (OSError, ValueError, IndexError):
        pass
    return sorted(set(out))


def _connects(host: str, port: int, timeout: float) -> bool:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            return s.connect_ex((host, port)) == 0
        except OSError:
            return False


def shopsim_exposure_warning(url: str, *, addresses: Sequence[str] | None = None,
                             timeout: float = 0.3) -> str | None:
    """A warning when ShopSim's port answers on a non-loopback address of this host.

    Only this host's own addresses are tried. It sees the bind, not a firewall in front
    of the interface, so a firewalled port still warns (the message says so).
    """
    ep = _endpoint(url)
    if ep is None:
        return None
    port = ep[1]
    addrs = local_addresses() if addresses is None else list(addresses)
    exposed = [a for a in addrs if not ipaddress.ip_address(a).is_loopback and _connects(a, port, timeout)]
    if not exposed:
        return None
    return (f"ShopSim's port {port} answers on {', '.join(exposed)}, not only on loopback: it has no "
            "authentication, so anyone who can reach it can call release_all in the middle of training; "
            f"fix: firewall it (e.g. iptables -I INPUT -p tcp --dport {port} ! -i lo -j DROP) or keep the "
            "box off shared networks (seen from this host, so an existing firewall rule is not detected)")
