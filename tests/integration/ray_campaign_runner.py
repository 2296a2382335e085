"""``shoprld run`` with the launcher ``train.launcher`` names (for the real-Ray test).

    python ray_campaign_runner.py CAMPAIGN.toml

It passes ``build_launcher(cfg, layout)`` through ``run_campaign`` explicitly (the engine
builds the same one by itself), so the test exercises exactly the Ray Jobs launcher.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.ops.run import run_campaign
from shoprld.daemon.services.ray import build_launcher


def main() -> int:
    path = Path(sys.argv[1])
    cfg = load_config(path)
    layout = Layout.from_config(cfg)
    return run_campaign(path, launcher=build_launcher(cfg, layout))


if __name__ == "__main__":
    sys.exit(main())
