"""The TMPDIR guard (issue 14, blocker 1): no child gets a TMPDIR, TMP, TEMP or RAY_TMPDIR too long
for an AF_UNIX socket under it; `shoprld check` and PREFLIGHT refuse one in one line (exit 3)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.storage.preflight import TMPDIR_KEYS, tmpdir_problems, tmpdir_too_long
from tests.demotree import make_tree

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "run" / "slime-4xa800.toml"
SHOPRLD = [sys.executable, "-m", "shoprld.daemon.ops.cli"]
LONG = "/var/tmp/" + "x" * 70  # 79 characters: 79 + 40 > 107


def campaign(tmp_path: Path, section: str) -> Path:
    (tmp_path / "repo").mkdir(exist_ok=True)
    if "[train]" not in section:
        section = '[train]\ncommand = ["{python}", "t.py"]\n' + section
    p = tmp_path / "c.toml"
    p.write_text(f"""
[campaign]
name = "tmpg"
experiment = "exp1"
rounds = 1
steps_per_round = 2
[storage]
repo = "repo"
ephemeral_root = "eph"
state_dir = "state"
[disk]
require_mount = false
forbid_same_fs = false
[wandb]
enabled = false
{section}
""")
    return p


def test_the_limit_is_107_minus_40() -> None:
    """A value of 67 characters passes; 68 is refused."""
    assert not tmpdir_too_long("/" + "a" * 66) and tmpdir_too_long("/" + "a" * 67)


@pytest.mark.parametrize(("section", "key"), [
    ('[train]\ncommand = ["{python}", "t.py"]\nruntime_env = { TMPDIR = "{exp_dir}/tmp/' + "y" * 40 + '" }',
     "train.runtime_env.TMPDIR"),
    (f'[val]\nenv = {{ TEMP = "{LONG}" }}', "val.env.TEMP"),
    (f'[shopsim]\nenv = {{ RAY_TMPDIR = "{LONG}" }}', "shopsim.env.RAY_TMPDIR"),
    (f'[val]\nserver_env = {{ TMP = "{LONG}" }}', "val.server_env.TMP"),
])
def test_check_refuses_a_long_tmpdir_in_one_line(tmp_path: Path, section: str, key: str) -> None:
    """`shoprld check` exits 3 with NOT READY naming the file:key, its length and the fix."""
    c = campaign(tmp_path, section)
    proc = subprocess.run([*SHOPRLD, "check", "-c", str(c)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    # The minimal config has other gaps the shared validation lists too (NOT READY, then "also:").
    line = next(ln for ln in proc.stdout.splitlines()
                if ln.lstrip().startswith(("NOT READY: ", "also: ")) and "too long for a unix socket" in ln)
    assert f"{key} is too long for a unix socket" in line and f"{c}:{key} = " in line
    assert "at most 67" in line and "remove it" in line


def test_preflight_refuses_a_long_tmpdir_before_any_work(tmp_path: Path) -> None:
    """`shoprld run` stops in PREFLIGHT_DISK with exit 3 and the one line, before any child starts."""
    # A demo tree, valid in every other respect (the shared validation passes), plus the long TMPDIR.
    c = make_tree(tmp_path / "t", rounds=1, edits={r'^env = \{ DEMO_STEP_SECONDS': f'env = {{ TMPDIR = "{LONG}", DEMO_STEP_SECONDS'})
    proc = subprocess.run([*SHOPRLD, "run", "-c", str(c)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("shoprld: train.env.TMPDIR is too long for a unix socket"), last
    journal = (tmp_path / "t" / "state" / "journal.jsonl").read_text()
    assert '"stage.spawn"' not in journal  # refused before any child started


def test_a_short_tmpdir_passes_and_the_layouts_own_values_are_short(tmp_path: Path) -> None:
    """A short configured value and the layout's links (even for a long experiment dir) pass."""
    c = campaign(tmp_path, '[train]\ncommand = ["{python}", "t.py"]\nenv = { TMPDIR = "/tmp/short" }')
    cfg = load_config(c)
    cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"ephemeral_root": tmp_path / ("e" * 90)})})
    lay = Layout.from_config(cfg, environ={})
    assert tmpdir_problems(cfg, lay, {"exp_dir": str(lay.exp_dir)}) == []
    env = lay.child_env(cfg, base={"TMP": LONG, "TEMP": LONG, "TMPDIR": LONG})
    assert {env[k] for k in ("TMPDIR", "TMP", "TEMP")} == {str(lay.child_tmp)}
    assert not any(tmpdir_too_long(env[k]) for k in TMPDIR_KEYS)


def test_recipe_print_commands_shows_only_short_tmpdirs() -> None:
    """`shoprld check -c run/slime-4xa800.toml --print-commands`: every TMPDIR-like value (child env,
    stage env, the Ray job's runtime_env) leaves room for a unix socket, and none is refused."""
    proc = subprocess.run([*SHOPRLD, "check", "-c", str(RECIPE), "--print-commands"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in (0, 3), proc.stderr
    found: list[tuple[str, str]] = []
    for line in proc.stdout.splitlines():
        for m in re.finditer(r"(?:^|\s)(TMPDIR|TMP|TEMP|RAY_TMPDIR)=('[^']*'|\S+)", line):
            value = shlex.split(m.group(2))[0].split(" -> ")[0]
            found.append((m.group(1), value))
    assert {k for k, _ in found} == set(TMPDIR_KEYS)
    assert any("runtime_env.env_vars" in ln and "TMPDIR=" in ln for ln in proc.stdout.splitlines())
    long = [(k, v) for k, v in found if tmpdir_too_long(v)]
    assert not long, long
    assert "too long for a unix socket" not in proc.stdout
