"""``shoprld check`` against the machine: the GPU count (``nvidia-smi -L``, as upstream's loop
does) and each conda env's own interpreter (never the host's python through PATH)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.system.envinfo import gpu_count_check, list_gpu_indices, probe, stage_interpreters
from shoprld.daemon.foundation.config.config import load_config


def _smi(bin_dir: Path, gpus: int) -> Path:
    """A stand-in nvidia-smi that answers ``-L`` the way the real one does."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i:08x}-0000-0000-0000-000000000000)'\n"
                    for i in range(gpus))
    smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\n{lines}")
    smi.chmod(0o755)
    return smi


def _campaign(tmp_path: Path, gpus: str = "") -> Path:
    (tmp_path / "repo").mkdir(exist_ok=True)
    (tmp_path / "repo" / ".env").write_text("WANDB_API_KEY=not-a-real-key-0000000000\n")
    p = tmp_path / "c.toml"
    p.write_text(f"""
[campaign]
name = "gpuc"
experiment = "exp1"
rounds = 1
steps_per_round = 2
[storage]
repo = "repo"
ephemeral_root = "eph"
[train]
command = ["{{python}}", "t.py"]
[gpus]
visible = [0, 1, 2, 3]
tp_size = 2
{gpus}
""")
    return p


def _check(campaign: Path, smi_dir: Path | None) -> subprocess.CompletedProcess[str]:
    path = f"{smi_dir}:/usr/bin:/bin" if smi_dir else "/usr/bin:/bin"
    return subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(campaign)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path, "HOME": str(campaign.parent / "home")})


def test_check_refuses_gpus_the_machine_does_not_have(tmp_path: Path) -> None:
    """Four GPUs in gpus.visible on a one-GPU machine: NOT READY (exit 3) with one line naming the
    config key, what nvidia-smi -L lists and the fix."""
    _smi(tmp_path / "bin", 1)
    res = _check(_campaign(tmp_path), tmp_path / "bin")
    assert res.returncode == 3, res.stdout + res.stderr
    want = (f"gpus.visible names 4 GPU(s) [0, 1, 2, 3], but `nvidia-smi -L` lists 1 on this machine (GPU 0); "
            f"GPU 1,2,3 is absent: {tmp_path / 'c.toml'}:gpus.visible (list only GPUs this machine has")
    assert want in res.stdout, res.stdout
    assert "Traceback" not in res.stdout + res.stderr


def test_check_accepts_the_gpus_the_machine_has(tmp_path: Path) -> None:
    """Four listed, four present: no GPU problem; eight present: a note that 4 of 8 are in use."""
    campaign = _campaign(tmp_path)
    _smi(tmp_path / "four", 4)
    res = _check(campaign, tmp_path / "four")
    assert "gpus.visible names" not in res.stdout and "GPU count: 4 GPU(s), as `nvidia-smi -L` lists" in res.stdout
    _smi(tmp_path / "eight", 8)
    res = _check(campaign, tmp_path / "eight")
    assert "gpus.visible names" not in res.stdout and "GPU count: 4 of the machine's 8 GPUs in use" in res.stdout


def test_check_refuses_gpus_on_a_box_that_shows_none_unless_the_recipe_uses_no_gpu(tmp_path: Path) -> None:
    """No nvidia-smi and no NVML (a CPU box, or one without its driver): gpus.visible names GPUs
    that are not there, NOT READY (exit 3) in one line with the key and the fix. gpus.probe =
    "none" (the demo's stand-ins, which use no GPU): not checked, even where nvidia-smi lists fewer."""
    campaign = _campaign(tmp_path, 'nvidia_smi = "nvidia-smi-absent-here"')
    res = _check(campaign, None)
    assert res.returncode == 3, res.stdout + res.stderr
    want = "gpus.visible names 4 GPU(s) [0, 1, 2, 3], but this machine shows no GPU (nvidia-smi-absent-here not found; "
    # NVML's reason: the package is missing (CI), or it finds no driver (the [gpu] extra on a CPU box).
    assert want in res.stdout and f"): {campaign}:gpus.visible (run it on the GPU box" in res.stdout, res.stdout
    assert 'sets gpus.probe = "none")' in res.stdout
    assert "Traceback" not in res.stdout + res.stderr
    _smi(tmp_path / "bin", 1)
    (tmp_path / "demo").mkdir()
    res = _check(_campaign(tmp_path / "demo", 'probe = "none"'), tmp_path / "bin")
    assert 'GPU count not checked (gpus.probe = "none")' in res.stdout and "gpus.visible names" not in res.stdout


