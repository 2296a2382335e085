"""Why a stage attempt failed or stalled: one table of patterns, read top to bottom.

Theory of operation. :func:`classify` gets what is known about a failed attempt (its exit
status, the tail of its log, whether it stalled, and the kernel log since it started) and
returns the first :class:`Cause` whose recogniser matches. The table :data:`PATTERNS` is
plain data, in priority order: a specific cause (a CUDA OOM) beats the generic one (the
Python exception it raised), and a full disk is judged by :func:`disk.log_says_enospc`,
the project's one ENOSPC recogniser. A GPU Xid is looked for in the kernel log only (the
trainer's log never sees it). When nothing matches: the last line of a Python traceback,
else, for a death by a signal, ``killed`` (naming the signal and who may have sent it),
else ``unknown``.

The cause is journaled (``attempt.failed``), shown by ``status`` (``last_failure``),
recorded in the ledger's ``causes`` column, sent with every notification, and drives one
policy in the engine: the same CUDA OOM twice in a row is not retried a third time
(:data:`NO_THIRD_TRY`).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass

from shoprld.daemon.foundation.storage.disk import enospc_line, log_says_enospc

CUDA_OOM = "cuda_oom"
NCCL_TIMEOUT = "nccl_timeout"
ENOSPC = "enospc"
AF_UNIX_PATH = "af_unix_path_too_long"
SHOPSIM_UNREACHABLE = "shopsim_unreachable"
SGLANG_DIED = "sglang_died"
GPU_XID = "gpu_xid"
NCCL_ERROR = "nccl_error"
RAY_ACTOR_DIED = "ray_actor_died"
SEGFAULT = "segfault"
BUS_ERROR = "bus_error"
HOST_OOM = "oom"
STALL = "stall"
KILLED = "killed"  # by a signal, with no better class (no OOM-killer line, not SEGV/BUS)
PYTHON_EXCEPTION = "python_exception"
UNKNOWN = "unknown"

# Causes that retrying the same way cannot fix: a second one in a row ends the campaign.
NO_THIRD_TRY = frozenset({CUDA_OOM})


@dataclass(frozen=True)
class Cause:
    """A classified failure: the name (a constant above), the matching line, and the fix."""

    name: str
    detail: str = ""
    advice: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "detail": self.detail, "advice": self.advice}

    def line(self) -> str:
        """``cuda_oom (torch.OutOfMemoryError: CUDA out of memory...)``, one line."""
        return f"{self.name} ({self.detail[:200]})" if self.detail else self.name


@dataclass(frozen=True)
class Pattern:
    """One row of the table: a cause, a regex for the log tail, the operator's advice."""

    name: str
    regex: re.Pattern[str] | None
    advice: str
    # A recogniser that is not a regex (ENOSPC: disk.py owns it).
    test: Callable[[str], bool] | None = None


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.IGNORECASE | re.MULTILINE)


