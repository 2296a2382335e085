"""Failure causes: every row of daemon/foundation/tools/causes.py's table, on realistic log lines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.tools import causes
from shoprld.daemon.foundation.tools.causes import PATTERNS, classify, last_exception

# (cause, a realistic log tail). Every row of PATTERNS has at least one (checked below).
CASES = [
    (causes.CUDA_OOM, "  File \"megatron/core/tensor_parallel/layers.py\", line 812, in forward\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "79.33 GiB of which 1.12 GiB is free. Process 4121 has 78.20 GiB memory in use.\n"),
    (causes.CUDA_OOM, "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n"),
    (causes.CUDA_OOM, "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB\n"),
    (causes.NCCL_TIMEOUT, "[rank3]:[E1201 03:12:44.512 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
     "operation timeout: WorkNCCL(SeqNum=18422, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600071 "
     "milliseconds before timing out.\n"),
    (causes.NCCL_TIMEOUT, "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
     "process exited or there was a network error, NCCL version 2.21.5\n"),
    (causes.ENOSPC, "OSError: [Errno 28] No space left on device: '/ephemeral/x/checkpoints/iter_0000020/__0_0.distcp'\n"),
    (causes.ENOSPC, "RuntimeError: [enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing "
     "file data/12: file write failed\nerrno: 28\n"),
    (causes.AF_UNIX_PATH, "OSError: AF_UNIX path too long\n"),
    (causes.AF_UNIX_PATH, "ray.exceptions: ValueError: AF_UNIX path length cannot exceed 107 bytes: "
     "'/ephemeral/very/long/ray/session_2026/sockets/plasma_store'\n"),
    (causes.SHOPSIM_UNREACHABLE, "httpx.ConnectError: [Errno 111] Connection refused (http://127.0.0.1:5700/reset)\n"),
    (causes.SHOPSIM_UNREACHABLE, "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host "
     "127.0.0.1:5700 ssl:default [Connect call failed ('127.0.0.1', 5700)]\n"),
    (causes.SHOPSIM_UNREACHABLE, "WARNING shopsim_client: ShopSim at http://127.0.0.1:5700 unreachable after 5 tries\n"),
    (causes.SGLANG_DIED, "[2026-12-01 03:14:07] Rank 0 scheduler is dead. Please check if there are relevant logs.\n"),
    (causes.SGLANG_DIED, "[2026-12-01 03:14:07] Received sigquit from a child process. It usually means the child "
     "failed.\n"),
    (causes.NCCL_ERROR, "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled "
     "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclSystemError: System call "
     "(e.g. socket, malloc) or external library call failed or device error.\n"),
    (causes.NCCL_ERROR, "node-3:4121:4190 [0] NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory\n"),
    (causes.RAY_ACTOR_DIED, "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
     "\tclass_name: RolloutRayActor\n\tactor_id: 9f2c...\n"),
    (causes.RAY_ACTOR_DIED, "(raylet) A worker died or was killed while executing a task by an unexpected system "
     "error.\nray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.\n"),
    (causes.SEGFAULT, "Fatal Python error: Segmentation fault\n\nThread 0x00007f3a (most recent call first):\n"
     "  File \"/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py\", line 302 in _lazy_init\n"),
    (causes.BUS_ERROR, "Fatal Python error: Bus error\n\nThread 0x00007f3a (most recent call first):\n"
     "  File \"/opt/conda/lib/python3.10/site-packages/torch/multiprocessing/reductions.py\", line 560\n"),
    (causes.BUS_ERROR, "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
     "shared memory (shm).\nBus error (core dumped)\n"),
]


@pytest.mark.parametrize(("name", "tail"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_each_pattern_recognises_its_realistic_lines(name: str, tail: str) -> None:
    """Each table row classifies the log lines its failure really prints."""
    cause = classify(exit_status=1, log_tail="rollout 11/20 step_time=0.19\n" + tail)
    assert cause.name == name
    assert cause.detail and cause.advice


def test_every_table_row_has_a_case() -> None:
    """The table and its tests stay in step: a new row without a realistic line fails here."""
    assert {p.name for p in PATTERNS} <= {n for n, _ in CASES}


def test_inotify_watch_limit_is_not_a_full_disk() -> None:
    """`[Errno 28] inotify watch limit reached` is ENOSPC from the kernel, not a full disk."""
    tail = "OSError: [Errno 28] inotify watch limit reached\n"
    assert classify(exit_status=1, log_tail=tail).name != causes.ENOSPC


def test_oom_beats_the_python_exception_it_raised() -> None:
    """A traceback ending in the OOM is a cuda_oom, not a generic python_exception."""
    tail = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
    assert classify(exit_status=1, log_tail=tail).name == causes.CUDA_OOM


def test_python_exception_reports_its_last_line() -> None:
    """An unrecognised traceback is a python_exception whose detail is its last line."""
    tail = ("rollout 3/20\nTraceback (most recent call last):\n  File \"slime/rollout.py\", line 88, in generate\n"
            "    sample = batch[\"prompt\"]\nKeyError: 'prompt'\n[rank0] exiting\n")
    cause = classify(exit_status=1, log_tail=tail)
    assert (cause.name, cause.detail) == (causes.PYTHON_EXCEPTION, "KeyError: 'prompt'")
    assert last_exception("no traceback here\nValueError: x\n") is None


def test_gpu_xid_comes_from_the_kernel_log() -> None:
    """An Xid in the kernel log names the GPU fault; the same text in no kernel log does not."""
    kmsg = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, name=python, GPU has fallen off the bus.\n"
    cause = classify(exit_status=-9, log_tail="rollout 4/20\n", kernel_log=kmsg)
    assert cause.name == causes.GPU_XID and "79" in cause.detail
    assert classify(exit_status=-9, log_tail="rollout 4/20\n").name == causes.KILLED


def test_unknown_says_the_exit_status_and_a_stall_says_it_stalled() -> None:
    """Nothing recognisable: unknown, with the exit status; a stall is `stall`, stopped by us,
    whatever the exit status of that stop (0 for a trainer that handles SIGTERM)."""
    assert classify(exit_status=3, log_tail="").detail == "exit status 3"
    assert classify(exit_status=1, log_tail="rollout 4/20\n[demo fault] crashing at rollout 5\n\n").detail == \
        "exit status 1; its last line: [demo fault] crashing at rollout 5"
    stall = classify(exit_status=0, log_tail="rollout 4/20\n", stalled=True)
    assert stall.name == causes.STALL and "stopped by shoprld" in stall.detail and "rollout 4/20" in stall.detail
    tail = "Traceback (most recent call last):\n  File \"w.py\", line 1\nKeyError: 'rho'\nrollout 4/20\n"
    assert classify(exit_status=-15, log_tail=tail, stalled=True).detail.endswith("last exception: KeyError: 'rho'")


OOM_KILL = ("Out of memory: Killed process 4121 (python) total-vm:812345678kB, anon-rss:120000000kB, "
            "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:300000kB oom_score_adj:0")


@pytest.mark.parametrize("status", [-9, 137])
def test_sigkill_with_the_oom_killer_line_is_a_host_oom(status: int) -> None:
    """Signal 9 (or a shell's 137) with the kernel's OOM-killer line since the attempt began: oom,
    the kernel's line as the detail. Without that line: killed, naming SIGKILL and who may have sent it."""
    kmsg = f"oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=python,pid=4121,uid=0\n{OOM_KILL}\n"
    cause = classify(exit_status=status, log_tail="rollout 4/20\n", kernel_log=kmsg)
    assert cause.name == causes.HOST_OOM and "pid=4121" in cause.detail and "RAM" in cause.advice
    bare = classify(exit_status=status, log_tail="rollout 4/20\n")
    assert bare.name == causes.KILLED and bare.detail == f"killed by SIGKILL (exit status {status})"
    assert "OOM-killer" in bare.advice
    # Not signal 9: an OOM line in the kernel log is not this attempt's cause.
    assert classify(exit_status=1, log_tail="", kernel_log=kmsg).name == causes.UNKNOWN


def test_sigsegv_and_sigbus_by_signal_and_the_shm_hint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A silent death by SIGSEGV/SIGBUS is named by the signal; a Bus error's advice gives /dev/shm's
    size when it is small (a real 64 MiB tmpfs stands in for a container's /dev/shm)."""
    from tests.fsfixtures import FsUnavailable, mount_tmpfs

    assert classify(exit_status=-11, log_tail="rollout 4/20\n").name == causes.SEGFAULT
    assert classify(exit_status=139, log_tail="").detail == "killed by SIGSEGV (exit status 139)"
    assert classify(exit_status=-7, log_tail="").name == causes.BUS_ERROR
    try:
        with mount_tmpfs("64m", base=tmp_path) as shm:
            advice = classify(exit_status=-7, log_tail="", shm=str(shm)).advice
    except FsUnavailable as exc:
        pytest.skip(str(exc))
    assert advice.startswith(f"{shm} is 64 MiB: too small") and "--shm-size" in advice


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=2000), st.one_of(st.none(), st.integers(-255, 255)), st.booleans(), st.text(max_size=300))
def test_classify_never_raises_on_any_log(tail: str, status: int | None, stalled: bool, kmsg: str) -> None:
    """Whatever a child printed, classification returns a known cause with a one-line detail."""
    cause = classify(exit_status=status, log_tail=tail, stalled=stalled, kernel_log=kmsg)
    known = {p.name for p in PATTERNS} | {causes.GPU_XID, causes.PYTHON_EXCEPTION, causes.UNKNOWN, causes.STALL,
                                          causes.HOST_OOM, causes.KILLED}
    assert cause.name in known and "\n" not in cause.detail
