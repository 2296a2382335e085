"""Megatron's async save under the daemon, on real demo campaigns (issue 30, item 2).

The stand-in trainer with ``--async-save --use-persistent-ckpt-worker`` saves as slime drives
Megatron's persistent worker: a save is finalized (``metadata.json``, then the tracker) only
when the next save starts, or at once for the round's last (forced-sync) save. So a kill -9
between two async saves leaves the newer one written but unfinalized, and the resume point
must be the save before it. Without the worker flag, Megatron's "Disabling --async-save"
warning is in the trainer's log: TRAIN journals ``train.async_save_disabled``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.demotree import SHOPRLD, journal, kill_tree_leftovers, make_tree, run_daemon, status

ASYNC_FLAGS = '"--save-hf", "{hf_dir}", "--async-save", "--use-persistent-ckpt-worker",'


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _wait_for(pred: Any, timeout: float, what: str, proc: subprocess.Popen[str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited ({proc.returncode}) before {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _train_log(root: Path) -> Path | None:
    return next((root / "ephemeral").rglob("r000-train.log"), None)


@pytest.mark.slow
def test_kill_9_between_two_async_saves_resumes_from_the_last_finalized_save(tmp_path: Path) -> None:
    """Saves every 3 (iterations 2, 5, 8, 11, ...), async. The trainer hangs at rollout 13, after
    save 11 was scheduled (its shards written) and save 8 finalized by save 11's start; it is
    SIGKILLed there (its whole process group). iter_0000011 has no metadata.json and the tracker
    says 8: the relaunch must load iter_0000008 and start at rollout 9, and the campaign ends DONE."""
    campaign = make_tree(tmp_path, rounds=1, edits={
        r"^save_interval = 10000$": "save_interval = 3",
        r'"--save-hf", "\{hf_dir\}",': ASYNC_FLAGS,
        r'^stall_min = "4s"$': 'stall_min = "120s"',  # only our kill -9 ends the hang
    })
    env = {**os.environ, "DEMO_STALL_AT": "13", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "faults")}
    out = open(tmp_path / "daemon.out", "w")
    proc = subprocess.Popen([*SHOPRLD, "run", "-c", str(campaign)], env=env, stdout=out, stderr=subprocess.STDOUT,
                            text=True)
    try:
        _wait_for(lambda: (log := _train_log(tmp_path)) is not None and b"stall at rollout 13" in log.read_bytes(),
                  120, "the trainer's hang at rollout 13", proc)
        save = next((tmp_path / "ephemeral").rglob("latest_checkpointed_iteration.txt")).parent
        pending = save / "iter_0000011"
        _wait_for(lambda: (pending / ".metadata").is_file(), 30, "save 11's shards", proc)
        # What a kill between two async saves finds: 11 written, not finalized; the tracker at 8.
        assert not (pending / "metadata.json").exists()
        assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "8"
        spawn = [r for r in journal(tmp_path) if r["event"] == "stage.spawn" and r.get("role") == "trainer"][-1]
        os.killpg(spawn["pid"], signal.SIGKILL)  # the trainer's own group (its launcher's new session)
        assert proc.wait(timeout=180) == 0, (tmp_path / "daemon.out").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    recs = journal(tmp_path)
    checks = [r for r in recs if r["event"] == "train.resume_check"]
    assert [(c["ok"], c["expected"], c["seen"]) for c in checks] == [(True, 9, 9)], checks
    assert checks[0]["checkpoint"].endswith("iter_0000008")
    assert checks[0]["rerun"] == 4  # rollouts 9..12 were trained before the kill, and again after
    assert status(tmp_path)["state"] == "DONE"
    final = save / "iter_0000020"
    assert (final / "metadata.json").is_file()  # the round's last save is finalized at once (force_sync)
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "20"


def test_megatrons_disabling_line_is_journaled_as_a_warning(tmp_path: Path) -> None:
    """--async-save without --use-persistent-ckpt-worker: the stand-in prints Megatron's warning
    and saves synchronously; TRAIN journals train.async_save_disabled with the fix, and the
    campaign still ends DONE."""
    campaign = make_tree(tmp_path, rounds=1, edits={r'"--save-hf", "\{hf_dir\}",': '"--save-hf", "{hf_dir}", "--async-save",'})
    proc = run_daemon(campaign, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [r for r in journal(tmp_path) if r["event"] == "train.async_save_disabled"]
    assert len(warned) == 1, warned
    assert "Disabling --async-save" in warned[0]["message"] and "--use-persistent-ckpt-worker" in warned[0]["message"]
    assert "\n" not in warned[0]["message"]


def test_a_launch_with_mid_round_saves_leaves_save_hf_out_and_export_converts_once(tmp_path: Path) -> None:
    """{save_hf} {save_hf_dir} with saves every 3: slime would write the HF copy after each of
    them, so the trainer gets no --save-hf and EXPORT_HF converts the final checkpoint once
    (route convert, no export.save_hf_invalid); the campaign ends DONE."""
    campaign = make_tree(tmp_path, rounds=1, edits={
        r"^save_interval = 10000$": "save_interval = 3",
        r'"--save-hf", "\{hf_dir\}",': '"{save_hf}", "{save_hf_dir}",',
    })
    proc = run_daemon(campaign, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = journal(tmp_path)
    log = next((tmp_path / "ephemeral").rglob("r000-train.log")).read_text()
    assert "--save-interval 3 " in log and "--save-hf" not in log
    assert len([r for r in recs if r["event"] == "stage.spawn" and r.get("role") == "exporter"]) == 1
    record = next((tmp_path / "ephemeral").rglob("round-000/export.json"), None) or next(
        p for p in (tmp_path / "ephemeral").rglob("*.json") if '"route"' in p.read_text(errors="replace"))
    assert '"route": "convert"' in record.read_text().replace('":"', '": "')
    assert not [r for r in recs if r["event"] == "export.save_hf_invalid"]
    assert status(tmp_path)["state"] == "DONE"
