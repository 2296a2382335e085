"""The ShopSimRL tools stand-in: emit, check, the sidecar's drain, analyze, bare val, gate, curriculum."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (Procs, child_env, free_port, http, run_demo, start_shopsim, start_valserver, wait_until)

ROUND = "round-000"
KEY = {"BAILIAN_API_KEY": "bailian-test-key"}


def tool(*args: str, cwd: Path | None = None, **knobs: str) -> subprocess.CompletedProcess[str]:
    return run_demo("shopsimrl.py", *args, env=child_env(**knobs), cwd=cwd)


@pytest.fixture(scope="module")
def stack(module_procs: Procs, hf_dirs: dict[str, Path]) -> dict[str, str]:
    """One ShopSim and one val server (serving hf_dirs["a"]) shared by this module."""
    _, shop_url = start_shopsim(module_procs, slots=8)
    _, val_url = start_valserver(module_procs, hf_dirs["a"])
    return {"shop": shop_url, "val": val_url}


def make_project(root: Path, shop_url: str, val_url: str, tasks: int = 12) -> Path:
    """init-cold-start + emit for round-000; returns runs/loop/round-000."""
    root.mkdir(parents=True, exist_ok=True)
    assert tool("init-cold-start", "--out", str(root / "artifacts" / "cold-start")).returncode == 0
    res = tool("emit", "--project-root", str(root), "--round-id", ROUND,
               "--skillbank", str(root / "artifacts/cold-start/selected_skillbank.json"),
               "--curriculum", str(root / "artifacts/cold-start/curriculum.json"),
               "--shopsim-url", shop_url, "--val-url", val_url, "--val-tasks", str(tasks), "--val-concurrency", "4")
    assert res.returncode == 0, res.stderr
    return root / "runs" / "loop" / ROUND


def write_triage(root: Path, groups: int, pending_every: int = 2) -> int:
    """Synthetic training output: `groups` triage files, every `pending_every`-th pending analysis."""
    pending = 0
    for g in range(groups):
        d = root / "runs" / "slime-training" / ROUND / f"group-{g:09d}"
        d.mkdir(parents=True, exist_ok=True)
        status = "full_skill_failure_pending_analysis" if g % pending_every == 0 else "scored"
        pending += status != "scored"
        (d / "triage.json").write_text(json.dumps({"group_id": g, "round_id": ROUND, "task_id": g, "rollout_id": g // 4,
                                                   "classification": status, "status": status}))
    return pending


def cards(root: Path) -> list[dict]:
    path = root / "runs" / f"{ROUND}-online-analysis" / "failure_cards.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---------------------------------------------------------------- emit, check, curriculum

def test_emit_writes_the_four_round_configs(tmp_path: Path) -> None:
    """emit writes runs/loop/<round>/{slime,analysis,val,gate}.yaml (JSON, valid YAML) carrying URLs, paths and seed."""
    loop = make_project(tmp_path, "http://127.0.0.1:5799", "http://127.0.0.1:30099")
    assert sorted(p.name for p in loop.iterdir()) == ["analysis.yaml", "gate.yaml", "slime.yaml", "val.yaml"]
    cfgs = {p.stem: json.loads(p.read_text()) for p in loop.iterdir()}
    for cfg in cfgs.values():
        assert cfg["round_id"] == ROUND and cfg["project_root"] == str(tmp_path.resolve())
        assert cfg["shopsim_url"] == "http://127.0.0.1:5799" and cfg["val_url"] == "http://127.0.0.1:30099"
        assert isinstance(cfg["seed"], int)
    assert cfgs["slime"]["shopsim_environment_base_url"] == "http://127.0.0.1:5799"
    assert cfgs["slime"]["shopsim_episode_concurrency"] == 4
    assert cfgs["analysis"]["online_analysis"]["output_dir"].endswith(f"runs/{ROUND}-online-analysis")
    assert cfgs["val"]["model"]["base_url"] == "http://127.0.0.1:30099/v1" and cfgs["val"]["tasks"]["sample_size"] == 12
    assert cfgs["gate"]["online_gate"]["bare_run_dir"].endswith(f"runs/{ROUND}-bare-val")


CHECK_KEYS = ["status", "scope", "round_id", "curriculum_state_id", "skillbank_sha256", "active_chunks",
              "training_tasks", "skill_free_probability", "episode_concurrency"]


def test_check_prints_the_real_indented_payload_or_a_traceback(tmp_path: Path) -> None:
    """training check prints the real tool's indented 9-key payload (exit 0), or, like the real tool,
    a traceback on stderr with nothing on stdout (exit 1), never a JSON error."""
    loop = make_project(tmp_path, "http://127.0.0.1:1", "http://127.0.0.1:2")
    tasks = tmp_path / "artifacts/cold-start/train_tasks.jsonl"
    ok = tool("training", "check", str(loop / "slime.yaml"), "--task-data", str(tasks))
    assert ok.returncode == 0, ok.stderr
    payload = json.loads(ok.stdout)
    assert list(payload) == CHECK_KEYS and payload["status"] == "ready" and payload["round_id"] == ROUND
    assert ok.stdout == json.dumps(payload, ensure_ascii=False, indent=2) + "\n"  # indented, many lines
    assert isinstance(payload["active_chunks"], int) and isinstance(payload["skill_free_probability"], float)
    bad = tool("training", "check", str(loop / "slime.yaml"), "--task-data", str(tmp_path / "none.jsonl"))
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("Traceback (most recent call last):") and "FileNotFoundError" in bad.stderr


def test_build_curriculum_is_atomic_and_deterministic(tmp_path: Path) -> None:
    """build-curriculum writes OUT by rename (no temp left), with rho in [rho_min, rho_max], identically twice."""
    make_project(tmp_path, "http://x", "http://y")
    bank = str(tmp_path / "artifacts/cold-start/selected_skillbank.json")
    args = ["training", "build-curriculum", bank, "--round-id", "round-001", "--skill-free-probability", "0.20",
            "--rho-min", "0.20", "--rho-max", "0.90"]
    assert tool(*args[:3], str(tmp_path / "c1" / "curriculum.json"), *args[3:]).returncode == 0
    assert tool(*args[:3], str(tmp_path / "c2" / "curriculum.json"), *args[3:]).returncode == 0
    one, two = (tmp_path / "c1/curriculum.json").read_bytes(), (tmp_path / "c2/curriculum.json").read_bytes()
    assert one == two and [p.name for p in (tmp_path / "c1").iterdir()] == ["curriculum.json"]
    cur = json.loads(one)
    assert cur["round_id"] == "round-001" and cur["skill_free_probability"] == 0.2
    assert all(0.2 <= ch["inclusion_probability"] <= 0.9 for ch in cur["chunks"]) and cur["chunks"]
    assert str(tmp_path) not in one.decode()


def test_build_curriculum_refuses_a_skill_without_positive_effect(tmp_path: Path) -> None:
    """A skill without a positive estimated_effect is one error line and exit 1, and OUT is not written."""
    bank = tmp_path / "bank.json"
    bank.write_text(json.dumps({"version": 1, "round_id": "r", "skills": [{"id": "s", "title": "t", "body": "b"}]}))
    res = tool("training", "build-curriculum", str(bank), str(tmp_path / "out.json"), "--round-id", "round-001")
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and not (tmp_path / "out.json").exists()


# ---------------------------------------------------------------- the sidecar

def test_sidecar_drains_pending_work_after_the_stop_file(tmp_path: Path, procs: Procs) -> None:
    """Touching the stop file makes the sidecar finish every pending analysis, then exit 0."""
    loop = make_project(tmp_path, "http://x", "http://y")
    pending = write_triage(tmp_path, 16)
    stop = tmp_path / "runs" / "analyst.stop"
    p = procs.start("shopsimrl.py", "training", "watch-analyze", str(loop / "analysis.yaml"), "--stop-file", str(stop),
                    env=child_env(DEMO_ANALYST_SECONDS="0.3", DEMO_ANALYST_POLL="0.05", **KEY))
    wait_until(lambda: len(cards(tmp_path)) >= 1, timeout=10, what="first card")
    stop.touch()
    assert p.wait(20) == 0
    assert "draining" in p.log()
    got = cards(tmp_path)
    assert len(got) == pending == len({c["source_trajectory_id"] for c in got})


def test_sidecar_drains_on_sigterm(tmp_path: Path, procs: Procs) -> None:
    """SIGTERM also drains: all pending groups get a card and the exit code is 0."""
    loop = make_project(tmp_path, "http://x", "http://y")
    pending = write_triage(tmp_path, 8)
    p = procs.start("shopsimrl.py", "training", "watch-analyze", str(loop / "analysis.yaml"), "--stop-file",
                    str(tmp_path / "never"), env=child_env(DEMO_ANALYST_SECONDS="0.2", DEMO_ANALYST_POLL="0.05", **KEY))
    wait_until(lambda: len(cards(tmp_path)) >= 1, timeout=10, what="first card")
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait(20) == 0
    assert "SIGTERM" in p.log() and len(cards(tmp_path)) == pending


def test_sidecar_picks_up_groups_written_while_it_runs(tmp_path: Path, procs: Procs) -> None:
    """Triage files that appear during training are polled and analysed."""
    loop = make_project(tmp_path, "http://x", "http://y")
    stop = tmp_path / "stop"
    p = procs.start("shopsimrl.py", "training", "watch-analyze", str(loop / "analysis.yaml"), "--stop-file", str(stop),
                    env=child_env(DEMO_ANALYST_SECONDS="0", DEMO_ANALYST_POLL="0.05", **KEY))
    p.wait_log("watching")
    pending = write_triage(tmp_path, 6)
    wait_until(lambda: len(cards(tmp_path)) == pending, timeout=10, what="cards while running")
    stop.touch()
    assert p.wait(10) == 0


def test_sidecar_restart_does_not_duplicate_cards(tmp_path: Path) -> None:
    """Cards are deduplicated by trajectory across restarts, and a torn last line is repaired."""
    loop = make_project(tmp_path, "http://x", "http://y")
    pending = write_triage(tmp_path, 10)
    stop = tmp_path / "stop"
    stop.touch()  # already there: the sidecar does its final sweep, drains, exits
    args = ["training", "watch-analyze", str(loop / "analysis.yaml"), "--stop-file", str(stop)]
    assert tool(*args, DEMO_ANALYST_SECONDS="0", **KEY).returncode == 0
    path = tmp_path / "runs" / f"{ROUND}-online-analysis" / "failure_cards.jsonl"
    with open(path, "a") as f:
        f.write('{"source_trajectory_id": "torn')
    assert tool(*args, DEMO_ANALYST_SECONDS="0", **KEY).returncode == 0
    assert len(cards(tmp_path)) == pending


def test_sidecar_without_bailian_key_runs_but_writes_no_cards(tmp_path: Path) -> None:
    """Without BAILIAN_API_KEY the sidecar logs an error, produces no card, and still exits 0 on stop."""
    loop = make_project(tmp_path, "http://x", "http://y")
    write_triage(tmp_path, 4)
    (tmp_path / "stop").touch()
    res = tool("training", "watch-analyze", str(loop / "analysis.yaml"), "--stop-file", str(tmp_path / "stop"))
    assert res.returncode == 0 and "BAILIAN_API_KEY is not set" in res.stdout
    assert cards(tmp_path) == []


# ---------------------------------------------------------------- analyze

def test_analyze_writes_pool_ledger_and_summary(tmp_path: Path) -> None:
    """analyze (with the key) catches up cards and writes candidate_pool.json, proposal_ledger.jsonl, status ok."""
    loop = make_project(tmp_path, "http://x", "http://y")
    pending = write_triage(tmp_path, 12)
    res = tool("training", "analyze", str(loop / "analysis.yaml"), "--wandb", "--wandb-mode", "offline", **KEY)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "runs" / f"{ROUND}-online-analysis"
    summary = json.loads((out / "analysis_summary.json").read_text())
    pool = json.loads((out / "candidate_pool.json").read_text())
    assert summary["status"] == "ok" and summary["triage_groups"] == pending and summary["candidates"] == len(pool["candidates"]) > 0
    assert len(pool["current_skills"]) == 4 and all(c["operation"] == "ADD" for c in pool["candidates"])
    assert len((out / "proposal_ledger.jsonl").read_text().splitlines()) == len(pool["candidates"])


@pytest.mark.parametrize("knobs", [{}, {"DEMO_ANALYST_FAIL": "1", **KEY}])
def test_analyze_failure_still_exits_0_with_a_fallback_pool(tmp_path: Path, knobs: dict) -> None:
    """A missing BAILIAN_API_KEY or DEMO_ANALYST_FAIL=1 gives status failed, a current-skills-only pool, exit 0."""
    loop = make_project(tmp_path, "http://x", "http://y")
    write_triage(tmp_path, 6)
    res = tool("training", "analyze", str(loop / "analysis.yaml"), **knobs)
    assert res.returncode == 0
    out = tmp_path / "runs" / f"{ROUND}-online-analysis"
    assert json.loads((out / "analysis_summary.json").read_text())["status"] == "failed"
    pool = json.loads((out / "candidate_pool.json").read_text())
    assert pool["candidates"] == [] and len(pool["current_skills"]) == 4


# ---------------------------------------------------------------- bare val

def summary(root: Path) -> dict:
    return json.loads((root / "runs" / f"{ROUND}-bare-val" / "summary.json").read_text())


def traces(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "runs" / f"{ROUND}-bare-val" / "traces.jsonl").read_text().splitlines()]


def test_run_writes_manifest_traces_and_summary(tmp_path: Path, stack: dict[str, str]) -> None:
    """run completes every episode through ShopSim and the val server; summary has counts and primary metrics."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    res = tool("run", str(loop / "val.yaml"))
    assert res.returncode == 0, res.stderr
    s = summary(tmp_path)
    assert s["counts"]["requested"] == s["counts"]["completed"] == 12 and s["counts"]["failed"] == 0
    assert s["counts"]["coverage"] == 1.0
    assert 0 <= s["primary"]["reward_mean"] <= 1 and 0 <= s["primary"]["success_rate"] <= 1
    assert s["weight_version"] == "default" and len(s["weights_fingerprint"]) == 64
    assert json.loads((tmp_path / "runs" / f"{ROUND}-bare-val" / "manifest.json").read_text())["fingerprint"]
    assert len(traces(tmp_path)) == 12
    assert http("GET", stack["shop"] + "/healthz")[1]["free_slots"] == 8


