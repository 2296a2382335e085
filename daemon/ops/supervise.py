"""Supervision without systemd: a supervisord config for one campaign, and its watchdog.

On the user's box (an AutoDL Docker container) PID 1 is not systemd, so ``shoprld@.service``
cannot run. Supervisor (``pip install supervisor``; AutoDL's users already know it) takes the
unit's place. ``shoprld install-service --supervisor OUT.conf`` writes one config that
``supervisord -c OUT.conf`` accepts as written, and that mirrors the unit line for line:

=============================  =========================================================
``shoprld@.service``           the supervisord config
=============================  =========================================================
``Restart=on-failure``,        ``autorestart=unexpected``, ``exitcodes=0,3,4,5``: 1, 6 and
``RestartPreventExitStatus``   signals restart; 0, 3 (config/lock/preflight), 4 (disk park)
                               and 5 (gate stop) need a human and never restart
(no start-up grace)            ``startsecs=0``: supervisord judges an exit that comes before
                               ``startsecs`` as a failed start and retries it whatever its
                               code (``supervisor/process.py``, ``finish``: "Exited too
                               quickly"), so an immediate exit 3 would be retried
``KillMode=mixed``,            ``stopsignal=TERM``, ``stopwaitsecs=900``: the daemon stops
``TimeoutStopSec=15min``       its own children; ``killasgroup``: what is left gets SIGKILL
``StateDirectory=``            ``STATE_DIRECTORY`` = the state dir ``shoprld status`` and
                               ``stop`` find by hand; supervisord's pidfile, logs and socket
                               live in ``<state dir>/supervisor/``
``WatchdogSec=120s``           the event listener below: ``NOTIFY_SOCKET``/``WATCHDOG_USEC``
                               make the daemon ping it, as it pings systemd; a heartbeat older
                               than 120 s gets the daemon SIGKILLed, and so restarted
``StartLimitBurst=5`` in 30min the listener stops the program at a sixth start in 30 minutes
=============================  =========================================================

The listener is ``python -m shoprld.daemon.ops.supervise`` (a supervisord
``[eventlistener:...]`` on ``TICK_5`` and ``PROCESS_STATE``, speaking supervisor's listener
protocol through :mod:`supervisor.childutils`, acting through supervisord's own XML-RPC on the
unix socket). Nothing here restarts anything itself: supervisord does.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, EXIT_OK, ConfigError, ShoprldError
from shoprld.daemon.foundation.records.identity import IDENTITY_FILE
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.outputs import campaign_files, write_output
from shoprld.daemon.ops.notifytest import SELF_REPORTED, death_words

SYSTEMD_RUNTIME = Path("/run/systemd/system")  # sd_booted(3): this dir exists iff systemd is PID 1
WATCHDOG_SEC = 120          # the unit's WatchdogSec=
STOP_WAIT_SEC = 15 * 60     # the unit's TimeoutStopSec=
START_LIMIT_BURST = 5       # the unit's StartLimitBurst=
START_LIMIT_WINDOW = 30 * 60  # the unit's StartLimitIntervalSec=
EXPECTED_EXITS = (0, 3, 4, 5)  # the unit's RestartPreventExitStatus=, and 0


def systemd_running(runtime_dir: Path = SYSTEMD_RUNTIME) -> bool:
    """Whether this host's init is systemd (what ``systemctl`` needs)."""
    return runtime_dir.is_dir()


def no_systemd_message(config: Path) -> str:
    """install-service's one line on a host without systemd (a Docker container's PID 1)."""
    return (f"this host does not run systemd ({SYSTEMD_RUNTIME} is missing: a container?), so a unit cannot "
            f"supervise the daemon; fix: shoprld install-service -c {config} --supervisor "
            f"{config.with_suffix('.supervisord.conf')}   (then: supervisord -c <that file>)")


@dataclass(frozen=True)
class SupervisorFiles:
    """Where one campaign's supervisord keeps its own files (under the campaign's state dir)."""

    root: Path

    @classmethod
    def for_state_dir(cls, state_dir: Path) -> SupervisorFiles:
        return cls(state_dir / "supervisor")

    @property
    def socket(self) -> Path:
        return self.root / "supervisord.sock"

    @property
    def pidfile(self) -> Path:
        return self.root / "supervisord.pid"

    @property
    def log(self) -> Path:
        return self.root / "supervisord.log"

    @property
    def daemon_log(self) -> Path:
        return self.root / "shoprld.log"

    @property
    def watchdog_log(self) -> Path:
        return self.root / "watchdog.log"

    @property
    def notify_socket(self) -> Path:
        return self.root / "notify.sock"


def program_name(campaign: str) -> str:
    """supervisord's program name for a campaign (letters, digits, ``-_.`` only)."""
    return "shoprld-" + "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in campaign)


