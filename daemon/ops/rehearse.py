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

A failing stage does not end the rehearsal: the engine runs again (resuming the round) with
that stage switched off, so every stage that can run does, and one rehearsal lists every
mismatch; build-curriculum, which needs only files, runs on its own when INJECT is not
reached. Then every stage gets a verdict (rehearse_judge.py), ``ok`` or the exact mismatch
against the tools contract (``shared/contracts/shopsimrl-tools.md``), and one overall line. A
failed rehearsal keeps its logs and says where. Exit 0 when every stage is ok, 6 otherwise, 3
for a config the campaign itself could not run with.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
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

from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.core.engine import Engine
from shoprld.daemon.foundation.system.errors import EXIT_OK, EXIT_STAGE, LockError, ShoprldError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.system.logs import configure
from shoprld.daemon.round.plan import demo_dir, resolve
from shoprld.daemon.foundation.config.secrets import Secrets, load_secrets
from shoprld.daemon.foundation.config.condaenv import activation_argv
from shoprld.daemon.ops.rehearse_judge import (CONTRACT, SECTION, TRAINER, Pass, judge_pass, merge, read_records,
                                              tool_verdicts)
from shoprld.daemon.services.validate import validate

TIME_LIMIT_S = 600.0
ROLLOUTS = 2
VAL_TASKS = 4
EPISODE_CONCURRENCY = 2
VAL_CONCURRENCY = 2
# Engine runs at most: each after the first resumes with one more failing stage switched off.
MAX_PASSES = 1 + 6  # the first, then one per stage that can be switched off (SWITCH_OFF, emit)
# The stages a pass may run without (the later stages then run on what the earlier ones left).
SWITCH_OFF = frozenset({"train.check_command", "sidecar.command", "gate.analyze_command", "gate.command",
                        "inject.command"})
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


def _wrap(cmd: tuple[str, ...], stage: str, sc: Scratch, *, emit_spec: Path | None = None,
          conda: Path | None = None, cwd: Path | None = None) -> tuple[str, ...]:
    """``cmd`` inside :mod:`rehearse_tool`, in the campaign's conda env for it (``conda``: the
    same activation ``run`` uses, condaenv.py) inside the wrapper, so that the wrapper itself
    runs on shoprld's Python whatever the env's hooks set. ``cwd``: for emit and check, which
    run under ``[train]``, whose cwd the trainer stand-in replaces."""
    if not cmd:
        return cmd
    extra = ("--emit-spec", str(emit_spec), "--loop-dir", "{loop_dir}") if emit_spec else ()
    where = ("--cwd", str(cwd)) if cwd is not None else ()
    inner = tuple(activation_argv(conda, list(cmd))) if conda is not None else cmd
    return ("{python}", "-m", "shoprld.daemon.ops.rehearse_tool", "--record", str(sc.records), "--stage", stage,
            *extra, *where, "--", *inner)


def derive(cfg: Config, layout: Layout, sc: Scratch, *, real_analyst: bool, notify: bool = False,
           off: frozenset[str] = frozenset()) -> Config:
    """The scratch config: the campaign's own tools and ShopSim, stand-ins for the GPU/API parts.
    Nothing of production's operator kit: no page unless ``notify`` (then marked, see
    :data:`REHEARSAL_MARKER`), no digest, and the metrics textfile in the scratch dir.

    ``off``: the stages an earlier pass found failing, switched off so that this pass runs the
    ones after them (see :data:`SWITCH_OFF`). An incomplete gate never stops a rehearsal (the
    seed's ``continue``): INJECT still runs, keeping the current SkillBank."""
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
        "emit_command": () if "train.emit_command" in off else _wrap(
            t.emit_command, "train.emit_command", sc, emit_spec=spec_file, conda=t.conda_prefix, cwd=t.cwd),
        "check_command": () if "train.check_command" in off else _wrap(
            t.check_command, "train.check_command", sc, conda=t.conda_prefix, cwd=t.cwd),
        # Wrapped too: its own output, apart from the sidecar's in the same stage log, is what
        # names a trainer that died (rehearse_judge's trainer verdict).
        "command": _wrap(("{python}", f"{demo}/slime_train.py", "--hf-checkpoint", "{origin_hf_dir}",
                          "--load", "{load}",
                    "--save", "{save_dir}", "--save-interval", "{save_interval}", "--save-hf", "{hf_dir}",
                    "{async_save}", "{async_save_worker}",
                    "--custom-config-path", "{loop_dir}/slime.yaml", "--num-rollout", "{num_rollout}",
                    "--use-wandb", "--wandb-mode", "offline", "--wandb-project", "{wandb_project}",
                    "--wandb-group", "{wandb_group}", "--wandb-dir", "{wandb_dir}"), TRAINER, sc),
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
        "command": _wrap(v.command, "val.command", sc, conda=v.conda_prefix), "conda_prefix": None,
    })
    g = cfg.gate
    gate = g.model_copy(update={
        **no_retry, "timeout": 300.0, "policy": "continue", "empty_analysis": "continue",
        "conda_prefix": None,
        "analyze_command": () if "gate.analyze_command" in off else _wrap(g.analyze_command, "gate.analyze_command",
                                                                            sc, conda=g.conda_prefix),
        # Switched off, the gate "exits 1 with no manifest": the seed's loop then keeps the current
        # SkillBank, and so does INJECT here.
        "command": ("{python}", "-c", "raise SystemExit(1)") if "gate.command" in off else _wrap(
            g.command, "gate.command", sc, conda=g.conda_prefix)})
    # The one rehearsed round is the scratch campaign's last: build its curriculum all the same,
    # so that build-curriculum is checked too.
    inject = cfg.inject.model_copy(update={**no_retry, "conda_prefix": None,
                                           "command": _wrap(cfg.inject.command, "inject.command", sc,
                                                            conda=cfg.inject.conda_prefix),
                                           "after_last_round": "inject.command" not in off})
    sidecar = cfg.sidecar.model_copy(update={**no_retry, "drain_timeout": 60.0,
                                             "enabled": cfg.sidecar.enabled and "sidecar.command" not in off,
                                             "conda_prefix": None,
                                             "command": _wrap(cfg.sidecar.command, "sidecar.command", sc,
                                                              conda=cfg.sidecar.conda_prefix)})
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


