"""``shoprld demo --dir D --no-run``: the demo tree is written, nothing runs, edits survive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shoprld.daemon.foundation.config.config import load_config


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "demo", *args],
                          capture_output=True, text=True, timeout=120)


def test_no_run_writes_the_tree_and_runs_nothing(tmp_path: Path) -> None:
    """The tree is complete (a loadable campaign file, the repo, the base model), the state dir
    is empty (no state, no journal, no lock: the daemon never started), and the output says how
    to run it later."""
    d = tmp_path / "D"
    res = _demo("--dir", str(d), "--no-run", "--fast")
    assert res.returncode == 0, res.stderr
    campaign = d / "campaign.toml"
    cfg = load_config(campaign)
    assert cfg.campaign.name == "demo"
    assert (d / "repo" / ".env").is_file() and (d / "models" / "base_torch_dist").is_dir()
    assert list((d / "state").iterdir()) == []
    assert not any((d / "ephemeral").iterdir())
    assert f"demo --dir {d.resolve()}" in res.stdout and "watch it" not in res.stdout


def test_no_run_keeps_an_edited_campaign_file(tmp_path: Path) -> None:
    """A second --no-run on an existing tree leaves the user's edits alone and still runs nothing."""
    d = tmp_path / "D"
    assert _demo("--dir", str(d), "--no-run", "--fast").returncode == 0
    campaign = d / "campaign.toml"
    edited = campaign.read_text().replace('name = "demo"', 'name = "edited"', 1)
    campaign.write_text(edited)
    res = _demo("--dir", str(d), "--no-run")
    assert res.returncode == 0, res.stderr
    assert "already exists" in res.stdout
    assert campaign.read_text() == edited
    assert list((d / "state").iterdir()) == []
