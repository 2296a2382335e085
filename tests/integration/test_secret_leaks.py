"""The secret-leak scan: canary values for every secret key never leave the children's env."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.ops.demo import FAKE_ENV
from tests.demotree import CmdlineSampler, kill_tree_leftovers, leak_hits, make_tree, reference_run, run_daemon

CANARIES = {
    "WANDB_API_KEY": "canary-wandb-5f1d0c2e9b7a",
    "BAILIAN_API_KEY": "canary-bailian-8e2f4a6c1d3b",
    "HF_TOKEN": "canary-hftoken-3c5e7a9b1d2f",
    "HUGGING_FACE_HUB_TOKEN": "canary-hfhub-7b9d1f3a5c8e",
}


@pytest.mark.smoke
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
    cli = [sys.executable, "-m", "shoprld.daemon.ops.cli"]
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
        from shoprld.daemon.ops.unit import render

        texts["systemd unit"] = render(campaign, user=False).text
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


# A check command that reads the key from .env itself and echoes it in its failure verdict, as a
# real tool does with "401 invalid key <key>": the daemon builds its failure message from that
# output, so the message carries the secret however carefully the daemon handled the env.
LEAKY_CHECK = """
import json, sys
from pathlib import Path
key = next(l.split("=", 1)[1] for l in Path(sys.argv[1]).read_text().splitlines() if l.startswith("WANDB_API_KEY="))
print("auth check: 401 invalid key " + key)
print(json.dumps({"status": "error", "detail": "401 invalid key " + key}))
"""


def test_a_failure_message_built_from_child_output_is_redacted_everywhere_it_is_persisted(tmp_path: Path) -> None:
    """A stage whose failure output contains a .env secret: after the failure, no file in the state dir,
    no ledger, no daemon stdout/stderr, no `status` or `status --json` output contains it, and the
    failure itself is still recorded (with the secret masked)."""
    canary = CANARIES["WANDB_API_KEY"]
    script = tmp_path / "leaky_check.py"
    script.write_text(LEAKY_CHECK)
    env_file = tmp_path / "repo" / ".env"
    campaign = make_tree(tmp_path, rounds=1, edits={
        # the demo's own check_command (it spans lines) replaced by the leaky one
        r"^check_command = \[[^\]]*\]\n": f'check_command = ["{{python}}", "{script}", "{env_file}"]\n'})
    env_file.write_text("".join(f"{k}={v}\n" for k, v in CANARIES.items()))
    try:
        proc = run_daemon(campaign)
    finally:
        kill_tree_leftovers(tmp_path)
    assert proc.returncode == 6, proc.stderr[-2000:]
    cli = [sys.executable, "-m", "shoprld.daemon.ops.cli"]
    texts = {
        "daemon stdout+stderr": proc.stdout + proc.stderr,
        "status": subprocess.run([*cli, "status", "-c", str(campaign)], capture_output=True, text=True).stdout,
        "status --json": subprocess.run([*cli, "status", "--json", "-c", str(campaign)], capture_output=True,
                                        text=True).stdout,
        "ledger": subprocess.run([*cli, "ledger", "-c", str(campaign)], capture_output=True, text=True).stdout,
    }
    state = tmp_path / "state"
    hits = [h for h in leak_hits(tmp_path, [canary], texts)
            if not h.startswith(str(tmp_path / "ephemeral")) or "shoprld.log" in h]  # the child's own log is its own
    assert hits == [], hits
    assert "401 invalid key ***" in (state / "state.json").read_text()
    assert "401 invalid key ***" in texts["status --json"]
    # The demo made its state dir 0755; the daemon closed it, and every file in it, to its user.
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in state.iterdir() if p.is_file()}
    assert {"state.json", "journal.jsonl", "status.json"} <= set(modes) and set(modes.values()) == {0o600}, modes
