"""``shoprld rehearse``: one tiny round of the real campaign config, in minutes, before the night.

It drives the real engine (daemon/core/engine.py) over a config derived from the campaign's own:

- kept: the campaign's ShopSim command and its ShopSimRL tool commands (emit, check, the
  sidecar, analyze, the bare val, the online gate, build-curriculum), their envs, conda envs
  and secrets, and train.progress_pattern;
- replaced: slime by the trainer stand-in (run/demo/slime_train.py: real-shaped Megatron
  checkpoints and the HF export), the export converter by its stand-in, the SGLang val
  server by run/demo/valserver.py, and the analyst's LLM API by run/demo/analyst_llm.py
  (``--real-analyst`` keeps the real one, at the user's cost);
- sized down: 1 round of 2 rollouts, every retry off, through the SAME emitted YAMLs the real
  round uses: every tool command runs inside :mod:`rehearse_tool`, which records what the tool
  printed and how it exited, and after emit re-points the hard-coded ports and shrinks the
  concurrencies and the val split in the emitted files (to a handful of tasks, but more than
  the online gate's regression factors, or the real gate refuses before any rollout);
- scratch: experiment dir, state dir, ledger, caches, W&B (offline, project
  ``<project>-rehearse``) and the metrics textfile live under a fresh scratch dir; no page is
  sent, unless ``--notify`` (then to the campaign's endpoints, every page marked
  ``[rehearsal]``); ShopSim, the val server and the
  analyst stand-in listen on free loopback ports; GPU probing is off (nothing touches a GPU).
  The one shared path is ``<project_root>/runs``, the link the tools hard-code: it points into
  the scratch dir during the rehearsal and is put back after. The real campaign's daemon must
  not be running (its lock is held for the rehearsal, so it cannot start meanwhile).

Then every stage gets a verdict, ``ok`` or the exact mismatch against the tools contract
(``shared/contracts/shopsimrl-tools.md``), and one overall line. Exit 0 when every stage is
ok, 6 otherwise, 3 for a config the campaign itself could not run with.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from shoprld.daemon.foundation.config import Config, load_config
from shoprld.daemon.core.engine import Engine
from shoprld.daemon.foundation.errors import EXIT_OK, EXIT_STAGE, LockError
from shoprld.daemon.foundation.layout import Layout
from shoprld.daemon.foundation.logs import configure
from shoprld.daemon.round.plan import demo_dir
from shoprld.daemon.foundation.secrets import load_secrets
from shoprld.daemon.foundation.toolout import ToolOutputError, last_json_object
from shoprld.daemon.services.validate import validate

TIME_LIMIT_S = 600.0
ROLLOUTS = 2
VAL_TASKS = 4
EPISODE_CONCURRENCY = 2
VAL_CONCURRENCY = 2
CONTRACT = "shared/contracts/shopsimrl-tools.md"
# Before every page of `rehearse --notify`: nobody may take a rehearsal's page for production's.
REHEARSAL_MARKER = "[rehearsal]"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hostport(url: str) -> str:
    p = urlsplit(url)
    return f"{p.hostname}:{p.port or (443 if p.scheme == 'https' else 80)}"


def _served_name(argv: tuple[str, ...]) -> str:
    for i, a in enumerate(argv):
        if a == "--served-model-name" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--served-model-name="):
            return a.split("=", 1)[1]
    return "Qwen/Qwen3.5-4B"


@dataclass
class Scratch:
    """The rehearsal's own places and ports."""

    root: Path
    shopsim_port: int = field(default_factory=_free_port)
    val_port: int = field(default_factory=_free_port)
    analyst_port: int = field(default_factory=_free_port)

    @property
    def records(self) -> Path:
        return self.root / "records"

    @property
    def analyst_url(self) -> str:
        return f"http://127.0.0.1:{self.analyst_port}/v1"


