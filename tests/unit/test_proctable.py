"""The one /proc scanner (daemon/foundation/system/proctable.py), on real processes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shoprld.daemon.foundation.system.proctable import environ, group_pids, pids, session_pids


def test_a_new_session_lists_its_members_and_only_them() -> None:
    """A child in its own session (and group) with a grandchild: both listed, nobody else."""
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                              "print(p.pid, flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        assert session_pids(child.pid) == sorted([child.pid, grandchild])
        assert group_pids(child.pid) == sorted([child.pid, grandchild])
        assert os.getpid() not in session_pids(child.pid)
        assert child.pid in pids() and pids() == sorted(pids())
    finally:
        os.killpg(child.pid, 9)  # the whole group: child and grandchild
        child.wait()


def test_environ_reads_a_child_and_is_empty_for_a_gone_pid(tmp_path: Path) -> None:
    """A tag in a child's environment is found; an unlistable /proc or a gone pid gives nothing."""
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             env={**os.environ, "SHOPRLD_TEST_TAG": "x|y"}, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"  # exec'd: its own environment
        assert b"SHOPRLD_TEST_TAG=x|y" in environ(child.pid)
    finally:
        child.kill()
        child.wait()
    assert environ(child.pid) == []
    assert pids(tmp_path / "missing") == []
