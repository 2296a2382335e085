"""A stage context outside the engine, for tests and benches that drive one stage or service.

The engine builds ``RoundContext`` from a ``RoundPlan`` and its own services; here the same
class is built around a real launcher, with the children kept in a dict and the events in a
list (the engine persists and journals them instead). Nothing is faked below the context:
launches, values and paths run the production code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.services.processes import Child, Launcher, LocalLauncher, SystemClock
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.services.shopsim import ShopsimService
from shoprld.daemon.services.valserver import ValServerService
from shoprld.states.base import RoundContext


def standalone_context(plan: RoundPlan, *, launcher: Launcher | None = None, http: httpx.AsyncClient | None = None,
                       val_server: ValServerService | None = None, shopsim: ShopsimService | None = None,
                       events: list[tuple[str, dict[str, Any]]] | None = None) -> RoundContext:
    """``plan``'s round as a stage sees it: ``launcher`` (local processes by default) starts the
    children; each registered child is found by its role; each event lands in ``events``."""
    children: dict[str, Child] = {}
    seen = events if events is not None else []

    def find(role: str) -> Child | None:
        child = children.get(role)
        return child if child is not None and child.alive() else None

    def unregister(child: Child) -> None:
        if children.get(child.record.role) is child:
            del children[child.record.role]

    return RoundContext(
        plan=plan, launcher=launcher or LocalLauncher(),
        http=http,  # type: ignore[arg-type]  # None: a test whose stage makes no HTTP call
        clock=SystemClock(), shopsim=shopsim or ShopsimService(), val_server=val_server or ValServerService(),
        emit=lambda event, **fields: seen.append((event, fields)),
        register_child=lambda child: children.__setitem__(child.record.role, child),
        unregister_child=unregister, find_child=find,
    )


def minimal_context(root: Path, round_index: int, *, rounds: int = 2,
                    events: list[tuple[str, dict[str, Any]]] | None = None) -> RoundContext:
    """Round ``round_index`` of the smallest campaign the config accepts (a trainer command, no
    services), laid out under ``root``: for tests of one stage's decisions on files."""
    (root / "repo").mkdir(exist_ok=True)
    toml = root / "c.toml"
    toml.write_text(f'[campaign]\nname = "rd"\nexperiment = "e"\nrounds = {rounds}\nsteps_per_round = 2\n'
                    '[storage]\nrepo = "repo"\nephemeral_root = "eph"\nstate_dir = "st"\n'
                    '[train]\ncommand = ["{python}", "t.py"]\n[wandb]\nenabled = false\n')
    cfg = load_config(toml)
    return standalone_context(RoundPlan(cfg, Layout.from_config(cfg, environ={}), round_index), events=events)
