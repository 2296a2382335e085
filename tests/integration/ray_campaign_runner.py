"""``shoprld run`` with the launcher ``train.launcher`` names (for the real-Ray test).

The engine builds a LocalLauncher by default until it calls ``build_launcher`` itself;
this runner passes ``build_launcher(cfg, layout)`` through ``run_campaign``, exactly as the
engine will. Usage: python ray_campaign_runner.py CAMPAIGN.toml
"""

from __future__ import annotations

import sys
from pathlib import Path

from shoprld.daemon.config import load_config
from shoprld.daemon.engine import run_campaign
from shoprld.daemon.layout import Layout
from shoprld.daemon.raylauncher import build_launcher


def main() -> int:
    path = Path(sys.argv[1])
    cfg = load_config(path)
    return run_campaign(path, launcher=build_launcher(cfg, Layout.from_config(cfg)))


if __name__ == "__main__":
    sys.exit(main())
