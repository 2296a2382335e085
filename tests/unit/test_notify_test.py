"""`shoprld notify-test -c FILE`: one [test] page per endpoint, through the real CLI, to a real
loopback receiver; a dead endpoint is named and the exit is 3; nothing of the campaign is written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from shoprld.daemon.ops.notifytest import systemd_death
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


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


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


# -- systemd's view of the death: ExecStopPost= ($SERVICE_RESULT, $EXIT_*) and OnFailure= ($MONITOR_*) --
SYSTEMD_CASES = [
    # (environment, page?, gave up?, words in the reason)
    ({"SERVICE_RESULT": "signal", "EXIT_CODE": "killed", "EXIT_STATUS": "KILL"}, True, False, "killed by SIGKILL"),
    ({"SERVICE_RESULT": "core-dump", "EXIT_CODE": "dumped", "EXIT_STATUS": "SEGV"}, True, False, "(core dumped)"),
    ({"SERVICE_RESULT": "watchdog", "EXIT_CODE": "killed", "EXIT_STATUS": "ABRT"}, True, False, "watchdog"),
    ({"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "1"}, True, False, "status 1 (a bug"),
    ({"SERVICE_RESULT": "success", "EXIT_CODE": "exited", "EXIT_STATUS": "0"}, False, False, "nothing to page"),
    ({"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "6"}, False, False, "status 6"),
    ({"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "3"}, False, False, "status 3"),
    ({"MONITOR_SERVICE_RESULT": "start-limit-hit", "MONITOR_EXIT_CODE": "killed", "MONITOR_EXIT_STATUS": "KILL",
      "MONITOR_UNIT": "shoprld@c.service"}, True, True, "stopped restarting shoprld@c.service"),
    # systemd 252 at the start limit after a SIGKILL: the result stays the death's, not start-limit-hit.
    ({"MONITOR_SERVICE_RESULT": "signal", "MONITOR_EXIT_CODE": "killed", "MONITOR_EXIT_STATUS": "KILL",
      "MONITOR_UNIT": "shoprld@c.service"}, True, True, "stopped restarting shoprld@c.service: it started too "
     "often (StartLimitBurst= in StartLimitIntervalSec=); the last death: killed by SIGKILL"),
    ({"MONITOR_SERVICE_RESULT": "exit-code", "MONITOR_EXIT_CODE": "exited", "MONITOR_EXIT_STATUS": "6"},
     True, True, "stopped restarting the unit"),
    ({"MONITOR_SERVICE_RESULT": "exit-code", "MONITOR_EXIT_CODE": "exited", "MONITOR_EXIT_STATUS": "3"},
     True, True, "exited with status 3 (config, lock or preflight), and systemd does not restart it"),
    ({"MONITOR_SERVICE_RESULT": "exit-code", "MONITOR_EXIT_CODE": "exited", "MONITOR_EXIT_STATUS": "4"},
     False, False, "paged that itself"),
]


@pytest.mark.parametrize("env,page,gave_up,words", SYSTEMD_CASES,
                         ids=[f"{'MON-' if 'MONITOR_UNIT' in c[0] or 'MONITOR_EXIT_STATUS' in c[0] else ''}"
                              f"{c[0].get('EXIT_STATUS') or c[0].get('MONITOR_SERVICE_RESULT')}-"
                              f"{c[0].get('SERVICE_RESULT') or c[0].get('MONITOR_EXIT_STATUS')}" for c in SYSTEMD_CASES])
def test_systemd_death_pages_only_what_the_daemon_could_not_say(env: dict[str, str], page: bool, gave_up: bool,
                                                                 words: str) -> None:
    """A signal, the watchdog or a bug is paged after the stop; the daemon's own exits are not;
    OnFailure='s start limit and an exit that is not restarted are paged as given up, 4 and 5 not."""
    death = systemd_death(env)
    assert (death.page, death.gave_up) == (page, gave_up) and words in death.reason, death


def test_a_sigkill_then_the_start_limit_page_twice_and_an_exit_4_not_at_all(tmp_path: Path) -> None:
    """`notify-crashed --systemd` as the units run it: ExecStopPost= after a SIGKILL pages it; the
    next crash in the same state and round is deduped; OnFailure= at the start limit pages again
    (nothing restarts it); after an exit 4 (the daemon paged `parked`) nothing is sent."""
    with Receiver() as r:
        cfg = _dead_campaign(tmp_path, r.url)

        def run(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
            clean = {k: v for k, v in os.environ.items() if not k.startswith(("MONITOR_", "SERVICE_RESULT", "EXIT_"))}
            return subprocess.run([*SHOPRLD, "notify-crashed", "-c", str(cfg), "--systemd", *extra], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60, env={**clean, **env})

        killed = {"SERVICE_RESULT": "signal", "EXIT_CODE": "killed", "EXIT_STATUS": "KILL"}
        first, again = run(killed), run(killed)
        limit = run({"MONITOR_SERVICE_RESULT": "start-limit-hit", "MONITOR_EXIT_CODE": "killed",
                     "MONITOR_EXIT_STATUS": "KILL", "MONITOR_UNIT": "shoprld@c.service"}, "--gave-up")
        parked = run({"MONITOR_SERVICE_RESULT": "exit-code", "MONITOR_EXIT_CODE": "exited",
                      "MONITOR_EXIT_STATUS": "4"}, "--gave-up")
    for proc in (first, again, limit, parked):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    hooks = [h for h in (_json(q.body) for q in r.requests) if isinstance(h, dict) and "message" in h]  # webhook    assert [h["cause"] for h in hooks] == [None, "gave_up"], hooks
    assert hooks[0]["message"].startswith("the daemon is not running (last seen in TRAIN, round-002): "
                                          "killed by SIGKILL: the kernel's OOM killer?; systemd restarts it")
    assert hooks[1]["message"].startswith("the daemon is not running, and nothing restarts it (last seen in TRAIN, "
                                          "round-002): systemd stopped restarting shoprld@c.service")
    assert "already sent" in again.stdout and "paged that itself; no page sent" in parked.stdout
