"""The one judgement of a config before it is used: at ``run``'s start (daemon/ops/run.py), at a
SIGHUP reload (sources.reloaded), and first in ``check``'s list (daemon/ops/check.py, which adds
its machine checks).

:func:`start_problems` is what ``run`` refuses before anything starts (exit 3) and what a
reload refuses whole (the running config stays): the layout and command validation shared
with ``check`` (daemon/services/validate.py), the secrets the config needs, the notify
endpoints' URLs and tokens (daemon/foundation/config/endpoints.py) and the ``[metrics]`` extra.
"""

from __future__ import annotations

from shoprld.daemon.core.metrics import extras_problem, textfile_problem
from shoprld.daemon.foundation.records.outputs import campaign_files
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.endpoints import endpoint_problems
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import Secrets
from shoprld.daemon.services.validate import Problem, problems as validation_problems


def start_problems(cfg: Config, layout: Layout, secrets: Secrets, invalid: list[Problem] | None = None) -> list[str]:
    """Every reason not to run ``cfg``, one line each, in a stable order (empty: it may run).
    ``invalid``: the validation's problems when the caller already has them."""
    found = validation_problems(cfg, layout) if invalid is None else invalid
    out = [p.line() for p in found]
    try:
        secrets.require(cfg.required_secrets())
    except ConfigError as exc:
        out.append(str(exc))
    out.extend(endpoint_problems(cfg.notify, secrets, layout.env_file))
    for missing in (extras_problem(cfg.metrics.textfile),
                    textfile_problem(cfg.metrics.textfile, campaign_files(cfg.source, layout))):
        if missing:
            out.append(missing)
    return out