def _q(value: str) -> str:
    """A value for supervisord's ``environment=`` (double-quoted; ``%`` is its own escape)."""
    if '"' in value or "\n" in value:
        raise ConfigError(f"{value!r}: a path for the supervisord config holds a quote or a newline; fix: rename it")
    return '"' + value.replace("%", "%%") + '"'


def _word(value: str) -> str:
    """One word of a supervisord ``command=`` (shlex-split by supervisord; ``%`` escaped)."""
    if "\n" in value:
        raise ConfigError(f"{value!r}: a path for the supervisord config holds a newline; fix: rename it")
    return shlex.quote(value).replace("%", "%%")


def render(config_path: Path, *, command: list[str], python: str, environ: Mapping[str, str] = os.environ,
           watchdog_sec: int = WATCHDOG_SEC) -> tuple[str, Layout]:
    """The supervisord config text for one campaign file (and the layout it was rendered for)."""
    config = Path(os.path.abspath(config_path))
    cfg = load_config(config)
    layout = Layout.from_config(cfg, environ)
    files = SupervisorFiles.for_state_dir(layout.state_dir)
    name = program_name(cfg.campaign.name)
    run = " ".join(_word(w) for w in [*command, "run", "-c", str(config)])
    listener = " ".join(_word(w) for w in [
        python, "-m", "shoprld.daemon.ops.supervise", "--program", name, "--notify-socket", str(files.notify_socket),
        "--watchdog-sec", str(watchdog_sec), "--start-limit", str(START_LIMIT_BURST),
        "--start-window", str(START_LIMIT_WINDOW), "--config", str(config)])
    env = {"PYTHONUNBUFFERED": "1", "STATE_DIRECTORY": str(layout.state_dir),
           "NOTIFY_SOCKET": str(files.notify_socket), "WATCHDOG_USEC": str(watchdog_sec * 1_000_000)}
    for key in ("HOME", "USER", "PATH", "XDG_STATE_HOME"):  # what `shoprld run` by hand would see
        if environ.get(key):
            env.setdefault(key, environ[key])
    environment = ",".join(f"{k}={_q(v)}" for k, v in env.items())
    # The listener's pages (notify-crashed) read the same state dir, and never ping anything.
    listener_env = ",".join(f"{k}={_q(v)}" for k, v in env.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC"))
    text = f"""\
; Rendered by `shoprld install-service --supervisor` for {config}.
; Start it with `supervisord -c THIS_FILE`; after an instance restart (AutoDL's 关机/开机 ends
; every process), start it again, e.g. in tmux:  tmux new -d -s shoprld 'supervisord -n -c THIS_FILE'
; Status: `shoprld status -c {config}`; stop gracefully: `shoprld stop -c {config}` (exit 0: not
; restarted); everything: `supervisorctl -c THIS_FILE shutdown`.
; Exit codes 0 3 4 5 need a human and are not restarted; 1, 6 and signals are, at most
; {START_LIMIT_BURST} starts in {START_LIMIT_WINDOW // 60} minutes. No secret is in this file: the daemon reads .env itself.

[unix_http_server]
file={files.socket}
chmod=0700

[supervisord]
logfile={files.log}
logfile_maxbytes=10MB
logfile_backups=3
pidfile={files.pidfile}
childlogdir={files.root}
identifier={name}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{files.socket}

[program:{name}]
command={run}
directory={layout.repo}
autostart=true
autorestart=unexpected
exitcodes={",".join(str(c) for c in EXPECTED_EXITS)}
startsecs=0
startretries=3
stopsignal=TERM
stopwaitsecs={STOP_WAIT_SEC}
stopasgroup=false
killasgroup=true
priority=100
redirect_stderr=true
stdout_logfile={files.daemon_log}
stdout_logfile_maxbytes=50MB
stdout_logfile_backups=3
environment={environment}

[eventlistener:{name}-watchdog]
command={listener}
events=TICK_5,PROCESS_STATE
priority=1
autorestart=true
buffer_size=100
stderr_logfile={files.watchdog_log}
stderr_logfile_maxbytes=5MB
stderr_logfile_backups=1
environment={listener_env}
"""
    return text, layout


def _foreign_state_dir(out: Path, own: Path) -> Path | None:
    """The state dir of another campaign that ``out`` would land in, if any."""
    for parent in [out.parent, *out.parent.parents]:
        if (parent / IDENTITY_FILE).is_file() and parent.resolve() != own.resolve():
            return parent
    return None


def write_config(config_path: Path, out: Path, *, command: list[str], python: str,
                 environ: Mapping[str, str] = os.environ) -> Path:
    """Write the config to ``out`` (refusing what is not ours to replace); return the state dir's
    supervisor dir, made with mode 0700. Raises :class:`ConfigError` (exit 3), writing nothing."""
    text, layout = render(config_path, command=command, python=python, environ=environ)
    out = Path(os.path.abspath(out))
    foreign = _foreign_state_dir(out, layout.state_dir)
    if foreign is not None:
        raise ConfigError(f"{out}: inside the state dir of another campaign ({foreign}); fix: write the "
                          f"supervisord config elsewhere, e.g. {Path(os.path.abspath(config_path)).with_suffix('.supervisord.conf')}")
    files = SupervisorFiles.for_state_dir(layout.state_dir)
    protected = campaign_files(Path(os.path.abspath(config_path)), layout)
    try:
        write_output(out, text.encode(), protected, what="supervisord config", mode=0o600)
        files.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write ({exc.strerror}); fix: choose a writable path") from None
    return files.root


# -- the watchdog listener ------------------------------------------------------------------------
@dataclass
class Watchdog:
    """The listener's memory: pure decisions on plain numbers (see :meth:`on_tick`, :meth:`on_start`)."""

    watchdog_sec: float
    start_limit: int
    start_window: float
    running_since: float | None = None
    last_beat: float | None = None
    starts: deque[float] | None = None

    def __post_init__(self) -> None:
        self.starts = deque()

    def on_start(self, now: float) -> bool:
        """The program is starting; False when this start is over the start limit."""
        assert self.starts is not None
        self.starts.append(now)
        while self.starts and now - self.starts[0] > self.start_window:
            self.starts.popleft()
        self.running_since, self.last_beat = now, None
        return len(self.starts) <= self.start_limit

    def on_stop(self) -> None:
        self.running_since, self.last_beat = None, None

    def on_beat(self, now: float) -> None:
        self.last_beat = now

    def stale(self, now: float) -> bool:
        """Whether a running daemon has not pinged for ``watchdog_sec`` (since its start, before
        its first ping: its start-up is bounded like the unit's)."""
        if self.running_since is None:
            return False
        since = self.last_beat if self.last_beat is not None else self.running_since
        return now - since > self.watchdog_sec


def _bind(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            path.unlink()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    return sock


def _drain(sock: socket.socket) -> bool:
    """Read every datagram waiting; True if one held ``WATCHDOG=1`` (or READY=1)."""
    beat = False
    while True:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return beat
        lines = data.decode(errors="replace").splitlines()
        beat = beat or "WATCHDOG=1" in lines or "READY=1" in lines


def _say(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} shoprld-watchdog: {text}", file=sys.stderr, flush=True)


# supervisord's own line for an exit it did not expect (supervisor/process.py, ``finish``).
_EXITED = "exited: {name} ("


def exit_page(program: str, log_tail: str) -> tuple[bool, str]:
    """(page?, reason) for the program's last unexpected exit, read from supervisord's log (the
    PROCESS_STATE_EXITED event carries no status, and a restart clears it from getProcessInfo).
    6 (a stage failed: the daemon paged ``failed``) is no page; a signal or 1 is."""
    at = log_tail.rfind(_EXITED.format(name=program))
    if at < 0:
        return True, "exited unexpectedly (supervisord's log does not say how)"
    words = log_tail[at + len(_EXITED.format(name=program)):].split("\n", 1)[0]
    words = words.split("; not expected")[0].rstrip(")")
    m = re.fullmatch(r"exit status (\d+)", words)
    if m:
        if int(m.group(1)) in SELF_REPORTED:
            return False, f"{words}: the daemon paged that itself"
        return True, death_words("exited", m.group(1))
    sig = re.match(r"terminated by (SIG[A-Z0-9]+)", words)
    if sig:
        return True, death_words("dumped" if "core dumped" in words else "killed", sig.group(1))
    return True, f"exited unexpectedly ({words})"


class Pager:
    """Runs ``shoprld notify-crashed`` for the listener, in the background: the listener must
    answer supervisord's next event meanwhile. Its stdin and stdout are the protocol's, so the
    child gets neither (its lines go to the listener's stderr log). Reaped on the next call."""

    def __init__(self, config: Path | None, python: str = sys.executable) -> None:
        self.config, self.python = config, python
        self.children: list[subprocess.Popen[bytes]] = []

    def page(self, reason: str, *, gave_up: bool) -> None:
        self.children = [c for c in self.children if c.poll() is None]
        if self.config is None:
            _say(f"no page ({reason}): the listener has no --config (render the config again)")
            return
        argv = [self.python, "-m", "shoprld.daemon.ops.cli", "notify-crashed", "-c", str(self.config),
                "--reason", reason, "--seen-dead", *(["--gave-up"] if gave_up else [])]
        _say(f"paging crashed: {reason}")
        try:
            self.children.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                                                  stderr=sys.stderr.fileno()))
        except OSError as exc:
            _say(f"could not run notify-crashed: {exc}")


