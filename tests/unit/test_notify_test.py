"""`shoprld notify-test -c FILE`: one [test] page per endpoint, through the real CLI, to a real
loopback receiver; a dead endpoint is named and the exit is 3; nothing of the campaign is written."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.demotree import SHOPRLD
from tests.receiver import Receiver

CAMPAIGN = """[campaign]
name = "nt"
rounds = 1
steps_per_round = 1
[storage]
state_dir = "{state}"
[train]
command = ["x"]
[wandb]
enabled = false
[notify]
retries = 0
timeout = 5
endpoints = [
  {{ kind = "webhook", url_env = "HOOK_URL", events = ["done"] }},
  {{ kind = "slack", url_env = "SLACK_URL" }},
  {{ kind = "ntfy", url_env = "NTFY_URL", token_env = "NTFY_TOKEN" }},
]
"""


def _dead_port() -> int:
    with socket.socket() as s:  # bound, never listening: connection refused
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tmp_path: Path, urls: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "c.toml").write_text(CAMPAIGN.format(state=tmp_path / "state"))
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in urls.items()) + "NTFY_TOKEN=tok-abcdefgh12\n")
    return subprocess.run([*SHOPRLD, "notify-test", "-c", str(tmp_path / "c.toml")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_every_endpoint_gets_one_test_page(tmp_path: Path) -> None:
    """Whatever events an endpoint subscribes to, it gets one page marked [test]; exit 0."""
    with Receiver() as r:
        proc = _run(tmp_path, {"HOOK_URL": r.url, "SLACK_URL": r.url, "NTFY_URL": r.url})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["notify.endpoints[0] (webhook, HOOK_URL): sent",
                                        "notify.endpoints[1] (slack, SLACK_URL): sent",
                                        "notify.endpoints[2] (ntfy, NTFY_URL): sent"]
    hook, slack, ntfy = r.requests
    assert hook.json()["event"] == "test" and hook.json()["marker"] == "[test]"
    assert slack.json()["text"].startswith("*[test] shoprld nt: test*: test page from shoprld")
    assert ntfy.headers["Title"] == "[test] shoprld nt: test" and ntfy.headers["Authorization"] == "Bearer tok-abcdefgh12"
    assert not (tmp_path / "state").exists()  # no dedupe record, no journal


def test_a_dead_endpoint_is_named_and_exits_3(tmp_path: Path) -> None:
    """A refused connection: that endpoint's line says NOT SENT (no URL printed), the others
    are still sent, and the exit is 3 with one line on stderr."""
    dead = f"http://127.0.0.1:{_dead_port()}/hook"
    with Receiver() as r:
        proc = _run(tmp_path, {"HOOK_URL": r.url, "SLACK_URL": dead, "NTFY_URL": r.url})
    assert proc.returncode == 3
    assert proc.stdout.splitlines()[1] == "notify.endpoints[1] (slack, SLACK_URL): NOT SENT: ConnectError"
    assert len(r.requests) == 2 and dead not in proc.stdout + proc.stderr
    assert proc.stderr.startswith("shoprld: 1 of 3 endpoints did not accept the test page; fix:")


def _dead_campaign(tmp_path: Path, url: str, state: str = "TRAIN") -> Path:
    """A campaign whose daemon died in ``state`` (status.json as the engine leaves it; no lock held)."""
    import json

    cfg = tmp_path / "c.toml"
    cfg.write_text(CAMPAIGN.format(state=tmp_path / "state").replace('events = ["done"]', 'events = ["crashed"]'))
    (tmp_path / ".env").write_text(f"HOOK_URL={url}\nSLACK_URL={url}\nNTFY_URL={url}\nNTFY_TOKEN=tok-abcdefgh12\n")
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "status.json").write_text(json.dumps({
        "campaign": "nt", "state": state, "round": 2, "last_error": "TRAIN failed after 3 attempts: boom",
        "daemon": {"pid": 999999999, "started_at": 1.0}}))
    return cfg


def test_notify_crashed_pages_once_about_a_dead_daemon(tmp_path: Path) -> None:
    """A dead daemon (no lock holder): one `crashed` page per endpoint with the last state, round
    and error and how to restart; run again (a crash loop's next OnFailure), it is deduped."""
    with Receiver() as r:
        cfg = _dead_campaign(tmp_path, r.url)
        first = subprocess.run([*SHOPRLD, "notify-crashed", "-c", str(cfg), "--reason", "start limit hit"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=60)
        second = subprocess.run([*SHOPRLD, "notify-crashed", "-c", str(cfg)], cwd=tmp_path, capture_output=True,
                                text=True, timeout=60)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert len(r.requests) == 3 and r.events() == ["crashed"]  # webhook, slack, ntfy: once each
    hook = r.requests[0].json()
    assert hook["state"] == "TRAIN" and hook["round_id"] == "round-002"
    assert hook["message"].startswith("the daemon is not running (last seen in TRAIN, round-002): start limit hit; "
                                      "last error: TRAIN failed after 3 attempts: boom; fix: read `journalctl -u shoprld@c`")
    assert r.requests[2].headers["Priority"] == "urgent"
    assert "already sent" in second.stdout
