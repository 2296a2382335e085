"""The user's box, scaled 1024x (issue 25): a data disk little larger than a campaign.

53 MiB checkpoints, a 9 MiB HF export, the DEFAULT floors (no limits, margin, hysteresis or
ballast set: all derive from the checkpoint size), adaptive saves, on a real tmpfs with
2 x 53 + 9 + 6 MiB free at start. Upstream's loop fits there (previous iter + new iter + the
HF dir); so must shoprld, unattended, with mid-round saves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.demotree import SHOPRLD, journal, kill_tree_leftovers, make_tree, run_daemon, status
from tests.fsfixtures import tmpfs_fixture  # noqa: F401  (fixture)

MiB = 1024 * 1024
CKPT, HF = 53 * MiB, 9 * MiB
FREE_AT_START = 2 * CKPT + HF + 6 * MiB

pytestmark = [pytest.mark.slow, pytest.mark.root]


def _tree(root: Path, volume: Path, rounds: int) -> Path:
    return make_tree(root, rounds=rounds, edits={
        r'^ephemeral_root = "ephemeral"$': f'ephemeral_root = "{volume}"',
        r"^require_mount = false$": "require_mount = true",
        r'^hard_limit = ".*"\n': "", r'^soft_limit = ".*"\n': "", r'^margin = ".*"\n': "",
        r'^hysteresis = ".*"\n': "", r'^ballast = ".*"\n': "",
        r"^keep_finals = 2$": "keep_finals = 1",
        r'^checkpoint_estimate = ".*"$': 'checkpoint_estimate = "53MiB"',
        r'^hf_estimate = ".*"$': 'hf_estimate = "9MiB"',
        r"^interval = 0.5$": "interval = 0.1",
        r'DEMO_CKPT_BYTES = "1048576"': f'DEMO_CKPT_BYTES = "{CKPT}", DEMO_HF_BYTES = "{HF}", DEMO_CKPT_SHARDS = "4"',
        # Young/Daly with a 0.5 s save and an MTBF prior of 8 s: a save every ~3 steps.
        r"^\[sidecar\]$": '[saves]\nmode = "adaptive"\ncost_guess = "0.5s"\nstep_guess = "1s"\n'
                          'prior_faults = 1\nprior_window = "8s"\n\n[sidecar]',
    })


def _size_volume(volume: Path, free: int) -> None:
    """Remount the tmpfs so that exactly ``free`` bytes (to the page) are free on it now."""
    st = os.statvfs(volume)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    subprocess.run(["mount", "-o", f"remount,size={(used + free) // 4096 * 4096}", str(volume)], check=True)


def test_a_campaign_fits_where_upstreams_loop_fits(tmpfs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """5 rounds with default floors on 2 x 53 + 9 + 6 MiB: `check` says it fits, the campaign
    ends DONE without ever parking, with mid-round saves, and one final is left."""
    volume = tmpfs("400m")
    campaign = _tree(tmp_path, volume, rounds=5)
    _size_volume(volume, FREE_AT_START)
    check = subprocess.run([*SHOPRLD, "check", "-c", str(campaign)], capture_output=True, text=True, timeout=120)
    need = next(line for line in check.stdout.splitlines() if line.startswith("disk: needs"))
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr
    assert "for 5 rounds unattended" in need and ": ok (" in need, need
    try:
        proc = run_daemon(campaign, timeout=600)
    finally:
        kill_tree_leftovers(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert status(tmp_path)["state"] == "DONE"
    records = journal(tmp_path)
    assert not [r for r in records if r.get("event") == "transition" and r.get("dst") == "PAUSED_DISK"]
    assert not [r for r in records if r.get("event") in ("disk.soft_limit", "disk.hard_limit", "saves.no_room")]
    budget = [r for r in records if r.get("event") == "disk.budget"]
    assert budget and budget[0]["ok"] is True
    mid = [r["iteration"] for r in records if r.get("event") == "checkpoint.committed" and r["iteration"] % 20]
    assert mid, "no mid-round save was committed"
    # Each vouched save superseded the previous final: never three checkpoints on the volume.
    finals_pruned = [r for r in records if r.get("event") == "retention.applied"
                     and any(i % 20 == 0 for i in r.get("deleted", []))]
    assert finals_pruned
    save_dir = next(p for p in volume.rglob("megatron") if p.is_dir())
    assert sorted(p.name for p in save_dir.glob("iter_*")) == ["iter_0000100"]
    print(f"\nshow: {need}\nshow: {len(mid)} mid-round saves, {len(finals_pruned)} prunes of a final, "
          f"min free {min(r['free_bytes'] for r in records if isinstance(r.get('free_bytes'), int)) / MiB:.1f} MiB")


def test_check_refuses_a_volume_the_first_round_cannot_finish_on(tmpfs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """53 + 9 MiB free: the first round's final save would cross the hard floor: exit 3, one line."""
    volume = tmpfs("400m")
    campaign = _tree(tmp_path, volume, rounds=5)
    _size_volume(volume, CKPT + HF)
    check = subprocess.run([*SHOPRLD, "check", "-c", str(campaign)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 3
    assert "NOT ENOUGH for the first round" in check.stdout
    assert check.stderr.count("\n") == 1 and "not enough free space on the volume" in check.stderr


def test_a_soft_limit_above_the_volume_is_refused_by_check_and_run(tmpfs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """soft_limit larger than the disk: one line naming disk.soft_limit, exit 3, nothing written."""
    volume = tmpfs("64m")
    campaign = _tree(tmp_path, volume, rounds=1)
    campaign.write_text(campaign.read_text().replace("[disk]\n", '[disk]\nsoft_limit = "1GiB"\n', 1))
    check = subprocess.run([*SHOPRLD, "check", "-c", str(campaign)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 3 and "disk.soft_limit" in check.stderr and check.stderr.count("\n") == 1
    before = sorted(p.name for p in volume.iterdir())
    run = run_daemon(campaign, timeout=120)
    assert run.returncode == 3 and "disk.soft_limit" in run.stderr and "Traceback" not in run.stderr
    assert sorted(p.name for p in volume.iterdir()) == before
