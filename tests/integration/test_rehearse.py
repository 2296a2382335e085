"""``shoprld rehearse`` on the demo campaign (whose tools are the stand-ins): every stage ok, and
each deviation a fault knob makes a stand-in commit is named by rehearse, with exit 6.

Real processes throughout: the CLI, the engine, the campaign's ShopSim, the wrapped tools and
the stand-ins for slime, the val server and the analyst API."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.demotree import SHOPRLD, make_tree, proc_environ, proc_pids


def _rehearse(campaign: Path, env: dict[str, str] | None = None, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run([*SHOPRLD, "rehearse", "-c", str(campaign), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout, proc.stderr


def _verdicts(out: str) -> dict[str, str]:
    rows = re.findall(r"^  (\S+(?: \(slime stand-in\))?|ledger row)\s{2,}(.+)$", out, re.M)
    return {k: v for k, v in rows if not k.startswith(("stand-ins", "kept"))}


def _scratch(out: str) -> Path:
    m = re.search(r"scratch (\S+)", out)
    assert m, out
    return Path(m.group(1))


def _leftovers(scratch: Path) -> list[int]:
    """Processes still carrying the scratch tree in their environment or argv."""
    key = str(scratch).encode()
    found = []
    for pid in proc_pids():
        env = proc_environ(pid) or b""
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmd = b""
        if key in env or key in cmd:
            found.append(pid)
    return found


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tree(tmp_path_factory.mktemp("rehearse"), rounds=3)


def test_rehearse_demo_campaign_is_ok_and_leaves_nothing(tree: Path) -> None:
    """Every stage ok, exit 0, the time printed; the scratch dir is gone, no process is left,
    the campaign's own state dir, ledger and volume were never written, runs/ is as before."""
    root = tree.parent
    before = sorted(p.relative_to(root) for p in root.rglob("*") if "shoprld-rehearse-" not in str(p))
    code, out, err = _rehearse(tree)
    assert code == 0, out + err
    verdicts = _verdicts(out)
    assert set(verdicts) >= {"shopsim", "train.emit_command", "train.check_command", "sidecar.command",
                             "train.command (slime stand-in)", "export", "val.command", "gate.analyze_command",
                             "gate.command", "inject.command", "ledger row"}, out
    assert all(v == "ok" for v in verdicts.values()), out
    assert re.search(r"^rehearse: ok: .*\(\d+\.\ds\)$", out, re.M), out
    scratch = _scratch(out)
    assert not scratch.exists()
    assert _leftovers(scratch) == []
    after = sorted(p.relative_to(root) for p in root.rglob("*") if "shoprld-rehearse-" not in str(p))
    assert after == before  # nothing of the real campaign (state, ledger, runs link, volume) changed
    assert not (root / "repo" / "runs").exists()


DEVIATIONS = [
    ({"DEMO_FAULT_DROP_KEY": "check:status"}, "train.check_command",
     "train.check_command printed an indented JSON object without `status`"),
    ({"DEMO_FAULT_ONE_LINE": "check"}, "train.check_command",
     "train.check_command printed its JSON payload on one line; the real tool prints it indented"),
    ({"DEMO_FAULT_FILE_DROP": "summary.json:counts.coverage"}, "val.command", "summary.json lacks `counts.coverage`"),
    ({"DEMO_FAULT_EXIT": "online-gate:1"}, "gate.command",
     "gate.command exited 1 but online_gate_manifest.json says 'complete'"),
    ({"DEMO_FAULT_ONE_LINE": "build-curriculum"}, "inject.command",
     "inject.command printed its JSON payload on one line"),
]


@pytest.mark.parametrize(("env", "stage", "expect"), DEVIATIONS, ids=[d[1] + ":" + next(iter(d[0])) for d in DEVIATIONS])
def test_rehearse_names_each_deviation(tree: Path, env: dict[str, str], stage: str, expect: str) -> None:
    """A stand-in made to deviate from the contract: rehearse names it at its stage, exit 6."""
    code, out, err = _rehearse(tree, env, "--keep")
    scratch = _scratch(out)
    try:
        assert code == 6, out + err
        assert expect in _verdicts(out)[stage], out
        assert re.search(rf"^rehearse: NOT READY: .*first {re.escape(stage)}", out, re.M), out
        assert _leftovers(scratch) == []
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
