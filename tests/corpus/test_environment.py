"""The environment class of issue 15: destinations that cannot take a file, readers that leave
early, Ctrl-C during start-up. Each is one stderr line (or none) and a documented exit code,
never a traceback, and no temp file is left behind. Real child processes, real filesystems."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.demotree import make_tree
from tests.fsfixtures import read_only, tmpfs_fixture  # noqa: F401  (fixture)

CLI = [sys.executable, "-m", "shoprld.daemon.ops.cli"]


def _cli(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          **kw)  # type: ignore[call-overload]


def _one_line(proc: subprocess.CompletedProcess[str], code: int, needle: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo tree with a campaign state to export."""
    root = tmp_path_factory.mktemp("env")
    c = make_tree(root / "t", rounds=1)
    (root / "t" / "state").mkdir(exist_ok=True)
    (root / "t" / "state" / "state.json").write_text(json.dumps({"schema": 1, "state": "TRAIN", "round": 0}))
    return c


def _no_temp_left(d: Path) -> None:
    assert [p.name for p in d.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("dest,needle", [
    (lambda d: d, "is a directory"),
    (lambda d: d / "missing" / "b.tar", "no such directory"),
    (lambda d: Path("/proc/b.tar"), "cannot write"),
    (lambda d: Path("/dev/full"), "not a regular file"),
], ids=["dir", "missing-parent", "proc", "dev-full"])
def test_export_to_a_place_that_cannot_take_the_bundle_is_one_line(campaign: Path, tmp_path: Path,
                                                                  dest: Callable[[Path], Path], needle: str) -> None:
    """export-campaign to a dir, a missing parent, /proc or a device: exit 3, one line, nothing left."""
    out = dest(tmp_path)
    _one_line(_cli("export-campaign", "-c", str(campaign), str(out)), 3, needle)
    _no_temp_left(tmp_path)


def test_export_to_a_read_only_fs_is_one_line_and_leaves_nothing(campaign: Path,
                                                                 tmpfs: Callable[..., Path]) -> None:
    """A real read-only tmpfs: exit 3, one line naming the bundle and the reason."""
    mnt = tmpfs("4m")
    with read_only(mnt):
        line = _one_line(_cli("export-campaign", "-c", str(campaign), str(mnt / "b.tar")), 3, "Read-only file system")
    assert str(mnt / "b.tar") in line
    assert list(mnt.iterdir()) == []


def test_export_to_a_full_fs_removes_its_temp_file(campaign: Path, tmpfs: Callable[..., Path]) -> None:
    """A tmpfs too small for the bundle: exit 3, one line, and the 0600 temp tar is gone."""
    mnt = tmpfs("8k")
    _one_line(_cli("export-campaign", "-c", str(campaign), str(mnt / "b.tar")), 3, "No space left on device")
    assert list(mnt.iterdir()) == []


def test_exported_bundle_is_private(campaign: Path, tmp_path: Path) -> None:
    """The bundle (it holds the campaign's state) is 0600, like the temp file it was written through."""
    proc = _cli("export-campaign", "-c", str(campaign), str(tmp_path / "b.tar"))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "b.tar").st_mode) == 0o600
    _no_temp_left(tmp_path)


@pytest.mark.parametrize("argv,needle", [
    (["init", "--force", "DIR"], "is a directory"),
    (["init", "/dev/full"], "not a regular file"),
    (["init", "--force", "/dev/full"], "not a regular file"),
    (["init", "/proc/campaign.toml"], "cannot write the template"),
    (["init", "DIR/missing/campaign.toml"], "the directory DIR/missing does not exist; fix: create it first"),
    (["init", "/dev/null/campaign.toml"], "cannot inspect (Not a directory)"),
], ids=["force-dir", "dev-full", "force-dev-full", "proc", "missing-parent", "parent-a-device"])
def test_init_where_no_template_can_go_is_one_line(tmp_path: Path, argv: list[str], needle: str) -> None:
    """init onto a dir, a device, /proc or into a missing parent: exit 3, one line; the dir is left
    as it was (a missing parent is not created)."""
    needle = needle.replace("DIR", str(tmp_path))
    argv = [a.replace("DIR", str(tmp_path)) for a in argv]
    _one_line(_cli(*argv), 3, needle)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["check"], ["check", "--print-commands"], ["clean", "--dry-run"],
                                  ["status"], ["ledger"]])
def test_a_reader_that_left_early_is_a_quiet_exit_141(campaign: Path, argv: list[str]) -> None:
    """stdout's reader is gone before the first write (`| head -1` at its worst): exit 141, stderr empty."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run([*CLI, *argv, "-c", str(campaign)], stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
    finally:
        os.close(w)
    assert proc.returncode in (0, 141), proc.stderr  # 0: a command that printed nothing to stdout
    assert proc.stderr == ""
    if argv[0] in ("check", "clean"):
        assert proc.returncode == 141


# A child that sends itself a real SIGINT at a chosen point of its start-up: when it first imports
# the named module, or opens the named file. An audit hook only picks the moment.
_SIGINT_AT = r'''
import os, signal, sys
# What a terminal's Ctrl-C meets: Python's own SIGINT handler, even when this test runs under a
# runner that started it with SIGINT ignored (a background job of a script inherits SIG_IGN).
signal.signal(signal.SIGINT, signal.default_int_handler)
sent = []
def hook(ev, args):
    if sent:
        return
    if (ev == "import" and args[0] == sys.argv[1]) or (ev == "open" and str(args[0]) == sys.argv[1]):
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(hook)
from shoprld.daemon.ops.cli import main
sys.exit(main(sys.argv[2:]))
'''


@pytest.mark.parametrize("at", ["argparse", "shoprld.daemon.foundation.system.errors", "shoprld.daemon.foundation.config.config", "CONFIG"])
@pytest.mark.parametrize("cmd", ["check", "run"])
def test_sigint_during_start_up_is_one_line_and_exit_130(campaign: Path, tmp_path: Path, at: str, cmd: str) -> None:
    """Ctrl-C while the CLI imports its modules or reads the config (before the engine's handlers):
    exit 130, one line, no traceback, and no state written."""
    c = tmp_path / "campaign.toml"
    assert 'state_dir = "state"' in campaign.read_text()
    c.write_text(campaign.read_text().replace('state_dir = "state"', f'state_dir = "{tmp_path / "st"}"'))
    point = str(c) if at == "CONFIG" else at
    proc = subprocess.run([sys.executable, "-c", _SIGINT_AT, point, cmd, "-c", str(c)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    _one_line(proc, 130, "interrupted")
    assert not (tmp_path / "st" / "state.json").exists()


def test_sigint_handling_does_not_hide_other_signals(campaign: Path) -> None:
    """The start-up hook answers only SIGINT: SIGTERM still ends the process by the signal."""
    proc = subprocess.run([sys.executable, "-c", _SIGINT_AT.replace("os.kill(os.getpid(), signal.SIGINT)", "os.kill(os.getpid(), signal.SIGTERM)"), "argparse", "check", "-c",
                           str(campaign)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM
