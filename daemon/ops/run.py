"""``shoprld run``: load the campaign, refuse what ``check`` refuses, set up the logs, and
run the engine (daemon/core/engine.py) until it returns the exit code.

It touches nothing on disk itself before the engine locks the state dir: the config and
``.env`` are only read, and the validation is the one ``check`` runs (issue 15).
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.console import Campaign, terminal_mode
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.system.logs import configure
from shoprld.daemon.foundation.config.secrets import load_secrets
from shoprld.daemon.services.processes import Launcher
from shoprld.daemon.services.boxcheck import box_refusals
from shoprld.daemon.services.validate import validate
from shoprld.daemon.core.engine import Engine
from shoprld.daemon.core.startcheck import start_problems


def run_campaign(config: Path, *, debug: bool = False, wait_for_space: bool = False,
                 launcher: Launcher | None = None, adopt_state: bool = False, verbose: bool = False) -> int:
    """``shoprld run``: load, check secrets, configure logging, run the engine.

    The console gets JSON lines when piped or under systemd, the compact view on a
    terminal, and every event with ``verbose`` or ``debug`` (daemon/foundation/system/console.py).
    """
    cfg = load_config(config)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    # What `shoprld check` refuses, run refuses here, before the state dir is touched or any
    # child starts (the same function: issue 15).
    validate(cfg, layout)
    # A Ray head on our ports with no record of ours: `check`'s refusal, before anything starts.
    for refusal in box_refusals(cfg, layout):
        raise ConfigError(secrets.redact(refusal))  # a foreign command line may quote a key
    mode = terminal_mode(sys.stdout, verbose=verbose or debug)
    # The process's redactor is built here, from the loaded .env, and handed on: to the logs
    # now, and (the engine's, from the same secrets) to the store, the notifier and the alerts.
    configure(level="DEBUG" if debug else "INFO", json_stdout=mode == "json",
              compact=Campaign(cfg.campaign.rounds, cfg.campaign.steps_per_round) if mode == "compact" else None,
              redactor=secrets.redactor)
    # The one judgement of a config before it is used (the same lines as `check` and a reload):
    # the secrets it needs (notify.endpoints' url_env/token_env among them), a URL or token
    # httpx cannot send to (refused now, not at the first page), the metrics extra.
    refused = start_problems(cfg, layout, secrets, invalid=[])  # validate() passed above
    if refused:
        raise ConfigError(refused[0])
    engine = Engine(cfg, layout, secrets, launcher=launcher, wait_for_space=wait_for_space, adopt_state=adopt_state)
    code = anyio.run(engine.main)
    if code and engine.final_message:
        # The engine's redactor: a reload may have made more keys secret since the start.
        print(f"shoprld: {engine.redactor.text(engine.final_message)}", file=sys.stderr)
    return code
