"""One validation for `check` and `run` (issue 15): what `check` calls ready, `run` must not crash
on, and what `check` refuses, `run` refuses at its start with the same one line (exit 3), before
the state dir is touched or any child starts. `check` runs in-process through the CLI's main;
`run` as a real child process (were it not refused, it would start the campaign)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoprld.daemon.ops import cli
from shoprld.daemon.foundation.config.config import Config, config_from_dict, load_config
from shoprld.daemon.foundation.system.errors import ConfigError
from tests.demotree import kill_tree_leftovers, make_tree
from tests.fsfixtures import FsUnavailable, mount_tmpfs, read_only

CLI = [sys.executable, "-m", "shoprld.daemon.ops.cli"]


def check(campaign: Path) -> tuple[int, str, str]:
    """`shoprld check -c campaign` through the CLI's main: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["check", "-c", str(campaign)])
    return code, out.getvalue(), err.getvalue()


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def bare(line: str) -> str:
    """The problem itself, without the CLI's prefixes."""
    return line.removeprefix("shoprld: ").removeprefix("NOT READY: ")


def refused_by_check(campaign: Path, needle: str) -> str:
    code, out, err = check(campaign)
    line = one_line(err)
    assert code == 3, (code, err)
    assert needle in line and "; fix: " in line, line
    return line


