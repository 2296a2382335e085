"""A full state dir (issue 26): exit 4 in one line, no temp file left, and the campaign resumes
once there is room.

The state dir sits on a real tmpfs; a filler file leaves it a few KiB, so the daemon's next
writes (the journal, state.json, status.json, rounds.jsonl) fail with ENOSPC wherever they fall.
It used to exit 1 ("unexpected error: OSError") and leave ``.status.json.<pid>.tmp`` behind.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.demotree import kill_tree_leftovers, make_tree, proc_environ, proc_pids, run_daemon
from tests.fsfixtures import FsUnavailable, mount_tmpfs


def leftovers(state: Path) -> list[int]:
    want = f"SHOPRLD_CHILD={state}|".encode()
    return [pid for pid in proc_pids() if (env := proc_environ(pid)) is not None and want in env]


def rounds_done(state: Path) -> list[int]:
    out = []
    for line in (state / "rounds.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line)["round"])
        except (ValueError, KeyError, TypeError):
            pass
    return sorted(set(out))


@pytest.mark.parametrize("room_kib", [4, 12, 24])
def test_a_full_state_dir_stops_with_exit_4_leaves_no_temp_file_and_resumes(tmp_path: Path, room_kib: int) -> None:
    """Round 0 done; the state dir's tmpfs filled to ``room_kib`` KiB; round 1: exit 4, one line
    naming the state dir, no temp file, no child left. The filler removed: the campaign resumes
    and finishes round 1 (round 0 is not run again)."""
    campaign = make_tree(tmp_path, rounds=1)
    try:
        mount = mount_tmpfs("2m", base=tmp_path)
        mnt = mount.__enter__()
    except FsUnavailable as exc:
        pytest.skip(str(exc))
    state = mnt / "state"
    try:
        campaign.write_text(re.sub(r'^state_dir = .*$', f'state_dir = "{state}"', campaign.read_text(), flags=re.M))
        assert run_daemon(campaign).returncode == 0
        vfs = os.statvfs(mnt)
        filler = mnt / "filler"
        with open(filler, "wb") as fh:
            free = vfs.f_bavail * vfs.f_frsize - room_kib * 1024
            fh.write(b"\0" * max(0, free))
        campaign.write_text(re.sub(r"^rounds = \d+$", "rounds = 2", campaign.read_text(), flags=re.M))
        proc = run_daemon(campaign)
        assert proc.returncode == 4, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and str(state) in lines[0] and "no space left" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr
        assert not [p.name for p in state.iterdir() if p.name.startswith(".")], "temp files left"
        assert not leftovers(state), "children left running"
        filler.unlink()
        again = run_daemon(campaign)
        assert again.returncode == 0, again.stderr[-2000:]
        assert rounds_done(state) == [0, 1]
        assert json.loads((state / "state.json").read_text())["state"] == "DONE"
        rows = [ln for ln in (tmp_path / "repo/reports/shoprld/demo.tsv").read_text().splitlines()[1:] if ln]
        assert [r.split("\t")[0] for r in rows] == ["0", "1"]
    finally:
        for pid in leftovers(state):
            os.kill(pid, 9)
        kill_tree_leftovers(tmp_path)
        mount.__exit__(None, None, None)