def _switch_off(blamed: str | None, layout: Layout) -> str | None:
    """The stage the next pass runs without, so that the stages after ``blamed`` run on what
    exists; None when nothing after it can run (its output is the later stages' input)."""
    if blamed in SWITCH_OFF:
        return blamed
    if blamed == "train.emit_command" and all(
            (layout.runs / "loop" / "round-000" / f"{n}.yaml").is_file() for n in ("slime", "analysis", "val", "gate")):
        return blamed  # it wrote the YAMLs (and failed otherwise): the round goes on with them
    return None


def _inject_alone(scfg: Config, slayout: Layout, secrets: Secrets, sc: Scratch,
                  verdicts: list[tuple[str, str]], timeout: float) -> list[tuple[str, str]]:
    """build-curriculum needs only files: when the engine never reached INJECT, run it anyway,
    as INJECT would have after a failed gate (on the current SkillBank), with the same argv,
    env, conda env and cwd, so that its mismatches are known too."""
    now = dict(verdicts)
    if not scfg.inject.command or not now.get("inject.command", "").startswith("not reached"):
        return verdicts
    values = resolve(scfg, slayout, 0, secrets)
    values.plan.next_runs_dir.mkdir(parents=True, exist_ok=True)
    if scfg.storage.manage_runs_link:
        slayout.ensure_runs_link()  # what the tools hard-code (put back by _RunsLink after)
    before = {f.name for f in sc.records.glob("*.json")}
    log = slayout.stage_log(0, "INJECT")
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = values.wrap(values.argv(scfg.inject.command), scfg.inject)
    with open(log, "ab") as fh:
        shown = secrets.redact(" ".join(argv))
        fh.write(f"=== shoprld rehearse: inject.command run on its own (INJECT not reached): {shown}\n".encode())
        fh.flush()
        try:
            proc = subprocess.Popen(argv, env=values.env(scfg.inject), cwd=scfg.inject.cwd or slayout.project_root,
                                    stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except OSError as exc:
            fh.write(f"=== shoprld rehearse: cannot start it: {exc}\n".encode())
            return verdicts
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the wrapper and the tool
            proc.wait()
            fh.write(f"=== shoprld rehearse: stopped after {timeout:.0f}s (the rehearsal's time limit)\n".encode())
    new = {f.name for f in sc.records.glob("*.json")} - before
    records = read_records(sc.records, new)
    if "inject.command" not in records:
        return verdicts
    found = tool_verdicts(Pass(scfg, slayout, [], records)).get("inject.command")
    verdict = (found + ("" if CONTRACT in found else f" [{CONTRACT} {SECTION['inject.command']}]") if found else
               "ok (run on its own, on the current SkillBank: INJECT was not reached)")
    return [(n, verdict if n == "inject.command" else v) for n, v in verdicts]


def _keep_logs(sc: Scratch, slayout: Layout) -> None:
    """A failed rehearsal's scratch dir stays, for its stage logs, tool records, journal and
    the tools' output files the verdicts name; only the bulky stand-in weights go."""
    for bulky in (sc.root / "models", slayout.save_dir):
        shutil.rmtree(bulky, ignore_errors=True)


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
    timed_out = threading.Event()
    passes: list[Pass] = []
    off: set[str] = set()
    print(f"shoprld rehearse: {cfg.campaign.name} / {cfg.campaign.experiment}: 1 round x {ROLLOUTS} rollouts, "
          f"scratch {sc.root}")
    print(f"  stand-ins: slime, the val server{'' if real_analyst else ', the analyst LLM API'}; "
          f"ShopSim port {sc.shopsim_port}, val port {sc.val_port}")
    sys.stdout.flush()

    def out_of_time() -> None:
        timed_out.set()
        os.kill(os.getpid(), signal.SIGTERM)

    # Between two passes no engine holds SIGTERM: a stop (the time limit's, or anyone's) must
    # then end the rehearsal through its cleanup, never kill it with the runs link re-pointed.
    stop_asked = threading.Event()

    def on_term(_s: int, _f: object) -> None:
        stop_asked.set()

    old_term = signal.signal(signal.SIGTERM, on_term)

    try:
        _prepare_models(sc)
        scfg = derive(cfg, layout, sc, real_analyst=real_analyst, notify=notify)
        slayout = Layout.from_config(scfg)
        if not real_analyst:
            analyst = subprocess.Popen(
                [sys.executable, str(demo_dir() / "analyst_llm.py"), "--port", str(sc.analyst_port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        # A rehearsal's failures are expected events: the engine's warnings go to the scratch
        # dir's logs/shoprld.log (kept after a failed rehearsal, and named at the end), and the
        # terminal gets the verdicts, not the same failures again as raw JSON lines.
        # (os.devnull stays open: the root logger's handler holds it until the process ends.)
        quiet = sys.stderr if debug else open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
        configure(level="DEBUG" if debug else "WARNING", stream=quiet, redactor=secrets.redactor)
        # Past the limit the engine gets SIGTERM: it stops every child as on any stop request.
        timer = threading.Timer(time_limit, out_of_time)
        timer.daemon = True
        timer.start()
        for _ in range(MAX_PASSES):
            scfg = derive(cfg, layout, sc, real_analyst=real_analyst, notify=notify, off=frozenset(off))
            slayout = Layout.from_config(scfg)
            journal_at = len(_journal(slayout.state_dir))
            records_before = {f.name for f in sc.records.glob("*.json")}
            log_at = _size(slayout.stage_log(0, "TRAIN"))
            failure: ShoprldError | None = None
            try:
                anyio.run(Engine(scfg, slayout, secrets, notify_marker=REHEARSAL_MARKER).main)
            except ShoprldError as exc:
                if not passes:
                    raise  # the campaign's own config: one line, exit 3, as `run`
                failure = exc  # a later pass: the verdicts so far stand, and say where it ended
            finally:
                signal.signal(signal.SIGTERM, on_term)  # asyncio put back SIG_DFL when the engine's loop closed
            new = {f.name for f in sc.records.glob("*.json")} - records_before
            p = judge_pass(Pass(scfg, slayout, _journal(slayout.state_dir)[journal_at:], read_records(sc.records, new),
                                trainer_log=_read_from(slayout.stage_log(0, "TRAIN"), log_at)))
            if failure is not None:
                p.blamed, p.message = "engine", f"engine pass {len(passes) + 1} ended: {failure}"
            passes.append(p)
            if failure is not None:
                break
            if timed_out.is_set() or stop_asked.is_set() or p.stopped:
                break
            nxt = _switch_off(p.blamed, slayout)
            if nxt is None or nxt in off:
                break
            off.add(nxt)
        verdicts = merge(passes)
        if not (timed_out.is_set() or stop_asked.is_set() or passes[-1].stopped):
            verdicts = _inject_alone(scfg, slayout, secrets, sc, verdicts,
                                     timeout=max(5.0, time_limit - (time.monotonic() - t0)))
    finally:
        if timer is not None:
            timer.cancel()
        signal.signal(signal.SIGTERM, old_term)
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
    if timed_out.is_set():
        verdicts.append(("time", f"ran past the {time_limit:.0f}s limit and was stopped"))
    # The engine names the tools' files by <project_root>/runs, the link that is put back by now:
    # name them where they are (the scratch experiment dir), never by a path that is gone.
    link_runs = str(layout.project_root / "runs")
    verdicts = [(n, v.replace(link_runs + "/", f"{slayout.runs}/")) for n, v in verdicts]
    width = max(len(n) for n, _ in verdicts) + 2
    for name, verdict in verdicts:
        print(f"  {name:<{width}}{secrets.redact(verdict)}")
    bad = [n for n, v in verdicts if not v.startswith(("ok", "skipped"))]
    runs_note = f"{len(passes)} engine passes, switched off after failing: {', '.join(sorted(off))}" if off else ""
    if bad:
        unreached = sum(1 for n, v in verdicts if v.startswith("not "))
        first = next((n for n, v in verdicts if n in bad and not v.startswith("not ")), bad[0])
        print(f"rehearse: NOT READY: {len(bad) - unreached} stage(s) not ok, {unreached} not reached; first "
              f"{first} ({took:.1f}s{'; ' + runs_note if runs_note else ''})")
        code = EXIT_STAGE
    else:
        print(f"rehearse: ok: every stage ran and matches the tools contract ({took:.1f}s)")
        code = EXIT_OK
    if keep:
        print(f"  kept {sc.root} (stage logs in {slayout.logs})")
    elif code != EXIT_OK:
        _keep_logs(sc, slayout)
        print(f"  logs kept: stage logs in {slayout.logs}, tool records in {sc.records}, the tools' files in "
              f"{slayout.runs}; remove {sc.root} when done")
    else:
        shutil.rmtree(sc.root, ignore_errors=True)
    return code


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
