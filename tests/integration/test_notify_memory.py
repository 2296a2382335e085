"""A webhook that answers every page 200 with a 600 MiB body (streamed lazily by the test
server, never allocated): a real daemon runs a demo campaign to the end, its pages count as
delivered, and its peak RSS (VmHWM, sampled from /proc until it exits) stays small, because
the body is never read. Prints the figure for the issue's note."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.demotree import journal, kill_tree_leftovers, make_tree, start_daemon
from tests.hostile_http import HUGE_BYTES, HostileReceiver

# The daemon's own peak is ~100 MiB on the demo; reading one 600 MiB body would be 6 times that.
PEAK_LIMIT = 400 * 1024 * 1024


@pytest.fixture(autouse=True)
def _cleanup(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    kill_tree_leftovers(tmp_path)


def _hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def test_a_600_mib_webhook_answer_is_never_read(tmp_path: Path) -> None:
    campaign = make_tree(tmp_path, rounds=2)
    campaign.write_text(campaign.read_text() + '\n[notify]\nendpoints = [{ kind = "webhook", '
                                               'url_env = "SHOPRLD_WEBHOOK_URL" }]\nbackoff = 0.05\n')
    env = tmp_path / "repo" / ".env"
    with HostileReceiver("huge") as hook:
        env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={hook.url}\n")
        proc = start_daemon(campaign)
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], _hwm(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            out, _ = proc.communicate(timeout=300)
        finally:
            done.set()
            sampler.join()
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    sent = [j for j in journal(tmp_path) if j["event"] == "notify.sent"]
    assert [j["notify_event"] for j in sent] == ["round_done", "round_done", "done"]
    print(f"\ndaemon peak RSS (VmHWM) {peak[0] / 2**20:.0f} MiB with {len(sent)} answers of "
          f"{HUGE_BYTES / 2**20:.0f} MiB; the server got {hook.sent_body / 2**20:.1f} MiB onto the wire")
    assert 0 < peak[0] < PEAK_LIMIT
    assert hook.sent_body < len(sent) * 64 * 1024 * 1024
