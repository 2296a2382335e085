"""A real supervisord runs the daemon from `install-service --supervisor` (issue 25: no systemd
in the user's container): a SIGKILLed daemon is restarted on to DONE; exit 0 and exit 3 are not
restarted; a daemon whose heartbeat stops (SIGSTOP) is killed by the watchdog listener and
restarted, as the unit's WatchdogSec does; a killed daemon pages `crashed` to a loopback webhook,
and so does the start limit (issue 28)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.demotree import SHOPRLD, journal, kill_tree_leftovers, make_tree, status
from tests.receiver import Receiver

pytest.importorskip("supervisor")
pytestmark = pytest.mark.slow


class Supervisord:
    """``supervisord -n -c CONF`` in its own session; stopped (and its group killed) at the end."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-n", "-c", str(conf)],
                                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ctl(self, *args: str) -> str:
        return subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.conf), *args],
                              capture_output=True, text=True, timeout=30).stdout

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    campaign = make_tree(tmp_path, rounds=3, edits={r'^step_seconds = ".*"$': 'step_seconds = "0.4"'})
    conf = tmp_path / "demo.supervisord.conf"
    proc = subprocess.run([*SHOPRLD, "install-service", "-c", str(campaign), "--supervisor", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    yield campaign, conf
    kill_tree_leftovers(tmp_path)


def _wait(what: str, cond, timeout: float = 180.0, every: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"timed out waiting for {what}")


def _daemon_pid(root: Path) -> int | None:
    try:
        return int(json.loads((root / "state" / "daemon.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _in_train(root: Path) -> bool:
    try:
        return status(root).get("state") == "TRAIN"
    except (OSError, ValueError):
        return False


def _starts(root: Path) -> int:
    """Daemon starts: each opens with a transition from nothing (trigger "start", then "resume")."""
    return sum(1 for r in journal(root) if r.get("event") == "transition" and r.get("src") is None)


def test_a_killed_daemon_is_restarted_to_done_and_exit_0_is_final(tree: tuple[Path, Path]) -> None:
    """SIGKILL in TRAIN: supervisord starts it again, it resumes and ends DONE (exit 0), and then
    stays EXITED: nothing restarts a finished campaign."""
    campaign, conf = tree
    root = campaign.parent
    sd = Supervisord(conf)
    try:
        _wait("TRAIN", lambda: _in_train(root))
        first = _wait("the daemon's pid", lambda: _daemon_pid(root))
        os.kill(first, signal.SIGKILL)
        _wait("a second start", lambda: _starts(root) >= 2)
        _wait("DONE", lambda: status(root).get("state") == "DONE")
        line = _wait("EXITED", lambda: (out := sd.ctl("status", "shoprld-demo")) and "EXITED" in out and out)
        time.sleep(2)
        assert "EXITED" in sd.ctl("status", "shoprld-demo"), "a finished campaign was started again"
        assert _starts(root) == 2
        assert "exit status 0" in line or "EXITED" in line
    finally:
        sd.close()


def test_exit_3_is_not_restarted(tree: tuple[Path, Path]) -> None:
    """A config error (exit 3) at the first start: supervisord leaves it EXITED, one start only."""
    campaign, conf = tree
    text = campaign.read_text().replace("steps_per_round = 20", "steps_per_round = 0")
    campaign.write_text(text)
    sd = Supervisord(conf)
    try:
        out = _wait("EXITED", lambda: (o := sd.ctl("status", "shoprld-demo")) and "EXITED" in o and o, timeout=60)
        time.sleep(3)
        assert "EXITED" in sd.ctl("status", "shoprld-demo")
        log = (campaign.parent / "state" / "supervisor" / "shoprld.log").read_text()
        assert log.count("steps_per_round") == 1, log[-2000:]
        assert out
    finally:
        sd.close()


def test_a_daemon_without_heartbeat_is_killed_and_restarted(tree: tuple[Path, Path]) -> None:
    """SIGSTOP (a hung event loop): no WATCHDOG=1 reaches the listener; after its watchdog
    (shortened here to 4 s) it SIGKILLs the daemon and supervisord restarts it, on to DONE."""
    campaign, conf = tree
    root = campaign.parent
    conf.write_text(conf.read_text().replace("--watchdog-sec 120", "--watchdog-sec 4")
                    .replace('WATCHDOG_USEC="120000000"', 'WATCHDOG_USEC="4000000"'))
    sd = Supervisord(conf)
    try:
        _wait("TRAIN", lambda: _in_train(root))
        first = _wait("the daemon's pid", lambda: _daemon_pid(root))
        os.kill(first, signal.SIGSTOP)
        _wait("a second start", lambda: _starts(root) >= 2, timeout=60)
        watchdog = (root / "state" / "supervisor" / "watchdog.log").read_text()
        assert "sent no heartbeat" in watchdog
        _wait("DONE", lambda: status(root).get("state") == "DONE")
    finally:
        sd.close()


def test_stop_and_status_by_hand_reach_the_supervised_daemon(tree: tuple[Path, Path]) -> None:
    """`shoprld status`/`stop -c FILE` from another shell (no STATE_DIRECTORY) find the daemon
    supervisord runs; the stop is graceful (exit 0) and supervisord does not start it again."""
    campaign, conf = tree
    root = campaign.parent
    env = {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"}
    sd = Supervisord(conf)
    try:
        _wait("TRAIN", lambda: _in_train(root))
        st = subprocess.run([*SHOPRLD, "status", "--json", "-c", str(campaign)], capture_output=True, text=True,
                            timeout=60, env=env)
        assert st.returncode == 0 and json.loads(st.stdout)["state"] == "TRAIN", st.stdout[-500:] + st.stderr
        stop = subprocess.run([*SHOPRLD, "stop", "-c", str(campaign)], capture_output=True, text=True, timeout=120,
                              env=env)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "nothing to stop" not in stop.stdout + stop.stderr
        _wait("EXITED", lambda: "EXITED" in sd.ctl("status", "shoprld-demo"), timeout=120)
        time.sleep(3)
        assert "EXITED" in sd.ctl("status", "shoprld-demo") and _starts(root) == 1
        assert status(root)["state"] == "STOPPED"
    finally:
        sd.close()


# -- a dead daemon pages someone (the unit's ExecStopPost=/OnFailure=, here the listener) ----------
NOTIFY = """
[notify]
endpoints = [{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL", events = ["crashed"] }]
backoff = 0.05
"""


def _with_webhook(campaign: Path, url: str) -> None:
    campaign.write_text(campaign.read_text() + NOTIFY)
    env = campaign.parent / "repo" / ".env"
    env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={url}\n")


def _crashed(r: Receiver) -> list[dict[str, Any]]:
    return [q.json() for q in list(r.requests) if q.json().get("event") == "crashed"]


def test_a_sigkilled_daemon_pages_crashed_and_is_restarted(tree: tuple[Path, Path]) -> None:
    """SIGKILL in TRAIN: the listener pages `crashed` once (how it died, that supervisord restarts
    it) to a loopback webhook, and supervisord starts it again."""
    campaign, conf = tree
    root = campaign.parent
    with Receiver() as r:
        _with_webhook(campaign, r.url)
        sd = Supervisord(conf)
        try:
            _wait("TRAIN", lambda: _in_train(root))
            first = _wait("the daemon's pid", lambda: _daemon_pid(root))
            os.kill(first, signal.SIGKILL)
            page = _wait("a crashed page", lambda: _crashed(r), timeout=60)[0]
            _wait("a second start", lambda: _starts(root) >= 2)
            time.sleep(2)
        finally:
            sd.close()
    assert len(_crashed(r)) == 1, _crashed(r)
    assert page["state"] == "TRAIN" and page["cause"] is None
    assert "killed by SIGKILL: the kernel's OOM killer?; supervisord restarts it" in page["message"], page
    assert page["message"].startswith("the daemon died (last seen in TRAIN, round-")
    assert "paging crashed: killed by SIGKILL" in (root / "state" / "supervisor" / "watchdog.log").read_text()


def test_the_start_limit_pages_that_nothing_restarts_it(tree: tuple[Path, Path]) -> None:
    """A start limit of 1 (the unit's is 5 in 30 min): after one SIGKILL the restart is over it,
    the listener stops the program and pages `crashed` saying nothing restarts it (a page of its
    own besides the crash's), and the program stays stopped."""
    campaign, conf = tree
    root = campaign.parent
    conf.write_text(conf.read_text().replace("--start-limit 5", "--start-limit 1"))
    with Receiver() as r:
        _with_webhook(campaign, r.url)
        sd = Supervisord(conf)
        try:
            _wait("TRAIN", lambda: _in_train(root))
            os.kill(_wait("the daemon's pid", lambda: _daemon_pid(root)), signal.SIGKILL)
            pages = _wait("two crashed pages", lambda: (p := _crashed(r)) and len(p) >= 2 and p, timeout=60)
            _wait("STOPPED", lambda: "STOPPED" in sd.ctl("status", "shoprld-demo"), timeout=60)
        finally:
            sd.close()
    gave_up = [p for p in pages if p["cause"] == "gave_up"]
    assert len(gave_up) == 1 and len(pages) == 2, pages
    assert gave_up[0]["message"].startswith("the daemon died, and nothing restarts it (last seen in "), gave_up
    assert "it started more than 1 times in 30 minutes, so the listener stopped it" in gave_up[0]["message"]
