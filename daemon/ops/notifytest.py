"""``shoprld notify-test -c FILE``: one test page to every configured endpoint, before the night;
``shoprld notify-crashed -c FILE``: the page about a daemon that is gone (a unit's ``OnFailure=``).

A wrong URL, a revoked token or a receiver that refuses the payload is otherwise first seen
mid-campaign. Each endpoint gets one page marked ``[test]`` (event ``test``, whatever events it
subscribes to), sent as the daemon sends (same payloads, timeouts and retries; URLs and tokens
from ``.env``, never printed). One line per endpoint; exit 0 when every endpoint accepted it,
3 (a config problem: the URL, the token or the receiver) when any did not. Nothing is written:
the campaign's dedupe record and journal are not touched.

``notify-crashed`` is for whatever notices a dead daemon (systemd's ``OnFailure=`` after the
start limit, a supervisord event listener): a dead daemon cannot page about itself. It reads
``status`` (as ``shoprld status`` does); a live daemon gets no page (exit 0). Otherwise one
``crashed`` page with the last state, round, error and how to restart, deduped in the campaign's
``alerts.json`` like the daemon's own pages (a crash loop pages once per state and round).
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import anyio

from shoprld.daemon.core.alerts import Alerts
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.config.endpoints import endpoint_problems
from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, EXIT_OK, ConfigError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import load_secrets
from shoprld.daemon.foundation.records.status import collect

TEST_MARKER = "[test]"


def run_notify_test(path: Path) -> int:
    """Send the test pages; print one line per endpoint; 0 when all were accepted, else 3."""
    cfg = load_config(path)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    if not cfg.notify.endpoints:
        raise ConfigError(f"{cfg.source}: notify.endpoints is empty: there is nothing to test; fix: add an "
                          f'endpoint, e.g. endpoints = [{{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL" }}]')
    needed = {ep.url_env: f"notify.endpoints[{i}].url_env" for i, ep in enumerate(cfg.notify.endpoints)}
    needed.update({ep.token_env: f"notify.endpoints[{i}].token_env" for i, ep in enumerate(cfg.notify.endpoints)
                   if ep.token_env})
    secrets.require(needed)
    problems = endpoint_problems(cfg.notify, secrets, layout.env_file)
    if problems:
        raise ConfigError(problems[0])
    text = (f"test page from shoprld on {socket.gethostname()} for campaign {cfg.campaign.name}: if you read "
            f"this, pages reach you")
    # A throwaway state dir: the test neither reads nor writes the campaign's dedupe record.
    with tempfile.TemporaryDirectory(prefix="shoprld-notify-test-") as scratch:
        alerts = Alerts(cfg.notify, secrets, secrets.redactor, Path(scratch), cfg.campaign.name,
                        lambda *_a, **_k: None, marker=TEST_MARKER)
        results = anyio.run(alerts.send_test, text)
    failed = 0
    for where, error in results:
        if error is None:
            print(f"{where}: sent")
        else:
            failed += 1
            print(f"{where}: NOT SENT: {secrets.redactor.text(error)}")
    if failed:
        print(f"shoprld: {failed} of {len(results)} endpoints did not accept the test page; fix: check "
              f"their URL/token in {layout.env_file} and that the receiver is up", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_OK


# Exit codes after which the daemon has paged, or will page, by itself: 0 done or stopped on
# request (`done`/`stopped`), 4 parked (`parked`), 5 the gate policy (`gate_stop`), 6 a stage
# failed after its retries (`failed`). A crashed page for them would be a second page about one event.
SELF_REPORTED = frozenset({0, 4, 5, 6})
# The dedupe cause of a supervisor that stopped restarting the daemon: a page of its own, even
# when a crash in the same state and round was paged already.
GAVE_UP = "gave_up"


@dataclass(frozen=True)
class Death:
    """What a supervisor saw end, and whether it is worth a ``crashed`` page."""

    page: bool
    reason: str
    gave_up: bool = False   # nothing restarts it: the operator must


def death_words(code: str, status: str, result: str = "") -> str:
    """How the daemon ended, in words: systemd's $EXIT_CODE/$EXIT_STATUS/$SERVICE_RESULT
    (``killed``/``KILL``, ``exited``/``1``, ``watchdog``); supervisord's listener says the same."""
    if result == "watchdog":
        return "no watchdog ping for WatchdogSec=: the event loop hung, and systemd killed it"
    if code in ("killed", "dumped"):
        sig = status if status.startswith("SIG") or not status else f"SIG{status}"
        return f"killed by {sig}" + (" (core dumped)" if code == "dumped" else "") + \
            (": the kernel's OOM killer?" if sig == "SIGKILL" else "")
    if code == "exited":
        return f"exited with status {status}" + (" (a bug: its traceback is in the journal)" if status == "1" else "")
    return f"ended ({result or 'unknown result'})"


