"""`shoprld rehearse` never touches production's operator kit: the derived config sends no page
(unless --notify) and writes its metrics textfile inside the scratch dir."""

from __future__ import annotations

from pathlib import Path

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.ops.rehearse import Scratch, derive
from tests.demotree import make_tree

KIT = """
[notify]
endpoints = [{{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL" }}]
digest_at = "08:00"

[metrics]
textfile = "{prom}"
"""


def test_rehearse_derives_no_page_and_a_scratch_textfile(tmp_path: Path) -> None:
    campaign = make_tree(tmp_path, rounds=2)
    prom = tmp_path / "textfile" / "shoprld.prom"
    campaign.write_text(campaign.read_text() + KIT.format(prom=prom))
    cfg = load_config(campaign)
    sc = Scratch(tmp_path / "scratch")
    sc.root.mkdir()
    quiet = derive(cfg, Layout.from_config(cfg), sc, real_analyst=False)
    assert quiet.notify.endpoints == () and quiet.notify.digest_at == ""
    assert quiet.metrics.textfile is not None and quiet.metrics.textfile.is_relative_to(sc.root)
    loud = derive(cfg, Layout.from_config(cfg), sc, real_analyst=False, notify=True)
    assert loud.notify.endpoints == cfg.notify.endpoints and loud.notify.digest_at == ""
    assert loud.metrics.textfile == quiet.metrics.textfile
    cfg_off = load_config(make_tree(tmp_path / "off", rounds=1))
    assert derive(cfg_off, Layout.from_config(cfg_off), sc, real_analyst=False).metrics.textfile is None