def test_run_with_failed_episodes_exits_0_and_heals_within_3_attempts(tmp_path: Path, stack: dict[str, str]) -> None:
    """Failed episodes still exit 0; reruns retry them, but never beyond 3 attempts counted over all traces."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    for _ in range(4):
        assert tool("run", str(loop / "val.yaml"), DEMO_VAL_FAIL_EPISODES="2").returncode == 0
    s = summary(tmp_path)
    assert (s["counts"]["completed"], s["counts"]["failed"], s["counts"]["exhausted"]) == (10, 2, 2)
    assert s["counts"]["coverage"] < 1 and len(traces(tmp_path)) == 12 + 2 + 2
    assert tool("run", str(loop / "val.yaml")).returncode == 0  # the budget is spent: no healing now
    assert summary(tmp_path)["counts"]["completed"] == 10 and len(traces(tmp_path)) == 16


def test_run_heals_failed_episodes_on_rerun(tmp_path: Path, stack: dict[str, str]) -> None:
    """Episodes that failed once complete on a rerun within the budget: coverage returns to 1."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    assert tool("run", str(loop / "val.yaml"), DEMO_VAL_FAIL_EPISODES="3").returncode == 0
    assert summary(tmp_path)["counts"]["failed"] == 3
    assert tool("run", str(loop / "val.yaml")).returncode == 0
    assert summary(tmp_path)["counts"]["coverage"] == 1.0 and len(traces(tmp_path)) == 15


