"""Issue 18 end to end on demo campaigns: notifications to a real loopback receiver, failure
causes and their policy, crash bundles (with a py-spy dump of a stalled trainer), the ledger's
causes column, status, and the Prometheus textfile."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoprld.daemon.foundation.records import bundles
from tests.demotree import journal, kill_tree_leftovers, ledger_rows, make_tree, run_daemon, status
from tests.fsfixtures import tmpfs_fixture  # noqa: F401  (fixture)
from tests.receiver import Receiver

KIT = """
[notify]
endpoints = [{{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL" }}]
backoff = 0.05

[metrics]
textfile = "{prom}"
"""
OOM_TRAINER = """import sys
print("rollout 0/20 step_time=0.1", flush=True)
print("Traceback (most recent call last):", flush=True)
print('  File "megatron/core/tensor_parallel/layers.py", line 812, in forward', flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
      "of 79.33 GiB of which 1.12 GiB is free.", flush=True)
sys.exit(1)
"""


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _kit_tree(tmp_path: Path, url: str, edits: dict[str, str] | None = None) -> Path:
    campaign = make_tree(tmp_path, rounds=2, edits=edits)
    campaign.write_text(campaign.read_text() + KIT.format(prom=tmp_path / "textfile" / "shoprld.prom"))
    env = tmp_path / "repo" / ".env"
    env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={url}\n")
    return campaign


class CmdlineWatch(threading.Thread):
    """Scans every /proc/*/cmdline while the campaign runs, for a text that must never be there."""

    def __init__(self, needle: str) -> None:
        super().__init__(daemon=True)
        self.needle, self.hits, self.scans = needle.encode(), [], 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        data = Path(entry.path, "cmdline").read_bytes()
                    except OSError:
                        continue
                    if self.needle in data:
                        self.hits.append(data.decode(errors="replace"))
            self.scans += 1
            self.done.wait(0.02)


def test_crash_and_stall_are_notified_bundled_and_measured(tmp_path: Path) -> None:
    """A trainer crash (round 0) and a stall (round 1): the receiver gets recovered, stalled,
    round_done and done, with causes and bundle paths; the stall's bundle holds a py-spy dump
    taken before the stop; the ledger and status carry the causes; the .prom file parses; and
    the webhook URL is in no process's argv at any time."""
    with Receiver() as r:
        campaign = _kit_tree(tmp_path, r.url, {r"^save_interval = 10000$": "save_interval = 5"})
        watch = CmdlineWatch(r.url.split("//", 1)[1])
        watch.start()
        try:
            proc = run_daemon(campaign, env={"DEMO_CRASH_AT": "12", "DEMO_STALL_AT": "25",
                                             "DEMO_FAULT_ONCE_DIR": str(tmp_path)}, timeout=300)
        finally:
            watch.done.set()
            watch.join()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert watch.scans > 10 and watch.hits == []
    assert r.events() == ["recovered", "round_done", "stalled", "recovered", "round_done", "done"]
    stalled = r.requests[2].json()
    assert stalled["round_id"] == "round-001" and stalled["state"] == "TRAIN" and stalled["cause"] == "stall"
    bundle = Path(stalled["bundle"])
    assert bundle.name == "round-001-TRAIN-1"
    spy = (bundle / "py-spy.txt").read_text()
    if bundles.py_spy_binary() is not None:
        assert "stall_forever" in spy  # where the stand-in hangs: dumped before it was stopped
    else:
        assert spy == bundles.PY_SPY_ABSENT
    doc = json.loads((bundle / "bundle.json").read_text())
    assert doc["stalled"] and doc["argv"][1].endswith("slime_train.py") and doc["stopped_by"].startswith("shoprld")
    crash = json.loads((bundle.parent / "round-000-TRAIN-1" / "bundle.json").read_text())
    assert crash["exit_status"] == 1 and "crashing at rollout 12" in (bundle.parent / "round-000-TRAIN-1" /
                                                                      "log-tail.txt").read_text()
    failed = [j for j in journal(tmp_path) if j["event"] == "attempt.failed"]
    assert [(j["round"], j["state"], j["cause"]["name"]) for j in failed] == [(0, "TRAIN", "unknown"),
                                                                              (1, "TRAIN", "stall")]
    rows = ledger_rows(tmp_path)
    assert [row[-1] for row in rows] == ["TRAIN:unknown", "TRAIN:stall"]  # the causes column
    assert status(tmp_path)["last_failure"]["bundle"] == str(bundle)
    fams = {f.name: f for f in text_string_to_metric_families((tmp_path / "textfile" / "shoprld.prom").read_text())}
    values = {(s.name, s.labels.get("state") or s.labels.get("round")): s.value for f in fams.values() for s in f.samples}
    assert values[("shoprld_state", "DONE")] == 1 and values[("shoprld_round_metric", "1")] > 0
    assert values[("shoprld_stalls_total", None)] == 1 and values[("shoprld_restarts_total", None)] == 2


def test_the_same_cuda_oom_twice_fails_with_advice_and_pages_once_across_restarts(tmp_path: Path) -> None:
    """A trainer that OOMs every time: the second OOM in a row ends the campaign (exit 6, the
    advice in the one line); a second daemon start fails the same way, and the receiver gets one
    `failed`, not two."""
    oom = tmp_path / "oom_trainer.py"
    oom.write_text(OOM_TRAINER)
    with Receiver() as r:
        campaign = _kit_tree(tmp_path, r.url, {r"\{demo_dir\}/slime_train\.py": str(oom)})
        first = run_daemon(campaign, timeout=180)
        second = run_daemon(campaign, timeout=180)
    for proc in (first, second):
        assert proc.returncode == 6, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1] == (
            "shoprld: TRAIN failed twice in a row with cuda_oom (torch.OutOfMemoryError: CUDA out of memory. "
            "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.33 GiB of which 1.12 GiB is free.); "
            "not retried a third time; fix: lower the micro-batch (or max tokens per GPU) or raise gpus.tp_size")
    assert r.events().count("failed") == 1
    assert r.requests[-1].json()["cause"] == "cuda_oom"
    assert any(j["event"] == "notify.deduped" and j["notify_event"] == "failed" for j in journal(tmp_path))
    attempts = sorted(p.name for p in next((tmp_path / "ephemeral").rglob("attempts")).iterdir())
    assert attempts == ["round-000-TRAIN-1", "round-000-TRAIN-2", "round-000-TRAIN-3", "round-000-TRAIN-4"]


def test_inotify_watch_limit_in_the_trainer_log_is_not_a_disk_park(tmp_path: Path) -> None:
    """`[Errno 28] inotify watch limit reached` in the trainer's log is a failed attempt (retried,
    then exit 6), not a full disk: TRAIN uses disk.log_says_enospc, not its own regex."""
    trainer = tmp_path / "inotify_trainer.py"
    trainer.write_text('import sys\nprint("OSError: [Errno 28] inotify watch limit reached", flush=True)\n'
                       'sys.exit(1)\n')
    campaign = make_tree(tmp_path, rounds=1, edits={r"\{demo_dir\}/slime_train\.py": str(trainer),
                                                    r"^retries = 3$": "retries = 1"})
    proc = run_daemon(campaign, timeout=180)
    assert proc.returncode == 6, proc.stderr[-2000:]
    assert not any(j.get("dst") == "PAUSED_DISK" for j in journal(tmp_path))


def test_a_disk_park_pages_parked(tmpfs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A volume too small for the campaign (a real tmpfs) parks in PAUSED_DISK: exit 4 and one
    `parked` page that says why."""
    from tests.integration.test_disk_guard import _tree

    volume = tmpfs("36m")
    with Receiver() as r:
        campaign = _tree(tmp_path, volume, rounds=4)
        campaign.write_text(campaign.read_text() + KIT.format(prom=tmp_path / "textfile" / "shoprld.prom"))
        env = tmp_path / "repo" / ".env"
        env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={r.url}\n")
        proc = run_daemon(campaign)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert r.events()[-1] == "parked" and r.events().count("parked") == 1
    assert "parked in PAUSED_DISK: free" in r.requests[-1].json()["message"]