def _wrap(cmd: tuple[str, ...], stage: str, sc: Scratch, *, emit_spec: Path | None = None) -> tuple[str, ...]:
    if not cmd:
        return cmd
    extra = ("--emit-spec", str(emit_spec), "--loop-dir", "{loop_dir}") if emit_spec else ()
    return ("{python}", "-m", "shoprld.daemon.ops.rehearse_tool", "--record", str(sc.records), "--stage", stage,
            *extra, "--", *cmd)


def derive(cfg: Config, layout: Layout, sc: Scratch, *, real_analyst: bool, notify: bool = False) -> Config:
    """The scratch config: the campaign's own tools and ShopSim, stand-ins for the GPU/API parts.
    Nothing of production's operator kit: no page unless ``notify`` (then marked, see
    :data:`REHEARSAL_MARKER`), no digest, and the metrics textfile in the scratch dir."""
    demo = "{demo_dir}"
    models = sc.root / "models"
    spec = {"scratch": str(sc.root), "episode_concurrency": EPISODE_CONCURRENCY, "val_concurrency": VAL_CONCURRENCY,
            "val_tasks": VAL_TASKS, "analyst_url": None if real_analyst else sc.analyst_url,
            "swaps": [[_hostport(cfg.shopsim.url), f"127.0.0.1:{sc.shopsim_port}"],
                      ["127.0.0.1:5700", f"127.0.0.1:{sc.shopsim_port}"],
                      [_hostport(cfg.val.url), f"127.0.0.1:{sc.val_port}"],
                      ["127.0.0.1:30000", f"127.0.0.1:{sc.val_port}"]]}
    # The same host:port twice (a campaign on the seed's ports) would swap twice: keep the first.
    seen: set[str] = set()
    spec["swaps"] = [s for s in spec["swaps"] if not (s[0] in seen or seen.add(s[0]))]
    spec_file = sc.root / "emit-spec.json"
    spec_file.write_text(json.dumps(spec, indent=2))
    no_retry = {"retries": 0, "backoff": 0.0}
    t = cfg.train
    train = t.model_copy(update={
        **no_retry, "launcher": "local", "conda_prefix": None, "cwd": None, "timeout": 300.0,
        "emit_command": _wrap(t.emit_command, "train.emit_command", sc, emit_spec=spec_file),
        "check_command": _wrap(t.check_command, "train.check_command", sc),
        "command": ("{python}", f"{demo}/slime_train.py", "--hf-checkpoint", "{origin_hf_dir}", "--load", "{load}",
                    "--save", "{save_dir}", "--save-interval", "{save_interval}", "--save-hf", "{hf_dir}",
                    "{async_save}", "{async_save_worker}",
                    "--custom-config-path", "{loop_dir}/slime.yaml", "--num-rollout", "{num_rollout}",
                    "--use-wandb", "--wandb-mode", "offline", "--wandb-project", "{wandb_project}",
                    "--wandb-group", "{wandb_group}", "--wandb-dir", "{wandb_dir}"),
        "env": {**t.env, "DEMO_STEP_SECONDS": "0.01", "DEMO_CKPT_BYTES": "65536"},
        "base_load": models / "base_torch_dist", "ray_start_head": False, "ray_head_command": (),
        "runtime_env": {}, "stall_min": 120.0,
    })
    v = cfg.val
    val = v.model_copy(update={
        **no_retry, "server_command": ("{python}", f"{demo}/valserver.py", "--model-path", "{hf_dir}", "--host",
                                       "{val_host}", "--port", "{val_port}", "--served-model-name",
                                       _served_name(v.server_command), "--weight-version", "{weight_version}"),
        "server_env": {}, "url": f"http://127.0.0.1:{sc.val_port}", "ready_timeout": 60.0,
        "concurrency": VAL_CONCURRENCY, "tasks": VAL_TASKS, "reuse_server": False, "timeout": 300.0,
        "command": _wrap(v.command, "val.command", sc),
    })
    g = cfg.gate
    gate = g.model_copy(update={**no_retry, "timeout": 300.0,
                                "analyze_command": _wrap(g.analyze_command, "gate.analyze_command", sc),
                                "command": _wrap(g.command, "gate.command", sc)})
    # The one rehearsed round is the scratch campaign's last: build its curriculum all the same,
    # so that build-curriculum is checked too.
    inject = cfg.inject.model_copy(update={**no_retry, "command": _wrap(cfg.inject.command, "inject.command", sc),
                                           "after_last_round": True})
    sidecar = cfg.sidecar.model_copy(update={**no_retry, "drain_timeout": 60.0,
                                             "command": _wrap(cfg.sidecar.command, "sidecar.command", sc)})
    export = cfg.export.model_copy(update={
        **no_retry, "conda_prefix": None, "hf_dir": None, "origin_hf_dir": models / "hf-origin",
        "command": ("{python}", f"{demo}/convert_torch_dist_to_hf.py", "--input-dir", "{checkpoint_dir}",
                    "--output-dir", "{hf_tmp_dir}", "--origin-hf-dir", "{origin_hf_dir}")})
    shopsim = cfg.shopsim.model_copy(update={
        **no_retry, "url": f"http://127.0.0.1:{sc.shopsim_port}", "manage": True,
        "episode_concurrency": min(EPISODE_CONCURRENCY, cfg.shopsim.slots)})
    return cfg.model_copy(update={
        "campaign": cfg.campaign.model_copy(update={"rounds": 1, "steps_per_round": ROLLOUTS, "deadline": ""}),
        "storage": cfg.storage.model_copy(update={
            "repo": layout.repo, "project_root": layout.project_root, "env_file": layout.env_file,
            "ephemeral_root": sc.root / "ephemeral", "state_dir": sc.root / "state",
            "ledger": str(sc.root / "ledger.tsv"), "user": "rehearse"}),
        "disk": cfg.disk.model_copy(update={"require_mount": False, "forbid_same_fs": False,
                                            "ballast": min(cfg.disk.ballast_bytes, 1024 * 1024),
                                            "wait_for_space": False}),
        "gpus": cfg.gpus.model_copy(update={"probe": "none"}),
        "shopsim": shopsim, "train": train, "sidecar": sidecar, "export": export, "val": val, "gate": gate,
        "inject": inject,
        "wandb": cfg.wandb.model_copy(update={"mode": "offline", "project": f"{cfg.wandb.project}-rehearse"}),
        "notify": cfg.notify.model_copy(update={"endpoints": cfg.notify.endpoints if notify else (),
                                                "digest_at": ""}),
        "metrics": cfg.metrics.model_copy(update={
            "textfile": sc.root / "metrics" / cfg.metrics.textfile.name if cfg.metrics.textfile else None}),
    })


