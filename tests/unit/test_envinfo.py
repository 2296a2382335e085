"""Stage env tool versions (read in the env's own interpreter, nothing imported) and the GPU arch check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.foundation.system import envinfo
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.envinfo import ABSENT, Gpu, arch_warnings, normalize_sm, probe, query_gpus, stage_interpreters

RUN = Path(__file__).resolve().parents[2] / "run"


def _dist(site: Path, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture()
def memo_site(tmp_path: Path) -> Path:
    """A site dir with the memo's stack as metadata only (torch's version.py gives its CUDA)."""
    site = tmp_path / "site"
    _dist(site, "torch", "2.11.0+cu129")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('the probe must not import torch')\n")
    (site / "torch" / "version.py").write_text("__version__ = '2.11.0+cu129'\ncuda: Optional[str] = '12.9'\n")
    _dist(site, "sglang", "0.5.15.post1")
    _dist(site, "megatron-core", "0.16.0rc0")
    _dist(site, "transformer-engine", "2.16.1")
    return site


def test_probe_reads_the_memo_stack_without_importing_anything(memo_site: Path) -> None:
    """Versions come from metadata and torch/version.py; torch's __init__ (which raises) never runs."""
    env = {**os.environ, "PYTHONPATH": str(memo_site)}
    got = probe(sys.executable, env=env, stages=("train",))
    assert got.error is None, got.error
    assert got.versions == {"python": "%d.%d.%d" % sys.version_info[:3], "torch": "2.11.0+cu129", "torch.cuda": "12.9",
                            "sglang": "0.5.15.post1", "megatron-core": "0.16.0rc0", "transformer-engine": "2.16.1",
                            "apex": ABSENT}
    line = got.line()
    assert line.startswith("train (") and "torch 2.11.0+cu129" in line and "apex absent" in line


def test_megatron_from_a_source_checkout_is_read_from_package_info(tmp_path: Path) -> None:
    """megatron-core installed as a source tree (no dist-info) is read from megatron/core/package_info.py."""
    core = tmp_path / "Megatron-LM" / "megatron" / "core"
    core.mkdir(parents=True)
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 16\nPATCH = 0\nPRE_RELEASE = 'rc0'\n")
    got = probe(sys.executable, env={**os.environ, "PYTHONPATH": str(tmp_path / "Megatron-LM")})
    assert got.versions["megatron-core"] == "0.16.0rc0 (source)"


def test_missing_tools_are_absent_and_a_cpu_torch_says_cpu(tmp_path: Path) -> None:
    """Nothing installed reads 'absent'; a torch whose version.py has cuda = None reads 'cpu'."""
    site = tmp_path / "site"
    _dist(site, "torch", "2.5.0+cpu")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("cuda: Optional[str] = None\n")
    got = probe(sys.executable, env={**os.environ, "PYTHONPATH": str(site)})
    assert got.versions["torch"] == "2.5.0+cpu" and got.versions["torch.cuda"] == "cpu"
    assert got.versions["sglang"] == ABSENT and got.versions["transformer-engine"] == ABSENT


