"""Crash bundles: the py-spy dump of a hanging process, its absence, and the bundle's files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from shoprld.daemon.foundation.records import bundles
from shoprld.daemon.foundation.config.secrets import with_pattern

SECRET = "wandb-secret-value-123456"
HANG = "import time\ndef hang_in_allreduce():\n    time.sleep(600)\nprint('ready', flush=True)\nhang_in_allreduce()\n"


@pytest.fixture
def hanging() -> subprocess.Popen[str]:
    """A stand-in trainer that hangs in a named function, in its own session."""
    proc = subprocess.Popen([sys.executable, "-c", HANG], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.skipif(bundles.py_spy_binary() is None, reason="py-spy is not installed (pip install 'shoprld[debug]')")
def test_py_spy_dump_shows_where_a_hanging_process_waits(tmp_path: Path, hanging: subprocess.Popen[str]) -> None:
    """The dump of a hanging stand-in names the function it hangs in (py-spy needs ptrace: root)."""
    out = anyio.run(lambda: bundles.dump_stacks(tmp_path, hanging.pid, with_pattern({}, None).redactor))
    text = out.read_text()
    assert f"py-spy dump --pid {hanging.pid}" in text and "hang_in_allreduce" in text
    assert hanging.poll() is None  # dumped while alive; the stop comes after


def test_without_py_spy_the_bundle_says_so(tmp_path: Path, hanging: subprocess.Popen[str]) -> None:
    """No py-spy: py-spy.txt says it is absent and how to install it."""
    out = anyio.run(lambda: bundles.dump_stacks(tmp_path, hanging.pid, with_pattern({}, None).redactor,
                                                find_py_spy=lambda: None))
    assert out.read_text() == bundles.PY_SPY_ABSENT


def test_bundle_files_are_redacted_and_never_overwritten(tmp_path: Path) -> None:
    """bundle.json, the log tail and the GPU snapshot; a secret is masked; a second bundle of the
    same attempt number (a restarted daemon) goes to the next free dir."""
    secrets = with_pattern({"WANDB_API_KEY": SECRET}, None)
    log = tmp_path / "r000-train.log"
    log.write_text(f"key={SECRET}\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    logs = tmp_path / "logs"
    for _ in range(2):
        dest = bundles.free_attempt_dir(logs, "round-000", "TRAIN", 1)
        problem = anyio.run(lambda: bundles.write_bundle(
            dest, round_id="round-000", state="TRAIN", attempt=1, exit_status=1,
            cause={"name": "cuda_oom", "detail": "x", "advice": "y"}, argv=["python", f"--key={SECRET}"],
            message="m", log_path=log, stalled=False, redactor=secrets.redactor, nvidia_smi="no-such-nvidia-smi"))
        assert problem is None
    dirs = sorted(p.name for p in (logs / "attempts").iterdir())
    assert dirs == ["round-000-TRAIN-1", "round-000-TRAIN-2"]
    first = logs / "attempts" / "round-000-TRAIN-1"
    doc = json.loads((first / "bundle.json").read_text())
    assert doc["exit_status"] == 1 and doc["cause"]["name"] == "cuda_oom" and doc["argv"] == ["python", "--key=***"]
    assert "not found" in (first / "nvidia-smi.txt").read_text()
    assert SECRET not in "".join(p.read_text() for p in first.iterdir())
    assert bundles.causes_of_round(logs, "round-000") == "TRAIN:cuda_oom TRAIN:cuda_oom"


def _bundle(logs: Path, rid: str, attempt: int, cause: str, *, stalled: bool = False) -> Path:
    log = logs.parent / "stage.log"
    log.write_text("rollout 4/20\n")
    dest = bundles.free_attempt_dir(logs, rid, "TRAIN", attempt)
    assert anyio.run(lambda: bundles.write_bundle(
        dest, round_id=rid, state="TRAIN", attempt=attempt, exit_status=0 if stalled else 1,
        cause={"name": cause, "detail": "d", "advice": "a"}, argv=["python"], message="m", log_path=log,
        stalled=stalled, redactor=with_pattern({}, None).redactor, nvidia_smi="no-such-nvidia-smi")) is None
    return dest


def test_a_stall_bundle_says_shoprld_stopped_it(tmp_path: Path) -> None:
    """Exit status 0 of a trainer we stopped for a stall is not a clean exit: the bundle says so."""
    doc = json.loads((_bundle(tmp_path / "logs", "round-000", 1, "stall", stalled=True) / "bundle.json").read_text())
    assert doc["exit_status"] == 0 and doc["stopped_by"].startswith("shoprld: no training step")
    assert "stopped_by" not in json.loads((_bundle(tmp_path / "logs", "round-000", 2, "unknown") / "bundle.json").read_text())


def test_prune_keeps_the_newest_n_per_cause_and_every_bundle_json(tmp_path: Path) -> None:
    """Six python_exception bundles and one cuda_oom, keep 2: the four oldest python_exception
    bundles lose their files but keep bundle.json (so the ledger's causes column is unchanged);
    the cuda_oom one is untouched; pruning again changes nothing."""
    logs = tmp_path / "logs"
    made = [_bundle(logs, f"round-00{i // 3}", i % 3 + 1, "python_exception") for i in range(6)]
    oom = _bundle(logs, "round-001", 9, "cuda_oom")
    for i, d in enumerate(made):  # written_at in order, whatever the clock's resolution
        doc = json.loads((d / "bundle.json").read_text())
        doc["written_at"] = 1000.0 + i
        (d / "bundle.json").write_text(json.dumps(doc))
    before = bundles.causes_of_round(logs, "round-000"), bundles.causes_of_round(logs, "round-001")
    pruned = bundles.prune(logs, 2)
    assert pruned == made[:4] or sorted(pruned) == sorted(made[:4])
    for d in made[:4]:
        assert [p.name for p in d.iterdir()] == ["bundle.json"]
        assert json.loads((d / "bundle.json").read_text())["pruned_at"] > 0
    for d in [*made[4:], oom]:
        assert {"bundle.json", "log-tail.txt", "nvidia-smi.txt"} <= {p.name for p in d.iterdir()}
    assert (bundles.causes_of_round(logs, "round-000"), bundles.causes_of_round(logs, "round-001")) == before
    assert bundles.prune(logs, 2) == []
    assert bundles.prune(tmp_path / "none", 2) == []