def _prepare_models(sc: Scratch) -> None:
    """The stand-in trainer's converted base model and the HF origin (config.json), in scratch."""
    models = sc.root / "models"
    (models / "hf-origin").mkdir(parents=True, exist_ok=True)
    (models / "hf-origin" / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2}))
    subprocess.run([sys.executable, str(demo_dir() / "slime_train.py"), "--init-base",
                    str(models / "base_torch_dist")], check=True, capture_output=True, timeout=60)


class _RealLock:
    """Hold the real campaign's lock (if its state dir has one) for the rehearsal: the real
    daemon must not run while ``<project_root>/runs`` points into the scratch dir."""

    def __init__(self, state_dir: Path) -> None:
        self.fd: int | None = None
        try:
            self.fd = os.open(state_dir / "lock", os.O_RDWR)  # never created: the state dir stays untouched
        except OSError:
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LockError(f"{state_dir}: the campaign's daemon (pid {holder}) is running; rehearse re-points "
                                "<project_root>/runs, which it uses; fix: rehearse before the campaign starts, or "
                                "`shoprld stop` it first") from None
            raise

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _RunsLink:
    """Remember ``<project_root>/runs`` and put it back after the rehearsal."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.target = os.readlink(path) if path.is_symlink() else None
        try:  # the project root's own times: adding and removing the link moves its mtime
            st = path.parent.stat()
            self.parent_times: tuple[int, int] | None = (st.st_atime_ns, st.st_mtime_ns)
        except OSError:
            self.parent_times = None

    def restore(self) -> None:
        if not self.path.is_symlink():
            return  # a real dir is refused by the engine and never replaced
        self.path.unlink()
        if self.target is not None:
            self.path.symlink_to(self.target, target_is_directory=True)
        if self.parent_times is not None:
            try:  # `ls -la` of the project root then shows what it showed before the rehearsal
                os.utime(self.path.parent, ns=self.parent_times)
            except OSError:
                pass


# -- the verdicts ---------------------------------------------------------------------------------
STAGES: tuple[tuple[str, str], ...] = (
    ("preflight", "PREFLIGHT_DISK"), ("shopsim", "START_SHOPSIM"), ("train.emit_command", "TRAIN"),
    ("train.check_command", "TRAIN"), ("sidecar.command", "TRAIN"), ("train.command (slime stand-in)", "TRAIN"),
    ("export", "EXPORT_HF"), ("val.command", "VAL"), ("gate.analyze_command", "GATE"), ("gate.command", "GATE"),
    ("inject.command", "INJECT"), ("ledger row", "NEXT_ROUND"),
)


def _records(sc: Scratch) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(sc.records.glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out.setdefault(doc.get("stage", "?"), []).append(doc)
    return out


def _payload(stage: str, rec: dict[str, Any], *, need: tuple[str, ...] = ("status",),
             status: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """The tool's final JSON payload per the contract (indented, at the end of stdout)."""
    text = rec.get("stdout", "")
    try:
        obj = last_json_object(text, source=stage)
    except ToolOutputError:
        return None, f"{stage} printed no JSON object (the real tool prints its payload as indented JSON at the end)"
    tail = text[text.rstrip().rfind("\n{") + 1:] if "\n{" in text else text
    indented = "\n" in tail.strip()
    for key in need:
        if key not in obj:
            shape = "an indented" if indented else "a one-line"
            return obj, f"{stage} printed {shape} JSON object without `{key}`"
    if not indented:
        return obj, f"{stage} printed its JSON payload on one line; the real tool prints it indented ({CONTRACT} §0)"
    if status is not None and obj.get("status") != status:
        return obj, f"{stage} reported status {obj.get('status')!r}, not {status!r}"
    return obj, None


