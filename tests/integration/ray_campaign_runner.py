"""``shoprld run`` with the launcher ``train.launcher`` names (for the real-Ray test).

    python ray_campaign_runner.py CAMPAIGN.toml [--with-engine-diff]

The engine builds a LocalLauncher until it calls ``build_launcher`` itself; this runner
passes ``build_launcher(cfg, layout)`` through ``run_campaign``, as the engine will.

``--with-engine-diff`` runs the engine with the two changes proposed for ``daemon/engine.py``
(issue 8's report), so the test can show they work before they are applied:

- ``_load`` keeps a child record whose ``job_id`` is set although its pid (0) is not alive;
- ``_stop_strays`` leaves strays alone during PREFLIGHT_DISK and START_SHOPSIM, so the round
  state that resumes (TRAIN adopts ``trainer``) decides, instead of PREFLIGHT_DISK stopping a
  trainer that has not saved since the round began.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from shoprld.daemon import engine as engine_mod
from shoprld.daemon.config import load_config
from shoprld.daemon.layout import Layout
from shoprld.daemon.machine import State
from shoprld.daemon.processes import ChildRecord
from shoprld.daemon.raylauncher import build_launcher


class DiffEngine(engine_mod.Engine):
    """The engine with the proposed diff applied (see the module docstring)."""

    def _load(self) -> None:
        super()._load()
        loaded = self.store.load()
        for role, raw in ((loaded.state if loaded else {}).get("children") or {}).items():
            rec = ChildRecord.from_json(raw)
            if rec.job_id:
                self.adoptable.setdefault(role, rec)

    async def _stop_strays(self, state: State) -> None:
        if state in (State.PREFLIGHT_DISK, State.START_SHOPSIM):
            return
        await super()._stop_strays(state)


def main() -> int:
    path = Path(sys.argv[1])
    cfg = load_config(path)
    layout = Layout.from_config(cfg)
    launcher = build_launcher(cfg, layout)
    if "--with-engine-diff" not in sys.argv[2:]:
        return engine_mod.run_campaign(path, launcher=launcher)
    from shoprld.daemon.logs import configure, set_secrets
    from shoprld.daemon.secrets import load_secrets

    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    set_secrets(secrets)
    configure(level="INFO")
    secrets.require(cfg.required_secrets())
    return anyio.run(DiffEngine(cfg, layout, secrets, launcher=launcher).main)


if __name__ == "__main__":
    sys.exit(main())
