"""INJECT: the next round's SkillBank (the gate's selection, or the current one kept) and
its curriculum, built atomically, with the branch taken recorded.

Step 12 of the seed's round. The seed could not resume after an incomplete gate because
nothing recorded which SkillBank was kept; ``artifacts/inject/<round>.json`` does, and the
next round's TRAIN reads its inputs from it. The selected SkillBank is copied (atomically)
to ``runs/<next>/selected_skillbank.json``, so the next round does not depend on a gate
dir that a retry might archive.
"""

from __future__ import annotations

from pathlib import Path

from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.foundation.records.store import atomic_write, atomic_write_json

from .base import Outcome, RoundContext, read_json

STATE = State.INJECT
ADOPTS: tuple[ChildRole, ...] = ()


def completed(ctx: RoundContext) -> bool:
    """The decision is recorded and the next curriculum it names exists and parses (after the
    campaign's last round: recorded as not built, as upstream skips it)."""
    rec = ctx.read_record("inject")
    if not rec:
        return False
    if rec.get("curriculum_built") is False and _last_round(ctx):
        return True
    return read_json(Path(str(rec.get("curriculum", "")))) is not None


def _last_round(ctx: RoundContext) -> bool:
    return ctx.round >= ctx.cfg.campaign.rounds - 1


async def run(ctx: RoundContext) -> Outcome:
    gate = ctx.read_record("gate")
    if gate is None:
        return Outcome.fail(f"{ctx.record_path('gate')}: missing; GATE must run first")
    current = ctx.inputs()
    ctx.plan.next_runs_dir.mkdir(parents=True, exist_ok=True)
    values = ctx.values()
    skillbank = Path(values["next_skillbank"])
    selected = gate.get("selected_skillbank")
    if skillbank != Path(current["skillbank"]) and selected:
        branch = "selected"
        atomic_write(skillbank, Path(selected).read_bytes())
    else:
        branch = "kept"
        ctx.emit("inject.keep", reason="gate incomplete; keep current skillbank", skillbank=str(skillbank))
    history = gate.get("proposal_ledger") or current["history_ledger"] or ""
    curriculum = Path(values["next_curriculum"])
    # Upstream builds no curriculum after the last round (run_full_train.sh: `if i+1 <
    # NUM_ROUNDS`). Should `campaign.rounds` be raised later, the next TRAIN builds it first
    # (RoundContext.ensure_inputs), from this record.
    built = not _last_round(ctx) or ctx.cfg.inject.after_last_round
    if built:
        problem = await ctx.build_next_curriculum(STATE)
        if problem:
            return Outcome.retry(problem)
    else:
        ctx.emit("inject.curriculum_skipped", reason="the campaign's last round", curriculum=str(curriculum))
    rec = {"round": ctx.round, "round_id": ctx.round_id, "next_round_id": ctx.next_round_id, "branch": branch,
           "skillbank": str(skillbank), "curriculum": str(curriculum), "curriculum_built": built,
           "history_ledger": history}
    ctx.record_path("inject").parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(ctx.record_path("inject"), rec)
    ctx.emit("inject.decision", branch=branch, skillbank=str(skillbank))
    return Outcome.done(f"next SkillBank: {branch}", branch=branch)


