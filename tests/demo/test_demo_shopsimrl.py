"""The ShopSimRL tools stand-in: emit, check, the sidecar's drain, analyze, bare val, gate, curriculum."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (Procs, child_env, free_port, http, run_demo, start_shopsim, start_valserver, wait_until)

REPO = Path(__file__).resolve().parents[2]

ROUND = "round-000"
KEY = {"BAILIAN_API_KEY": "bailian-test-key"}


def tool(*args: str, cwd: Path | None = None, **knobs: str) -> subprocess.CompletedProcess[str]:
    return run_demo("shopsimrl.py", *args, env=child_env(**knobs), cwd=cwd)


@pytest.fixture(scope="module")
def stack(module_procs: Procs, hf_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One ShopSim and one val server (serving hf_dirs["a"]) shared by this module. ShopSim serves
    the first 12 products of the shipped catalog, in its real format: tasks 0..23, so the val
    split (the upper half) is tasks 12..23."""
    catalog = tmp_path_factory.mktemp("catalog") / "catalog.json"
    shipped = json.loads((REPO / "run" / "demo" / "shopsim_catalog.json").read_text())
    catalog.write_text(json.dumps(shipped[:12]))
    _, shop_url = start_shopsim(module_procs, slots=8, SHOPSIM_CATALOG=str(catalog))
    wait_until(lambda: http("GET", shop_url + "/healthz")[1]["ready"], what="shopsim ready")
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
    """emit writes runs/loop/<round>/{slime,analysis,val,gate}.yaml as block YAML with the real keys only:
    no top-level round_id/seed (a `seed` in slime.yaml would override slime's --seed), the full val split."""
    from shoprld.daemon.services.commands import _mini_yaml

    loop = make_project(tmp_path, "http://127.0.0.1:5799", "http://127.0.0.1:30099")
    assert sorted(p.name for p in loop.iterdir()) == ["analysis.yaml", "gate.yaml", "slime.yaml", "val.yaml"]
    texts = {p.stem: p.read_text() for p in loop.iterdir()}
    assert not any(t.lstrip().startswith("{") for t in texts.values())  # block YAML, not JSON
    cfgs = {k: _mini_yaml(t) for k, t in texts.items()}
    assert set(cfgs["analysis"]) == {"online_analysis"} and set(cfgs["gate"]) == {"online_gate"}
    assert "seed" not in cfgs["slime"] and "round_id" not in cfgs["slime"] and len(cfgs["slime"]) == 14
    assert cfgs["slime"]["shopsim_environment_base_url"] == "http://127.0.0.1:5799"
    assert cfgs["slime"]["shopsim_episode_concurrency"] == 4 and cfgs["slime"]["shopsim_environment_persona"] is True
    assert cfgs["analysis"]["online_analysis"]["output_dir"].endswith(f"runs/{ROUND}-online-analysis")
    assert cfgs["val"]["model"]["base_url"] == "http://127.0.0.1:30099/v1"
    assert cfgs["val"]["tasks"]["sample_size"] is None and cfgs["val"]["tasks"]["split"] == "val"
    assert cfgs["val"]["experiment"]["seed"] == 20260830 and cfgs["val"]["model"]["api_key_env"] is None
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


def test_sidecar_without_bailian_key_writes_analyst_error_cards(tmp_path: Path) -> None:
    """Without BAILIAN_API_KEY the real sidecar writes an ANALYST_ERROR card per pending group, and
    prints its indented {"status": "watched", ...} payload on stop, exit 0."""
    loop = make_project(tmp_path, "http://x", "http://y")
    pending = write_triage(tmp_path, 4)
    (tmp_path / "stop").touch()
    res = tool("training", "watch-analyze", str(loop / "analysis.yaml"), "--stop-file", str(tmp_path / "stop"))
    assert res.returncode == 0 and "BAILIAN_API_KEY is not set" in res.stdout
    got = cards(tmp_path)
    assert len(got) == pending and all(c["status"] == "ANALYST_ERROR" and c["eligible_for_consolidation"] is False
                                       for c in got)
    payload = json.loads(res.stdout[res.stdout.index("\n{") + 1:])
    assert payload == {"status": "watched", "triage_groups": pending, "newly_analyzed": pending, "analyzed_cards": pending}


# ---------------------------------------------------------------- analyze

ANALYSIS_KEYS = {"schema_version", "created_at", "triage_groups", "analyzed_cards", "eligible_cards", "candidates",
                 "proposal_history_records", "evidence_only_card_ids", "candidate_pool_path",
                 "current_skillbank_sha256", "compilation_input_sha256"}


