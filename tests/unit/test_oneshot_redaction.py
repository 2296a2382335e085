"""The one-shot commands journal through the campaign's Redactor too (issue 15's rule,
"whoever built the text"; they used to append unredacted)."""

from __future__ import annotations

import io
from pathlib import Path

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import load_secrets
from shoprld.daemon.foundation.records.store import JOURNAL_FILE
from shoprld.daemon.ops.clean import clean
from shoprld.daemon.ops.oneshot import OneShotLock
from tests.demotree import make_tree

CANARY = "canary0secret0value0123456789"


def test_the_one_shot_lock_store_redacts_what_is_appended(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(f"WANDB_API_KEY={CANARY}\n")
    secrets = load_secrets(tmp_path / ".env")
    with OneShotLock(tmp_path, "clean", redactor=secrets.redactor) as store:
        store.append({"event": "campaign.cleaned", "deleted": [f"/x/{CANARY}/runs"]})
    text = (tmp_path / JOURNAL_FILE).read_text()
    assert "campaign.cleaned" in text and CANARY not in text


def test_clean_journals_no_secret_even_in_a_path(tmp_path: Path) -> None:
    """A .env value that also names the experiment (so every path of it holds the value): the
    ``campaign.cleaned`` line and the printed report list those paths, masked."""
    campaign = make_tree(tmp_path, rounds=1, edits={r'^experiment = ".*"$': f'experiment = "{CANARY}"'})
    layout = Layout.from_config(load_config(campaign))
    layout.env_file.write_text(layout.env_file.read_text() + f"CANARY_TOKEN={CANARY}\n")
    (layout.save_dir / "iter_0000001").mkdir(parents=True)
    (layout.save_dir / "iter_0000001" / "common.pt").write_bytes(b"x")
    out = io.StringIO()
    assert clean(campaign, out=out) == 0
    line = (layout.state_dir / JOURNAL_FILE).read_text().splitlines()[-1]
    assert '"campaign.cleaned"' in line and "iter_0000001" in line  # the path is listed ...
    assert CANARY not in line  # ... masked
    assert "iter_0000001" in out.getvalue() and CANARY not in out.getvalue()  # the report too
