"""How GPU hygiene looks at the GPUs: the :class:`GpuProbe` seam and its probes.

NVML through the optional ``nvidia-ml-py`` package (``pip install 'shoprld[gpu]'``, imported as
``pynvml``), else ``nvidia-smi --query-compute-apps``, else nothing (no driver: the demo and
CI), chosen by ``gpus.probe``. Tests use a fake probe, or a stand-in ``nvidia-smi`` program
named by ``gpus.nvidia_smi``. Standard library only at load time (a GPU machine's bare Python
runs it).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any, Protocol

from shoprld.daemon.foundation.system.errors import ConfigError

MIB = 1024 * 1024
_SMI_TIMEOUT_S = 30.0
# nvidia-smi's and NVML's ways of saying "no number here".
_NO_VALUE = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]"}
_NVML_NOT_AVAILABLE = 2**64 - 1


class GpuProbeError(Exception):
    """The probe exists but failed (a driver error, a broken nvidia-smi)."""


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on one GPU, as the driver reports it."""

    pid: int
    used_bytes: int | None  # None: the driver does not say ([N/A], [Not Supported])
    gpu: int | None         # the nvidia-smi index; None when the uuid maps to no index
    uuid: str = ""


class GpuProbe(Protocol):
    """The seam: which compute processes hold GPU memory now."""

    name: str

    def compute_apps(self) -> list[GpuProcess] | None:
        """Every compute process on every GPU; None when there are no GPUs to check (no
        driver, no tool). Raises :class:`GpuProbeError` when the tool is there but fails."""
        ...


# -- the probes ---------------------------------------------------------------------------------
class NoProbe:
    """No GPUs to check: the demo, CI, ``gpus.probe = "none"``."""

    name = "none"

    def compute_apps(self) -> list[GpuProcess] | None:
        return None