def test_a_driver_that_fails_is_no_gpu_for_check(tmp_path: Path) -> None:
    """nvidia-smi present but failing (no driver loaded): refused, with nvidia-smi's own last line."""
    bad = tmp_path / "bin" / "nvidia-smi"
    bad.parent.mkdir()
    bad.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    bad.chmod(0o755)
    res = _check(_campaign(tmp_path), tmp_path / "bin")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "but this machine shows no GPU (nvidia-smi -L failed (NVIDIA-SMI has failed because it could not " \
           "communicate with the driver)" in res.stdout, res.stdout


def test_a_failing_nvidia_smi_is_a_note_not_a_crash(tmp_path: Path) -> None:
    """A driver error from nvidia-smi -L skips the count with its last line."""
    bad = tmp_path / "nvidia-smi"
    bad.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    bad.chmod(0o755)
    problem, note = gpu_count_check((0,), smi=str(bad))
    assert problem is None and note is not None and "could not communicate" in note and "not checked" in note


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300))
def test_nvidia_smi_l_output_never_crashes_the_parser(text: str) -> None:
    """Whatever nvidia-smi prints, the parser returns indices it read from `GPU <n>:` lines only."""
    def runner(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, text, "")

    got, why = list_gpu_indices(runner=runner)
    assert why is None and got is not None
    assert all(isinstance(i, int) and f"GPU {i}:" in text for i in got)


# -- each conda env's own interpreter ------------------------------------------------------------


def test_a_conda_env_without_its_python_is_reported_not_read_from_the_host(tmp_path: Path) -> None:
    """A prefix whose bin/ has no python3: an error naming the path, not the host's versions
    (through activation, PATH would have found the host's python3)."""
    prefix = tmp_path / "envs" / "slime"
    (prefix / "bin").mkdir(parents=True)
    got = probe("python3", conda_prefix=str(prefix))
    assert got.error == (f"no python3 in the conda env ({prefix / 'bin' / 'python3'}); fix: check conda_prefix, "
                         "or create the env")
    assert got.versions == {}


def test_the_probe_runs_the_envs_own_python(tmp_path: Path) -> None:
    """A real env (a venv as the prefix): the probe's sys.executable is the env's own python3."""
    prefix = tmp_path / "envs" / "shopsim"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=60)
    got = probe("python3", conda_prefix=str(prefix))
    assert got.error is None, got.error
    assert Path(got.executable).parent == prefix / "bin"


def test_an_env_python_that_runs_the_hosts_is_refused(tmp_path: Path) -> None:
    """An env whose python3 is a wrapper that execs the host's interpreter: the versions would be the
    host's, so the probe says so instead of reporting them."""
    prefix = tmp_path / "envs" / "broken"
    (prefix / "bin").mkdir(parents=True)
    wrapper = prefix / "bin" / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    got = probe("python3", conda_prefix=str(prefix))
    assert got.error is not None and "outside the conda env" in got.error and got.versions == {}


def test_conda_stages_are_probed_with_the_interpreter_name_they_run() -> None:
    """The slime recipe's stages run python3 in their env; the probe asks for that name."""
    run = Path(__file__).resolve().parents[2] / "run"
    got = {(py, prefix) for py, prefix, _ in stage_interpreters(load_config(run / "slime-4xa800.toml"))}
    assert ("python3", "/root/miniconda3/envs/slime") in got


def test_check_says_whether_py_spy_is_there(tmp_path: Path) -> None:
    """A stall's bundle needs py-spy for the stacks: check says where it is, or that it is missing."""
    _smi(tmp_path / "bin", 4)
    res = _check(_campaign(tmp_path), tmp_path / "bin")
    assert "py-spy: not installed: a stall's bundle will have no stack dump; fix: pip install 'shoprld[debug]'" \
        in res.stdout or "py-spy: /" in res.stdout  # a venv with the [debug] extra has it beside python
    if "not installed" in res.stdout:
        spy = tmp_path / "bin" / "py-spy"
        spy.write_text("#!/bin/sh\nexit 0\n")
        spy.chmod(0o755)
        assert f"py-spy: {spy} (a stall's bundle gets the trainer's stacks)" in _check(_campaign(tmp_path), tmp_path / "bin").stdout


