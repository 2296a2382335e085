"""The round's room: a pure plan, its planned mode, and one resolution of its values per launch.

Reads are counted with a real audit hook (``sys.addaudithook``: every ``open`` and
``os.scandir`` the interpreter performs), so the counts cover every code path, not one
function a test chose to wrap.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.config.config import Config, config_from_dict
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.services.ray import RayLauncher
from shoprld.daemon.services.rayjobs import RayJobsClient
from shoprld.daemon.round.plan import RoundFacts, RoundPlan, resolve
from tests.roundctx import standalone_context

BASE = "/models/base_torch_dist"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_cfg(tmp_path: Path, **train: object) -> Config:
    return config_from_dict({
        "campaign": {"name": "camp", "experiment": "exp", "rounds": 3, "steps_per_round": 2},
        "storage": {"repo": str(tmp_path / "repo"), "ephemeral_root": str(tmp_path / "eph"),
                    "state_dir": str(tmp_path / "state"), "user": "u"},
        "wandb": {"enabled": False},
        "train": {"command": ["trainer", "--load", "{load}", "--num-rollout", "{num_rollout}",
                              "--skillbank", "{skillbank}"], "base_load": BASE,
                  "env": {"TRAIN_ROUND": "{round_id}"}, "runtime_env": {"JOB_ROUND": "{round_id}"}, **train},
    }, tmp_path / "campaign.toml")


def write_record(plan: RoundPlan, kind: str, rid: str, data: dict[str, Any]) -> Path:
    path = plan.record_path(kind, rid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def commit_checkpoint(save_dir: Path, iteration: int) -> None:
    """A complete checkpoint in Megatron's torch_dist layout, and the tracker naming it."""
    it = ckpt.iter_dir(save_dir, iteration)
    it.mkdir(parents=True)
    for name in ("common.pt", "__0_0.distcp", ".metadata"):
        (it / name).write_bytes(b"x")
    (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (save_dir / ckpt.TRACKER_NAME).write_text(f"{iteration}\n")


@contextlib.contextmanager
def reads_of(*paths: Path) -> Iterator[Counter[str]]:
    """Count the opens and directory scans of ``paths`` while the block runs."""
    watched = {str(p) for p in paths}
    counts: Counter[str] = Counter()
    live = [True]  # an audit hook cannot be removed: it goes quiet when the block ends

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if live and event in ("open", "os.scandir", "os.listdir") and args and str(args[0]) in watched:
            counts[str(args[0])] += 1

    sys.addaudithook(hook)
    try:
        yield counts
    finally:
        live.clear()


def ray_transport() -> tuple[httpx.MockTransport, list[dict[str, Any]]]:
    """A Ray Jobs API that accepts every submission (and remembers it), for the launcher's client."""
    submitted: list[dict[str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.method == "GET" and req.url.path == "/api/jobs/":
            return httpx.Response(200, json=[])
        if req.method == "POST":
            submitted.append(json.loads(req.content))
            return httpx.Response(200, json={"submission_id": submitted[-1]["submission_id"]})
        return httpx.Response(200, json={"status": "RUNNING", "submission_id": req.url.path.split("/")[-1]})

    return httpx.MockTransport(handler), submitted


@pytest.mark.anyio
async def test_one_trainer_launch_reads_the_checkpoints_and_records_once(tmp_path: Path) -> None:
    """A Ray trainer start scans the save dir once and reads the INJECT and GATE records once
    (they were read 3 times before: for the argv, the env, and again inside the launcher)."""
    cfg = make_cfg(tmp_path, launcher="ray", ray_address="http://ray.invalid:8265")
    layout = Layout.from_config(cfg, environ={})
    plan = RoundPlan(cfg, layout, 1, base_env={})
    inject = write_record(plan, "inject", "round-000", {"skillbank": "/sb/round-001.json", "curriculum": "/c.json"})
    gate = write_record(plan, "gate", "round-001", {"decision": "incomplete"})
    commit_checkpoint(layout.save_dir, 2)
    transport, submitted = ray_transport()
    launcher = RayLauncher(cfg, layout, client=RayJobsClient(cfg.train.ray_address, transport=transport))
    ctx = standalone_context(plan, launcher=launcher)
    try:
        with reads_of(layout.save_dir, inject, gate) as reads:
            child = await ctx.start("trainer", cfg.train.command, cfg.train, state="TRAIN")
    finally:
        await launcher.client.aclose()
    assert reads == {str(layout.save_dir): 1, str(inject): 1, str(gate): 1}
    [job] = submitted
    assert child.record.job_id == job["submission_id"] == "shoprld-camp-exp-round-001-1"
    assert f"--load {layout.save_dir} --num-rollout 5 --skillbank /sb/round-001.json" in job["entrypoint"]
    assert job["runtime_env"]["env_vars"]["JOB_ROUND"] == "round-001"


def test_a_plan_reads_nothing_until_its_inputs_are_asked_for(tmp_path: Path) -> None:
    """Building a plan and naming its paths touches no file; its inputs read the previous
    round's INJECT record once, and nothing else."""
    cfg = make_cfg(tmp_path)
    layout = Layout.from_config(cfg, environ={})
    seed = RoundPlan(cfg, layout, 2)
    inject = write_record(seed, "inject", "round-001", {"skillbank": "/sb2", "curriculum": "/c2",
                                                          "history_ledger": "/h2"})
    gate = write_record(seed, "gate", "round-002", {"decision": "complete", "selected_skillbank": "/sel"})
    with reads_of(layout.save_dir, inject, gate) as reads:
        plan = RoundPlan(cfg, layout, 2)
        names = (plan.round_id, plan.loop_dir, plan.gate_dir, plan.bare_val_dir, plan.checkpoint_dir,
                 plan.record_path("export"), plan.log_path("TRAIN"), plan.weight_version)
        assert reads == {}
        assert plan.inputs == {"skillbank": "/sb2", "curriculum": "/c2", "history_ledger": "/h2"}
        assert plan.inputs["skillbank"] == "/sb2"
    assert reads == {str(inject): 1}
    assert names[0] == "round-002" and names[4] == layout.save_dir / "iter_0000006"


def test_the_values_follow_the_two_facts_on_disk(tmp_path: Path) -> None:
    """--load is the base model until the save dir holds a committed checkpoint; the next
    SkillBank is the gate's selection only once the gate was complete."""
    cfg = make_cfg(tmp_path)
    layout = Layout.from_config(cfg, environ={})
    plan = RoundPlan(cfg, layout, 0)
    before = plan.values(RoundFacts.read(plan))
    assert before["load"] == BASE and before["next_skillbank"] == before["skillbank"]
    commit_checkpoint(layout.save_dir, 2)
    write_record(plan, "gate", "round-000", {"decision": "complete", "selected_skillbank": "/sel"})
    after = plan.resolve()
    assert after.values["load"] == str(layout.save_dir)
    assert after.values["next_skillbank"] == str(plan.next_runs_dir / "selected_skillbank.json")
    assert after.argv(cfg.train.command)[2] == str(layout.save_dir)
    assert after.env(cfg.train)["TRAIN_ROUND"] == "round-000"


def test_planned_mode_shows_a_fresh_campaign_whatever_is_on_disk(tmp_path: Path) -> None:
    """Planned: round 0 loads the base model even after a checkpoint, round 1 the save dir, and
    round 1's inputs are what a complete gate leaves until its INJECT record exists."""
    cfg = make_cfg(tmp_path)
    layout = Layout.from_config(cfg, environ={})
    commit_checkpoint(layout.save_dir, 2)
    r0, r1 = (resolve(cfg, layout, r, planned=True) for r in (0, 1))
    assert r0.values["load"] == BASE and r1.values["load"] == str(layout.save_dir)
    runs = layout.project_root / "runs"
    assert (r1.values["skillbank"], r1.values["curriculum"], r1.values["history_ledger"]) == (
        str(runs / "round-001" / "selected_skillbank.json"), str(runs / "round-001" / "curriculum.json"),
        str(runs / "round-000-online-gate" / "proposal_ledger.jsonl"))
    write_record(r1.plan, "inject", "round-000", {"skillbank": "/sb", "curriculum": "/c", "history_ledger": "/h"})
    assert resolve(cfg, layout, 1, planned=True).values["skillbank"] == "/sb"


def test_every_iteration_name_is_megatrons(tmp_path: Path) -> None:
    """The round's weight_version, its checkpoint dir and {checkpoint_dir} are the one helper's name."""
    cfg = make_cfg(tmp_path)
    layout = Layout.from_config(cfg, environ={})
    rv = resolve(cfg, layout, 3)
    assert ckpt.iter_name(8) == "iter_0000008" == rv.plan.weight_version == rv.plan.checkpoint_dir.name
    assert rv.values["checkpoint_dir"] == str(layout.save_dir / "iter_0000008")
    assert rv.values["weight_version"] == "iter_0000008"


def test_the_plan_owns_the_window_and_names_every_record(tmp_path: Path) -> None:
    """The round trains (previous end, its end]; each record has one path, and a kind that is not
    a record is refused rather than built by hand."""
    cfg = make_cfg(tmp_path)
    lay = Layout.from_config(cfg, environ={})
    plan = RoundPlan(cfg, lay, 1)
    assert (plan.start_iteration, plan.end_iteration) == (2, 4)
    assert RoundPlan(cfg, lay, 0).start_iteration == 0
    assert plan.export_record == lay.artifacts / "export" / "round-001.json"
    assert plan.sidecar_record.parent.name == "sidecar" and plan.round_record.parent.name == "round"
    assert plan.saves_record.parent.name == "saves"
    with pytest.raises(ValueError, match="unknown record kind 'exports'"):
        plan.record_path("exports")


def test_save_dir_facts_reads_one_scan_the_witness_and_the_exports(tmp_path: Path) -> None:
    """What round/resume.py decides from: the scan, the witness as written, and the end saves
    whose round has an EXPORT_HF record (round 0's here, not round 1's)."""
    from tests.unit.test_checkpoints import save

    cfg = make_cfg(tmp_path)
    lay = Layout.from_config(cfg, environ={})
    plan = RoundPlan(cfg, lay, 1)
    for n in (2, 3, 4):
        save(lay.save_dir, n)
    write_record(plan, "export", "round-000", {"iteration": 2})
    facts = plan.save_dir_facts()
    assert facts.witness is None and facts.exported == {2}
    assert facts.resume_point is not None and facts.resume_point.iteration == 4
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    lay.shopsim_witness.write_text('{"iteration": 3, "outage": true}')
    witness = plan.save_dir_facts().witness
    assert witness is not None and (witness.iteration, witness.outage) == (3, True)
    lay.shopsim_witness.write_text("{torn")
    witness = plan.save_dir_facts().witness
    assert witness is not None and not witness.readable and not witness.vouches(0)