class NvmlProbe:
    """NVML through ``nvidia-ml-py`` (``import pynvml``); raises ImportError when it is absent."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml  # lazy: optional extra [gpu]; ImportError picks the next probe

        self._nvml: Any = pynvml

    def compute_apps(self) -> list[GpuProcess] | None:
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            # No library or no driver loaded: nothing to check here (a CPU box with the package).
            absent = tuple(getattr(nv, n) for n in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")
                           if hasattr(nv, n))
            if absent and isinstance(exc, absent):
                return None
            raise GpuProbeError(f"NVML init: {exc}") from None
        try:
            out: list[GpuProcess] = []
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = nv.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = getattr(p, "usedGpuMemory", None)
                    ok = isinstance(used, int) and 0 <= used < _NVML_NOT_AVAILABLE
                    out.append(GpuProcess(int(p.pid), used if ok else None, index, uuid))
            return out
        except nv.NVMLError as exc:
            raise GpuProbeError(f"NVML: {exc}") from None
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass


def nvml_gpu_indices() -> tuple[list[int] | None, str]:
    """The GPU indices NVML counts (NVML's index order is nvidia-smi's), or (None, why) when it
    cannot tell: ``nvidia-ml-py`` not installed, or no driver loaded."""
    try:
        import pynvml  # lazy: optional extra [gpu]
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML: {exc}"
    try:
        return list(range(int(pynvml.nvmlDeviceGetCount()))), ""
    except pynvml.NVMLError as exc:
        return None, f"NVML: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


class SmiProbe:
    """``nvidia-smi --query-compute-apps`` (and ``--query-gpu`` for the uuid -> index map)."""

    name = "nvidia-smi"

    def __init__(self, command: str = "nvidia-smi") -> None:
        self.command = command

    def _query(self, arg: str, *, units: bool) -> str | None:
        fmt = "--format=csv,noheader" + (",nounits" if units else "")
        try:
            r = subprocess.run([self.command, arg, fmt], capture_output=True, text=True, timeout=_SMI_TIMEOUT_S,
                               check=False)
        except FileNotFoundError:
            return None
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuProbeError(f"{self.command} {arg}: {exc}") from None
        if r.returncode != 0:
            why = (r.stderr or r.stdout).strip().splitlines()
            raise GpuProbeError(f"{self.command} {arg} exited {r.returncode}: {why[0] if why else 'no output'}")
        return r.stdout

    def compute_apps(self) -> list[GpuProcess] | None:
        gpus = self._query("--query-gpu=index,uuid", units=False)
        if gpus is None:
            return None
        apps = self._query("--query-compute-apps=pid,used_memory,gpu_uuid", units=True)
        if apps is None:
            return None
        index = parse_gpu_indices(gpus)
        return [GpuProcess(pid, used, index.get(uuid), uuid) for pid, used, uuid in parse_compute_apps(apps)]


class AutoProbe:
    """NVML when ``nvidia-ml-py`` is installed and finds a driver, else nvidia-smi, else nothing."""

    def __init__(self, nvidia_smi: str = "nvidia-smi") -> None:
        chain: list[GpuProbe] = []
        try:
            chain.append(NvmlProbe())
        except ImportError:
            pass
        chain.append(SmiProbe(nvidia_smi))
        self._chain = chain
        self.name = "auto"

    def compute_apps(self) -> list[GpuProcess] | None:
        error: GpuProbeError | None = None
        for probe in self._chain:
            try:
                found = probe.compute_apps()
            except GpuProbeError as exc:
                error = exc
                continue
            if found is not None:
                self.name = probe.name
                return found
        if error is not None:
            raise error
        return None


def build_probe(kind: str, nvidia_smi: str = "nvidia-smi") -> GpuProbe:
    """The probe ``gpus.probe`` names."""
    if kind == "none":
        return NoProbe()
    if kind == "nvidia-smi":
        return SmiProbe(nvidia_smi)
    if kind == "nvml":
        try:
            return NvmlProbe()
        except ImportError:
            raise ConfigError("gpus.probe: nvml, but the nvidia-ml-py package is not installed; "
                              "fix: pip install 'shoprld[gpu]', or set gpus.probe = \"auto\"") from None
    return AutoProbe(nvidia_smi)


# -- nvidia-smi's CSV ---------------------------------------------------------------------------
def _mib(text: str) -> int | None:
    t = text.strip()
    if t.lower() in _NO_VALUE:
        return None
    if t.lower().endswith("mib"):  # a query run without nounits
        t = t[:-3].strip()
    try:
        value = float(t)
    except ValueError:
        return None
    if not (0 <= value < 2**43):  # NaN, inf, negative, absurd: no number
        return None
    return int(value * MIB)


def parse_compute_apps(text: str) -> list[tuple[int, int | None, str]]:
    """``pid, used_memory (MiB), gpu_uuid`` lines -> (pid, used bytes or None, uuid).

    A line that is not three fields with a positive integer pid and a uuid (nvidia-smi's
    "No running processes found", a warning, garbage) is skipped; a memory value that is not a
    number ("[N/A]" under MIG or in containers, "[Not Supported]") is None, and the pid stays.
    """
    out: list[tuple[int, int | None, str]] = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        pid_s, mem_s, uuid = fields
        if not pid_s.isdigit() or not pid_s.isascii() or not uuid or int(pid_s) <= 0 or int(pid_s) >= 2**22:
            continue
        out.append((int(pid_s), _mib(mem_s), uuid))
    return out


def parse_gpu_indices(text: str) -> dict[str, int]:
    """``index, uuid`` lines -> {uuid: index}; other lines are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].isdigit() and fields[0].isascii() and fields[1]:
            out[fields[1]] = int(fields[0])
    return out


__all__ = [
    "MIB", "AutoProbe", "GpuProbe", "GpuProbeError", "GpuProcess", "NoProbe", "NvmlProbe", "SmiProbe",
    "build_probe", "nvml_gpu_indices", "parse_compute_apps", "parse_gpu_indices",
]
