"""``shoprld rehearse`` tells the truth (issue 28, item 9), on the demo campaign with stand-in
tools made to deviate from the contract by their DEMO_FAULT_* knobs:

- every stage that can run is run: three deviating tools are all named by ONE rehearsal;
- analysis_summary.json without ``candidates`` is said to lack it (GATE archived the file);
- a trainer that died is named by its own last line, not blamed on ``progress_pattern``;
- a failed rehearsal keeps its logs, and every path it prints exists afterwards;
- emit and check run in ``[train]``'s conda env (its activation hooks), not the host's python3;
- a failed rehearsal (several engine passes) leaves the ShopSim checkout and project root as found.

Real processes throughout: the CLI, the engine, ShopSim, the wrapped tools and the stand-ins."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from tests.demotree import SHOPRLD, make_tree
from tests.shopsimcheckout import differences, make_checkout, snapshot
from tests.integration.test_rehearse import _leftovers, _scratch

THREE = {"DEMO_FAULT_DROP_KEY": "check:status", "DEMO_FAULT_FILE_DROP": "analysis_summary.json:candidates",
         "DEMO_FAULT_ONE_LINE": "build-curriculum"}


def _rehearse(campaign: Path, env: dict[str, str] | None = None, *args: str) -> tuple[int, str]:
    proc = subprocess.run([*SHOPRLD, "rehearse", "-c", str(campaign), *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stdout + "\n--- stderr ---\n" + proc.stderr[-3000:]


def _verdicts(out: str) -> dict[str, str]:
    rows = re.findall(r"^  (\S+(?: \(slime stand-in\))?|ledger row)\s{2,}(.+)$", out.split("--- stderr ---")[0], re.M)
    return dict(rows)


def test_one_rehearsal_names_three_deviating_tools(tmp_path: Path) -> None:
    """check (payload without `status`: TRAIN fails), analyze (summary without `candidates`:
    GATE archives it and fails) and build-curriculum (one-line payload): all three named, with
    the contract's section, in one run; the stages between them ran and are ok."""
    campaign = make_tree(tmp_path, rounds=2)
    code, out = _rehearse(campaign, THREE)
    scratch = _scratch(out)
    try:
        assert code == 6, out
        v = _verdicts(out)
        assert v["train.check_command"].startswith(
            "train.check_command printed an indented JSON object without `status`"), out
        assert "§3.2" in v["train.check_command"], out
        archived = "runs/round-000-online-analysis/analysis_summary.json.archived-"
        assert v["gate.analyze_command"].startswith(f"analysis_summary.json lacks `candidates` ({archived}"), out
        assert "not written" not in v["gate.analyze_command"], out
        assert v["inject.command"].startswith("inject.command printed its JSON payload on one line"), out
        ok = ("shopsim", "train.emit_command", "sidecar.command", "train.command (slime stand-in)", "export",
              "val.command", "gate.command", "ledger row")
        assert {k: v[k] for k in ok} == dict.fromkeys(ok, "ok"), out
        assert re.search(r"^rehearse: NOT READY: 3 stage\(s\) not ok, 0 not reached; first train.check_command "
                         r"\(\d+\.\ds; 3 engine passes", out, re.M), out
        # The engine's failure events are in the kept shoprld.log, not repeated as JSON on the terminal.
        assert '"event"' not in out.split("--- stderr ---")[1], out
        shoprld_log = next(scratch.rglob("logs/shoprld.log")).read_text()
        assert '"event": "campaign.failed"' in shoprld_log and "'status' key" in shoprld_log
        assert _leftovers(scratch) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_dead_trainer_is_named_by_its_own_error_and_its_logs_are_kept(tmp_path: Path) -> None:
    """The trainer exits 1 at its first rollout, before any progress line: its own last line is
    the verdict (not progress_pattern), what needs its checkpoint is "not reached: needs ...",
    and without --keep the logs stay: every path the rehearsal printed still exists."""
    campaign = make_tree(tmp_path, rounds=2)
    code, out = _rehearse(campaign, {"DEMO_CRASH_AT": "1"})
    scratch = _scratch(out)
    try:
        assert code == 6, out
        v = _verdicts(out)
        trainer = v["train.command (slime stand-in)"]
        assert trainer.startswith("the trainer died on its own: '[demo fault] crashing at rollout 1'"), out
        assert "progress_pattern" not in trainer, out
        assert v["export"] == ("not reached (the rehearsal stopped at train.command (slime stand-in)): needs the "
                               "trainer's final checkpoint"), out
        assert v["inject.command"].startswith("ok (run on its own, on the current SkillBank"), out
        printed = out.split("--- stderr ---")[0]
        m = re.search(r"^  logs kept: stage logs in (\S+),", printed, re.M)
        assert m, out
        assert "[demo fault] crashing at rollout 1" in (Path(m.group(1)) / "r000-train.log").read_text()
        paths = {p.rstrip(".,;:)") for p in re.findall(r"(/[^\s'\"()]+)", printed)}
        assert paths and all(Path(p).exists() for p in paths), [p for p in paths if not Path(p).exists()]
        assert _leftovers(scratch) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


FAKE_PYTHON = """#!/bin/sh
echo "activated=$FAKE_ENV_ACTIVATED prefix=$CONDA_PREFIX $2 $3 $4" >> "$CONDA_PREFIX/calls.log"
exec {python} "$@"
"""