# In priority order (first match wins). Each row has its realistic log lines in
# tests/unit/test_causes.py.
PATTERNS: tuple[Pattern, ...] = (
    Pattern(ENOSPC, None, "free space on the volume (see `shoprld status` for the disk)", test=log_says_enospc),
    Pattern(CUDA_OOM, _rx(r"CUDA out of memory", r"torch\.(?:cuda\.)?OutOfMemoryError",
                          r"CUDA error: out of memory", r"cudaErrorMemoryAllocation",
                          r"CUBLAS_STATUS_ALLOC_FAILED"),
            "lower the micro-batch (or max tokens per GPU) or raise gpus.tp_size"),
    Pattern(NCCL_TIMEOUT, _rx(r"Watchdog caught collective operation timeout", r"ProcessGroupNCCL.*[Tt]imeout",
                              r"NCCL (?:communicator|operation).*(?:timed out|timeout)",
                              r"NCCL watchdog", r"DistBackendError.*NCCL"),
            "a rank hung or died: look for the first failing rank's log; check NVLink/IB health"),
    Pattern(AF_UNIX_PATH, _rx(r"AF_UNIX path (?:too long|length cannot exceed)", r"sun_path.*too long"),
            "shorten the socket directory (storage.ephemeral_root or TMPDIR): AF_UNIX paths are at most 107 bytes"),
    Pattern(SHOPSIM_UNREACHABLE, _rx(r"shopsim\S*\s.*(?:unreachable|connection refused|connecterror|timed out)",
                                     r"(?:127\.0\.0\.1|localhost|0\.0\.0\.0):5700\b.*(?:refused|unreachable|"
                                     r"ConnectError|Connect call failed)",
                                     r"(?:refused|Connect call failed|Cannot connect to host)[^\n]*:5700\b"),
            "ShopSim is down or not listening: see the shopsim log and `shoprld status`"),
    Pattern(SGLANG_DIED, _rx(r"scheduler is dead", r"Received sigquit from a child process",
                             r"sglang\S*.*(?:died|exited unexpectedly|is dead|crashed)",
                             r"SGLang (?:server|engine|router).*(?:died|exited|not responding)"),
            "the SGLang rollout engine died: see its log above this line in the trainer's log"),
    Pattern(NCCL_ERROR, _rx(r"NCCL error", r"nccl(?:InternalError|SystemError|UnhandledCudaError|RemoteError|InvalidUsage)",
                            r"NCCL WARN .*(?:fail|error)"),
            "a collective failed: find the first failing rank; check NCCL_DEBUG=INFO output, NVLink/IB and "
            "that every rank sees the same GPUs"),
    Pattern(RAY_ACTOR_DIED, _rx(r"ray\.exceptions\.(?:ActorDiedError|RayActorError)", r"\bActorDiedError\b",
                                r"The actor died unexpectedly", r"\bRayActorError\b"),
            "a Ray actor (a rollout or training worker) died: its own error is in the Ray worker logs "
            "(session_latest/logs/worker-*.err); memory pressure shows in the kernel log"),
    # The text a crashing interpreter or libc prints; the signal alone is judged in classify().
    Pattern(SEGFAULT, _rx(r"Fatal Python error: Segmentation fault", r"^Segmentation fault\b", r"\bSIGSEGV\b"),
            "a native crash (segfault): the faulthandler stack above this line names the extension; "
            "check the CUDA/driver/torch versions agree"),
    Pattern(BUS_ERROR, _rx(r"Fatal Python error: Bus error", r"^Bus error\b", r"\bSIGBUS\b"), ""),
)
PATTERNS_BY_NAME = {p.name: p for p in PATTERNS}
GPU_XID_PATTERN = re.compile(r"NVRM: Xid \([^)]*\): (\d+)[^\n]*", re.IGNORECASE)
GPU_XID_ADVICE = "a GPU fault in the kernel log: check `nvidia-smi -q` and the node's health before restarting"
_TRACEBACK = "Traceback (most recent call last):"
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)\b(?::.*)?)$")


# The kernel OOM killer's own line (host or cgroup); the "Killed process" one names the victim.
HOST_OOM_PATTERN = re.compile(r"(?:Memory cgroup out of memory|Out of memory): Kill(?:ed)? process \d+[^\n]*"
                              r"|oom-kill:[^\n]*", re.IGNORECASE)
HOST_OOM_ADVICE = ("the host (or the container's cgroup) ran out of RAM and the kernel killed the process: lower "
                   "rollout/data-loader workers or CPU offload, or give the box more memory")
SHM_HINT_BYTES = 1 << 30  # a /dev/shm below this is the usual reason for a Bus error in a container


def signal_of(exit_status: int | None) -> int | None:
    """The signal that ended a process: a negative return code (Popen), or 128+N as a shell
    wrapper reports it for the signals that end trainers (ABRT, BUS, KILL, SEGV, TERM)."""
    if exit_status is None:
        return None
    if exit_status < 0:
        return -exit_status
    if exit_status - 128 in (signal.SIGABRT, signal.SIGBUS, signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM):
        return exit_status - 128
    return None


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 77`` for one Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def bus_error_advice(shm: str = "/dev/shm") -> str:
    """A Bus error's fix, with /dev/shm's size when it is small (Docker's default is 64 MiB)."""
    try:
        st = os.statvfs(shm)
        size = st.f_blocks * st.f_frsize
    except OSError:
        size = None
    if size is not None and size < SHM_HINT_BYTES:
        return (f"{shm} is {size / 2**20:.0f} MiB: too small for the trainer's shared memory (NCCL, data "
                f"loaders); run the container with --shm-size=16g (or more), or mount a bigger tmpfs there")
    return (f"usually {shm} too small for shared memory (NCCL, data loaders): give the container "
            f"--shm-size=16g; else a file mapped into memory was truncated")


