"""`shoprld rehearse` on a campaign with [notify] (a real loopback receiver) and [metrics]: no
page reaches the receiver and production's textfile is never written; with --notify the pages
arrive, every one marked [rehearsal]."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.demotree import SHOPRLD, make_tree
from tests.receiver import Receiver

KIT = """
[notify]
endpoints = [{{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL" }}]
backoff = 0.05

[metrics]
textfile = "{prom}"
"""


def _rehearse(campaign: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHOPRLD, "rehearse", "-c", str(campaign), *args], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))


def test_rehearse_pages_nobody_and_keeps_off_the_production_textfile(tmp_path: Path) -> None:
    campaign = make_tree(tmp_path, rounds=2)
    prom = tmp_path / "textfile" / "shoprld.prom"
    campaign.write_text(campaign.read_text() + KIT.format(prom=prom))
    with Receiver() as r:
        env = tmp_path / "repo" / ".env"
        env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={r.url}\n")
        quiet = _rehearse(campaign)
        assert quiet.returncode == 0, quiet.stdout[-3000:] + quiet.stderr[-3000:]
        assert r.requests == [] and not prom.exists() and not prom.parent.exists()
        loud = _rehearse(campaign, "--notify")
        assert loud.returncode == 0, loud.stdout[-3000:] + loud.stderr[-3000:]
    assert not prom.exists()
    assert "done" in r.events(), r.events()
    assert all(q.json()["message"].startswith("[rehearsal] ") and q.json()["marker"] == "[rehearsal]"
               for q in r.requests)
