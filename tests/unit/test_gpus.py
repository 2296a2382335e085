"""GPU hygiene's parts: nvidia-smi's CSV, the probes, whose a process is, and the failure line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.services import gpus
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.services.gpus import GpuProcess, Holder, Owners, parse_compute_apps, parse_gpu_indices
from shoprld.daemon.services.processes import CHILD_TAG

MIB = 1024**2
UUID0 = "GPU-091d79f2-a224-7b75-2e77-4c0a44cdd7cc"


def test_compute_apps_csv_is_parsed_in_bytes() -> None:
    """Real nvidia-smi lines (nounits: MiB) become (pid, bytes, uuid)."""
    text = f"503, 4706, {UUID0}\n9876, 20581, GPU-1\n"
    assert parse_compute_apps(text) == [(503, 4706 * MIB, UUID0), (9876, 20581 * MIB, "GPU-1")]


@pytest.mark.parametrize("value", ["[N/A]", "[Not Supported]", "N/A", "", "[Insufficient Permissions]", "nan", "-5"])
def test_memory_without_a_number_keeps_the_pid(value: str) -> None:
    """A memory field with no number ([N/A] under MIG or in a container, [Not Supported]) is None,
    and the pid is still reported: it holds the GPU all the same."""
    assert parse_compute_apps(f"1234, {value}, GPU-0") == [(1234, None, "GPU-0")]


def test_memory_with_units_is_read_too() -> None:
    """A query run without nounits says "4706 MiB"."""
    assert parse_compute_apps("7, 4706 MiB, GPU-0") == [(7, 4706 * MIB, "GPU-0")]


@pytest.mark.parametrize("text", ["No running processes found", "pid, used_memory, gpu_uuid",
                                  "abc, 10, GPU-0", "0, 10, GPU-0", "12, 10,", "1,2,3,4", "-3, 10, GPU-0"])
def test_lines_that_are_not_a_process_are_skipped(text: str) -> None:
    """Headers, nvidia-smi's "no processes" line, and malformed lines name no process."""
    assert parse_compute_apps(text) == []


def test_gpu_index_map() -> None:
    """``index, uuid`` lines map uuid -> index; others are skipped."""
    assert parse_gpu_indices(f"0, {UUID0}\n1, GPU-1\nwarning: x\n") == {UUID0: 0, "GPU-1": 1}


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_garbage_never_raises_and_yields_only_well_formed_rows(text: str) -> None:
    """Whatever nvidia-smi prints, the parser returns positive pids, non-negative byte counts or None."""
    for pid, used, uuid in parse_compute_apps(text):
        assert pid > 0 and uuid and (used is None or used >= 0)
    for uuid, index in parse_gpu_indices(text).items():
        assert uuid and index >= 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4_000_000), st.integers(0, 200_000) | st.sampled_from(["[N/A]", "[Not Supported]"]),
                          st.from_regex(r"GPU-[0-9a-f\-]{1,36}", fullmatch=True)), max_size=8))
def test_well_formed_rows_round_trip(rows: list[tuple[int, object, str]]) -> None:
    """Every well-formed row comes back, in order."""
    text = "\n".join(f"{p}, {m}, {u}" for p, m, u in rows)
    want = [(p, m * MIB if isinstance(m, int) else None, u) for p, m, u in rows]
    assert parse_compute_apps(text) == want


def _stand_in_smi(tmp_path: Path, apps: str, *, rc: int = 0) -> Path:
    """A stand-in nvidia-smi program (the seam gpus.nvidia_smi names)."""
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"if '--query-gpu=index,uuid' in sys.argv: print('0, GPU-a'); print('1, GPU-b')\n"
                    f"else: sys.stdout.write({apps!r})\nsys.exit({rc})\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_smi_probe_maps_uuids_to_indices(tmp_path: Path) -> None:
    """The nvidia-smi probe runs both queries and gives each process its GPU index."""
    probe = gpus.SmiProbe(str(_stand_in_smi(tmp_path, "11, 100, GPU-b\n12, [N/A], GPU-z\n")))
    assert probe.compute_apps() == [GpuProcess(11, 100 * MIB, 1, "GPU-b"), GpuProcess(12, None, None, "GPU-z")]


def test_smi_probe_absent_means_nothing_to_check(tmp_path: Path) -> None:
    """No nvidia-smi (the demo, CI): no GPUs to check, not an error."""
    assert gpus.SmiProbe(str(tmp_path / "missing")).compute_apps() is None