def classify(*, exit_status: int | None, log_tail: str, stalled: bool = False, kernel_log: str = "",
             shm: str = "/dev/shm") -> Cause:
    """The cause of one failed (or stalled) attempt; never raises."""
    for p in PATTERNS:
        if p.test is not None:
            if p.test(log_tail):
                return Cause(p.name, enospc_line(log_tail), p.advice)
            continue
        assert p.regex is not None
        m = p.regex.search(log_tail)
        if m:
            return Cause(p.name, _line_at(log_tail, m.start()), bus_error_advice(shm) if p.name == BUS_ERROR else p.advice)
    xid = GPU_XID_PATTERN.search(kernel_log)
    if xid:
        return Cause(GPU_XID, xid.group(0).strip(), GPU_XID_ADVICE)
    exc = last_exception(log_tail)
    if stalled:  # shoprld stopped it: the exit status is of that stop, not a crash
        seen = f"; the log's last exception: {exc}" if exc else f"; the log's last line: {_last_line(log_tail)}"
        return Cause(STALL, "no training step within train.stall_timeout: stopped by shoprld" + seen,
                     "see the bundle's py-spy.txt for where it hung (pip install 'shoprld[debug]' for py-spy)")
    sig = signal_of(exit_status)
    if sig == signal.SIGKILL:
        oom = HOST_OOM_PATTERN.search(kernel_log)
        if oom:
            return Cause(HOST_OOM, oom.group(0).strip()[:300], HOST_OOM_ADVICE)
    if sig == signal.SIGSEGV:
        return Cause(SEGFAULT, f"killed by SIGSEGV (exit status {exit_status})", PATTERNS_BY_NAME[SEGFAULT].advice)
    if sig == signal.SIGBUS:
        return Cause(BUS_ERROR, f"killed by SIGBUS (exit status {exit_status})", bus_error_advice(shm))
    if exc:
        return Cause(PYTHON_EXCEPTION, exc, "fix the error above (the full traceback is in the bundle's log tail)")
    if sig is not None:
        why = {signal.SIGKILL: "killed from outside (no OOM-killer line in the kernel log, which a container "
                               "may not see): an operator, a scheduler, or a cgroup memory limit",
               signal.SIGTERM: "asked to stop from outside shoprld (an operator or a scheduler)",
               signal.SIGABRT: "aborted (an assertion or a C++ exception): see the log tail"}.get(sig, "")
        return Cause(KILLED, f"killed by {signal_name(sig)} (exit status {exit_status})",
                     why or "see the bundle's log tail")
    what = "no exit status" if exit_status is None else f"exit status {exit_status}"
    if log_tail.strip():  # the child's own last words are the best line there is
        what += f"; its last line: {_last_line(log_tail)}"
    return Cause(UNKNOWN, what, "see the bundle's log tail")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(empty)"


def last_exception(text: str) -> str | None:
    """The last line of the last Python traceback in ``text`` (``KeyError: 'x'``), or None."""
    i = text.rfind(_TRACEBACK)
    if i < 0:
        return None
    found: str | None = None
    for line in text[i:].splitlines()[1:]:
        line = line.strip()
        if _EXC_LINE.match(line):
            found = line[:300]
    return found


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)].strip()[:300]


def kernel_log_since(monotonic_start: float, *, path: str = "/dev/kmsg", limit: int = 4096) -> str:
    """Kernel log records newer than ``monotonic_start`` (CLOCK_MONOTONIC seconds), best effort.

    Reads ``/dev/kmsg`` without blocking (its records carry microseconds since boot on the
    same clock). Returns "" when it cannot be read (no permission, a container).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    lines: list[str] = []
    try:
        for _ in range(100_000):
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record overwritten while reading; go on
                continue
            if not rec:
                break
            head, _, msg = rec.decode(errors="replace").partition(";")
            fields = head.split(",")
            if len(fields) >= 3 and fields[2].isdigit() and int(fields[2]) / 1e6 >= monotonic_start:
                lines.append(msg.split("\n", 1)[0])
    finally:
        os.close(fd)
    return "\n".join(lines[-limit:])