def listen(program: str, notify_socket: Path, dog: Watchdog, *, stdin: TextIO = sys.stdin,
           stdout: TextIO = sys.stdout, rpc: Any = None, pager: Pager | None = None) -> None:
    """supervisord's listener protocol, forever: READY, one event, RESULT."""
    from supervisor import childutils  # the supervisor extra: only the listener needs it

    sock = _bind(notify_socket)
    rpc = rpc or childutils.getRPCInterface(os.environ)
    pager = pager or Pager(None)
    watchdog_killed = False
    while True:
        headers, payload = childutils.listener.wait(stdin, stdout)
        now = time.monotonic()
        if _drain(sock):
            dog.on_beat(now)
        event = headers.get("eventname", "")
        fields = childutils.get_headers(payload.split("\n", 1)[0]) if event.startswith("PROCESS_STATE") else {}
        if fields.get("processname") == program:
            if event == "PROCESS_STATE_STARTING" and not dog.on_start(now):
                _say(f"{program} started more than {dog.start_limit} times in {dog.start_window:.0f} s: "
                     f"stopping it (the unit's start limit); fix the cause, then `supervisorctl start {program}`")
                _call(rpc.supervisor.stopProcess, f"{program}", False)
                dog.on_stop()
                pager.page(f"it started more than {dog.start_limit} times in {dog.start_window / 60:.0f} minutes, "
                           "so the listener stopped it (the unit's start limit)", gave_up=True)
            elif event in ("PROCESS_STATE_EXITED", "PROCESS_STATE_STOPPED", "PROCESS_STATE_FATAL",
                           "PROCESS_STATE_BACKOFF"):
                dog.on_stop()
                if event == "PROCESS_STATE_EXITED" and fields.get("expected") == "0":
                    if watchdog_killed:
                        page, reason = True, (f"no heartbeat for {dog.watchdog_sec:.0f} s (a hung event loop): "
                                              "the watchdog listener killed it")
                    else:
                        page, reason = exit_page(program, _log_tail(rpc))
                    if page:
                        pager.page(f"{reason}; supervisord restarts it", gave_up=False)
                    else:
                        _say(f"{program} {reason}: no page")
                elif event == "PROCESS_STATE_FATAL":
                    why = _spawnerr(rpc, program)
                    pager.page(f"supervisord gave up starting it ({why})", gave_up=True)
                watchdog_killed = False
        elif event.startswith("TICK") and dog.stale(now):
            _say(f"{program} sent no heartbeat for {dog.watchdog_sec:.0f} s (the unit's WatchdogSec): "
                 "SIGKILL, supervisord restarts it")
            _call(rpc.supervisor.signalProcess, program, "KILL")
            watchdog_killed = True
            dog.on_stop()
        childutils.listener.ok(stdout)