def test_smi_probe_failure_is_an_error_with_its_first_line(tmp_path: Path) -> None:
    """nvidia-smi that fails (a driver mismatch) raises GpuProbeError with what it said."""
    probe = gpus.SmiProbe(str(_stand_in_smi(tmp_path, "NVIDIA-SMI has failed\n", rc=9)))
    with pytest.raises(gpus.GpuProbeError, match="exited 9"):
        probe.compute_apps()


def test_probe_none_and_missing_nvml(tmp_path: Path) -> None:
    """gpus.probe = none checks nothing; nvml without the package is a one-line config error."""
    assert gpus.build_probe("none").compute_apps() is None
    try:
        import pynvml  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"nvidia-ml-py .*fix: pip install 'shoprld\[gpu\]'"):
            gpus.build_probe("nvml")


def _sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)


def test_ownership_is_the_campaign_tag_and_the_role_decides_live(tmp_path: Path) -> None:
    """A process carrying this campaign's tag is ours (its role from the tag); another campaign's
    tag, or none, is foreign; a live child's role is kept, not a straggler."""
    base = {k: v for k, v in os.environ.items() if k != CHILD_TAG}
    ours = _sleeper({**base, CHILD_TAG: f"{tmp_path}/state|val_server"})
    other = _sleeper({**base, CHILD_TAG: f"{tmp_path}/other-state|trainer"})
    bare = _sleeper(base)
    try:
        owners = Owners.of(tmp_path / "state")
        assert owners.role_of(ours.pid) == "val_server"
        assert owners.role_of(other.pid) is None and owners.role_of(bare.pid) is None
        procs = [GpuProcess(p.pid, MIB, 0, "GPU-a") for p in (ours, other, bare)] + [GpuProcess(ours.pid, MIB, 0, "x")]
        kinds = lambda live: [h.kind for h in gpus.classify(procs, visible=[0], owners=owners,  # noqa: E731
                                                             is_live=lambda r: live)]
        assert kinds(True) == ["live", "foreign", "foreign"]
        assert kinds(False) == ["straggler", "foreign", "foreign"]
        # A process on a GPU outside gpus.visible is none of our business.
        assert gpus.classify([GpuProcess(bare.pid, MIB, 3, "GPU-d")], visible=[0, 1], owners=owners,
                             is_live=lambda r: False) == []
    finally:
        for p in (ours, other, bare):
            p.kill()
            p.wait()


def test_ray_head_session_is_ours(tmp_path: Path) -> None:
    """A process in the session of the Ray head this campaign started (recorded) is ours, role "ray"."""
    head = _sleeper(dict(os.environ))
    try:
        import json

        from shoprld.daemon.services.processes import proc_start_ticks

        (tmp_path / "shoprld-head.json").write_text(json.dumps(
            {"pid": head.pid, "sid": head.pid, "start_ticks": proc_start_ticks(head.pid)}))
        sid = gpus.ray_head_sid(tmp_path)
        assert sid == head.pid
        assert Owners.of(tmp_path / "state", sid).role_of(head.pid) == "ray"
        (tmp_path / "shoprld-head.json").write_text(json.dumps({"pid": head.pid, "sid": head.pid, "start_ticks": 1}))
        assert gpus.ray_head_sid(tmp_path) is None  # the pid was reused: not our head
    finally:
        head.kill()
        head.wait()


def test_failure_line_names_pid_gpu_memory_and_owner() -> None:
    """ONE line: GPU, pid, command, memory, whose, the wait and the fix."""
    h = Holder(GpuProcess(1234, int(20.1 * 1024**3), 0, "GPU-a"), "foreign", "", "python")
    line = gpus.failure_line([h], timeout=120, stage="trainer", survivors=set())
    assert line == ("GPU 0 still holds pid 1234 (python, 20.1 GiB, not ours) after 120 s (gpus.free_timeout), "
                    "before the trainer starts; fix: end it (shoprld never stops a process that is not its own), "
                    "or take GPU 0 out of gpus.visible")
    many = [Holder(GpuProcess(i, None, i % 2, "u"), "foreign", "", "x") for i in range(1, 7)]
    line = gpus.failure_line(many, timeout=5, stage="val server", survivors=set())
    assert "\n" not in line and "memory n/a" in line and "and 2 more" in line and "GPU 0,1 out of" in line
    stuck = Holder(GpuProcess(77, MIB, 1, "u"), "straggler", "trainer", "python")
    assert "ours: trainer, survived SIGKILL" in gpus.failure_line([stuck], timeout=5, stage="trainer", survivors={77})
