"""install-service --supervisor: the supervisord config (parsed by supervisor's own parser), the
no-systemd refusal, the refusals of a bad destination, and the watchdog listener's decisions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.ops import supervise
from tests.demotree import make_tree

CLI = [sys.executable, "-m", "shoprld.daemon.ops.cli"]
supervisor_options = pytest.importorskip("supervisor.options")
supervisor_datatypes = pytest.importorskip("supervisor.datatypes")


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "t", rounds=1)


def _parse(conf: Path) -> object:
    opts = supervisor_options.ServerOptions()
    opts.realize(["-c", str(conf)])  # supervisord's own reading; raises on what it refuses
    return opts


def test_the_config_is_what_supervisord_reads_and_mirrors_the_unit(demo: Path, tmp_path: Path) -> None:
    """One program running `shoprld run -c FILE`: restart on 1, 6 and signals, never on 0 3 4 5;
    startsecs 0 (an early exit is judged by its code); TERM then 15 min; files in the state dir;
    the listener registered on ticks and process states."""
    out = tmp_path / "demo.supervisord.conf"
    files = supervise.write_config(demo, out, command=["/opt/venv/bin/shoprld"], python=sys.executable)
    opts = _parse(out)
    (group,) = [g for g in opts.process_group_configs if not g.name.endswith("-watchdog")]  # type: ignore[attr-defined]
    (prog,) = group.process_configs
    assert prog.name == "shoprld-demo"
    assert prog.command == f"/opt/venv/bin/shoprld run -c {demo}"
    assert prog.exitcodes == [0, 3, 4, 5] and prog.startsecs == 0 and prog.stopwaitsecs == 900
    assert prog.autorestart is supervisor_datatypes.RestartWhenExitUnexpected
    assert prog.stopsignal == 15 and prog.killasgroup
    state = files.parent
    assert prog.environment["STATE_DIRECTORY"] == str(state)
    assert prog.environment["NOTIFY_SOCKET"] == str(files / "notify.sock")
    assert prog.environment["WATCHDOG_USEC"] == "120000000"
    assert opts.pidfile == str(files / "supervisord.pid")  # type: ignore[attr-defined]
    assert str(opts.server_configs[0]["file"]) == str(files / "supervisord.sock")  # type: ignore[attr-defined]
    (listener,) = [g for g in opts.process_group_configs if g.name.endswith("-watchdog")]  # type: ignore[attr-defined]
    assert "--watchdog-sec 120" in listener.process_configs[0].command
    assert os.stat(files).st_mode & 0o777 == 0o700
    text = out.read_text()
    assert "WANDB" not in text and "BAILIAN" not in text  # no secret, ever


def test_unexpected_means_what_the_unit_restarts() -> None:
    """supervisord's autorestart=unexpected is Restart=on-failure with RestartPreventExitStatus=3 4 5."""
    assert supervise.EXPECTED_EXITS == (0, 3, 4, 5)


