"""The stage environments' tool versions, and the GPU architecture check (issue 9).

The memo's box (``seeds/003``) pins its stack by hand: Python 3.12, torch 2.11.0+cu129,
sglang 0.5.15.post1, megatron-core 0.16.0rc0, TransformerEngine 2.16.1, all built for A800
(SM80); "another GPU architecture needs TE and apex rebuilt". So the launch checklist and
the reproducibility record carry, for every distinct stage interpreter:

- its versions, read by running THAT interpreter (through conda activation when the stage
  names a ``conda_prefix``, exactly as the stage runs) on a tiny ``importlib.metadata``
  script. Nothing is imported: importing torch or TE costs seconds and may need a GPU; the
  torch CUDA version is read from ``torch/version.py``. Bounded by a timeout; a tool that is
  not installed is ``absent``;
- a warning when a visible GPU's compute capability (``nvidia-smi --query-gpu=compute_cap``)
  differs from the SM the envs were built for (an argument here; the config key is
  ``gpus.build_sm``).

Only the standard library at import time, so ``python daemon/foundation/system/envinfo.py --expected-sm 80``
also runs on a bare box.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoprld.daemon.foundation.config.condaenv import activation_argv
from shoprld.daemon.foundation.config.configvalues import normalize_sm

if TYPE_CHECKING:
    from shoprld.daemon.foundation.config.config import Config
    from shoprld.daemon.foundation.records.layout import Layout

ABSENT = "absent"
# The report's columns, in the memo's order.
TOOLS = ("python", "torch", "torch.cuda", "sglang", "megatron-core", "transformer-engine", "apex")

# Runs inside the stage's interpreter. Reads metadata only; never imports a tool.
_PROBE = r"""
import json, os, re, sys
import importlib.metadata as md, importlib.util as iu
def ver(*names):
    for n in names:
        try:
            return md.version(n)
        except Exception:
            pass
    return None
def pkg_file(pkg, *rel):
    try:
        spec = iu.find_spec(pkg)
    except Exception:
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = os.path.join(loc, *rel)
        if os.path.isfile(p):
            return p
    return None
def read(p):
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return ""
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable}
out["torch"] = ver("torch")
cuda = None
p = pkg_file("torch", "version.py")
if p:
    m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", read(p), re.M)
    cuda = m.group(1) if m else "cpu"