def test_emit_and_check_run_in_the_campaigns_conda_env(tmp_path: Path) -> None:
    """[train] and [inject] name a conda env whose python3 emit, check and build-curriculum call:
    the rehearsal runs them through that env's activation (PATH, CONDA_PREFIX, activate.d
    hooks), as `run` does, never with the host's python3."""
    env = tmp_path / "envs" / "shopsimrl"
    (env / "bin").mkdir(parents=True)
    (env / "etc" / "conda" / "activate.d").mkdir(parents=True)
    (env / "etc" / "conda" / "activate.d" / "mark.sh").write_text("export FAKE_ENV_ACTIVATED=1\n")
    py = env / "bin" / "python3"
    py.write_text(FAKE_PYTHON.format(python=sys.executable))
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    campaign = make_tree(tmp_path / "t", rounds=2, edits={
        r"^\[train\]$": f'[train]\nconda_prefix = "{env}"',
        r'^emit_command = \["\{python\}"': 'emit_command = ["python3"',
        r'^check_command = \["\{python\}"': 'check_command = ["python3"',
        r"^\[inject\]$": f'[inject]\nconda_prefix = "{env}"',
        r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "training", "build-curriculum"':
            'command = ["python3", "{demo_dir}/shopsimrl.py", "training", "build-curriculum"'})
    code, out = _rehearse(campaign)
    scratch = _scratch(out)
    try:
        assert code == 0, out
        calls = (env / "calls.log").read_text().splitlines()
        assert any(c.startswith(f"activated=1 prefix={env} emit --project-root") for c in calls), calls
        assert any(c.startswith(f"activated=1 prefix={env} training check ") for c in calls), calls
        assert any(c.startswith(f"activated=1 prefix={env} training build-curriculum ") for c in calls), calls
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


SHOP_ENV = "repo/ShopSimulator/shop_env"
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


def test_a_failed_rehearsal_leaves_the_shopsim_checkout_and_project_root_as_found(tmp_path: Path) -> None:
    """ShopSim started as the user's `bash start.sh` in their checkout, three engine passes (two
    failing tools): the checkout and the project root are as found, stat for stat."""
    campaign = make_tree(tmp_path, rounds=2, edits={
        r'^command = \["\{python\}", "\{demo_dir\}/shopsim.py"\]':
            f'command = ["bash", "start.sh"]\ncwd = "{SHOP_ENV}"',
        r'^env = \{ SHOPSIM_ENV_SLOTS = "\{slots\}"': f'env = {{ PATH = "{PATH}", SHOPSIM_ENV_SLOTS = "{{slots}}"'})
    shop_env = make_checkout(tmp_path / SHOP_ENV)
    checkout_before = snapshot(shop_env)
    repo_before = snapshot(tmp_path / "repo")
    code, out = _rehearse(campaign, THREE)
    scratch = _scratch(out)
    try:
        assert code == 6, out
        assert "3 engine passes" in out, out
        assert differences(checkout_before, snapshot(shop_env)) == []
        assert differences(repo_before, snapshot(tmp_path / "repo")) == []
        assert (shop_env / "shop_agent.log").read_text() == "an earlier session's requests\n"
        assert _leftovers(scratch) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_past_a_failing_val_build_curriculum_still_runs_and_is_judged(tmp_path: Path) -> None:
    """The bare val's summary lacks `counts.coverage`: VAL cannot finish, so the gate is not
    reached (it needs that summary), but build-curriculum needs only files: it runs on its own,
    on the current SkillBank, and its one-line payload is named."""
    campaign = make_tree(tmp_path, rounds=2)
    code, out = _rehearse(campaign, {"DEMO_FAULT_FILE_DROP": "summary.json:counts.coverage",
                                     "DEMO_FAULT_ONE_LINE": "build-curriculum"})
    scratch = _scratch(out)
    try:
        assert code == 6, out
        v = _verdicts(out)
        assert v["val.command"].startswith("summary.json lacks `counts.coverage` (runs/round-000-bare-val/"), out
        assert v["gate.command"] == ("not reached (the rehearsal stopped at val.command): needs a bare val "
                                     "summary.json the daemon accepts (val.command)"), out
        assert v["inject.command"].startswith("inject.command printed its JSON payload on one line"), out
        assert v["inject.command"].count("tools contract") == 1, out
        assert _leftovers(scratch) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_gate_whose_manifest_the_daemon_archives_is_named_and_inject_still_runs(tmp_path: Path) -> None:
    """The gate's manifest lacks `status`: GATE archives the whole gate dir and fails; the next
    pass runs with the gate switched off ("exit 1, no manifest": the seed keeps the current
    SkillBank), so INJECT and the ledger row run; the sidecar's own exit 3 is named too."""
    campaign = make_tree(tmp_path, rounds=2)
    code, out = _rehearse(campaign, {"DEMO_FAULT_FILE_DROP": "online_gate_manifest.json:status",
                                     "DEMO_FAULT_EXIT": "watch-analyze:3"})
    scratch = _scratch(out)
    try:
        assert code == 6, out
        v = _verdicts(out)
        assert v["gate.command"].startswith("online_gate_manifest.json lacks `status` "
                                            "(runs/round-000-online-gate.archived-1/online_gate_manifest.json"), out
        assert v["sidecar.command"].startswith("sidecar.command exited 3, expected 0"), out
        assert v["inject.command"] == "ok" and v["ledger row"] == "ok", out
        assert "2 engine passes, switched off after failing: gate.command" in out, out
        assert _leftovers(scratch) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