def test_check_refuses_a_metrics_textfile_where_nothing_can_be_written(tmp_path: Path) -> None:
    """A textfile under a regular file (a typo'd path): one NOT READY line, exit 3; a directory
    not made yet is fine (the writer makes it)."""
    _smi(tmp_path / "bin", 4)
    c = _campaign(tmp_path)
    (tmp_path / "afile").write_text("")
    base = c.read_text()
    c.write_text(base + f'\n[metrics]\ntextfile = "{tmp_path}/afile/shoprld.prom"\n')
    res = _check(c, tmp_path / "bin")
    assert res.returncode == 3
    assert [ln for ln in res.stdout.splitlines() if "metrics.textfile" in ln and f"{tmp_path}/afile" in ln]
    c.write_text(base + f'\n[metrics]\ntextfile = "{tmp_path}/not-yet/shoprld.prom"\n')
    assert "metrics.textfile" not in _check(c, tmp_path / "bin").stdout


def test_check_says_which_gpu_hygiene_mode_applies(tmp_path: Path) -> None:
    """A stand-in nvidia-smi (the probe seam) that lists a compute process under a pid this /proc
    does not have, as NVML does in a container: check prints the container line. With a pid of
    this machine holding a device node (made in a temp dir, named by gpus.devices): host pids
    match. ``probe = "none"``: not checked."""
    import time

    from tests.gpunodes import HOLD, make_nodes

    prefix, held = make_nodes(tmp_path / "dev")
    holder = subprocess.Popen([sys.executable, "-c", HOLD], env={**os.environ, "GPU_NODES": held})
    try:
        absent = next(p for p in range(3_000_000, 4_000_000, 7) if not os.path.exists(f"/proc/{p}"))
        pids = tmp_path / "pids"
        smi = _smi(tmp_path / "bin", 4)
        smi.write_text(smi.read_text().replace('[ "$1" = -L ] || exit 9\n', (
            '[ "$1" = --query-gpu=index,uuid ] && { echo "0, GPU-a"; exit 0; }\n'
            f'[ "$1" = --query-compute-apps=pid,used_memory,gpu_uuid ] && {{ cat {pids}; exit 0; }}\n'
            '[ "$1" = -L ] || exit 9\n')))
        campaign = _campaign(tmp_path, f'probe = "nvidia-smi"\ndevices = "{prefix}"')
        pids.write_text(f"{absent}, 2048, GPU-a\n")
        res = _check(campaign, tmp_path / "bin")
        assert (f"GPU hygiene: container: pids from NVML are host pids (1 listed, none a GPU process here); "
                f"holders found by their {prefix}* fds, free judged by memory used (probe nvidia-smi)") in res.stdout
        while not any("nvidia" in os.readlink(f"/proc/{holder.pid}/fd/{fd}")
                      for fd in os.listdir(f"/proc/{holder.pid}/fd")):
            time.sleep(0.05)
        pids.write_text(f"{holder.pid}, 2048, GPU-a\n")
        res = _check(campaign, tmp_path / "bin")
        assert "GPU hygiene: host pids match: NVML's pids are processes here (1 listed, probe nvidia-smi)" in res.stdout
        pids.write_text("")
        res = _check(campaign, tmp_path / "bin")
        assert "GPU hygiene: no compute process on the GPUs now (probe nvidia-smi)" in res.stdout
        demo = tmp_path / "demo"
        demo.mkdir()
        res = _check(_campaign(demo, 'probe = "none"'), tmp_path / "bin")
        assert 'GPU hygiene: not checked (gpus.probe = "none")' in res.stdout
    finally:
        holder.kill()
        holder.wait()


# The calls shoprld makes of nvidia-ml-py (``import pynvml``), answered for ``count`` GPUs with
# no process on them: a stand-in module on PYTHONPATH, as ``_smi`` is a stand-in nvidia-smi.
_PYNVML = '''
class NVMLError(Exception):
    pass
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return {count}
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUUID(h): return "GPU-%08x" % h
def nvmlDeviceGetComputeRunningProcesses(h): return []
'''


def test_without_nvidia_smi_check_counts_the_gpus_with_nvml(tmp_path: Path) -> None:
    """No nvidia-smi on PATH but nvidia-ml-py finds a driver: the count comes from NVML; two GPUs
    for four in gpus.visible is NOT READY naming NVML, four is the count's note."""
    campaign = _campaign(tmp_path, 'nvidia_smi = "nvidia-smi-absent-here"')
    for count, want in ((2, "gpus.visible names 4 GPU(s) [0, 1, 2, 3], but NVML lists 2 on this machine (GPU 0,1); "
                            "GPU 2,3 is absent"),
                        (4, "GPU count: 4 GPU(s), as NVML lists")):
        fake = tmp_path / f"nvml{count}"
        fake.mkdir()
        (fake / "pynvml.py").write_text(_PYNVML.format(count=count))
        res = subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(campaign)],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
                                  "PYTHONPATH": str(fake)})
        assert want in res.stdout, res.stdout + res.stderr
        assert "Traceback" not in res.stdout + res.stderr