out["torch.cuda"] = cuda
out["sglang"] = ver("sglang")
mc = ver("megatron-core", "megatron_core")
if mc is None:
    p = pkg_file("megatron", "core", "package_info.py")
    if p:
        t = read(p)
        parts = [re.search(r"^%s\s*=\s*['\"]?([0-9A-Za-z]*)" % k, t, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
        pre = re.search(r"^PRE_RELEASE\s*=\s*['\"]([^'\"]*)['\"]", t, re.M)
        if all(parts):
            mc = ".".join(x.group(1) for x in parts) + (pre.group(1) if pre else "") + " (source)"
out["megatron-core"] = mc
out["transformer-engine"] = ver("transformer-engine", "transformer_engine", "transformer-engine-cu12",
                                "transformer_engine_torch")
out["apex"] = ver("apex")
print("SHOPRLD-ENVINFO " + json.dumps(out))
"""
_MARK = "SHOPRLD-ENVINFO "
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class EnvVersions:
    """One stage interpreter and what it has installed."""

    python: str                          # the interpreter as the stages name it
    conda_prefix: str | None
    stages: tuple[str, ...]
    versions: Mapping[str, str] = field(default_factory=dict)  # TOOLS -> version or "absent"
    executable: str = ""                 # sys.executable as the env itself reports it
    error: str | None = None             # the probe could not run (then versions is empty)

    def line(self) -> str:
        """One line for ``shoprld check``."""
        where = f"conda {self.conda_prefix}" if self.conda_prefix else self.python
        head = f"{'+'.join(self.stages)} ({where})"
        if self.error:
            return f"{head}: {self.error}"
        return head + ": " + ", ".join(f"{t} {self.versions.get(t, ABSENT)}" for t in TOOLS)

    def as_dict(self) -> dict[str, Any]:
        return {"python": self.python, "conda_prefix": self.conda_prefix, "stages": list(self.stages),
                "executable": self.executable, "versions": dict(self.versions), "error": self.error}


def probe(python: str, *, conda_prefix: str | None = None, env: Mapping[str, str] | None = None,
          timeout: float = 20.0, stages: Sequence[str] = ()) -> EnvVersions:
    """Run the probe in ``python`` (through conda activation when ``conda_prefix`` is set)."""
    base = EnvVersions(python, conda_prefix, tuple(stages))
    argv = [python, "-c", _PROBE]
    own: Path | None = None
    if conda_prefix:
        # The env's own interpreter, by its path: a bare name would fall back to the host's
        # python through PATH when the env has none, and report the host's versions as the env's.
        own = Path(conda_prefix) / "bin" / Path(python).name
        if not own.is_file():
            return _with(base, error=f"no {Path(python).name} in the conda env ({own}); fix: check "
                                     "conda_prefix, or create the env")
        argv = activation_argv(Path(conda_prefix), [str(own), "-c", _PROBE])
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                             env=dict(env) if env is not None else None)
    except FileNotFoundError:
        return _with(base, error=f"interpreter not found ({argv[0]})")
    except subprocess.TimeoutExpired:
        return _with(base, error=f"probe timed out after {timeout:g}s")
    except OSError as exc:
        return _with(base, error=f"cannot run the probe ({exc.strerror or exc})")
    found = [ln[len(_MARK):] for ln in res.stdout.splitlines() if ln.startswith(_MARK)]
    if not found:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return _with(base, error=f"probe failed (exit {res.returncode}: {tail[:200]})")
    try:
        raw = json.loads(found[-1])
    except ValueError:
        return _with(base, error="probe printed garbage")
    versions = {t: str(raw.get(t)) if raw.get(t) else ABSENT for t in TOOLS}
    executable = str(raw.get("executable", ""))
    if own is not None and not _inside(executable, Path(conda_prefix or "")):
        return _with(base, executable=executable,
                     error=f"{own} runs {executable or '?'}, outside the conda env: its versions would be "
                           "the host's; fix: recreate the env's python")
    return _with(base, versions=versions, executable=executable)


def _inside(executable: str, prefix: Path) -> bool:
    """Whether ``executable`` lies in ``prefix`` (as named, or after resolving links)."""
    if not executable:
        return False
    for exe, root in ((Path(executable), prefix), (Path(executable).resolve(), prefix.resolve())):
        if exe == root or root in exe.parents:
            return True
    return False


def _with(v: EnvVersions, **changes: Any) -> EnvVersions:
    return replace(v, **changes)


def _interpreter(template: Sequence[str]) -> str | None:
    """The python a stage command runs, or None when its argv[0] is not a python."""
    if not template:
        return None
    first = template[0]
    if first == "{python}":
        return sys.executable
    if "{" in first:
        return None
    if _PYTHON_NAME.match(Path(first).name):
        return first if os.path.isabs(first) else (shutil.which(first) or first)
    return None


def _python_name(template: Sequence[str]) -> str:
    """The interpreter name a conda stage runs (``python3``), else ``python``."""
    first = Path(template[0]).name if template else ""
    return first if _PYTHON_NAME.match(first) else "python"


def stage_interpreters(cfg: Config) -> list[tuple[str, str | None, list[str]]]:
    """(python, conda_prefix, stage names) for every distinct stage interpreter, in stage order."""
    specs: list[tuple[str, Any, Sequence[str]]] = [
        ("shopsim", cfg.shopsim, cfg.shopsim.command),
        ("train", cfg.train, cfg.train.command),
        ("sidecar", cfg.sidecar, cfg.sidecar.command if cfg.sidecar.enabled else ()),
        ("export", cfg.export, cfg.export.command),
        ("val-server", cfg.val, cfg.val.server_command),
        ("val", cfg.val, cfg.val.command),
        ("gate", cfg.gate, cfg.gate.command or cfg.gate.analyze_command),
        ("inject", cfg.inject, cfg.inject.command),
    ]
    out: dict[tuple[str, str | None], list[str]] = {}
    for name, spec, template in specs:
        prefix = str(spec.conda_prefix) if spec.conda_prefix else None
        # In a conda env the stage's own interpreter name (the recipe's python3), found in the env.
        python = _python_name(template) if prefix else _interpreter(template)
        if python is None and prefix is None:
            continue
        out.setdefault((python or "python", prefix), []).append(name)
    return [(py, prefix, stages) for (py, prefix), stages in out.items()]


def stage_env_versions(cfg: Config, layout: Layout | None = None, *, timeout: float = 20.0) -> list[EnvVersions]:
    """Probe every distinct stage interpreter (with the etiquette's child environment)."""
    env = dict(layout.child_env(cfg)) if layout is not None else None
    return [probe(py, conda_prefix=prefix, env=env, timeout=timeout, stages=stages)
            for py, prefix, stages in stage_interpreters(cfg)]


# -- the GPU architecture --------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str  # "8.0"

    @property
    def sm(self) -> str:
        return normalize_sm(self.compute_cap) or f"?{self.compute_cap}"


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def query_gpus(smi: str = "nvidia-smi", *, timeout: float = 10.0,
               runner: Runner = subprocess.run) -> tuple[list[Gpu], str | None]:
    """(GPUs, problem). No nvidia-smi, or a driver that cannot report compute_cap, gives
    ([], why): the check is then skipped, not failed (a CPU-only box has nothing to check)."""
    argv = [smi, "--query-gpu=index,name,compute_cap", "--format=csv,noheader"]
    try:
        res = runner(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return [], f"{smi} not found: GPU architecture not checked"
    except subprocess.TimeoutExpired:
        return [], f"{smi} timed out after {timeout:g}s: GPU architecture not checked"
    except OSError as exc:
        return [], f"{smi}: {exc.strerror or exc}: GPU architecture not checked"
    if res.returncode != 0:
        tail = ((res.stderr or res.stdout).strip().splitlines() or ["no output"])[-1]
        return [], f"{smi} failed ({tail[:200]}): GPU architecture not checked"
    gpus: list[Gpu] = []
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        gpus.append(Gpu(int(cells[0]), ", ".join(cells[1:-1]), cells[-1]))
    return gpus, None if gpus else f"{smi} listed no GPU: GPU architecture not checked"


def arch_warnings(expected_sm: str | int | None, gpus: Sequence[Gpu],
                  visible: Sequence[int] | None = None) -> list[str]:
    """One line per GPU architecture among the visible GPUs that differs from ``expected_sm``."""
    want = normalize_sm(expected_sm)
    if want is None:
        return []
    chosen = [g for g in gpus if visible is None or g.index in visible]
    by_sm: dict[str, list[Gpu]] = {}
    for g in chosen:
        if g.sm.rstrip("a") != want.rstrip("a"):
            by_sm.setdefault(g.sm, []).append(g)
    out = []
    for sm, group in by_sm.items():
        ids = ",".join(str(g.index) for g in group)
        names = ", ".join(sorted({g.name for g in group}))
        digits = sm[2:].rstrip("a")
        arch = f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() else "?"
        out.append(
            f"GPU {ids} ({names}) is {sm}, but the stage envs were built for {want}: TransformerEngine and "
            f"apex (and any other CUDA extension) must be rebuilt for {sm}; fix: rebuild them with "
            f"TORCH_CUDA_ARCH_LIST=\"{arch}\", then record the new arch in gpus.build_sm"
        )
    return out


def gpu_report(expected_sm: str | int | None, visible: Sequence[int] | None = None, *,
               smi: str = "nvidia-smi", runner: Runner = subprocess.run) -> dict[str, Any]:
    """What the record and ``check`` show: the GPUs, the expected SM, and the warnings."""
    gpus, problem = query_gpus(smi, runner=runner)
    return {
        "gpus": [{"index": g.index, "name": g.name, "compute_cap": g.compute_cap, "sm": g.sm} for g in gpus],
        "expected_sm": normalize_sm(expected_sm),
        "problem": problem,
        "warnings": arch_warnings(expected_sm, gpus, visible),
    }


_SMI_L = re.compile(r"^GPU (\d+):")


def list_gpu_indices(smi: str = "nvidia-smi", *, timeout: float = 10.0,
                     runner: Runner = subprocess.run) -> tuple[list[int] | None, str | None]:
    """The GPU indices ``nvidia-smi -L`` lists (``GPU 0: NVIDIA H200 (UUID: ...)``), or
    (None, why) when it cannot be asked: then the count is not checked (a box without a driver)."""
    try:
        res = runner([smi, "-L"], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None, f"{smi} not found: the GPU count was not checked"
    except subprocess.TimeoutExpired:
        return None, f"{smi} -L timed out after {timeout:g}s: the GPU count was not checked"
    except OSError as exc:
        return None, f"{smi}: {exc.strerror or exc}: the GPU count was not checked"
    if res.returncode != 0:
        tail = ((res.stderr or res.stdout).strip().splitlines() or ["no output"])[-1]
        return None, f"{smi} -L failed ({tail[:200]}): the GPU count was not checked"
    found = [int(m.group(1)) for ln in res.stdout.splitlines() if (m := _SMI_L.match(ln.strip()))]
    return sorted(set(found)), None


def gpu_count_check(visible: Sequence[int], *, smi: str = "nvidia-smi",
                    runner: Runner = subprocess.run,
                    listed: tuple[list[int] | None, str | None] | None = None,
                    source: str | None = None) -> tuple[str | None, str | None]:
    """(problem, note) for ``gpus.visible`` against the GPUs this machine has.

    Upstream's loop refuses to start unless ``nvidia-smi -L`` sees at least NUM_GPUS GPUs;
    here every id in ``gpus.visible`` must be one the machine lists (``CUDA_VISIBLE_DEVICES``
    naming an absent GPU fails only when the trainer starts). A machine with more GPUs than
    listed is fine (a note), as upstream allows. No ``nvidia-smi``: a note, no problem (the
    caller decides whether a box that shows no GPU at all is one: ``shoprld check`` refuses it).
    ``listed``: the (indices, why) another probe found instead, named ``source`` in the lines.
    """
    have, why = listed if listed is not None else list_gpu_indices(smi, runner=runner)
    if have is None:
        return None, why
    by = source or f"`{smi} -L`"
    missing = [i for i in visible if i not in have]
    shown = ",".join(str(i) for i in have) or "none"
    if missing:
        return (f"gpus.visible names {len(visible)} GPU(s) {list(visible)}, but {by} lists "
                f"{len(have)} on this machine (GPU {shown}); GPU {','.join(map(str, missing))} is absent"), None
    extra = len(have) - len(visible)
    return None, (f"{len(visible)} of the machine's {len(have)} GPUs in use (gpus.visible)" if extra > 0 else
                  f"{len(visible)} GPU(s), as {by} lists")


def main(argv: Sequence[str] | None = None) -> int:
    """``python daemon/foundation/system/envinfo.py [--expected-sm 80] [PYTHON...]``: the JSON report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--expected-sm", default=None)
    p.add_argument("pythons", nargs="*", default=[sys.executable])
    a = p.parse_args(argv)
    report = {"envs": [probe(py).as_dict() for py in a.pythons], **gpu_report(a.expected_sm)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
