"""``shoprld notify-test -c FILE``: one test page to every configured endpoint, before the night.

A wrong URL, a revoked token or a receiver that refuses the payload is otherwise first seen
mid-campaign. Each endpoint gets one page marked ``[test]`` (event ``test``, whatever events it
subscribes to), sent as the daemon sends (same payloads, timeouts and retries; URLs and tokens
from ``.env``, never printed). One line per endpoint; exit 0 when every endpoint accepted it,
3 (a config problem: the URL, the token or the receiver) when any did not. Nothing is written:
the campaign's dedupe record and journal are not touched.
"""

from __future__ import annotations

import socket
import sys
import tempfile
from pathlib import Path

import anyio

from shoprld.daemon.core.alerts import Alerts
from shoprld.daemon.foundation.config import load_config
from shoprld.daemon.foundation.endpoints import endpoint_problems
from shoprld.daemon.foundation.errors import EXIT_CONFIG, EXIT_OK, ConfigError
from shoprld.daemon.foundation.layout import Layout
from shoprld.daemon.foundation.secrets import load_secrets

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