def test_probe_runs_through_conda_activation(tmp_path: Path, memo_site: Path) -> None:
    """With a conda prefix the probe runs the prefix's python after its activate.d hooks, as stages do."""
    prefix = tmp_path / "envs" / "slime"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    hooks = prefix / "etc" / "conda" / "activate.d"
    hooks.mkdir(parents=True)
    (hooks / "site.sh").write_text(f'export PYTHONPATH="{memo_site}"\n')
    got = probe("python", conda_prefix=str(prefix), env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert got.error is None, got.error
    assert got.versions["transformer-engine"] == "2.16.1" and got.conda_prefix == str(prefix)
    assert f"conda {prefix}" in got.line()


def test_probe_failures_are_one_line_errors(tmp_path: Path) -> None:
    """A missing interpreter, a hanging one (bounded by the timeout) and a broken one each give an error."""
    assert probe(str(tmp_path / "no-python")).error == f"interpreter not found ({tmp_path / 'no-python'})"
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    assert probe(str(hang), timeout=0.5).error == "probe timed out after 0.5s"
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'ImportError: libcudnn.so.9' >&2\nexit 1\n")
    broken.chmod(0o755)
    err = probe(str(broken)).error
    assert err is not None and "exit 1" in err and "libcudnn" in err and "\n" not in err


def test_stage_interpreters_group_stages_by_env() -> None:
    """The slime recipe has two envs (shopsim's and slime's); the demo runs every stage in shoprld's python."""
    slime = stage_interpreters(load_config(RUN / "slime-4xa800.toml"))
    assert [(prefix, stages[0]) for _, prefix, stages in slime] == [
        ("/root/miniconda3/envs/shopsim", "shopsim"), ("/root/miniconda3/envs/slime", "train")]
    demo = stage_interpreters(load_config(RUN / "demo" / "campaign.toml"))
    assert len(demo) == 1 and demo[0][0] == sys.executable and "train" in demo[0][2]


@pytest.mark.parametrize(("value", "sm"), [
    (80, "SM80"), ("80", "SM80"), ("sm_80", "SM80"), ("SM90", "SM90"), ("8.0", "SM80"), (9.0, "SM90"),
    ("9.0a", None), ("90a", "SM90a"), ("", None), (None, None), ("ampere", None),
])
def test_normalize_sm(value: object, sm: str | None) -> None:
    """Every common spelling of a compute capability maps to SM<major><minor>."""
    assert normalize_sm(value) == sm  # type: ignore[arg-type]


def test_arch_warning_when_the_gpu_differs_from_the_build_arch() -> None:
    """An H200 (SM90) against envs built for SM80 warns once, naming the GPUs and the TE/apex rebuild."""
    gpus = [Gpu(i, "NVIDIA H200", "9.0") for i in range(4)] + [Gpu(4, "NVIDIA A800-SXM4-80GB", "8.0")]
    (warning,) = arch_warnings("80", gpus, visible=(0, 1, 2, 3))
    assert "GPU 0,1,2,3 (NVIDIA H200) is SM90" in warning and "built for SM80" in warning
    assert "TransformerEngine and apex" in warning and 'TORCH_CUDA_ARCH_LIST="9.0"' in warning
    assert arch_warnings("sm_80", gpus, visible=(4,)) == []
    assert arch_warnings(None, gpus) == [] and arch_warnings("90", [Gpu(0, "H100", "9.0")]) == []


def test_query_gpus_with_a_real_nvidia_smi_stand_in(tmp_path: Path) -> None:
    """nvidia-smi's CSV (index, name, compute_cap) is parsed; a missing or failing one skips the check."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, 9.0'\necho '1, NVIDIA A800-SXM4-80GB, 8.0'\n")
    smi.chmod(0o755)
    gpus, problem = query_gpus(str(smi))
    assert problem is None and [(g.index, g.name, g.sm) for g in gpus] == [
        (0, "NVIDIA H200", "SM90"), (1, "NVIDIA A800-SXM4-80GB", "SM80")]
    gpus, problem = query_gpus(str(tmp_path / "absent-smi"))
    assert gpus == [] and problem is not None and "not checked" in problem
    old = tmp_path / "old-smi"
    old.write_text("#!/bin/sh\necho 'Field \"compute_cap\" is not a valid field to query.' >&2\nexit 2\n")
    old.chmod(0o755)
    gpus, problem = query_gpus(str(old))
    assert gpus == [] and problem is not None and "compute_cap" in problem


def test_gpu_report_with_an_injected_runner() -> None:
    """gpu_report carries the GPUs, the expected SM and the warnings (the record's envinfo.json shape)."""
    def runner(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "0, NVIDIA H200, 9.0\n", "")

    rep = envinfo.gpu_report("80", (0,), runner=runner)
    assert rep["expected_sm"] == "SM80" and rep["gpus"][0]["sm"] == "SM90" and len(rep["warnings"]) == 1
