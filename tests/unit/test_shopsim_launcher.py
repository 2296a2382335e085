"""ShopSim's launch from a copy of the checkout's ``start.sh`` (daemon/services/shopsim.py)."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.services.shopsim import LAUNCHER_DIR, SERVICE_LOG, launcher, start_script
from tests.demotree import make_tree
from tests.shopsimcheckout import differences, make_checkout, snapshot


def _plan(root: Path, env: str = "") -> tuple[RoundPlan, Path]:
    campaign = make_tree(root, rounds=2, edits={
        r'^command = \["\{python\}", "\{demo_dir\}/shopsim.py"\]':
            'command = ["bash", "start.sh"]\ncwd = "repo/ShopSimulator/shop_env"',
        r'^env = \{ SHOPSIM_ENV_SLOTS = "\{slots\}"': f'env = {{ {env}SHOPSIM_ENV_SLOTS = "{{slots}}"',
    })
    shop_env = make_checkout(root / "repo" / "ShopSimulator" / "shop_env")
    cfg = load_config(campaign)
    return RoundPlan(cfg, Layout.from_config(cfg), 0), shop_env


def test_the_launcher_is_a_copy_in_the_logs_pointed_back_at_the_checkout(tmp_path: Path) -> None:
    plan, shop_env = _plan(tmp_path)
    before = snapshot(shop_env)
    launch = launcher(plan)
    copy = plan.layout.logs / LAUNCHER_DIR / "start.sh"
    assert launch.template == ("bash", str(copy)) and launch.copied_from == shop_env / "start.sh"
    assert copy.read_bytes() == (shop_env / "start.sh").read_bytes() and os.access(copy, os.X_OK)
    assert launch.log == copy.parent / SERVICE_LOG
    assert launch.env == {"SHOP_SEARCH_INDEX": str(shop_env / "search_engine" / "products.sqlite3"),
                          "SHOP_ENV_CONFIG": str(shop_env / "configs" / "environment.json"),
                          "PYTHONPATH": str(shop_env), "PYTHONDONTWRITEBYTECODE": "1"}
    assert differences(before, snapshot(shop_env)) == []


def test_the_recipes_own_index_is_kept(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path, env='SHOP_SEARCH_INDEX = "/data/products.sqlite3", ')
    assert "SHOP_SEARCH_INDEX" not in launcher(plan).env


def test_a_command_without_start_sh_runs_as_configured(tmp_path: Path) -> None:
    campaign = make_tree(tmp_path, rounds=2)
    cfg = load_config(campaign)
    plan = RoundPlan(cfg, Layout.from_config(cfg), 0)
    launch = launcher(plan)
    assert launch.template == tuple(cfg.shopsim.command) and launch.env == {} and launch.copied_from is None
    assert not (plan.layout.logs / LAUNCHER_DIR).exists()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=6))
def test_start_script_never_raises_and_takes_a_relative_one_against_cwd(argv: list[str]) -> None:
    found = start_script(argv, argv, Path("/checkout"))
    if found is not None:
        i, path = found
        assert Path(argv[i]).name == "start.sh" and path.name == "start.sh"
        assert path.is_absolute() and (Path(argv[i]).is_absolute() or path == Path("/checkout") / argv[i])