def test_no_systemd_is_one_line_with_the_supervisor_form(demo: Path, tmp_path: Path) -> None:
    """A host without /run/systemd/system (a container): the line names the --supervisor form."""
    assert not supervise.systemd_running(tmp_path / "no-such-dir")
    (tmp_path / "sd").mkdir()
    assert supervise.systemd_running(tmp_path / "sd")
    line = supervise.no_systemd_message(demo)
    assert "\n" not in line and f"--supervisor {demo.with_suffix('.supervisord.conf')}" in line
    if not supervise.systemd_running():
        proc = subprocess.run([*CLI, "install-service", "-c", str(demo)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and "--supervisor" in proc.stderr
        assert proc.stdout == ""


def test_a_config_inside_another_campaigns_state_dir_is_refused(demo: Path, tmp_path: Path) -> None:
    """OUT under a dir holding another campaign's identity.json: exit 3, nothing written."""
    other = tmp_path / "other-state"
    other.mkdir()
    (other / "identity.json").write_text('{"campaign": "other"}')
    out = other / "sub" / "x.conf"
    (other / "sub").mkdir()
    with pytest.raises(ConfigError, match="another campaign"):
        supervise.write_config(demo, out, command=["shoprld"], python=sys.executable)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["dir", "fifo", "campaign", "missing-parent"])
def test_a_destination_that_is_not_ours_to_replace_is_refused(demo: Path, tmp_path: Path, kind: str) -> None:
    """A directory, a FIFO, the campaign file itself, a missing parent: one line, nothing written."""
    out = {"dir": tmp_path, "fifo": tmp_path / "fifo", "campaign": demo, "missing-parent": tmp_path / "no" / "x.conf"}[kind]
    if kind == "fifo":
        os.mkfifo(out)
    before = demo.read_bytes()
    proc = subprocess.run([*CLI, "install-service", "-c", str(demo), "--supervisor", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert demo.read_bytes() == before
    if kind == "fifo":
        assert Path(out).is_fifo()


def test_the_watchdog_kills_only_a_stale_running_daemon() -> None:
    """Stale after watchdog_sec without a ping (counted from the start before the first ping);
    never while stopped."""
    dog = supervise.Watchdog(watchdog_sec=120, start_limit=5, start_window=1800)
    assert not dog.stale(1000)
    assert dog.on_start(0)
    assert not dog.stale(120) and dog.stale(121)
    dog.on_beat(100)
    assert not dog.stale(220) and dog.stale(221)
    dog.on_stop()
    assert not dog.stale(10_000)


def test_the_start_limit_is_five_starts_in_thirty_minutes() -> None:
    """The sixth start inside 30 minutes is refused; starts older than the window are forgotten."""
    dog = supervise.Watchdog(watchdog_sec=120, start_limit=5, start_window=1800)
    assert all(dog.on_start(t) for t in (0, 60, 120, 180, 240))
    assert not dog.on_start(300)
    dog = supervise.Watchdog(watchdog_sec=120, start_limit=5, start_window=1800)
    assert all(dog.on_start(t) for t in (0, 600, 1200, 1800, 2400, 3000, 3600))


# -- pages about a dead daemon --------------------------------------------------------------------
LOG = """2026-12-05 17:20:01,001 INFO spawned: 'shoprld-demo' with pid 4242
2026-12-05 17:20:09,002 WARN exited: shoprld-demo ({how}; not expected)
2026-12-05 17:20:10,003 INFO spawned: 'shoprld-demo' with pid 4250
"""


@pytest.mark.parametrize("how,page,words", [
    ("terminated by SIGKILL", True, "killed by SIGKILL: the kernel's OOM killer?"),
    ("terminated by SIGSEGV (core dumped)", True, "killed by SIGSEGV (core dumped)"),
    ("exit status 1", True, "exited with status 1 (a bug"),
    ("exit status 6", False, "exit status 6: the daemon paged that itself"),
])
def test_an_unexpected_exit_is_paged_unless_the_daemon_paged_it(how: str, page: bool, words: str) -> None:
    """The listener reads how the program ended from supervisord's own log line (the event has no
    status): a signal or a bug is a page, 6 (a stage failed, paged `failed`) is not."""
    got_page, reason = supervise.exit_page("shoprld-demo", LOG.format(how=how))
    assert got_page is page and words in reason, reason


def test_an_exit_the_log_does_not_show_is_still_paged() -> None:
    """No line for the program (a rotated log): a page all the same, saying the log is silent."""
    assert supervise.exit_page("shoprld-demo", LOG.format(how="terminated by SIGKILL").replace("demo", "other")) == \
        (True, "exited unexpectedly (supervisord's log does not say how)")


def test_the_listener_knows_the_campaign_and_its_state_dir(demo: Path, tmp_path: Path) -> None:
    """The listener is started with --config (its pages read the campaign's [notify]) and the
    state dir the daemon uses, without the daemon's notify socket variables."""
    out = tmp_path / "demo.supervisord.conf"
    files = supervise.write_config(demo, out, command=["/opt/venv/bin/shoprld"], python=sys.executable)
    opts = _parse(out)
    (listener,) = [g for g in opts.process_group_configs if g.name.endswith("-watchdog")]  # type: ignore[attr-defined]
    conf = listener.process_configs[0]
    assert conf.command.endswith(f"--config {demo}")
    assert conf.environment["STATE_DIRECTORY"] == str(files.parent)
    assert "NOTIFY_SOCKET" not in conf.environment and "WATCHDOG_USEC" not in conf.environment
