"""``shoprld demo``: a whole campaign on the embedded demo stack, in a tree of its own.

    D/campaign.toml   the demo recipe (run/demo/campaign.toml) with free loopback ports
    D/repo/           a stand-in checkout: .env (obviously fake keys), the ledger, cold-start inputs
    D/ephemeral/      the stand-in volume (checkpoints, logs, runs/, caches)
    D/models/         the "converted base model" (Megatron layout, iteration 0) and its HF config
    D/state/          the daemon's state dir (state.json, journal.jsonl, status.json, lock)

Rerunning ``shoprld demo --dir D`` on an existing D resumes instead of starting over.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shoprld.daemon.ops.run import run_campaign
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.roundlog import read as read_rounds
from shoprld.daemon.round.plan import demo_dir
from shoprld.daemon.foundation.system.units import round_label

FAKE_ENV = (
    "# Demo secrets: obviously fake values. The demo's trainer stand-in checks that\n"
    "# WANDB_API_KEY reaches it through its environment (never argv), without printing it.\n"
    "WANDB_API_KEY=demo-fake-wandb-key-0000000000000000\n"
    "BAILIAN_API_KEY=demo-fake-bailian-key-000000000000\n"
)
PACED_STEP_S = "0.25"
FAST_STEP_S = "0.01"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"demo setup failed: {' '.join(argv[:3])}: {tail[0]}")


def create_tree(root: Path, *, fast: bool, rounds: int | None = None) -> Path:
    """Lay out a fresh demo tree under ``root``; returns the campaign file."""
    demo = demo_dir()
    text = (demo / "campaign.toml").read_text(encoding="utf-8")
    text = text.replace("127.0.0.1:5700", f"127.0.0.1:{_free_port()}")
    text = text.replace("127.0.0.1:30000", f"127.0.0.1:{_free_port()}")
    text = re.sub(r'^step_seconds = ".*"$', f'step_seconds = "{FAST_STEP_S if fast else PACED_STEP_S}"', text,
                  flags=re.M)
    if rounds is not None:
        text = re.sub(r"^rounds = \d+$", f"rounds = {rounds}", text, flags=re.M)
    for sub in ("repo", "ephemeral", "models", "state"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    repo = root / "repo"
    if not (repo / ".env").exists():
        (repo / ".env").write_text(FAKE_ENV)
        (repo / ".env").chmod(0o600)
    (repo / ".gitignore").write_text(".env\nruns\n")
    py = sys.executable
    _run([py, str(demo / "slime_train.py"), "--init-base", str(root / "models" / "base_torch_dist")])
    _run([py, str(demo / "shopsimrl.py"), "init-cold-start", "--out", str(repo / "artifacts" / "cold-start")])
    origin = root / "models" / "hf-origin"
    origin.mkdir(parents=True, exist_ok=True)
    (origin / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                                    "hidden_size": 64, "num_hidden_layers": 2}, indent=2))
    _git_init(repo)
    campaign = root / "campaign.toml"
    campaign.write_text(text)
    return campaign


def _git_init(repo: Path) -> None:
    """A real checkout, so the ledger records a commit and a branch like it would on the box."""
    try:
        for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                     ["git", "-c", "user.name=shoprld demo", "-c", "user.email=demo@localhost",
                      "commit", "-q", "-m", "demo checkout"]):
            subprocess.run(argv, cwd=repo, capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        pass  # no git: the ledger's commit columns stay empty


def self_command() -> str:
    """How to run this very shoprld again, pasteable as printed: the venv's console script is
    usually not on PATH, so its absolute path (else this interpreter with ``-m``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "shoprld" and os.path.isfile(argv0):
        return shlex.quote(os.path.abspath(argv0))
    return f"{shlex.quote(sys.executable)} -m shoprld.daemon.ops.cli"


def run_demo(where: Path | None, *, fast: bool = False, debug: bool = False, rounds: int | None = None,
             verbose: bool = False, no_run: bool = False) -> int:
    """Create (or resume) the demo tree in ``where`` and run its campaign.

    With ``no_run`` the tree is written (or left as it is, when it exists) and nothing runs, so
    the campaign file can be edited first (e.g. its ``[shopsim]`` pointed at a real
    ShopSimulator, see run/demo/README.md); ``shoprld demo --dir D`` or ``shoprld run -c
    D/campaign.toml`` runs it afterwards.
    """
    root = (where or Path(tempfile.mkdtemp(prefix="shoprld-demo-"))).resolve()
    campaign = root / "campaign.toml"
    if campaign.exists():
        print(f"shoprld demo: {'the demo tree already exists' if no_run else 'resuming the demo campaign'} "
              f"in {root}")
    else:
        root.mkdir(parents=True, exist_ok=True)
        create_tree(root, fast=fast, rounds=rounds)
        print(f"shoprld demo: new demo {'tree' if no_run else 'campaign'} in {root}")
    print(f"  campaign file  {campaign}")
    print(f"  repo (ledger)  {root / 'repo'}")
    print(f"  volume         {root / 'ephemeral'}")
    print(f"  state dir      {root / 'state'}")
    me = self_command()
    quoted = shlex.quote(str(campaign))
    if no_run:
        print(f"  check it       {me} check -c {quoted}")
        print(f"  run it         {me} demo --dir {shlex.quote(str(root))}   (or: {me} run -c {quoted})")
        return 0
    print(f"  watch it       {me} status --watch -c {quoted}")
    print(f"  stop it        {me} stop -c {quoted}")
    print("                 (Ctrl-C stops it too; rerun the demo with --dir to resume)")
    sys.stdout.flush()
    t0 = time.monotonic()
    code = run_campaign(campaign, debug=debug, verbose=verbose)
    took = time.monotonic() - t0
    _summary(root, code, took)
    _report(campaign, me)
    return code


def _report(campaign: Path, me: str) -> None:
    """Write the campaign report when the report extra is installed; else say how."""
    from shoprld.daemon.ops.report import ReportExtraMissing, write_report  # lazy: the daemon never imports the report (test_report)

    try:
        path = write_report(campaign)
    except ReportExtraMissing:
        from shoprld.daemon.ops.report import INSTALL_HINT  # lazy: as above

        print(f"  report   needs the report extra: {INSTALL_HINT}, then: {me} report -c {shlex.quote(str(campaign))}")
        return
    except Exception as exc:  # the demo's result stands without its report  # noqa: BLE001
        print(f"  report   not written ({type(exc).__name__}: {exc})")
        return
    print(f"  report   {path}")


def _summary(root: Path, code: int, took: float) -> None:
    try:
        status = json.loads((root / "state" / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    print(f"\nshoprld demo: exit {code}, state {status.get('state')}, {took:.1f}s")
    rounds = int(status.get("rounds") or 0)
    for r in read_rounds(root / "state") or status.get("rounds_done", []):  # status.json: the newest only
        val = r.get("val")
        print(f"  {round_label(r['round'], rounds)}  success_rate={'-' if val is None else f'{val:.3g}'}  "
              f"gate={r.get('gate')}  skillbank={r.get('branch')}  {r.get('duration_seconds') or 0:.1f}s")
    ledger = root / "repo" / "reports" / "shoprld" / "demo.tsv"
    if ledger.exists():
        print(f"  ledger   {ledger}")
    print(f"  logs     {next(iter(sorted((root / 'ephemeral').glob('nemo-rl/*/nemo-rl-auto-research/demo/*/logs'))), '')}")