def test_run_refuses_a_mismatched_manifest(tmp_path: Path, stack: dict[str, str]) -> None:
    """A run dir made by another config is refused with one line and exit 1."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    assert tool("run", str(loop / "val.yaml")).returncode == 0
    cfg = json.loads((loop / "val.yaml").read_text())
    cfg["experiment"]["concurrency"] = 3
    (loop / "val.yaml").write_text(json.dumps(cfg))
    res = tool("run", str(loop / "val.yaml"))
    assert res.returncode == 1 and "fingerprint mismatch" in res.stderr and res.stderr.count("\n") == 1


def test_run_exits_1_when_the_val_server_is_unreachable(tmp_path: Path, stack: dict[str, str]) -> None:
    """No val server: one line and exit 1, no summary."""
    loop = make_project(tmp_path, stack["shop"], f"http://127.0.0.1:{free_port()}")
    res = tool("run", str(loop / "val.yaml"))
    assert res.returncode == 1 and "unreachable" in res.stderr
    assert not (tmp_path / "runs" / f"{ROUND}-bare-val" / "summary.json").exists()


# ---------------------------------------------------------------- gate and determinism

def analyzed_and_validated(root: Path, stack: dict[str, str]) -> Path:
    loop = make_project(root, stack["shop"], stack["val"])
    write_triage(root, 12)
    assert tool("training", "analyze", str(loop / "analysis.yaml"), **KEY).returncode == 0
    assert tool("run", str(loop / "val.yaml")).returncode == 0
    return loop


@pytest.fixture(scope="module")
def validated(stack: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One project analysed and bare-validated, shared by the gate tests (each gates into its own dir)."""
    return analyzed_and_validated(tmp_path_factory.mktemp("validated"), stack)


