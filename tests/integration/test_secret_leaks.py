"""The secret-leak scan: canary values for every secret key never leave the children's env."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shoprld.daemon.demo import FAKE_ENV
from tests.demotree import CmdlineSampler, kill_tree_leftovers, leak_hits, make_tree, reference_run, run_daemon

CANARIES = {
    "WANDB_API_KEY": "canary-wandb-5f1d0c2e9b7a",
    "BAILIAN_API_KEY": "canary-bailian-8e2f4a6c1d3b",
    "HF_TOKEN": "canary-hftoken-3c5e7a9b1d2f",
    "HUGGING_FACE_HUB_TOKEN": "canary-hfhub-7b9d1f3a5c8e",
}


def test_canaries_appear_nowhere_after_a_crashed_and_resumed_campaign(tmp_path: Path) -> None:
    """With canaries in .env, after a campaign killed mid-TRAIN and resumed: no log, state, journal,
    status (human and JSON), ledger, child cmdline or rendered systemd unit contains any of them,
    while the trainer did receive WANDB_API_KEY (it refuses to run without it)."""
    campaign = make_tree(tmp_path, rounds=2)
    (tmp_path / "repo" / ".env").write_text("".join(f"{k}={v}\n" for k, v in CANARIES.items()))
    sampler = CmdlineSampler(tmp_path)
    sampler.start()
    try:
        env = {"SHOPRLD_TEST_KILL": "TRAIN:spawn-trainer:1", "SHOPRLD_TEST_KILL_DIR": str(tmp_path)}
        assert run_daemon(campaign, env=env).returncode == -9
        done = run_daemon(campaign)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        sampler.stop()
        kill_tree_leftovers(tmp_path)
    cli = [sys.executable, "-m", "shoprld.daemon.cli"]
    texts = {
        "status": subprocess.run([*cli, "status", "-c", str(campaign)], capture_output=True, text=True).stdout,
        "status --json": subprocess.run([*cli, "status", "--json", "-c", str(campaign)], capture_output=True,
                                        text=True).stdout,
        "check --print-commands": subprocess.run([*cli, "check", "--print-commands", "-c", str(campaign)],
                                                 capture_output=True, text=True).stdout,
        "daemon stdout+stderr": done.stdout + done.stderr,
        "cmdlines": "\n".join(sampler.cmdlines.values()),
    }
    try:
        from shoprld.daemon.service import render_unit

        texts["systemd unit"] = render_unit(campaign, user=False)
    except ImportError:
        pass
    assert len(sampler.cmdlines) >= 10  # we did watch the children
    assert any("slime_train.py" in c for c in sampler.cmdlines.values())
    assert leak_hits(tmp_path, list(CANARIES.values()), texts) == []


def test_demo_fake_keys_are_treated_as_secrets(tmp_path: Path) -> None:
    """The demo's own (fake) keys are masked like real ones in every file of a finished demo run."""
    reference_run(tmp_path, 1)
    values = [line.split("=", 1)[1] for line in FAKE_ENV.splitlines() if "=" in line and not line.startswith("#")]
    assert leak_hits(tmp_path, values) == []