def test_analyze_writes_pool_ledger_and_summary(tmp_path: Path) -> None:
    """analyze (with the key) catches up cards and writes candidate_pool.json, proposal_ledger.jsonl and
    the real summary: exactly its fields, no `status` key; stdout is the indented summary."""
    loop = make_project(tmp_path, "http://x", "http://y")
    pending = write_triage(tmp_path, 12)
    res = tool("training", "analyze", str(loop / "analysis.yaml"), "--wandb", "--wandb-mode", "offline", **KEY)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "runs" / f"{ROUND}-online-analysis"
    summary = json.loads((out / "analysis_summary.json").read_text())
    pool = json.loads((out / "candidate_pool.json").read_text())
    assert set(summary) == ANALYSIS_KEYS
    assert summary["triage_groups"] == pending and summary["candidates"] == len(pool["candidates"]) > 0
    from shoprld.daemon.foundation.tools.payload import last_json_object

    assert last_json_object(res.stdout, source="analyze") == {**summary, "wandb_error": "wandb is not installed (demo stand-in)"}
    assert len(pool["current_skills"]) == 4 and all(c["operation"] == "ADD" for c in pool["candidates"])
    assert len((out / "proposal_ledger.jsonl").read_text().splitlines()) == len(pool["candidates"])


def test_analyze_without_the_key_is_silently_empty(tmp_path: Path) -> None:
    """A missing BAILIAN_API_KEY gives the real silent outcome: ANALYST_ERROR cards and a success-shaped
    summary (no status) with 0 candidates, exit 0."""
    loop = make_project(tmp_path, "http://x", "http://y")
    pending = write_triage(tmp_path, 6)
    assert tool("training", "analyze", str(loop / "analysis.yaml")).returncode == 0
    out = tmp_path / "runs" / f"{ROUND}-online-analysis"
    summary = json.loads((out / "analysis_summary.json").read_text())
    assert set(summary) == ANALYSIS_KEYS and summary["candidates"] == summary["eligible_cards"] == 0
    assert summary["analyzed_cards"] == pending and {c["status"] for c in cards(tmp_path)} == {"ANALYST_ERROR"}


def test_analyze_failure_still_exits_0_with_a_fallback_pool_and_no_ledger(tmp_path: Path) -> None:
    """DEMO_ANALYST_FAIL=1 gives the real fallback: status failed, a current-skills-only pool, NO ledger, exit 0."""
    loop = make_project(tmp_path, "http://x", "http://y")
    write_triage(tmp_path, 6)
    res = tool("training", "analyze", str(loop / "analysis.yaml"), DEMO_ANALYST_FAIL="1", **KEY)
    assert res.returncode == 0
    out = tmp_path / "runs" / f"{ROUND}-online-analysis"
    summary = json.loads((out / "analysis_summary.json").read_text())
    assert summary["status"] == "failed" and summary["proposal_history_records"] == 0
    assert summary["error"]["type"] == "RuntimeError" and summary["compilation_input_sha256"] is None
    pool = json.loads((out / "candidate_pool.json").read_text())
    assert pool["candidates"] == [] and len(pool["current_skills"]) == 4
    assert not (out / "proposal_ledger.jsonl").exists()


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
    assert "weight_version" not in s and set(s) == {"schema_version", "counts", "primary", "reward_components",
                                                     "behavior", "errors"}
    assert isinstance(s["counts"]["coverage"], float)
    assert json.loads((tmp_path / "runs" / f"{ROUND}-bare-val" / "manifest.json").read_text())["plan_fingerprint"]
    assert res.stdout.splitlines()[0].startswith("run=") and res.stdout.count(" status=completed ") == 12
    assert len(traces(tmp_path)) == 12
    assert http("GET", stack["shop"] + "/healthz")[1]["free_slots"] == 8


def test_run_retries_failed_episodes_in_waves_within_one_run(tmp_path: Path, stack: dict[str, str]) -> None:
    """Like the real run: failed episodes are retried in waves in the same run (3 attempts at most,
    counted over all traces), exit 0, and the summary counts each episode's latest record."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    res = tool("run", str(loop / "val.yaml"), DEMO_VAL_FAIL_EPISODES="3")
    assert res.returncode == 0 and res.stdout.count(" status=failed ") == 3
    s = summary(tmp_path)
    assert (s["counts"]["completed"], s["counts"]["failed"], s["counts"]["coverage"]) == (12, 0, 1.0)
    assert len(traces(tmp_path)) == 15
    assert tool("run", str(loop / "val.yaml")).returncode == 0 and len(traces(tmp_path)) == 15  # nothing left


def test_run_refuses_a_mismatched_manifest(tmp_path: Path, stack: dict[str, str]) -> None:
    """A run dir made by another config is refused with one line and exit 1."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    assert tool("run", str(loop / "val.yaml")).returncode == 0
    text = (loop / "val.yaml").read_text()
    (loop / "val.yaml").write_text(text.replace("  concurrency: 4\n", "  concurrency: 3\n", 1))
    res = tool("run", str(loop / "val.yaml"))
    assert res.returncode == 1 and "fingerprint mismatch" in res.stderr and res.stderr.count("\n") == 1