def gate_cfg(loop: Path, out: Path) -> Path:
    """A copy of gate.yaml that writes into `out`, so tests sharing one bare run do not interfere."""
    cfg = json.loads((loop / "gate.yaml").read_text())
    cfg["online_gate"]["output_dir"] = str(out)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_online_gate_complete_selects_a_skillbank(validated: Path, tmp_path: Path) -> None:
    """online-gate exits 0 with status complete and writes every gate file, including selected_skillbank.json."""
    out = tmp_path / "gate"
    res = tool("training", "online-gate", str(gate_cfg(validated, out)), "--wandb")
    assert res.returncode == 0, res.stderr
    for name in ("online_gate_manifest.json", "contributions.json", "mask_assignments.json", "proposal_ledger.jsonl",
                 "selected_skillbank.json", "selected_skill.md"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "online_gate_manifest.json").read_text())
    bank = json.loads((out / "selected_skillbank.json").read_text())
    assert manifest["status"] == "complete" and manifest["output"]["selected_chunk_ids"] == [s["id"] for s in bank["skills"]]
    assert bank["version"] == 1 and bank["round_id"] == ROUND
    assert all({"id", "title", "body"} <= set(s) and s["metadata"]["estimated_effect"] > 0 for s in bank["skills"])
    nxt = tool("training", "build-curriculum", str(out / "selected_skillbank.json"), str(tmp_path / "round-001/curriculum.json"),
               "--round-id", "round-001")
    assert nxt.returncode == 0, nxt.stderr