def _exit(stage: str, rec: dict[str, Any], want: int = 0) -> str | None:
    rc = rec.get("returncode")
    if rc == want:
        return None
    err = [ln for ln in str(rec.get("stderr_tail", "")).splitlines() if ln.strip()]
    last = f" ({err[-1].strip()[:200]})" if err else ""
    return f"{stage} exited {rc}{last}, expected {want}"


def _lacks(path: Path, keys: tuple[str, ...]) -> str | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{path.name} was not written ({path})"
    except (OSError, ValueError) as exc:
        return f"{path.name} is not valid JSON ({type(exc).__name__})"
    for dotted in keys:
        cur: Any = data
        for part in dotted.split("."):
            if not isinstance(cur, dict) or part not in cur:
                return f"{path.name} lacks `{dotted}`"
            cur = cur[part]
    return None


def _analyst_errors(cards: Path) -> str | None:
    """ANALYST_ERROR failure cards (latest per retry trace): the analyst never judged those
    retries, yet the sidecar and analyze still exit 0 with success-shaped counts (contract: a
    failed analysis is silent), so the round would get 0 candidates from them unnoticed."""
    latest: dict[str, dict[str, Any]] = {}
    try:
        lines = cards.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for ln in lines:
        try:
            card = json.loads(ln)
        except ValueError:
            continue
        if isinstance(card, dict) and isinstance(card.get("source_trajectory_id"), str):
            latest[card["source_trajectory_id"]] = card
    errs = [c for c in latest.values() if c.get("status") == "ANALYST_ERROR"]
    if not errs:
        return None
    err = errs[0].get("error") if isinstance(errs[0].get("error"), dict) else {}
    return (f"the analyst failed on {len(errs)} of {len(latest)} full-skill retry traces (ANALYST_ERROR "
            f"{err.get('type', '?')}: {str(err.get('message', ''))[:240]}); their cards count as analyzed but "
            "give no candidates")