def test_run_with_the_val_server_unreachable_exits_0_with_every_episode_failed(tmp_path: Path, stack: dict[str, str]) -> None:
    """Like the real run: no val server burns the 3 attempts of every episode and exits 0; coverage 0."""
    loop = make_project(tmp_path, stack["shop"], f"http://127.0.0.1:{free_port()}")
    res = tool("run", str(loop / "val.yaml"))
    assert res.returncode == 0
    s = summary(tmp_path)
    assert s["counts"]["coverage"] == 0.0 and s["counts"]["failed"] == 12 and len(traces(tmp_path)) == 36


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
    text = (loop / "gate.yaml").read_text()
    old = next(line for line in text.splitlines() if line.strip().startswith("output_dir:"))
    path = out.parent / f"{out.name}.yaml"
    path.write_text(text.replace(old, f"  output_dir: {out}"))
    return path


def test_online_gate_complete_selects_a_skillbank(validated: Path, tmp_path: Path) -> None:
    """online-gate exits 0 with status complete and writes every gate file, including selected_skillbank.json."""
    out = tmp_path / "gate"
    res = tool("training", "online-gate", str(gate_cfg(validated, out)), "--wandb")
    assert res.returncode == 0, res.stderr
    for name in ("online_gate_manifest.json", "contributions.json", "mask_assignments.json", "proposal_ledger.jsonl",
                 "selected_skillbank.json", "selected_skill.md", "traces.jsonl", "summary.json"):
        assert (out / name).is_file(), name
    manifest = json.loads((out / "online_gate_manifest.json").read_text())
    bank = json.loads((out / "selected_skillbank.json").read_text())
    assert manifest["status"] == "complete" and manifest["output"]["selected_chunk_ids"] == [s["skill_id"] for s in bank["skills"]]
    assert "weight_version" not in manifest["input"] and "reason" not in manifest and "counts" in manifest["summary"]
    assert set(bank) == {"schema_version", "bank_version", "metadata", "skills"} and bank["metadata"]["round_id"] == ROUND
    assert all(set(s) == {"skill_id", "version", "enabled", "content", "metadata"} and s["metadata"]["estimated_effect"] > 0
               for s in bank["skills"])
    assert res.stdout.rstrip().endswith("}") and json.loads(res.stdout[res.stdout.index("\n{") + 1:]) == manifest
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


def test_online_gate_without_bare_run_exits_1_with_no_manifest(tmp_path: Path, stack: dict[str, str]) -> None:
    """An error before any rollout (no bare run) is a traceback and exit 1, and no manifest is written."""
    loop = make_project(tmp_path, stack["shop"], stack["val"])
    assert tool("training", "analyze", str(loop / "analysis.yaml")).returncode == 0
    res = tool("training", "online-gate", str(loop / "gate.yaml"))
    assert res.returncode == 1 and "no completed bare trace" in res.stderr
    assert not (tmp_path / "runs" / f"{ROUND}-online-gate" / "online_gate_manifest.json").exists()


def test_online_gate_is_complete_with_dropped_pairs(validated: Path, tmp_path: Path) -> None:
    """Bare episodes that failed are dropped, not fatal: the gate is complete and lists them."""
    bare = validated.parent.parent / f"{ROUND}-bare-val" / "traces.jsonl"
    saved = bare.read_bytes()
    rows = [json.loads(x) for x in saved.decode().splitlines()]
    rows.append({**rows[0], "status": "failed", "final": None, "error": {"type": "RuntimeError"}})
    try:
        bare.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp_path / "gate"
        assert tool("training", "online-gate", str(gate_cfg(validated, out))).returncode == 0
    finally:
        bare.write_bytes(saved)
    contrib = json.loads((out / "contributions.json").read_text())
    assert contrib["dropped_episode_ids"] == [rows[0]["episode_id"]] and contrib["observations"] == 11
    assert json.loads((out / "online_gate_manifest.json").read_text())["status"] == "complete"


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