def refused_by_run(root: Path, campaign: Path, needle: str) -> str:
    """`shoprld run` exits 3 with the line, and creates neither the state dir's files nor the layout."""
    state = root / "state"
    before = sorted(p.name for p in state.iterdir()) if state.is_dir() else None
    try:
        proc = subprocess.run([*CLI, "run", "-c", str(campaign)], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    finally:
        kill_tree_leftovers(root)
    line = one_line(proc.stderr)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert needle in line, line
    after = sorted(p.name for p in state.iterdir()) if state.is_dir() else None
    assert after == before, "run touched the state dir"
    assert not (root / "ephemeral" / "nemo-rl").exists(), "run created the layout"
    return line


def tree(root: Path, **edits: str) -> Path:
    return make_tree(root, rounds=2, edits=edits or None)


# -- A config that `check` called ready but that crashed `run` ------------------------------------
CONFIG_CASES: dict[str, tuple[dict[str, str], str]] = {
    # `save_dir = "/etc"` gave the trainer `--save /etc` while the daemon watched the real dir.
    "vars-shadow-builtin": ({r'^step_seconds = "(.*)"$': r'step_seconds = "\1"\nsave_dir = "/etc"'},
                            'vars.save_dir: shadows the built-in placeholder {save_dir}'),
    "vars-forward-ref": ({r'^step_seconds = "(.*)"$': r'step_seconds = "\1"\na = "{b}/x"\nb = "y"'},
                         "vars.a: {b} is defined after it"),
    "vars-self-ref": ({r'^step_seconds = "(.*)"$': r'step_seconds = "\1"\na = "{a}"'}, "vars.a: refers to itself"),
    "vars-nested-spec": ({r'^step_seconds = "(.*)"$': r'step_seconds = "\1"\na = "{save_dir:{seed}}"'},
                         "vars.a: {save_dir:{seed}} is not a plain placeholder"),
    "command-format-spec": ({r'"--num-rollout", "\{num_rollout\}"': '"--num-rollout", "{round:03d}"'},
                            "train.command[15]: {round:03d} is not a plain placeholder"),
    "command-index": ({r'"--save", "\{save_dir\}"': '"--save", "{save_dir[0]}"'}, "is not a plain placeholder"),
    "disk-interval-0": ({r"^interval = 0.5$": "interval = 0"}, "disk.interval: Input should be greater than 0"),
    "disk-interval-negative": ({r"^interval = 0.5$": "interval = -1"}, "disk.interval: a duration cannot be negative"),
    "disk-interval-nan": ({r"^interval = 0.5$": "interval = nan"}, "disk.interval: a duration must be a number"),
    "disk-interval-inf": ({r"^interval = 0.5$": "interval = inf"}, "disk.interval: a duration above a year"),
    "poll-interval-0": ({r"^poll_interval = 0.2$": "poll_interval = 0"}, "train.poll_interval"),
    "duration-huge-string": ({r'^stall_min = "4s"$': f'stall_min = "{"9" * 400}d"'}, "train.stall_min"),
    "size-huge-string": ({r'^ballast = "8MiB"$': f'ballast = "{"9" * 400}GiB"'}, "disk.ballast"),
    "rounds-true": ({r"^rounds = 2$": "rounds = true"}, "campaign.rounds: Input should be a valid integer (got True)"),
    "rounds-1e9-float": ({r"^rounds = 2$": "rounds = 1e9"}, "campaign.rounds"),
    "rounds-1e9": ({r"^rounds = 2$": "rounds = 1000000000"}, "campaign.rounds: Input should be less than or equal"),
    "gpu-id-bool": ({r"^visible = \[0, 1, 2, 3\]$": "visible = [true, 1]"}, "gpus.visible[0]"),
    "end-offset-before-0": ({r"^save_interval = 10000$": "save_interval = 10000\nend_offset = -21"},
                            "train.end_offset: makes round 0 end before iteration 0"),
    "val-command-empty": ({r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "run".*$': "command = []"},
                          "val.command: empty, but VAL runs every round (got [])"),
    "sidecar-command-empty": ({r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "training", '
                               r'"watch-analyze".*\n.*\]$': "command = []"},
                              "sidecar.command: empty, but sidecar.enabled = true"),
    "shopsim-command-empty": ({r'^command = \["\{python\}", "\{demo_dir\}/shopsim.py"\]$': "command = []"},
                              "shopsim.command: empty, but shopsim.manage = true"),
    "program-empty": ({r'^command = \["\{python\}", "\{demo_dir\}/shopsim.py"\]$': 'command = ["", "x"]'},
                      "shopsim.command[0]: the program name is empty"),
    "command-not-found": ({r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "training", "online-gate"':
                           'command = ["no-such-program-15", "{demo_dir}/shopsimrl.py", "training", "online-gate"'},
                          "gate.command[0]: 'no-such-program-15' is neither on PATH (and the stage has no conda_prefix)"),
    "command-path-missing": ({r'^command = \["\{python\}", "\{demo_dir\}/shopsim.py"\]$':
                              'command = ["{demo_dir}/no-such-start.sh"]'}, "shopsim.command[0]: "),
    "soft-limit-above-volume": ({r'^soft_limit = ".*"$': 'soft_limit = "900TiB"'},
                                "disk.soft_limit: is not below the size of the volume"),
    "hard-limit-above-volume": ({r'^hard_limit = ".*"$': 'hard_limit = "800TiB"', r'^soft_limit = ".*"$': 'soft_limit = "900TiB"'},
                                "disk.hard_limit: is not below the size of the volume"),
    "env-nul": ({r'DEMO_CKPT_BYTES = "1048576"': r'DEMO_CKPT_BYTES = "1\\u0000"'},
                "train.env.DEMO_CKPT_BYTES: contains a NUL byte"),
    "env-name-with-equals": ({r'DEMO_CKPT_BYTES = "1048576"': r'"A=B" = "1"'},
                             "train.env.A=B: is not a usable environment variable name"),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_check_refuses_what_would_crash_run(name: str, tmp_path: Path) -> None:
    """Each case: `check` exits 3 with one line naming the key, the value and the fix."""
    edits, needle = CONFIG_CASES[name]
    refused_by_check(tree(tmp_path, **edits), needle)


@pytest.mark.parametrize("name", ["vars-shadow-builtin", "vars-forward-ref", "disk-interval-0", "rounds-true",
                                  "val-command-empty", "command-not-found",
                                  "soft-limit-above-volume"])
def test_run_refuses_the_same_at_its_start(name: str, tmp_path: Path) -> None:
    """`run` refuses what `check` refuses, with the same line, before the state dir or the layout exists."""
    edits, needle = CONFIG_CASES[name]
    campaign = tree(tmp_path, **edits)
    assert bare(refused_by_check(campaign, needle)) == bare(refused_by_run(tmp_path, campaign, needle))


def test_vars_may_use_the_vars_above_them(tmp_path: Path) -> None:
    """[vars] expand in order: a var built from an earlier var reaches the child (it crashed check before)."""
    campaign = tree(tmp_path, **{r'^step_seconds = "(.*)"$': r'base = "\1"' + '\nstep_seconds = "{base}"'})
    code, out, err = check(campaign)
    assert (code, err) == (0, ""), err
    cfg = load_config(campaign)
    from shoprld.daemon.foundation.records.layout import Layout
    from shoprld.daemon.round.plan import resolve

    values = resolve(cfg, Layout.from_config(cfg), 0).values
    assert values["step_seconds"] == values["base"] != "{base}"


def test_a_command_in_its_conda_env_resolves(tmp_path: Path) -> None:
    """A program missing from PATH but in the stage's conda env (<prefix>/bin) is fine; a prefix
    without it names both places."""
    env = tmp_path / "envs" / "tools"
    (env / "bin").mkdir(parents=True)
    tool = env / "bin" / "gate-tool-15"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    gate = r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "training", "online-gate", "\{loop_dir\}/gate.yaml"\]$'
    campaign = tree(tmp_path, **{gate: f'command = ["gate-tool-15"]\nconda_prefix = "{env}"'})
    code, _, err = check(campaign)
    assert (code, err) == (0, ""), err
    other = tmp_path / "envs" / "empty"
    (other / "bin").mkdir(parents=True)
    campaign.write_text(campaign.read_text().replace(str(env), str(other)))
    refused_by_check(campaign, f"gate.command[0]: 'gate-tool-15' is neither on PATH nor in the conda env {other}/bin")


# Every int and float field refuses a bool (pydantic strict): `rounds = true` became 1 round.
def _scalar_fields() -> Iterator[tuple[str, str]]:
    for sname, field in Config.model_fields.items():
        model: Any = field.annotation
        if not isinstance(model, type) or not hasattr(model, "model_fields"):
            continue
        for fname, f in model.model_fields.items():
            if f.annotation in (int, float):
                yield sname, fname


@pytest.mark.parametrize("section,key", sorted(_scalar_fields()))
def test_every_int_and_float_field_refuses_a_bool(section: str, key: str, tmp_path: Path) -> None:
    """`<section>.<key> = true` is a config error naming the key, never 1 or 1.0."""
    recipe = Path(__file__).resolve().parents[2] / "run" / "demo" / "campaign.toml"
    data = tomllib.loads(recipe.read_text())
    data.setdefault(section, {})[key] = True
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, recipe)
    msg = str(info.value)
    assert f"{section}.{key}" in msg and "(got True)" in msg, msg


def test_the_int_and_float_fields_are_all_covered() -> None:
    """The bool sweep above sees the fields it must (a rename would silently shrink it)."""
    fields = set(_scalar_fields())
    assert {("campaign", "rounds"), ("campaign", "steps_per_round"), ("train", "stall_factor"),
            ("val", "min_coverage"), ("shopsim", "slots"), ("train", "retries")} <= fields


# -- Layout traps ---------------------------------------------------------------------------------
def test_the_volume_equal_to_the_repo_is_refused(tmp_path: Path) -> None:
    """storage.ephemeral_root = the repo: one line at check and at run."""
    campaign = tree(tmp_path, **{r'^ephemeral_root = "ephemeral"$': 'ephemeral_root = "repo"'})
    needle = "storage.ephemeral_root: is the checkout itself"
    refused_by_check(campaign, needle)
    refused_by_run(tmp_path, campaign, needle)


def test_the_volume_inside_the_repo_is_refused(tmp_path: Path) -> None:
    """storage.ephemeral_root inside the repo (the repo inside the volume is the seed's layout, allowed)."""
    campaign = tree(tmp_path, **{r'^ephemeral_root = "ephemeral"$': 'ephemeral_root = "repo/volume"'})
    refused_by_check(campaign, "storage.ephemeral_root: is inside the checkout")


def test_the_state_dir_inside_the_volume_is_refused(tmp_path: Path) -> None:
    """storage.state_dir under the ephemeral root: refused, with the default as the fix."""
    campaign = tree(tmp_path, **{r'^state_dir = "state"$': 'state_dir = "ephemeral/state"'})
    line = refused_by_check(campaign, "storage.state_dir: is on the volume")
    assert "$XDG_STATE_HOME" in line


@contextlib.contextmanager
def bind_mount(src: Path, dst: Path) -> Iterator[Path]:
    subprocess.run(["mount", "--bind", str(src), str(dst)], check=True, capture_output=True, timeout=30)
    try:
        yield dst
    finally:
        subprocess.run(["umount", str(dst)], capture_output=True, timeout=30)


def test_the_state_dir_on_the_volume_device_is_refused(tmp_path: Path) -> None:
    """A state dir on the volume's filesystem by another path (a bind mount: same st_dev) is refused."""
    try:
        with mount_tmpfs("256m", base=tmp_path) as volume:  # above the demo's soft_limit (128MiB)
            campaign = tree(tmp_path, **{r'^ephemeral_root = "ephemeral"$': f'ephemeral_root = "{volume}"'})
            (volume / "elsewhere").mkdir()
            (tmp_path / "state").mkdir(exist_ok=True)
            with bind_mount(volume / "elsewhere", tmp_path / "state"):
                refused_by_check(campaign, "storage.state_dir: is on the volume")
            code, _, err = check(campaign)
            assert (code, err) == (0, ""), err  # unmounted: the same tree is ready
    except FsUnavailable as exc:
        pytest.skip(str(exc))


def test_a_tmpfs_inside_the_checkout_is_refused(tmp_path: Path) -> None:
    """A real tmpfs mounted inside the repo: refused at check and at run; unmounted whatever happens."""
    campaign = tree(tmp_path)
    try:
        with mount_tmpfs("4m", base=tmp_path / "repo") as mnt:
            needle = f"storage.repo: a tmpfs is mounted inside the checkout at {mnt}"
            refused_by_check(campaign, needle)
            refused_by_run(tmp_path, campaign, needle)
    except FsUnavailable as exc:
        pytest.skip(str(exc))
    assert not os.path.ismount(mnt)


# -- The environment: the state dir ---------------------------------------------------------------
def test_a_read_only_state_dir_is_not_ready(tmp_path: Path) -> None:
    """A state dir on a read-only filesystem (a real tmpfs remounted ro): NOT READY and run exits 3."""
    try:
        with mount_tmpfs("4m", base=tmp_path) as mnt, read_only(mnt):
            campaign = tree(tmp_path, **{r'^state_dir = "state"$': f'state_dir = "{mnt}"'})
            needle = f"storage.state_dir: {mnt} is on a read-only filesystem"
            line = refused_by_check(campaign, needle)
            assert line.startswith("shoprld: NOT READY: ")
            refused_by_run(tmp_path, campaign, needle)
    except FsUnavailable as exc:
        pytest.skip(str(exc))


def test_a_state_dir_that_cannot_be_created_is_not_ready(tmp_path: Path) -> None:
    """A state dir to be created under a read-only dir names that dir."""
    try:
        with mount_tmpfs("4m", base=tmp_path) as mnt, read_only(mnt):
            campaign = tree(tmp_path, **{r'^state_dir = "state"$': f'state_dir = "{mnt}/a/b"'})
            refused_by_check(campaign, f"storage.state_dir: {mnt} is on a read-only filesystem")
    except FsUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_state_dir_owned_by_another_user_is_not_ready(tmp_path: Path) -> None:
    """Owner uid != our euid is refused, even for root (who could write it anyway)."""
    campaign = tree(tmp_path)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    os.chown(state, 65534, 65534)
    needle = "storage.state_dir: is owned by "
    line = refused_by_check(campaign, needle)
    assert "uid 65534" in line and "(uid 0)" in line
    refused_by_run(tmp_path, campaign, needle)