def judge(cfg: Config, layout: Layout, sc: Scratch, journal: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """One verdict per stage: ``ok``, ``skipped (...)``, ``not reached``, or the mismatch."""
    recs = _records(sc)
    runs, rid, nxt = layout.runs, "round-000", "round-001"
    failed = next((e for e in journal if e.get("event") == "transition" and e.get("dst") == "FAILED"), None)
    stopped = next((e for e in journal if e.get("event") == "transition" and e.get("dst") == "STOPPED"), None)
    done = any(e.get("event") == "transition" and e.get("dst") == "DONE" for e in journal)
    entered = {e.get("dst") for e in journal if e.get("event") == "transition"}
    verdicts: dict[str, str | None] = {}

    def last(stage: str) -> dict[str, Any] | None:
        return recs.get(stage, [None])[-1]

    # Contract checks on what each tool printed and wrote.
    if (r := last("train.emit_command")) is not None:
        lines = [ln for ln in r["stdout"].splitlines() if ln.strip()]
        missing = [n for n in ("slime", "analysis", "val", "gate") if not (runs / "loop" / rid / f"{n}.yaml").is_file()]
        verdicts["train.emit_command"] = _exit("train.emit_command", r) or (
            f"train.emit_command did not write {', '.join(f'{n}.yaml' for n in missing)} in runs/loop/{rid}"
            if missing else None) or (
            f"train.emit_command printed {len(lines)} lines; the real emitter prints one (the loop dir)"
            if len(lines) != 1 else None) or next(
            (f"train.emit_command: {n}" for n in r.get("notes", []) if "failed" in n), None)
    if (r := last("train.check_command")) is not None:
        verdicts["train.check_command"] = _exit("train.check_command", r) or _payload(
            "train.check_command", r, status="ready")[1]
    if (r := last("sidecar.command")) is not None:
        verdicts["sidecar.command"] = _exit("sidecar.command", r) or _payload(
            "sidecar.command", r, status="watched")[1]
    if (r := last("val.command")) is not None:
        verdicts["val.command"] = _exit("val.command", r) or _lacks(
            runs / f"{rid}-bare-val" / "summary.json",
            ("schema_version", "counts.requested", "counts.completed", "counts.failed", "counts.coverage",
             "primary.reward_mean", "primary.success_rate"))
    if (r := last("gate.analyze_command")) is not None:
        adir = runs / f"{rid}-online-analysis"
        summary = adir / "analysis_summary.json"
        try:
            failed_shape = json.loads(summary.read_text()).get("status") == "failed"
        except (OSError, ValueError, AttributeError):
            failed_shape = False
        keys = ("schema_version", "error.type", "error.message") if failed_shape else (
            "schema_version", "triage_groups", "analyzed_cards", "eligible_cards", "candidates")
        verdicts["gate.analyze_command"] = _exit("gate.analyze_command", r) or _payload(
            "gate.analyze_command", r, need=())[1] or _lacks(summary, keys) or _lacks(
            adir / "candidate_pool.json", ("schema_version", "candidates")) or _analyst_errors(
            adir / "failure_cards.jsonl")
    if (r := last("gate.command")) is not None:
        gdir = runs / f"{rid}-online-gate"
        manifest = gdir / "online_gate_manifest.json"
        bad = _lacks(manifest, ("schema_version", "status", "input", "summary"))
        if bad is not None and not manifest.exists() and r.get("returncode") != 0:
            # The real gate's pre-rollout errors (contract: exit 1, traceback, no manifest): name
            # the error itself, and why the rehearsal's split provoked it when it did.
            emit = last("train.emit_command") or {}
            small = next((n for n in emit.get("notes", []) if n.startswith("val split too small")), None)
            err = [ln.strip() for ln in str(r.get("stderr_tail", "")).splitlines() if ln.strip()]
            bad = (f"gate.command exited {r.get('returncode')}" + (f" ({err[-1][:200]})" if err else "")
                   + " and wrote no online_gate_manifest.json" + (f"; {small}" if small else ""))
        if bad is None:
            status = json.loads(manifest.read_text()).get("status")
            want = 0 if status == "complete" else 1
            bad = (f"gate.command exited {r['returncode']} but online_gate_manifest.json says {status!r} (the real "
                   f"gate exits 0 when complete, 1 when incomplete)" if r["returncode"] != want else None)
            if bad is None and status == "complete":
                bad = _lacks(gdir / "selected_skillbank.json", ("skills",))
            bad = bad or _payload("gate.command", r)[1]
        verdicts["gate.command"] = bad
    if (r := last("inject.command")) is not None:
        verdicts["inject.command"] = _exit("inject.command", r) or _payload("inject.command", r, need=())[1] or _lacks(
            runs / nxt / "curriculum.json", ("schema_version", "round_id", "state_id", "chunks"))
    # The trainer stand-in ran under the campaign's own progress pattern.
    train_log = layout.stage_log(0, "TRAIN")
    if True:
        text = train_log.read_text(errors="replace") if train_log.is_file() else ""
        if re.search(r"^=== shoprld \S+ start trainer", text, re.M):
            if not re.search(cfg.train.progress_pattern, text):
                example = next((ln for ln in text.splitlines() if "- rollout " in ln), "")[:120]
                verdicts["train.command (slime stand-in)"] = (
                    f"train.progress_pattern {cfg.train.progress_pattern!r} never matched slime's progress lines "
                    f"(e.g. {example!r}); the daemon would restart a healthy trainer as stalled")
    # The engine's own outcome: the failing state's message goes to the last of its stages that
    # ran (the one that was running when it failed); the stages after it were not reached.
    error = next((e for e in journal if e.get("event") == "stage.error"), None)
    blame = failed.get("src") if failed else error.get("state") if error else stopped.get("src") if stopped else None
    message = ((failed or {}).get("message") or (error or {}).get("error")
               or (stopped and f"stopped: {stopped.get('message')}") or "failed")
    configured = {"train.check_command": bool(cfg.train.check_command), "sidecar.command": cfg.sidecar.enabled
                  and bool(cfg.sidecar.command), "inject.command": bool(cfg.inject.command),
                  "gate.analyze_command": bool(cfg.gate.analyze_command), "gate.command": bool(cfg.gate.command),
                  "train.emit_command": bool(cfg.train.emit_command)}
    text = train_log.read_text(errors="replace") if train_log.is_file() else ""
    ran = {n for n, _ in STAGES if n in recs} | {"preflight", "shopsim", "export", "ledger row"}
    if re.search(r"^=== shoprld \S+ start trainer", text, re.M):
        ran.add("train.command (slime stand-in)")
    states = [s for _, s in STAGES]
    blamed_stage = None
    if blame in states:
        in_state = [n for n, s in STAGES if s == blame and configured.get(n, True)]
        ran_here = [n for n in in_state if n in ran]
        blamed_stage = (ran_here or in_state or [None])[-1]
    out: list[tuple[str, str]] = []
    after = False
    for name, state in STAGES:
        if not configured.get(name, True):
            out.append((name, "skipped (not configured)"))
            continue
        found = verdicts.get(name)
        if name == blamed_stage:
            out.append((name, found or message))
            after = True
        elif found:
            out.append((name, found))
        elif after or (blame is None and not done and state not in entered) or (
                blame is not None and state not in entered):
            out.append((name, "not reached"))
        else:
            out.append((name, "ok"))
    if blame is not None and blamed_stage is None:
        out.append(("engine", message))
    return out


def _journal(state_dir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        lines = (state_dir / "journal.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        return out
    for ln in lines:
        try:
            out.append(json.loads(ln))
        except ValueError:
            continue
    return out


def run_rehearse(config: Path, *, keep: bool = False, real_analyst: bool = False, debug: bool = False,
                 time_limit: float = TIME_LIMIT_S, scratch_dir: Path | None = None, notify: bool = False) -> int:
    """``shoprld rehearse``: the verdicts on stdout; 0 all ok, 6 any stage not ok."""
    t0 = time.monotonic()
    cfg = load_config(config)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    validate(cfg, layout)
    secrets.require(cfg.required_secrets())
    lock = _RealLock(layout.state_dir)
    parent = scratch_dir or (cfg.storage.ephemeral_root if cfg.storage.ephemeral_root.is_dir() else None)
    sc = Scratch(Path(tempfile.mkdtemp(prefix="shoprld-rehearse-", dir=parent)).resolve())
    sc.records.mkdir()
    (sc.root / "ephemeral").mkdir()
    link = _RunsLink(layout.project_root / "runs")
    analyst: subprocess.Popen[bytes] | None = None
    timer: threading.Timer | None = None
    code = EXIT_STAGE
    print(f"shoprld rehearse: {cfg.campaign.name} / {cfg.campaign.experiment}: 1 round x {ROLLOUTS} rollouts, "
          f"scratch {sc.root}")
    print(f"  stand-ins: slime, the val server{'' if real_analyst else ', the analyst LLM API'}; "
          f"ShopSim port {sc.shopsim_port}, val port {sc.val_port}")
    sys.stdout.flush()
    try:
        _prepare_models(sc)
        scfg = derive(cfg, layout, sc, real_analyst=real_analyst, notify=notify)
        slayout = Layout.from_config(scfg)
        if not real_analyst:
            analyst = subprocess.Popen(
                [sys.executable, str(demo_dir() / "analyst_llm.py"), "--port", str(sc.analyst_port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        configure(level="DEBUG" if debug else "WARNING", stream=sys.stderr, redactor=secrets.redactor)
        engine = Engine(scfg, slayout, secrets, notify_marker=REHEARSAL_MARKER)
        # Past the limit the engine gets SIGTERM: it stops every child as on any stop request.
        timer = threading.Timer(time_limit, lambda: os.kill(os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()
        anyio.run(engine.main)
        verdicts = judge(scfg, slayout, sc, _journal(slayout.state_dir))
    finally:
        if timer is not None:
            timer.cancel()
        if analyst is not None:
            analyst.terminate()
            try:
                analyst.wait(timeout=10)
            except subprocess.TimeoutExpired:
                analyst.kill()
                analyst.wait()
        link.restore()
        lock.release()
    took = time.monotonic() - t0
    if took >= time_limit:
        verdicts.append(("time", f"ran past the {time_limit:.0f}s limit and was stopped"))
    width = max(len(n) for n, _ in verdicts) + 2
    for name, verdict in verdicts:
        print(f"  {name:<{width}}{secrets.redact(verdict)}")
    bad = [n for n, v in verdicts if v not in ("ok",) and not v.startswith("skipped")]
    if bad:
        unreached = sum(1 for n, v in verdicts if v == "not reached")
        print(f"rehearse: NOT READY: {len(bad) - unreached} stage(s) not ok, {unreached} not reached; first "
              f"{bad[0]} ({took:.1f}s)")
        code = EXIT_STAGE
    else:
        print(f"rehearse: ok: every stage ran and matches the tools contract ({took:.1f}s)")
        code = EXIT_OK
    if keep:
        print(f"  kept {sc.root} (stage logs in {slayout.logs})")
    else:
        shutil.rmtree(sc.root, ignore_errors=True)
    return code
