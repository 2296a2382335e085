"""A real SIGHUP to a real daemon: a reload `check` would refuse is refused whole (journaled, the
campaign goes on unharmed); one that passes is in effect at once: the [notify] it adds pages a
real loopback receiver, the [metrics] it adds writes its textfile, and a key it makes secret
(train.secrets) is masked from then on in the journal, state.json, status.json, the log, the
crash bundles, the pages and the last stderr line."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, start_daemon, wait_for
from tests.receiver import Receiver

PROBE = "probe-visible-1234567"
# Round 1's trainer after the reload: prints the value the way a failing tool quotes its
# config, then fails (every retry the same), so the campaign ends FAILED with that line.
LEAKY_TRAINER = ('command = ["{python}", "-c", "import os, sys; print(\'RuntimeError: login refused for key \' '
                 '+ os.environ[\'PROBE_VALUE\'], flush=True); sys.exit(1)"]')


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _events(root: Path, name: str) -> list[dict]:  # type: ignore[type-arg]
    try:
        return [j for j in journal(root) if j.get("event") == name]
    except (OSError, ValueError):
        return []


def test_sighup_is_all_or_nothing_and_a_new_secret_is_masked_from_then_on(tmp_path: Path) -> None:
    campaign = make_tree(tmp_path, rounds=2, edits={r'^step_seconds = "0.01"$': 'step_seconds = "0.4"'})
    env = tmp_path / "repo" / ".env"
    prom = tmp_path / "textfile" / "shoprld.prom"
    with Receiver() as r:
        env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={r.url}\nPROBE_VALUE={PROBE}\n")
        good = campaign.read_text()
        proc = start_daemon(campaign)
        try:
            wait_for(lambda: any(j.get("dst") == "TRAIN" for j in _events(tmp_path, "transition")), 120,
                     "round 0's TRAIN")
            # 1. What check refuses: a val.command naming a missing tool, plus a [notify] that would work.
            val = 'command = ["{python}", "{demo_dir}/shopsimrl.py", "run", "{loop_dir}/val.yaml"]'
            assert val in good
            campaign.write_text(good.replace(val, 'command = ["no-such-tool-xyz", "run", "{loop_dir}/val.yaml"]')
                                + '\n[notify]\nendpoints = [{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL" }]\n')
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: _events(tmp_path, "config.reload_refused"), 60, "the refusal")
            # 2. What check accepts: [notify], [metrics], a new secret, and round 1's trainer.
            text = good.replace('secrets = ["WANDB_API_KEY"]', 'secrets = ["WANDB_API_KEY", "PROBE_VALUE"]', 1)
            text = text.replace("retries = 3\n", "retries = 1\n", 1)
            head, sep, rest = text.partition('command = ["{python}", "{demo_dir}/slime_train.py",')
            assert sep
            rest = rest[rest.index('"--disable-wandb-random-suffix"]') + len('"--disable-wandb-random-suffix"]'):]
            campaign.write_text(head + LEAKY_TRAINER + rest
                                + '\n[notify]\nendpoints = [{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL" }]\n'
                                + f'backoff = 0.05\n\n[metrics]\ntextfile = "{prom}"\n')
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: _events(tmp_path, "config.reloaded"), 60, "the reload")
            out, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    refused = _events(tmp_path, "config.reload_refused")
    assert len(refused) == 1 and "val.command" in refused[0]["reason"], refused
    reloaded = _events(tmp_path, "config.reloaded")
    assert len(reloaded) == 1
    assert {"train.secrets", "train.command", "notify.endpoints", "metrics.textfile"} <= set(reloaded[0]["changed"])
    # The refused config never ran: round 0's VAL passed with the old command.
    assert any(j.get("state") == "VAL" and j.get("kind") == "done" for j in _events(tmp_path, "stage.outcome"))
    # Round 1's trainer (the reloaded command) failed: exit 6, its line masked.
    assert proc.returncode == 6, out[-3000:]
    assert "failed" in r.events(), r.events()  # [notify] added by the reload is in effect
    assert prom.is_file() and "shoprld_state" in prom.read_text()  # so is [metrics]
    texts = {p: p.read_text(errors="replace") for p in (tmp_path / "state").rglob("*") if p.is_file()}
    texts.update({p: p.read_text(errors="replace") for p in (tmp_path / "ephemeral").rglob("*.log") if p.is_file()
                  and p.name == "shoprld.log"})
    bundles = [p for p in (tmp_path / "ephemeral").rglob("*") if p.is_file() and "attempts" in p.parts]
    texts.update({p: p.read_text(errors="replace") for p in bundles})
    # The crash bundles quote the trainer's line, masked (the stage's own raw log is the child's).
    assert any("login refused for key ***" in texts[p] for p in bundles if p.name == "log-tail.txt")
    leaks = [str(p) for p, t in texts.items() if PROBE in t]
    assert leaks == [], leaks
    assert PROBE not in out.splitlines()[-1], out.splitlines()[-1]
    assert all(PROBE.encode() not in q.body for q in r.requests)
