"""Every child process has an owner: launch, stop, adopt, reap.

Each child runs in its own session (so its process group is its own and survives a
daemon crash), with stdout and stderr going straight to its stage log file, never
through a pipe the daemon must drain. Stopping is SIGTERM to the whole group, a grace
period, then SIGKILL to the group, and the child is always reaped. Nothing is ever killed
by name.

Every child is recorded (:class:`ChildRecord`: role (a :class:`~.roles.ChildRole`), pid, pgid and the kernel's start
time) in the state. After a daemon crash the new daemon *adopts* a child whose pid still
has the recorded start time (the pid was not reused), or stops it before relaunching.
An adopted child is not our child: its exit status is unknown, so stages judge it by its
artifacts, which is what they do anyway.

:class:`Launcher` is the seam for tests and for other launchers (Ray Jobs, conda).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from anyio.abc import Process

from shoprld.daemon.foundation.system.proctable import environ, pids
from shoprld.daemon.foundation.config.roles import ChildRole

if TYPE_CHECKING:
    from shoprld.daemon.round.plan import RoundValues

CHILD_TAG = "SHOPRLD_CHILD"


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``SHOPRLD_CHILD=<tag>`` (ours and their descendants)."""
    if not tag:
        return []
    want = f"{CHILD_TAG}={tag}".encode()
    found = []
    for pid in pids():
        if want in environ(pid) and proc_start_ticks(pid) is not None:
            found.append(pid)
    return found


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time since boot, in clock ticks), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the LAST ')'.
    rest = raw[raw.rfind(")") + 2:].split()
    if rest and rest[0] == "Z":  # a zombie is dead for our purposes
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True when ``pid`` runs and (if given) still has the recorded start time."""
    ticks = proc_start_ticks(pid)
    if ticks is None:
        return False
    return start_ticks is None or ticks == start_ticks


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclass
class ChildRecord:
    """What the state remembers of one child, enough to adopt or stop it after a crash."""

    role: str  # a ChildRole when started here; the recorded word when read back (equal to it)
    pid: int
    pgid: int
    start_ticks: int | None
    started_at: float
    log: str
    argv: list[str] = field(default_factory=list)  # redacted
    job_id: str = ""  # a Ray job's submission id (Ray Jobs launcher); "" for a local process
    # The SHOPRLD_CHILD value in its environment, inherited by every descendant: how a stop
    # finds processes that left the group (torchrun's ranks run in their own sessions).
    tag: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChildRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class Child:
    """A running (or adopted) child process, owned by one stage."""

    def __init__(self, record: ChildRecord, process: Process | None = None) -> None:
        self.record = record
        self._process = process
        self.returncode: int | None = None
        # Found running (a Ray job live in Ray), not launched by this attempt: no resume check
        # may judge it, since it loaded its checkpoint long before this attempt's look.
        self.reattached = False

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def adopted(self) -> bool:
        return self._process is None

    def alive(self) -> bool:
        if self.returncode is not None:
            return False
        if self._process is not None:
            # Keep the status once it is known, so whoever notices the exit (the ShopSim
            # supervisor's `shopsim.died`) can report it (-9: SIGKILLed) without a wait().
            self.returncode = self._process.returncode
            return self.returncode is None
        return pid_alive(self.record.pid, self.record.start_ticks)

    async def wait(self, poll: float = 0.2) -> int | None:
        """Wait for exit; our own child is reaped and gives its status, an adopted one None."""
        if self._process is not None:
            self.returncode = await self._process.wait()
            return self.returncode
        while pid_alive(self.record.pid, self.record.start_ticks):
            await anyio.sleep(poll)
        return None

    def signal_group(self, sig: int) -> None:
        """``sig`` to the child's process group, and to every process carrying its tag."""
        try:
            os.killpg(self.record.pgid, sig)
        except ProcessLookupError:
            pass
        for pid in tagged_pids(self.record.tag):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _anything_left(self) -> bool:
        return self.alive() or group_alive(self.record.pgid) or bool(tagged_pids(self.record.tag))

    async def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM to the group, ``grace`` seconds, then SIGKILL to the group; always reaped.

        Runs shielded, so a cancelled caller still leaves no orphan behind.
        """
        with anyio.CancelScope(shield=True):
            if self._anything_left():
                self.signal_group(signal.SIGTERM)
                with anyio.move_on_after(grace):
                    await self.wait(poll=0.05)
                    # The leader is gone; give the rest of its group (and its tag) the same grace.
                    while group_alive(self.record.pgid) or tagged_pids(self.record.tag):
                        await anyio.sleep(0.05)
                if self._anything_left():
                    self.signal_group(signal.SIGKILL)
            return await self.wait(poll=0.05)


class Launcher(Protocol):
    """The process seam: the engine and the stages only ever launch through this.

    ``round`` is the round the child belongs to, with its template values resolved once by
    the caller (``roundplan.RoundValues``); None for a child of no round (a Ray head, a test's
    process). A launcher that needs the round (Ray: the job's id and runtime env) reads it
    there, never from the log file's name, and never resolves the values again.
    """

    async def start(self, role: ChildRole, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None,
                    log: Path, redacted_argv: Sequence[str], round: RoundValues | None = None) -> Child: ...

    def adopt(self, record: ChildRecord) -> Child | None: ...

    async def live(self, role: ChildRole, *, log: Path, round: RoundValues) -> Child | None:
        """A child of ``role`` for ``round`` that runs without a record of ours (a Ray job that
        outlived its daemon, or that the daemon lost sight of): TRAIN asks before anything
        else, and re-attaches instead of launching under it. Local children have none."""
        ...

    async def idle(self) -> None:
        """TRAIN's job is done: stop what only it needed (a Ray head this campaign started)."""
        ...


class LocalLauncher:
    """Children as local processes in their own sessions, logging to a file."""

    async def start(self, role: ChildRole, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None,
                    log: Path, redacted_argv: Sequence[str], round: RoundValues | None = None) -> Child:
        log.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            os.write(fd, f"=== shoprld {stamp} start {role}: {' '.join(redacted_argv)}\n".encode())
            proc = await anyio.open_process(
                list(argv), stdin=None, stdout=fd, stderr=fd, cwd=cwd, env=dict(env),
                start_new_session=True,
            )
        finally:
            os.close(fd)
        record = ChildRecord(
            role=role, pid=proc.pid, pgid=proc.pid, start_ticks=proc_start_ticks(proc.pid),
            started_at=time.time(), log=str(log), argv=list(redacted_argv),
        )
        return Child(record, proc)

    def adopt(self, record: ChildRecord) -> Child | None:
        if pid_alive(record.pid, record.start_ticks):
            return Child(record, None)
        return None

    async def live(self, role: ChildRole, *, log: Path, round: RoundValues) -> Child | None:
        return None  # a local child without a record is found by its tag (children.py), not here

    async def idle(self) -> None:
        return None


class Clock(Protocol):
    """The clock seam: wall time (records) and monotonic time (deadlines)."""

    def time(self) -> float: ...
    def monotonic(self) -> float: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ChildHost(Protocol):
    """What a service (or the GPU check) uses of the daemon, besides the round's plan: the
    clock, the event sink, and the campaign's registry of children. Explicit, so that no
    service needs the stage context (``states/base.RoundContext`` provides it)."""

    @property
    def clock(self) -> Clock: ...
    def emit(self, event: str, /, **fields: Any) -> None: ...
    def find_child(self, role: str, /) -> Child | None: ...
    def unregister_child(self, child: Child, /) -> None: ...


def port_in_use(host: str, port: int) -> bool:
    """True while something accepts connections (or holds the bind) on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        try:
            return s.connect_ex((host, port)) == 0
        except OSError:
            return False


async def wait_port_free(host: str, port: int, timeout: float) -> bool:
    """Wait until nothing listens on host:port (before relaunching a server there)."""
    with anyio.move_on_after(timeout):
        while port_in_use(host, port):
            await anyio.sleep(0.1)
        return True
    return False