def systemd_death(env: Mapping[str, str]) -> Death:
    """The verdict for ``notify-crashed --systemd``, from the environment systemd gives it.

    Two places call it. ``ExecStopPost=`` of ``shoprld@.service`` runs after every stop, with
    ``$SERVICE_RESULT``, ``$EXIT_CODE`` and ``$EXIT_STATUS`` (systemd.exec(5)): a death the
    daemon could not report (a signal, the watchdog, an exit 1) is paged, and systemd restarts
    it. ``OnFailure=shoprld-crashed@%i.service`` runs once the unit is failed for good, with the
    same values as ``$MONITOR_*`` (systemd >= 251): the start limit was hit, or an exit that
    ``RestartPreventExitStatus=`` keeps down; that is paged as given up (4 and 5 excepted: the
    daemon paged them)."""
    monitor = "MONITOR_SERVICE_RESULT" in env
    pre = "MONITOR_" if monitor else ""
    result, code, status = (env.get(pre + k, "") for k in ("SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS"))
    how = death_words(code, status, result)
    exited = int(status) if code == "exited" and status.isdigit() else None
    if monitor:
        unit = env.get("MONITOR_UNIT") or "the unit"
        if exited is not None and exited in SELF_REPORTED and exited != 6:
            return Death(False, f"{unit} {how}: the daemon paged that itself")
        if exited == 3:
            return Death(True, f"{unit} {how} (config, lock or preflight), and systemd does not restart it",
                         gave_up=True)
        # Anything else is restarted (Restart=on-failure), so a unit failed for good hit its start
        # limit. systemd 252 keeps the last death's result then ('signal'), not 'start-limit-hit'
        # (seen under the real systemd of tests/systemd/run.sh).
        last = "" if result == "start-limit-hit" and not code else f"; the last death: {how}"
        return Death(True, f"systemd stopped restarting {unit}: it started too often (StartLimitBurst= in "
                           f"StartLimitIntervalSec=){last}", gave_up=True)
    if result == "success" or exited in SELF_REPORTED or exited == 3:
        # 3 (config/lock/preflight) is not restarted: OnFailure= pages it once, as given up.
        return Death(False, f"the daemon {how}: nothing to page from ExecStopPost=")
    return Death(True, f"{how}; systemd restarts it after RestartSec=")


def run_notify_crashed(path: Path, *, reason: str = "", gave_up: bool = False, seen_dead: bool = False,
                       systemd: bool = False, environ: Mapping[str, str] = os.environ) -> int:
    """Page ``crashed`` about this campaign's daemon unless it runs; 0 when sent, deduped or alive.

    ``systemd``: judge the death from systemd's environment first (:func:`systemd_death`).
    ``seen_dead``: the caller saw it die (a supervisor's listener), so a daemon that runs now is
    the next one (restarted at once, or being stopped at the start limit): the page is sent anyway. ``gave_up``: nothing restarts it; a page of its own
    (its dedupe cause differs from a crash's)."""
    if systemd:
        death = systemd_death(environ)
        if not death.page:
            print(f"shoprld: {death.reason}; no page sent")
            return EXIT_OK
        reason = "; ".join(r for r in (death.reason, reason) if r)
        gave_up = gave_up or death.gave_up
    doc = collect(path)
    daemon = doc.get("daemon") if isinstance(doc.get("daemon"), dict) else {}
    if daemon.get("alive") and not seen_dead:
        print(f"shoprld: the daemon of campaign {doc.get('campaign')} runs (pid {daemon.get('pid')}); no page sent")
        return EXIT_OK
    cfg = load_config(path)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    state, rnd = doc.get("state"), doc.get("round")
    last = doc.get("last_error") or (doc.get("last_failure") or {}).get("detail") or ""
    unit = f"shoprld@{path.stem}"
    head = "the daemon died" if seen_dead else "the daemon is not running"
    if gave_up:
        head += ", and nothing restarts it"
    text = (f"{head} (last seen in {state or 'no state'}"
            + (f", round-{int(rnd):03d}" if isinstance(rnd, int) else "") + ")"
            + (f": {reason}" if reason else "") + (f"; last error: {last}" if last else "")
            + f"; fix: read `journalctl -u {unit}` (or the supervisor's log), then restart it "
              f"(`systemctl reset-failed {unit} && systemctl start {unit}`, or `supervisorctl start`); "
              f"`shoprld status -c {path}` says where it stopped")
    sent: list[bool] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(alerts.run)
            sent.append(alerts.post("crashed", text, round=rnd if isinstance(rnd, int) else None,
                                    state=str(state) if state else None, cause=GAVE_UP if gave_up else None))
            await alerts.drain(cfg.notify.timeout * (cfg.notify.retries + 1) + 5)
            tg.cancel_scope.cancel()

    alerts = Alerts(cfg.notify, secrets, secrets.redactor, layout.state_dir, cfg.campaign.name,
                    lambda *_a, **_k: None)
    started = time.time()
    anyio.run(main)
    undelivered = [u for u in alerts.dedupe.undelivered if u.event == "crashed" and u.time >= started]
    if sent and sent[0] and not undelivered:
        print(f"shoprld: sent a crashed page for campaign {cfg.campaign.name}")
        return EXIT_OK
    if sent and not sent[0] and not undelivered:
        print("shoprld: no crashed page sent (already sent for this state and round, or no endpoint takes it)")
        return EXIT_OK
    print(f"shoprld: the crashed page was not delivered ({undelivered[-1].error if undelivered else 'unknown'}); "
          f"fix: shoprld notify-test -c {path}", file=sys.stderr)
    return EXIT_CONFIG