def _log_tail(rpc: Any) -> str:
    """The last 16 KiB of supervisord's own log (a negative offset reads the tail, however short)."""
    try:
        return str(rpc.supervisor.readLog(-16384, 0))
    except Exception as exc:  # an XML-RPC fault: page without the words
        _say(f"supervisord's log could not be read: {exc}")
        return ""


def _spawnerr(rpc: Any, program: str) -> str:
    try:
        info = rpc.supervisor.getProcessInfo(program)
        return str(info.get("spawnerr") or info.get("description") or "no reason given")
    except Exception as exc:
        return f"no reason: {exc}"


def _call(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:  # an XML-RPC fault (the process already gone): say it, keep listening
        _say(f"supervisord refused {getattr(fn, '_Method__name', 'the call')}: {exc}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shoprld.daemon.ops.supervise",
                                description="supervisord event listener: the unit's watchdog and start limit")
    p.add_argument("--program", required=True)
    p.add_argument("--notify-socket", required=True, type=Path)
    p.add_argument("--watchdog-sec", type=float, default=WATCHDOG_SEC)
    p.add_argument("--start-limit", type=int, default=START_LIMIT_BURST)
    p.add_argument("--start-window", type=float, default=START_LIMIT_WINDOW)
    p.add_argument("--config", type=Path, default=None, help="the campaign file: pages go to its [notify]")
    a = p.parse_args(argv)
    try:
        listen(a.program, a.notify_socket, Watchdog(a.watchdog_sec, a.start_limit, a.start_window),
               pager=Pager(a.config))
    except KeyboardInterrupt:
        return EXIT_OK
    except ImportError:
        print("shoprld: the supervisord listener needs the supervisor package; fix: pip install 'shoprld[supervisor]'",
              file=sys.stderr)
        return EXIT_CONFIG
    except ShoprldError as exc:
        print(f"shoprld: {exc}", file=sys.stderr)
        return exc.exit_code
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
