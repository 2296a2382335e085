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

import socket
import sys
import tempfile
import time
from pathlib import Path

import anyio

from shoprld.daemon.core.alerts import Alerts
from shoprld.daemon.foundation.config import load_config
from shoprld.daemon.foundation.endpoints import endpoint_problems
from shoprld.daemon.foundation.errors import EXIT_CONFIG, EXIT_OK, ConfigError
from shoprld.daemon.foundation.layout import Layout
from shoprld.daemon.foundation.secrets import load_secrets
from shoprld.daemon.foundation.status import collect

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


def run_notify_crashed(path: Path, *, reason: str = "") -> int:
    """Page ``crashed`` about this campaign's daemon unless it runs; 0 when sent, deduped or alive."""
    doc = collect(path)
    daemon = doc.get("daemon") if isinstance(doc.get("daemon"), dict) else {}
    if daemon.get("alive"):
        print(f"shoprld: the daemon of campaign {doc.get('campaign')} runs (pid {daemon.get('pid')}); no page sent")
        return EXIT_OK
    cfg = load_config(path)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    state, rnd = doc.get("state"), doc.get("round")
    last = doc.get("last_error") or (doc.get("last_failure") or {}).get("detail") or ""
    unit = f"shoprld@{path.stem}"
    text = (f"the daemon is not running (last seen in {state or 'no state'}"
            + (f", round-{int(rnd):03d}" if isinstance(rnd, int) else "") + ")"
            + (f": {reason}" if reason else "") + (f"; last error: {last}" if last else "")
            + f"; fix: read `journalctl -u {unit}` (or the supervisor's log), then restart it "
              f"(`systemctl reset-failed {unit} && systemctl start {unit}`); `shoprld status -c {path}` "
              f"says where it stopped")
    sent: list[bool] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(alerts.run)
            sent.append(alerts.post("crashed", text, round=rnd if isinstance(rnd, int) else None,
                                    state=str(state) if state else None))
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
