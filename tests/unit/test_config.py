"""Campaign config: frozen typed models; every bad input is ONE line naming file, key, value, fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.config.configvalues import parse_duration, parse_size
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.config.placeholders import expand

MINIMAL = """
[campaign]
name = "c1"
rounds = 2
steps_per_round = 20

[train]
command = ["{python}", "train.py", "--num-rollout", "{num_rollout}"]
"""


def write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_minimal_config_loads_frozen_with_defaults(tmp_path: Path) -> None:
    """A minimal file validates; defaults follow the seed (first 4 GPUs, 48 slots) and models are frozen."""
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.gpus.visible == (0, 1, 2, 3)
    assert cfg.shopsim.slots == 48 and cfg.shopsim.episode_concurrency == 32
    with pytest.raises(Exception):
        cfg.campaign.rounds = 3  # type: ignore[misc]


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    """storage paths are relative to the campaign file's directory."""
    cfg = load_config(write(tmp_path, MINIMAL + '\n[storage]\nrepo = "r"\nephemeral_root = "e"\n'))
    assert cfg.storage.repo == tmp_path / "r"
    assert cfg.storage.ephemeral_root == tmp_path / "e"


def test_repo_demo_and_seed_recipes_validate() -> None:
    """The shipped recipes are valid configs."""
    root = Path(__file__).resolve().parents[2]
    assert load_config(root / "run" / "demo" / "campaign.toml").campaign.rounds == 5


def test_templates_expand_per_argument_without_a_shell() -> None:
    """A value with spaces or shell metacharacters stays one argv element."""
    argv = expand(["x", "--p", "{v}"], {"v": "a b; rm -rf /"})
    assert argv == ["x", "--p", "a b; rm -rf /"]


@pytest.mark.parametrize("text,needle", [
    ("32GiB", 32 * 1024**3), ("500MB", 500 * 1000**2), (1024, 1024), ("1.5 GiB", int(1.5 * 1024**3)),
])
def test_sizes_parse(text: object, needle: int) -> None:
    """Sizes accept units and plain byte counts."""
    assert parse_size(text) == needle


def test_durations_parse() -> None:
    """Durations accept compound units and seconds."""
    assert parse_duration("1h30m") == 5400 and parse_duration(90) == 90.0 and parse_duration("250ms") == 0.25


BAD = {
    "unknown_key": (MINIMAL.replace("rounds = 2", "rounds = 2\nroundz = 3"), "campaign.roundz: unknown key"),
    "wrong_type": (MINIMAL.replace("rounds = 2", 'rounds = "two"'), "campaign.rounds"),
    "missing_section": ("[campaign]\nname='x'\nrounds=1\nsteps_per_round=1\n", "train: "),
    "missing_key": (MINIMAL.replace("steps_per_round = 20\n", ""), "campaign.steps_per_round"),
    "zero_rounds": (MINIMAL.replace("rounds = 2", "rounds = 0"), "campaign.rounds"),
    "negative_steps": (MINIMAL.replace("steps_per_round = 20", "steps_per_round = -5"), "campaign.steps_per_round"),
    "tp_not_dividing": (MINIMAL + "\n[gpus]\nvisible=[0,1,2]\ntp_size=2\n", "NUM_GPUS=3 is not divisible by tp_size=2"),
    "unknown_placeholder": (MINIMAL.replace("{num_rollout}", "{num_rolout}"), "unknown placeholder {num_rolout}"),
    "soft_below_hard": (MINIMAL + '\n[disk]\nsoft_limit="1GiB"\nhard_limit="2GiB"\n', "soft_limit"),
    "bad_size": (MINIMAL + '\n[disk]\nballast="lots"\n', "disk.ballast"),
    "negative_size": (MINIMAL + "\n[disk]\nmargin=-1\n", "disk.margin"),
    "bad_duration": (MINIMAL + '\n[disk]\ninterval="soon"\n', "disk.interval"),
    "slots_below_concurrency": (MINIMAL + "\n[shopsim]\nslots=16\nepisode_concurrency=32\n", "slots=16"),
    "bad_enum": (MINIMAL + '\n[gate]\npolicy="maybe"\n', "gate.policy"),
    "empty_train_command": (MINIMAL.replace('command = ["{python}", "train.py", "--num-rollout", "{num_rollout}"]',
                                            "command = []"), "train.command"),
    "command_is_a_string": (MINIMAL.replace('command = ["{python}", "train.py", "--num-rollout", "{num_rollout}"]',
                                            'command = "python train.py"'), "train.command"),
    "bad_campaign_name": (MINIMAL.replace('name = "c1"', 'name = "../etc"'), "campaign.name"),
    "duplicate_gpus": (MINIMAL + "\n[gpus]\nvisible=[0,0]\n", "duplicates"),
    "bad_deadline": (MINIMAL.replace("rounds = 2", 'rounds = 2\ndeadline = "tomorrow-ish"'), "campaign.deadline"),
    "duplicate_table": (MINIMAL + '\n[train]\n', "not valid TOML"),
    "unbalanced_brace": (MINIMAL.replace("{num_rollout}", "{num_rollout"), "malformed template"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_line_naming_file_key_and_fix(tmp_path: Path, case: str) -> None:
    """Each bad config raises one line that names the file, the key and a fix."""
    text, needle = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert str(path) in msg
    assert needle in msg, msg
    assert "fix:" in msg


def test_missing_file_not_toml_and_directory(tmp_path: Path) -> None:
    """A missing file, a non-TOML file and a directory each get their own one-line error."""
    for path, needle in ((tmp_path / "nope.toml", "no such campaign file"),
                         (write(tmp_path, "\x00\x01 not toml ==", "bad.toml"), "not valid TOML"),
                         (tmp_path, "is a directory")):
        with pytest.raises(ConfigError, match=needle):
            load_config(path)


def test_cli_check_on_bad_config_exits_3_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    """`shoprld check` on a bad config prints one line on stderr and exits 3."""
    path = write(tmp_path, MINIMAL.replace("rounds = 2", "rounds = 0"))
    proc = subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("shoprld: ")


def test_cli_bad_arguments_exit_2(tmp_path: Path) -> None:
    """Unknown subcommands or flags are usage errors (exit 2)."""
    proc = subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "frobnicate"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