@pytest.mark.parametrize("knobs,code", [({"DEMO_GATE_INCOMPLETE": "1"}, 1),
                                        ({"DEMO_GATE_INCOMPLETE_ROUNDS": "round-002,round-000"}, 1),
                                        ({"DEMO_GATE_INCOMPLETE_ROUNDS": "round-003"}, 0)])
def test_online_gate_incomplete_exits_1(validated: Path, tmp_path: Path, knobs: dict, code: int) -> None:
    """A forced incomplete gate (for this round) writes status incomplete, no selected_skillbank.json, exit 1."""
    out = tmp_path / "gate"
    assert tool("training", "online-gate", str(gate_cfg(validated, out)), **knobs).returncode == code
    status = json.loads((out / "online_gate_manifest.json").read_text())["status"]
    assert status == ("incomplete" if code else "complete")
    assert (out / "selected_skillbank.json").exists() == (code == 0)


def test_online_gate_without_bare_run_exits_1(tmp_path: Path, stack: dict[str, str]) -> None:
    """Without the bare run's summary the gate exits 1 with one line."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    assert tool("training", "analyze", str(loop / "analysis.yaml")).returncode == 0
    res = tool("training", "online-gate", str(loop / "gate.yaml"))
    assert res.returncode == 1 and "bare run missing" in res.stderr and res.stderr.count("\n") == 1


def test_online_gate_refuses_weights_changed_since_the_bare_run(tmp_path: Path, procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """If the served weights changed after the bare run, the gate exits 1 (weights must stay frozen)."""
    _, shop_url = start_shopsim(procs, slots=4)
    _, val_url = start_valserver(procs, hf_dirs["a"])
    loop = analyzed_and_validated(tmp_path, {"shop": shop_url, "val": val_url})
    assert http("POST", val_url + "/update_weights_from_disk", {"model_path": str(hf_dirs["b"])})[1]["success"]
    res = tool("training", "online-gate", str(loop / "gate.yaml"))
    assert res.returncode == 1 and "other weights" in res.stderr


def test_two_identical_campaign_rounds_give_identical_files(validated: Path, tmp_path: Path, stack: dict[str, str]) -> None:
    """Two projects with the same inputs and weights give byte-identical summary, gate and skillbank files."""
    one_gate = tmp_path / "one-gate"
    assert tool("training", "online-gate", str(gate_cfg(validated, one_gate))).returncode == 0
    two = tmp_path / "two"
    loop = analyzed_and_validated(two, stack)
    assert tool("training", "online-gate", str(loop / "gate.yaml")).returncode == 0
    one_runs = validated.parent.parent
    pairs = [(one_runs / f"{ROUND}-bare-val/summary.json", two / f"runs/{ROUND}-bare-val/summary.json"),
             (one_runs / f"{ROUND}-online-analysis/candidate_pool.json", two / f"runs/{ROUND}-online-analysis/candidate_pool.json"),
             (one_gate / "online_gate_manifest.json", two / f"runs/{ROUND}-online-gate/online_gate_manifest.json"),
             (one_gate / "selected_skillbank.json", two / f"runs/{ROUND}-online-gate/selected_skillbank.json")]
    for a, b in pairs:
        assert a.read_bytes() == b.read_bytes(), b.name
