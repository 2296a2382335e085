"""STAND-IN for ShopSimRL's tools: `scripts/run_shopsimrl.py` (the `shopsimrl.cli` subcommands
the loop uses) and `scripts/emit_training_loop_round.py` (here: the `emit` subcommand).
No LLM is called: the "Failure Analyst" is a hash, and val/gate episodes are real HTTP
episodes against the ShopSim and val-server stand-ins.

    shopsimrl.py emit --project-root R --round-id round-00i --skillbank S --curriculum C
                      [--history-ledger L] --shopsim-url U --val-url V [--episode-concurrency N]
                      [--val-tasks N] [--val-concurrency N] [--seed N]
    shopsimrl.py init-cold-start --out DIR
    shopsimrl.py run VAL_CFG
    shopsimrl.py training check CFG --task-data F
    shopsimrl.py training watch-analyze CFG --stop-file F
    shopsimrl.py training analyze CFG [--wandb ...]
    shopsimrl.py training online-gate GATE_CFG [--wandb ...]
    shopsimrl.py training build-curriculum SKILLBANK OUT --round-id R [--skill-free-probability P]
                      [--rho-min A] [--rho-max B] [--seed N]

They follow shared/contracts/shopsimrl-tools.md: the emitted configs are block YAML with the
real keys only (no `seed` or `round_id` in slime.yaml; val.yaml names the whole val split,
`sample_size: null`); every `training …` subcommand prints its payload once, at the end, as
indented JSON; task ids come from the service's `/healthz` `tasks` (train: the lower half of
0..n-1, val: the upper half). Files meant to be compared across demo runs (summary.json,
online_gate_manifest.json, selected_skillbank.json, curriculum.json, candidate_pool.json)
leave out the real ones' `created_at`, timing (`cost`) and absolute paths.

Exit codes, as the real tools': `run` exits 0 whenever it finishes (every episode failed
included; failed episodes are retried in waves, 3 attempts each over all traces), 1 on a
manifest mismatch or a bad config; `training analyze` exits 0 after success or its fallback
(`status: failed`, no proposal_ledger.jsonl), and without BAILIAN_API_KEY writes ANALYST_ERROR
cards and a success-shaped summary with 0 candidates; `training online-gate` exits 0 when
complete (dropped pairs included), 1 when incomplete, and 1 with no manifest on an error
before any rollout; `training check` prints the ready payload (exit 0) or a traceback (exit
1, nothing on stdout); argparse errors exit 2.
Knobs: DEMO_ANALYST_POLL, DEMO_ANALYST_SECONDS, DEMO_ANALYST_FAIL, DEMO_VAL_FAIL_EPISODES (the
first attempt of the first N val tasks fails), DEMO_GATE_INCOMPLETE, DEMO_GATE_INCOMPLETE_ROUNDS
(see run/demo/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import _common as c
import _faults  # DEMO_FAULT_* contract-deviation knobs (rehearse's tests); inert unless set

PROG = "shopsimrl"
MAX_ATTEMPTS = 3  # per episode, counted over ALL records in traces.jsonl
SKILLBANK_SCHEMA = "shopsimrl-skillbank-v1"
CURRICULUM_SCHEMA = "shopsimrl-skill-curriculum-v1"
POOL_SCHEMA = "shopsimrl-skill-candidate-pool-v1"
PENDING = "full_skill_failure_pending_analysis"
ANALYST_ERROR = "ANALYST_ERROR"
MECHANISMS = [
    ("missed_attribute_filter", "Filter on every requested attribute",
     "Before clicking a product, check each attribute in the instruction against the item page."),
    ("wrong_option_selected", "Select the requested options first",
     "Choose size, colour and pack options that the instruction names before Buy Now."),
    ("over_budget_purchase", "Respect the budget",
     "Compare the price with the budget in the instruction; go back when it is above it."),
    ("premature_purchase", "Do not buy on the first result",
     "Open at least two candidate items and compare them before buying."),
    ("search_query_too_narrow", "Broaden an empty search",
     "When a search returns nothing relevant, drop the least important attribute and search again."),
]
COLD_START = [
    ("cold-search-attributes", "Search with the key attributes",
     "Put the product type and its two most specific attributes in the first search query.", 0.04),
    ("cold-verify-item", "Verify the item page",
     "On the item page, compare title, attributes and price with the instruction before buying.", 0.03),
    ("cold-options", "Set options explicitly",
     "Click each option the instruction asks for; never rely on the default option.", 0.02),
    ("cold-finish", "Finish with one purchase",
     "End the episode with exactly one click[Buy Now] once the item matches.", 0.01),
]


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", flush=True)


_COMMAND = [""]  # the subcommand running, for the DEMO_FAULT_* knobs


def print_payload(payload: dict[str, Any]) -> None:
    """How every real `training …` subcommand prints its result: once, at the end, indented."""
    print(_faults.payload_text(_COMMAND[0], payload), flush=True)


_PLAIN = __import__("re").compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./@+:-]*$")


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    text = str(v)
    if _PLAIN.match(text) and c.parse_scalar(text) == text:
        return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def dump_yaml(obj: dict[str, Any], indent: int = 0) -> str:
    """Block YAML, keys in insertion order, as `yaml.safe_dump(sort_keys=False)` lays it out
    (mappings of scalars; `{}` / `[]` inline)."""
    out = []
    for k, v in obj.items():
        pad = " " * indent
        if isinstance(v, dict) and v:
            out.append(f"{pad}{k}:\n{dump_yaml(v, indent + 2)}")
        elif isinstance(v, (dict, list)) and not v:
            out.append(f"{pad}{k}: {'{}' if isinstance(v, dict) else '[]'}\n")
        elif isinstance(v, list):
            out.append(f"{pad}{k}:\n" + "".join(f"{pad}- {_yaml_scalar(x)}\n" for x in v))
        else:
            out.append(f"{pad}{k}: {_yaml_scalar(v)}\n")
    return "".join(out)


# ---------------------------------------------------------------- skillbanks and curricula

def make_skill(skill_id: str, title: str, body: str, effect: float, **meta: Any) -> dict[str, Any]:
    """A SkillBank skill with the real fields (`skill_id, version, enabled, content, metadata`)."""
    return {"skill_id": skill_id, "version": "1", "enabled": True, "content": body,
            "metadata": {"title": title, "estimated_effect": effect, **meta}}


def load_skills(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    bank = c.read_json(path, "skillbank")
    skills = bank.get("skills") if isinstance(bank, dict) else None
    if not isinstance(skills, list):
        raise c.DemoError(f"skillbank {path} has no skills list")
    out = []
    for s in skills:
        sid, body = s.get("skill_id"), s.get("content")
        if not isinstance(sid, str) or not isinstance(body, str) or not body.strip():
            raise c.DemoError(f"skillbank {path}: a skill lacks skill_id or content")
        if s.get("enabled", True) is False:
            continue
        meta = dict(s.get("metadata") or {})
        out.append({"id": sid, "title": meta.get("title") or sid, "body": body,
                    "effect": meta.get("estimated_effect"), "metadata": meta})
    return bank, out


def build_curriculum(skillbank: str | Path, round_id: str, seed: int, q: float, lo: float, hi: float) -> dict[str, Any]:
    """The real `build_curriculum_state`, minus created_at and the absolute skillbank path."""
    for name, value in (("skill-free-probability", q), ("rho-min", lo), ("rho-max", hi)):
        if not 0.0 <= value <= 1.0:
            raise c.DemoError(f"--{name} must be in [0, 1], got {value}", 2)
    if lo > hi:
        raise c.DemoError("--rho-min cannot exceed --rho-max", 2)
    bank, skills = load_skills(skillbank)
    for s in skills:
        e = s["effect"]
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e <= 0:
            raise c.DemoError(f"active skill {s['id']!r} in {skillbank} must have a positive estimated_effect")
    scale = max((float(s["effect"]) for s in skills), default=1.0)
    chunks = [{"skill_id": s["id"], "version": "1", "content": s["body"],
               "metadata": s["metadata"], "contribution": float(s["effect"]),
               "inclusion_probability": round(min(hi, max(lo, lo + (hi - lo) * float(s["effect"]) / scale)), 6)}
              for s in skills]
    core = {"round_id": round_id, "seed": seed, "skill_free_probability": q, "chunks": chunks,
            "source": {"skillbank_sha256": c.fingerprint(bank),
                       "probability_mapping": {"name": "clipped_linear_positive_contribution", "rho_min": lo,
                                               "rho_max": hi, "contribution_scale": scale,
                                               "scale_source": "largest_active_contribution"}}}
    return {"schema_version": CURRICULUM_SCHEMA, **core, "state_id": c.fingerprint(core)}


def cmd_init_cold_start(a: argparse.Namespace) -> int:
    out = Path(a.out)
    bank = {"schema_version": SKILLBANK_SCHEMA, "bank_version": "cold-start-v1",
            "metadata": {"source": "shoprld demo cold start"},
            "skills": [make_skill(i, t, b, e) for i, t, b, e in COLD_START]}
    c.atomic_write_json(out / "selected_skillbank.json", bank)
    c.atomic_write_json(out / "curriculum.json", build_curriculum(out / "selected_skillbank.json", "round-000", a.seed, 0.2, 0.2, 0.9))
    tasks = "".join(json.dumps({"prompt": str(t), "metadata": {"schema_version": "shopsimrl-slime-tasks-v1",
                                                               "task_id": t, "split": "train"}}) + "\n" for t in range(500))
    c.atomic_write_bytes(out / "train_tasks.jsonl", tasks.encode())
    log(f"wrote {out}/selected_skillbank.json, curriculum.json, train_tasks.jsonl")
    return 0


def cmd_build_curriculum(a: argparse.Namespace) -> int:
    payload = build_curriculum(a.skillbank, a.round_id, a.seed, a.skill_free_probability, a.rho_min, a.rho_max)
    c.atomic_write_json(a.out, payload)
    log(f"wrote curriculum {a.out} ({len(payload['chunks'])} chunks, state {payload['state_id'][:12]})")
    print_payload(payload)  # the real build-curriculum prints the state, indented (contract §8)
    return 0


# ---------------------------------------------------------------- emit

def cmd_emit(a: argparse.Namespace) -> int:
    """The real emitter's four block-YAML files (contracts §2), with no keys it does not write
    (a `seed` key in slime.yaml would override slime's --seed through --custom-config-path).
    The demo-only options set the values the real one hard-codes (ports, concurrencies)."""
    root = Path(a.project_root).resolve()
    runs = root / "runs"
    rid = a.round_id
    out = runs / "loop" / rid
    skillbank, curriculum = str(Path(a.skillbank).resolve()), str(Path(a.curriculum).resolve())
    shop, val = a.shopsim_url.rstrip("/"), a.val_url.rstrip("/")
    slime = {"shopsim_skillbank_path": skillbank, "shopsim_curriculum_path": curriculum,
             "shopsim_training_output_dir": str(runs / "slime-training"),
             "shopsim_system_prompt_file": "configs/prompts/persona_single_turn.txt",
             "shopsim_environment_base_url": shop, "shopsim_environment_timeout": 30,
             "shopsim_environment_persona": True, "shopsim_environment_trust_env": False,
             "shopsim_episode_concurrency": a.episode_concurrency, "shopsim_max_steps": 30,
             "shopsim_full_skill_retry": True, "shopsim_max_consecutive_failed_groups": 8,
             "shopsim_tool_parser": "qwen3_coder", "shopsim_reasoning_parser": "qwen3"}
    analysis = {"online_analysis": {
        "name": rid, "training_round_dir": str(runs / "slime-training" / rid),
        "current_skillbank_path": skillbank, "output_dir": str(runs / f"{rid}-online-analysis"),
        "proposal_checkpoint": f"qwen35-4b-{rid}", "max_candidates": 6, "resume": True,
        "trace2skill_config": str(root / "configs" / "trace2skill_cold_start.yaml")}}
    if a.history_ledger:
        analysis["online_analysis"]["proposal_ledger_history_path"] = str(Path(a.history_ledger).resolve())
    val_cfg = {"experiment": {"name": f"{rid}-bare-val", "output_dir": str(runs), "dotenv": str(root / ".env"),
                              "seed": 20260830, "concurrency": a.val_concurrency, "resume": True},
               "tasks": {"split_file": str(root / "ShopSimulator/shop_env/configs/persona_splits.v1.json"),
                         "split": "val", "sample_size": None, "repeats": 1},
               "environment": {"base_url": shop, "timeout": 30, "persona": None},
               "runtime": {"max_steps": 30},
               "prompt": {"system_prompt_file": str(root / "configs/prompts/persona_single_turn.txt")},
               "skills": {"path": None},
               "model": {"id": "qwen35-4b-current-checkpoint", "checkpoint_id": f"{rid}-checkpoint",
                         "name": "Qwen/Qwen3.5-4B", "base_url": f"{val}/v1", "api_key_env": None,
                         "temperature": 0.6, "top_p": 1.0,
                         "max_tokens": int(os.environ.get("ROLLOUT_MAX_RESPONSE_LEN", 4096)), "timeout": 180,
                         "max_retries": 3, "trust_env": False, "send_seed": False, "tool_choice": "auto",
                         "extra_body": {"enable_thinking": True}}}
    gate = {"online_gate": {
        "name": f"{rid}-online-gate", "output_dir": str(runs / f"{rid}-online-gate"),
        "experiment_config": str(out / "val.yaml"), "bare_run_dir": str(runs / f"{rid}-bare-val"),
        "candidate_pool_path": str(runs / f"{rid}-online-analysis" / "candidate_pool.json"),
        "mask_seed": 20260901, "active_skill_budget": 10}}
    for name, payload in (("slime", slime), ("analysis", analysis), ("val", val_cfg), ("gate", gate)):
        c.atomic_write_bytes(out / f"{name}.yaml", dump_yaml(payload).encode())
    print(out, flush=True)
    return 0


def check_payload(config: str, task_data: str) -> dict[str, Any]:
    """The real `training check`'s payload (contracts/shopsimrl-tools.md §3.2), or an exception."""
    cfg = c.load_config_file(config)
    for key in ("shopsim_environment_base_url", "shopsim_skillbank_path", "shopsim_curriculum_path",
                "shopsim_training_output_dir"):
        if not cfg.get(key):
            raise KeyError(f"{config}: {key} is missing")
    for key in ("shopsim_episode_concurrency", "shopsim_max_steps", "shopsim_max_consecutive_failed_groups"):
        if isinstance(cfg.get(key), bool) or not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise ValueError(f"{key} must be an integer >= 1")
    bank = c.read_json(cfg["shopsim_skillbank_path"], "skillbank")
    curriculum = c.read_json(cfg["shopsim_curriculum_path"], "curriculum")
    if curriculum.get("source", {}).get("skillbank_sha256") != c.fingerprint(bank):
        raise ValueError("skillbank sha256 does not match curriculum.source.skillbank_sha256")
    lines = [json.loads(ln) for ln in Path(task_data).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"task data {task_data} is empty")
    return {"status": "ready", "scope": "offline_inputs_only", "round_id": str(curriculum.get("round_id")),
            "curriculum_state_id": curriculum.get("state_id"), "skillbank_sha256": c.fingerprint(bank),
            "active_chunks": len(curriculum.get("chunks") or []), "training_tasks": len(lines),
            "skill_free_probability": float(curriculum.get("skill_free_probability", 0.0)),
            "episode_concurrency": cfg["shopsim_episode_concurrency"]}


def cmd_check(a: argparse.Namespace) -> int:
    """Like the real check: the indented payload and exit 0, or a traceback on stderr, exit 1,
    and nothing on stdout (never a JSON error)."""
    try:
        payload = check_payload(a.config, a.task_data)
    except Exception:  # the real CLI lets every exception escape: a traceback and exit 1
        traceback.print_exc(file=sys.stderr)
        return 1
    print_payload(payload)
    return 0


# ---------------------------------------------------------------- the Failure Analyst

def pending_triage(round_dir: Path) -> list[dict[str, Any]]:
    """Pending groups, sorted; a triage file that does not parse yet is skipped this time."""
    records = []
    for path in sorted(round_dir.glob("group-*/triage.json")):
        try:
            t = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (t.get("classification") or t.get("status")) == PENDING:
            records.append(t)
    return records


def trajectory_id(t: dict[str, Any]) -> str:
    return (t.get("full_skill_retry") or {}).get("episode_id") or f"{t.get('round_id')}-group-{t.get('group_id')}"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def triage_fingerprint(t: dict[str, Any]) -> str:
    return c.fingerprint({"triage": {k2: v for k2, v in t.items() if k2 != "full_skill_retry"}})


def analyze_group(t: dict[str, Any], seconds: float) -> dict[str, Any]:
    """One "LLM" analysis: a deterministic failure card for a pending group (the real card's
    fields, plus the demo's `failure_mechanism` that its compile groups by)."""
    time.sleep(seconds)
    if not os.environ.get("BAILIAN_API_KEY"):
        # The real analyst raises on the missing key and writes an ANALYST_ERROR card.
        return {"source_trajectory_id": trajectory_id(t), "eligible_for_consolidation": False,
                "status": ANALYST_ERROR, "error": {"type": "KeyError", "message": "BAILIAN_API_KEY is not set"},
                "input_fingerprint": triage_fingerprint(t)}
    k = int(c.unit("mechanism", t.get("round_id"), t.get("group_id")) * len(MECHANISMS))
    mech, title, _ = MECHANISMS[k]
    tid = trajectory_id(t)
    return {"schema_version": "shopsimrl-evidence-card-v3", "card_id": f"failure-{tid}-01",
            "source_trajectory_id": tid, "channel": "failure", "stage": "online", "status": "PROPOSE_ADD",
            "privileged_audit": None, "deployable_abstraction": f"{title}: the agent failed by {mech.replace('_', ' ')}.",
            "audit_action_summary": [], "audit_transcript": [], "terminal_trials": [],
            "successful_counterfactual_trials": [], "grounded_live_actions": [], "firewall_findings": [],
            "forced_no_proposal_reason": None, "eligible_for_consolidation": True, "created_at": now_iso(),
            "input_fingerprint": triage_fingerprint(t), "failure_mechanism": mech}


class CardStore:
    """failure_cards.jsonl: append-only, fsynced, deduplicated by source_trajectory_id."""

    def __init__(self, path: Path):
        self.path = path
        self.cards: dict[str, dict[str, Any]] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # a torn last line from a crash: drop it
                data = data[: data.rfind(b"\n") + 1]
                with open(path, "r+b") as f:
                    f.truncate(len(data))
            for line in data.decode("utf-8").splitlines():
                try:
                    card = json.loads(line)
                    self.cards[card["source_trajectory_id"]] = card
                except (ValueError, KeyError, TypeError):
                    continue
        self.lock = threading.Lock()

    def usable(self, tid: str) -> bool:
        """A card that needs no re-analysis (an ANALYST_ERROR one does, by `analyze`)."""
        card = self.cards.get(tid)
        return card is not None and card.get("status") != ANALYST_ERROR

    def append(self, card: dict[str, Any]) -> bool:
        """Append a card (latest wins per source_trajectory_id, as in the real file)."""
        with self.lock:
            if self.usable(card["source_trajectory_id"]):
                return False
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(card, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.cards[card["source_trajectory_id"]] = card
            return True


def analysis_spec(path: str) -> dict[str, Any]:
    cfg = c.load_config_file(path)
    oa = cfg.get("online_analysis") if isinstance(cfg, dict) else None
    if not isinstance(oa, dict):
        raise c.DemoError(f"{path}: config must contain an online_analysis mapping")
    for key in ("training_round_dir", "current_skillbank_path", "output_dir"):
        if not oa.get(key):
            raise c.DemoError(f"{path}: online_analysis.{key} is required")
    return oa


def cmd_watch_analyze(a: argparse.Namespace) -> int:
    oa = analysis_spec(a.config)
    round_dir, out = Path(oa["training_round_dir"]), Path(oa["output_dir"])
    stop_file = Path(a.stop_file)
    poll = c.env_float("DEMO_ANALYST_POLL", 0.2)
    seconds = c.env_float("DEMO_ANALYST_SECONDS", 0.05)
    has_key = bool(os.environ.get("BAILIAN_API_KEY"))
    store = CardStore(out / "failure_cards.jsonl")
    stop = threading.Event()
    reason: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if stop.is_set():
            os._exit(130)  # a second signal forces the exit, without draining
        reason.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"watch-analyze: watching {round_dir} every {poll}s; stop file {stop_file}; pid={os.getpid()}")
    if not has_key:
        log("ERROR: BAILIAN_API_KEY is not set; every failure card will be an ANALYST_ERROR")
    from concurrent.futures import ThreadPoolExecutor, wait  # imported late: ~50 ms that emit/check never need

    pool = ThreadPoolExecutor(max_workers=2)
    in_flight: dict[str, Any] = {}
    written = 0

    def submit_new() -> None:
        for t in pending_triage(round_dir):
            tid = trajectory_id(t)
            if tid not in store.cards and tid not in in_flight:  # the sidecar never retries an error card
                in_flight[tid] = pool.submit(analyze_group, t, seconds)

    def harvest(block: bool) -> None:
        nonlocal written
        if block and in_flight:
            wait(list(in_flight.values()))
        for tid, fut in list(in_flight.items()):
            if fut.done():
                del in_flight[tid]
                if fut.exception() is None and store.append(fut.result()):
                    written += 1

    while not stop.is_set() and not stop_file.exists():
        submit_new()
        harvest(block=False)
        stop.wait(poll)
    why = reason[0] if reason else f"stop file {stop_file}"
    submit_new()  # the final sweep: the trainer has finished writing triage files
    log(f"watch-analyze: stopping ({why}); draining {len(in_flight)} analysis(es)")
    harvest(block=True)
    pool.shutdown(wait=True)
    log(f"watch-analyze: drained; {written} new card(s), {len(store.cards)} in {store.path}")
    pending = pending_triage(round_dir) if round_dir.is_dir() else []
    print_payload({"status": "watched", "triage_groups": len(pending), "newly_analyzed": written,
                   "analyzed_cards": sum(1 for t in pending if trajectory_id(t) in store.cards)})
    return 0


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    c.atomic_write_bytes(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a torn last line
    return rows


def candidate_pool(oa: dict[str, Any], skills: list[dict[str, Any]], bank: dict[str, Any],
                   candidates: list[dict[str, Any]]) -> dict[str, Any]:
    payload = {"schema_version": POOL_SCHEMA, "round_id": oa.get("name"),
               "proposal_checkpoint": oa.get("proposal_checkpoint"), "current_skillbank_sha256": c.fingerprint(bank),
               "current_skills": [{"skill_id": s["id"], "version": "1", "content": s["body"],
                                   "metadata": s["metadata"]} for s in skills],
               "candidates": candidates}
    return {**payload, "pool_sha256": c.fingerprint(payload)}


def cmd_analyze(a: argparse.Namespace) -> int:
    """The real `training analyze` (contracts §5): exit 0 after either path; a success summary
    has no `status`; the fallback writes `status: failed` and NO proposal_ledger.jsonl; a missing
    analyst key gives ANALYST_ERROR cards and a success-shaped summary with 0 candidates."""
    oa = analysis_spec(a.config)
    out, round_dir = Path(oa["output_dir"]), Path(oa["training_round_dir"])
    bank, skills = load_skills(oa["current_skillbank_path"])
    history_path = oa.get("proposal_ledger_history_path")
    history = read_jsonl(Path(history_path)) if history_path else []
    out.mkdir(parents=True, exist_ok=True)
    pool_path = str((out / "candidate_pool.json").resolve())
    ledger: list[dict[str, Any]] | None
    try:
        if c.env_flag("DEMO_ANALYST_FAIL"):
            raise RuntimeError("the analyst failed (DEMO_ANALYST_FAIL=1)")
        if not round_dir.is_dir():
            raise FileNotFoundError(f"training round directory not found: {round_dir}")
        store = CardStore(out / "failure_cards.jsonl")
        triage = pending_triage(round_dir)
        for t in triage:  # catch up what the sidecar did not analyze (ANALYST_ERROR ones too), like the real drain
            if not store.usable(trajectory_id(t)):
                store.append(analyze_group(t, c.env_float("DEMO_ANALYST_SECONDS", 0.05)))
        ids = {trajectory_id(t) for t in triage}
        cards = sorted((card for tid, card in store.cards.items() if tid in ids and card.get("eligible_for_consolidation")),
                       key=lambda card: card["card_id"])
        by_mech: dict[str, list[str]] = {}
        for card in cards:
            by_mech.setdefault(card["failure_mechanism"], []).append(card["card_id"])
        candidates = []
        for mech, title, procedure in MECHANISMS:
            if mech not in by_mech or len(candidates) >= int(oa.get("max_candidates", 6)):
                continue
            content = f"### {title} ({oa.get('name')})\n\n- Procedure: {procedure}"
            cid = "online-" + c.fingerprint({"operation": "ADD", "content": content})[:16]
            candidates.append({"candidate_id": cid, "operation": "ADD", "target_chunk_id": None, "content": content,
                               "metadata": {"title": title, "failure_mechanism": mech, "evidence_card_ids": by_mech[mech],
                                            "consolidation_cluster_id": mech,
                                            "proposal_checkpoint": oa.get("proposal_checkpoint")}})
        pool = candidate_pool(oa, skills, bank, candidates)
        ledger = history + [{"candidate_id": cand["candidate_id"], "operation": "ADD", "target_chunk_id": None,
                             "source_card_ids": cand["metadata"]["evidence_card_ids"],
                             "failure_mechanism": cand["metadata"]["failure_mechanism"],
                             "proposal_checkpoint": oa.get("proposal_checkpoint"), "stage": "online",
                             "consolidation_cluster_id": cand["metadata"]["consolidation_cluster_id"],
                             "replacement_family_id": None, "content": cand["content"], "validation_result": None,
                             "estimated_effect": None, "contribution_rank": None, "notes": None} for cand in candidates]
        summary: dict[str, Any] = {
            "schema_version": "shopsimrl-online-failure-analysis-v1", "created_at": now_iso(),
            "triage_groups": len(triage), "analyzed_cards": len([i for i in ids if i in store.cards]),
            "eligible_cards": len(cards), "candidates": len(candidates), "proposal_history_records": len(history),
            "evidence_only_card_ids": [], "candidate_pool_path": pool_path,
            "current_skillbank_sha256": c.fingerprint(bank),
            "compilation_input_sha256": c.fingerprint([card["card_id"] for card in cards])}
    except Exception as exc:  # the real fallback: a current-skills-only pool, no ledger, exit 0
        pool = candidate_pool(oa, skills, bank, [])
        ledger = None
        summary = {"schema_version": "shopsimrl-online-failure-analysis-v1", "created_at": now_iso(),
                   "status": "failed", "submitted_candidates": False,
                   "error": {"type": type(exc).__name__, "message": str(exc)},
                   "triage_groups": 0, "analyzed_cards": 0, "eligible_cards": 0, "candidates": 0,
                   "proposal_history_records": 0, "evidence_only_card_ids": [], "candidate_pool_path": pool_path,
                   "current_skillbank_sha256": c.fingerprint(bank), "compilation_input_sha256": None}
    c.atomic_write_json(out / "candidate_pool.json", pool)
    if ledger is not None:
        write_jsonl(out / "proposal_ledger.jsonl", ledger)
    c.atomic_write_json(out / "analysis_summary.json", summary)
    printed = dict(summary)
    if getattr(a, "wandb", False) and a.wandb_mode != "disabled":
        printed["wandb_error"] = "wandb is not installed (demo stand-in)"  # printed only, never in the file
    print_payload(printed)
    return 0


# ---------------------------------------------------------------- episodes (val and gate)

class Servers:
    """HTTP calls to ShopSim and the val server, as the real runtime makes them."""

    def __init__(self, shop_url: str, val_url: str, shop_timeout: float, model_timeout: float):
        self.shop_url, self.val_url = shop_url.rstrip("/"), val_url.rstrip("/")
        self.shop_timeout, self.model_timeout = shop_timeout, model_timeout

    def model_info(self) -> dict[str, Any]:
        try:
            status, body = c.http_json("GET", self.val_url + "/get_model_info", timeout=10)
        except OSError as exc:
            raise c.DemoError(f"val server unreachable at {self.val_url}: {exc}") from None
        if status != 200 or not isinstance(body, dict) or not body.get("weights_fingerprint"):
            raise c.DemoError(f"val server at {self.val_url} has no model loaded (HTTP {status})")
        return body

    def episode(self, task_id: int, prompt_extra: str) -> dict[str, Any]:
        def generate(lease: dict[str, Any]) -> tuple[str, float]:
            # One generation per episode; the scripted shopper plays it (its key and skill come
            # from the generated text, so rewards depend on the served weights).
            prompt = f"{prompt_extra}{lease['task_instruction']}\n{lease['observation']}"
            status, gen = c.http_json("POST", self.val_url + "/generate",
                                      {"text": prompt, "sampling_params": {"temperature": 0.6, "max_new_tokens": 4096}},
                                      timeout=self.model_timeout)
            if status != 200 or not isinstance(gen, dict) or "text" not in gen:
                raise RuntimeError(f"generate HTTP {status}")
            return str(gen["text"]), 0.3 + 0.6 * c.unit("skill", gen["text"])

        out = c.ShopClient(self.shop_url, self.shop_timeout).play(task_id, "", 0.0, on_reset=generate)
        return {"done": True, "reward": out["reward"], "reward_detail": out["reward_detail"],
                "termination_reason": out["termination_reason"], "action": out["actions"][-1] if out["actions"] else ""}


def split_ids(n_tasks: int, split: str) -> list[int]:
    """The demo's frozen persona split of the service's tasks 0..n-1: train the lower half, val
    the upper half (a one-task catalog serves both)."""
    half = n_tasks // 2
    ids = list(range(half)) if split == "train" else list(range(half, n_tasks))
    return ids or list(range(n_tasks))


def service_tasks(shop_url: str) -> int:
    """How many tasks the ShopSim service serves (`/healthz` `tasks`): only those ids reset."""
    try:
        status, body = c.http_json("GET", shop_url.rstrip("/") + "/healthz", timeout=10)
    except OSError as exc:
        raise RuntimeError(f"ShopSim unreachable at {shop_url}: {exc}") from None
    tasks = body.get("tasks") if isinstance(body, dict) else None
    if status != 200 or isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise RuntimeError(f"ShopSim at {shop_url} reports no task count (HTTP {status})")
    return tasks


def val_task_ids(seed: int, n: int | None, n_tasks: int) -> list[int]:
    """The val split (the whole split when `tasks.sample_size` is null, as the real gate requires)."""
    ids = split_ids(n_tasks, "val")
    if n is None:
        return ids
    if not 1 <= n <= len(ids):
        raise c.DemoError(f"tasks.sample_size must be null or in [1, {len(ids)}] (the val split), got {n}", 2)
    return sorted(random.Random(seed).sample(ids, n))


def mean_sem(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    m = sum(values) / len(values)
    if len(values) < 2:
        return round(m, 6), None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return round(m, 6), round(math.sqrt(var / len(values)), 6)


def val_setup(cfg_path: str) -> tuple[dict[str, Any], Servers, list[int]]:
    cfg = c.load_config_file(cfg_path)
    try:
        exp, model, env = cfg["experiment"], cfg["model"], cfg["environment"]
        raw = (cfg.get("tasks") or {}).get("sample_size")
        n = None if raw is None else int(raw)
        val_url = str(model["base_url"]).rstrip("/").removesuffix("/v1")
        servers = Servers(env["base_url"], val_url, float(env.get("timeout", 30)), float(model.get("timeout", 180)))
        seed = int(exp["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise c.DemoError(f"{cfg_path}: malformed val config ({exc})", 2) from None
    return cfg, servers, val_task_ids(seed, n, service_tasks(servers.shop_url))


def run_parallel(jobs: list[Any], fn: Callable[[Any], None], concurrency: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for fut in [pool.submit(fn, j) for j in jobs]:
            fut.result()


def episode_id(task: int, sample: int = 0) -> str:
    return f"task-{task:06d}__sample-{sample:03d}"


def numeric(v: Any) -> bool:
    """A reward component the summary averages: real reward_detail values also hold str, bool,
    None and dicts, which are skipped (never float()-ed)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def latest_records(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if isinstance(r.get("episode_id"), str):
            out[r["episode_id"]] = r
    return out


def summarize(records: list[dict[str, Any]], eids: list[str]) -> dict[str, Any]:
    """The real `summarize_traces` over the latest record of each episode (contracts §6), minus
    `created_at` and `cost` (timing: this file is compared byte for byte across demo runs)."""
    latest = latest_records(records)
    done = {e: latest[e] for e in eids if e in latest and latest[e].get("status") == "completed"
            and isinstance(latest[e].get("final"), dict) and latest[e]["final"].get("done") is True}
    finals = [done[e]["final"] for e in eids if e in done]
    rewards = [float(f["reward"]) for f in finals if numeric(f.get("reward"))]
    reward_mean, reward_sem = mean_sem(rewards)
    components: dict[str, list[float]] = {}
    for f in finals:
        for k, v in sorted((f.get("reward_detail") or {}).items()):
            if k.startswith("r_") and numeric(v):
                components.setdefault(k, []).append(float(v))
    failed = [e for e in eids if e in latest and e not in done]
    reasons = Counter(str(f.get("termination_reason")) for f in finals)
    return {
        "schema_version": "shopsimrl-eval-summary-v2",
        "counts": {"requested": len(eids), "trace_files": sum(1 for e in eids if e in latest), "completed": len(finals),
                   "failed": len(failed), "scored": len(rewards),
                   "coverage": len(finals) / len(eids) if eids else 0.0},
        "primary": {"reward_mean": reward_mean, "reward_sem": reward_sem,
                    "success_rate": mean_sem(components.get("r_success", []))[0]},
        "reward_components": {k: mean_sem(v)[0] for k, v in sorted(components.items())},
        "behavior": {"steps_mean": 1.0 if finals else None, "model_steps": len(finals), "protocol_errors": 0,
                     "protocol_error_rate": 0.0 if finals else None, "policy_failures": 0,
                     "policy_failure_rate": 0.0 if finals else None, "invalid_action_rate": 0.0 if finals else None,
                     "invalid_actions": 0, "total_actions": len(finals),
                     "termination_reasons": dict(sorted(reasons.items()))},
        "errors": dict(sorted(Counter(((latest[e].get("error") or {}).get("type") or "unknown")
                                      for e in failed).items())),
    }


def cmd_run(a: argparse.Namespace) -> int:
    """The real `run` (contracts §6): waves until every episode is completed or has used its 3
    attempts (counted over every record in traces.jsonl), exit 0 whenever it finishes; exit 1 only
    on a manifest mismatch or a bad config."""
    cfg, servers, tasks = val_setup(a.config)
    exp, model = cfg["experiment"], cfg["model"]
    out = Path(exp["output_dir"]) / exp["name"]
    seed = int(exp["seed"])
    jobs = [{"task_id": t, "sample_id": 0, "seed": seed, "split": "val"} for t in tasks]
    plan = {"pipeline_version": "shopsimrl-v0.4", "experiment": exp["name"], "model_id": model.get("id"),
            "model": {"provider": "openai_compatible", "checkpoint_id": model.get("checkpoint_id"),
                      "model": model.get("name"), "base_url": model.get("base_url")},
            "task_split": {"split": "val", "sample_size": (cfg.get("tasks") or {}).get("sample_size")},
            "jobs": jobs, "environment": {"adapter": "shopsim_http", "base_url": servers.shop_url},
            "runtime": {"max_steps": (cfg.get("runtime") or {}).get("max_steps", 30),
                        "concurrency": exp.get("concurrency", 1)}, "skills": {"provider": "none"}}
    fp = c.fingerprint(plan)
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        old = c.read_json(manifest_path, "run manifest")
        if old.get("plan_fingerprint") != fp:
            raise c.DemoError(f"{manifest_path}: plan fingerprint mismatch (another config made this run dir); "
                              "archive the dir or restore its inputs")
    else:
        c.atomic_write_json(manifest_path, {"schema_version": "shopsimrl-run-manifest-v1", "created_at": now_iso(),
                                            "plan_fingerprint": fp, "plan": plan})
    traces_path = out / "traces.jsonl"
    fail_n = c.env_int("DEMO_VAL_FAIL_EPISODES", 0) or 0
    doomed = set(tasks[:fail_n])
    lock = threading.Lock()
    print(f"run={out.resolve()} episodes={len(jobs)} model={model.get('id')}", flush=True)
    eids = [episode_id(t) for t in tasks]

    def attempt(job: dict[str, Any], k: int, n: int, attempts: Counter[str]) -> None:
        eid = episode_id(job["task_id"])
        t0 = time.time()
        rec: dict[str, Any] = {"schema_version": "shopsimrl-episode-v4", "episode_id": eid, "job": job,
                               "provenance": {"model": plan["model"], "environment": plan["environment"]},
                               "started_at": now_iso(), "selected_skills": []}
        try:
            # DEMO_VAL_FAIL_EPISODES fails the first attempt of the first N tasks in each run dir.
            if job["task_id"] in doomed and attempts[eid] == 0:
                raise RuntimeError("injected episode failure (DEMO_VAL_FAIL_EPISODES)")
            rec.update(status="completed", final=servers.episode(job["task_id"], ""), error=None)
        except Exception as exc:
            rec.update(status="failed", final=None,
                       error={"stage": "episode", "type": type(exc).__name__, "message": str(exc), "traceback": None})
        rec.update(ended_at=now_iso(), duration_ms=round((time.time() - t0) * 1000, 1))
        with lock:
            with open(traces_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            reward = (rec["final"] or {}).get("reward")
            print(f"[{k}/{n}] {eid} status={rec['status']} reward={reward}", flush=True)

    while True:  # waves, as the real Evaluator runs them
        records = read_jsonl(traces_path)
        attempts = Counter(r.get("episode_id") for r in records)
        latest = latest_records(records)
        wave = [j for j, e in zip(jobs, eids) if (latest.get(e) or {}).get("status") != "completed"
                and attempts[e] < MAX_ATTEMPTS]
        if not wave:
            break
        counter = iter(range(1, len(wave) + 1))
        run_parallel(wave, lambda j: attempt(j, next(counter), len(wave), attempts), int(exp.get("concurrency", 1)))
    c.atomic_write_json(out / "summary.json", summarize(read_jsonl(traces_path), eids))
    return 0  # like the real tool: failed episodes do not change the exit code


# ---------------------------------------------------------------- the online gate

def gate_forced_incomplete(round_id: str) -> bool:
    rounds = {r.strip() for r in os.environ.get("DEMO_GATE_INCOMPLETE_ROUNDS", "").split(",") if r.strip()}
    return c.env_flag("DEMO_GATE_INCOMPLETE") or round_id in rounds


def cmd_online_gate(a: argparse.Namespace) -> int:
    """The real `training online-gate` (contracts §7). Before any rollout, a bad config, pool or
    bare run raises (exit 1, no manifest). Pairs need both the masked and the bare latest trace
    completed; unpaired episodes are DROPPED, and the gate is still complete. `incomplete` (exit
    1) only when the estimate cannot be made (no completed pair). The served weights are not
    checked: the real gate compares only `checkpoint_id` labels."""
    cfg = c.load_config_file(a.config)
    g = cfg.get("online_gate") if isinstance(cfg, dict) else None
    if not isinstance(g, dict):
        raise ValueError(f"{a.config}: config must contain an online_gate mapping")
    round_id = str(g.get("name", "")).removesuffix("-online-gate")
    out, bare = Path(g["output_dir"]), Path(g["bare_run_dir"])
    val_cfg, servers, tasks = val_setup(g["experiment_config"])
    if (val_cfg.get("tasks") or {}).get("sample_size") is not None:
        raise ValueError("the gate requires the complete val split (tasks.sample_size: null)")
    pool = c.read_json(g["candidate_pool_path"], "candidate pool")
    core_pool = {k: v for k, v in pool.items() if k not in ("pool_sha256", "created_at")}
    if pool.get("pool_sha256") != c.fingerprint(core_pool):
        raise ValueError(f"{g['candidate_pool_path']}: pool_sha256 does not verify")
    bare_latest = latest_records(read_jsonl(bare / "traces.jsonl"))
    bare_reward = {r["job"]["task_id"]: float(r["final"]["reward"]) for r in bare_latest.values()
                   if r.get("status") == "completed" and isinstance(r.get("final"), dict)
                   and numeric(r["final"].get("reward")) and isinstance(r.get("job"), dict)}
    if not (bare / "manifest.json").is_file() or not bare_reward:
        raise ValueError(f"bare run {bare}: no manifest or no completed bare trace")
    content = {s["skill_id"]: s["content"] for s in pool["current_skills"]}
    content.update({cand["candidate_id"]: cand["content"] for cand in pool["candidates"]})
    columns = list(content)
    if len(tasks) <= len(columns):
        raise ValueError("GateEvaluationError: OLS requires more observations than chunk factors")
    seed = int(g.get("mask_seed", 20260901))
    rows = [{"episode_id": episode_id(t), "task_id": t, "sample_id": 0, "seed": seed, "split": "val",
             "mask": [int(c.unit("mask", seed, t, col) < 0.5) for col in columns]} for t in tasks]
    for row in rows:
        row["included_chunk_ids"] = [col for col, m in zip(columns, row["mask"]) if m]
    core = {"mask_seed": seed, "pool_sha256": pool.get("pool_sha256"), "columns": columns, "assignments": rows}
    assignments = {"schema_version": "shopsimrl-online-skill-assignments-v1", **core, "assignment_sha256": c.fingerprint(core)}
    out.mkdir(parents=True, exist_ok=True)
    c.atomic_write_json(out / "mask_assignments.json", assignments)
    lock = threading.Lock()
    traces_path = out / "traces.jsonl"
    counter = iter(range(1, len(rows) + 1))

    def masked(row: dict[str, Any]) -> None:
        skills = "".join(f"[skill {i}]\n{content[i]}\n" for i in row["included_chunk_ids"])
        rec: dict[str, Any] = {"schema_version": "shopsimrl-episode-v4", "episode_id": row["episode_id"],
                               "job": {k: row[k] for k in ("task_id", "sample_id", "seed", "split")}}
        try:
            rec.update(status="completed", final=servers.episode(row["task_id"], skills), error=None)
        except Exception as exc:
            rec.update(status="failed", final=None, error={"stage": "episode", "type": type(exc).__name__,
                                                           "message": str(exc), "traceback": None})
        with lock:
            with open(traces_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            print(f"[{next(counter)}/{len(rows)}] {row['episode_id']} status={rec['status']} "
                  f"reward={(rec['final'] or {}).get('reward')}", flush=True)

    run_parallel(rows, masked, int(val_cfg["experiment"].get("concurrency", 1)))
    records = read_jsonl(traces_path)
    masked_latest = latest_records(records)
    summary = summarize(records, [r["episode_id"] for r in rows])
    c.atomic_write_json(out / "summary.json", summary)
    rewards = {r["task_id"]: float(masked_latest[r["episode_id"]]["final"]["reward"]) for r in rows
               if (masked_latest.get(r["episode_id"]) or {}).get("status") == "completed"}
    complete_rows = [r for r in rows if r["task_id"] in rewards and r["task_id"] in bare_reward]
    dropped = [r["episode_id"] for r in rows if r not in complete_rows]
    budget = int(g.get("active_skill_budget", 10))
    model = val_cfg["model"]
    manifest: dict[str, Any] = {
        "schema_version": "shopsimrl-online-validation-gate-v2", "status": "incomplete",
        # The real config block also has output_dir, candidate_pool_path and bare_run_dir, and
        # bare_baseline.run_dir: absolute paths, left out because demo runs compare this file.
        "config": {"name": g.get("name"), "mask_seed": seed, "active_skill_budget": budget},
        "protocol": {"split": "val", "masked_rollouts_per_task": 1, "reused_bare_rollouts_per_task": 1,
                     "masking": "bernoulli_0.5", "estimator": "difference_of_paired_deltas (demo stand-in for the paired OLS)",
                     "selection": "strictly_positive_top_k"},
        "input": {"proposal_checkpoint": pool.get("proposal_checkpoint"), "pool_sha256": pool.get("pool_sha256"),
                  "assignment_sha256": assignments["assignment_sha256"], "task_ids": tasks,
                  # The real input also has model.base_url and environment.base_url: left out, the
                  # demo picks free ports per run and compares this file across runs.
                  "model": {"checkpoint_id": model.get("checkpoint_id"), "model": model.get("name")},
                  "environment": {"persona": None},
                  "bare_baseline": {"observations": len(complete_rows),
                                    "requested_observations": len(rows), "dropped_observations": len(dropped),
                                    "checkpoint_id": model.get("checkpoint_id")}},
        "summary": summary, "output": None}
    if not complete_rows or gate_forced_incomplete(round_id):
        c.atomic_write_json(out / "online_gate_manifest.json", manifest)
        print_payload(manifest)
        return 1
    deltas = {r["task_id"]: rewards[r["task_id"]] - bare_reward[r["task_id"]] for r in complete_rows}
    coef = {}
    for k, col in enumerate(columns):
        inc = [deltas[r["task_id"]] for r in complete_rows if r["mask"][k]]
        exc = [deltas[r["task_id"]] for r in complete_rows if not r["mask"][k]]
        coef[col] = round(sum(inc) / len(inc) - sum(exc) / len(exc), 6) if inc and exc else 0.0
    ranked = sorted(columns, key=lambda col: (-coef[col], col))
    chosen = set([col for col in ranked if coef[col] > 0][:budget])
    current_ids = {s["skill_id"] for s in pool["current_skills"]}
    contributions = {"schema_version": "shopsimrl-online-chunk-contributions-v2", "pool_sha256": pool.get("pool_sha256"),
                     "assignment_sha256": assignments["assignment_sha256"], "observations": len(complete_rows),
                     "requested_observations": len(rows), "dropped_episode_ids": dropped,
                     "active_skill_budget": budget,
                     "selected_intervention_ids": [col for col in columns if col in chosen],
                     "selected_count": len(chosen), "replacement_winners": {},
                     "contributions": [{"intervention_id": col, "kind": "current" if col in current_ids else "candidate",
                                        "logical_chunk_id": col, "operation": "KEEP" if col in current_ids else "ADD",
                                        "order": k, "coefficient": coef[col], "rank": ranked.index(col) + 1,
                                        "status": "selected" if col in chosen else ("retired" if col in current_ids else "non_positive"),
                                        "auxiliary_coefficients": {}}
                                       for k, col in enumerate(columns)]}
    titles = {s["skill_id"]: (s.get("metadata") or {}).get("title") or s["skill_id"] for s in pool["current_skills"]}
    titles.update({cand["candidate_id"]: cand["metadata"].get("title", cand["candidate_id"]) for cand in pool["candidates"]})
    skills = [make_skill(col, titles[col], content[col], coef[col], validation_result="selected",
                         contribution_rank=ranked.index(col) + 1, selected_intervention_id=col)
              for col in columns if col in chosen]
    selected = {"schema_version": SKILLBANK_SCHEMA, "bank_version": f"online-{round_id}-selected-v1",
                "metadata": {"round_id": round_id, "proposal_checkpoint": pool.get("proposal_checkpoint"),
                             "pool_sha256": pool.get("pool_sha256"), "assignment_sha256": assignments["assignment_sha256"],
                             "active_skill_budget": budget, "selected_count": len(skills),
                             "selected_intervention_ids": contributions["selected_intervention_ids"]},
                "skills": skills}
    history = read_jsonl(Path(g["candidate_pool_path"]).with_name("proposal_ledger.jsonl"))
    by_col = {row["intervention_id"]: row for row in contributions["contributions"]}
    ledger = []
    for row in history:
        result = by_col.get(row.get("candidate_id"))
        if result:
            row = {**row, "evaluation_checkpoint": model.get("checkpoint_id"), "intervention_id": result["intervention_id"],
                   "validation_result": result["status"], "estimated_effect": result["coefficient"],
                   "contribution_rank": result["rank"], "pool_sha256": pool.get("pool_sha256"),
                   "assignment_sha256": assignments["assignment_sha256"],
                   "validation_history": [*(row.get("validation_history") or []), result["status"]]}
        ledger.append(row)
    c.atomic_write_json(out / "contributions.json", contributions)
    c.atomic_write_json(out / "selected_skillbank.json", selected)
    write_jsonl(out / "proposal_ledger.jsonl", ledger)
    text = "\n\n".join(s["content"] for s in skills) or "_No positive survivor._"
    c.atomic_write_bytes(out / "selected_skill.md",
                         f"# Shopping Skill\n\n> Active skill frozen by online randomized validation.\n\n{text}\n".encode())
    manifest.update(status="complete", output={
        "contributions_sha256": c.fingerprint(contributions), "selected_skillbank_sha256": c.fingerprint(selected),
        "proposal_ledger_sha256": c.fingerprint(ledger), "selected_chunk_ids": [s["skill_id"] for s in skills]})
    c.atomic_write_json(out / "online_gate_manifest.json", manifest)
    print_payload(manifest)
    return 0


# ---------------------------------------------------------------- CLI

def add_wandb(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wandb", action="store_true")
    p.add_argument("--wandb-project")
    p.add_argument("--wandb-group")
    p.add_argument("--wandb-mode", choices=["online", "offline", "disabled"], default="online")
    p.add_argument("--wandb-dir")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="ShopSimRL tools stand-in (demo)")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("emit", help="write runs/loop/<round>/{slime,analysis,val,gate}.yaml")
    e.add_argument("--project-root", required=True)
    e.add_argument("--round-id", required=True)
    e.add_argument("--skillbank", required=True)
    e.add_argument("--curriculum", required=True)
    e.add_argument("--history-ledger")
    e.add_argument("--shopsim-url", default="http://127.0.0.1:5700")
    e.add_argument("--val-url", default="http://127.0.0.1:30000")
    e.add_argument("--episode-concurrency", type=int, default=4)
    e.add_argument("--val-tasks", type=int, default=40)
    e.add_argument("--val-concurrency", type=int, default=8)
    e.add_argument("--seed", type=int, default=20260830)
    e.set_defaults(fn=cmd_emit)
    i = sub.add_parser("init-cold-start", help="write round-000's skillbank, curriculum and task data")
    i.add_argument("--out", required=True)
    i.add_argument("--seed", type=int, default=20260830)
    i.set_defaults(fn=cmd_init_cold_start)
    r = sub.add_parser("run", help="bare validation")
    r.add_argument("config")
    r.set_defaults(fn=cmd_run)
    t = sub.add_parser("training").add_subparsers(dest="training_cmd", required=True)
    ck = t.add_parser("check")
    ck.add_argument("config")
    ck.add_argument("--task-data", required=True)
    ck.set_defaults(fn=cmd_check)
    w = t.add_parser("watch-analyze")
    w.add_argument("config")
    w.add_argument("--stop-file", required=True)
    w.set_defaults(fn=cmd_watch_analyze)
    an = t.add_parser("analyze")
    an.add_argument("config")
    add_wandb(an)
    an.set_defaults(fn=cmd_analyze)
    og = t.add_parser("online-gate")
    og.add_argument("config")
    add_wandb(og)
    og.set_defaults(fn=cmd_online_gate)
    bc = t.add_parser("build-curriculum")
    bc.add_argument("skillbank")
    bc.add_argument("out")
    bc.add_argument("--round-id", required=True)
    bc.add_argument("--skill-free-probability", type=float, default=0.20)
    bc.add_argument("--rho-min", type=float, default=0.20)
    bc.add_argument("--rho-max", type=float, default=0.90)
    bc.add_argument("--seed", type=int, default=20260901)
    bc.set_defaults(fn=cmd_build_curriculum)
    return p


def main() -> int:
    args = build_parser().parse_args(sys.argv[1:])
    if getattr(args, "wandb", False) and args.wandb_mode != "disabled" and not os.environ.get("WANDB_API_KEY"):
        log("warning: --wandb given but WANDB_API_KEY is not set; not logging to W&B")
    _COMMAND[0] = args.training_cmd if args.cmd == "training" else args.cmd
    started = _faults.now()
    return _faults.after(_COMMAND[0], int(args.fn(args)), started)


if __name__ == "__main__":
    c.run_main(PROG, main)
