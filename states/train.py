"""TRAIN: slime runs until this round's end iteration is a complete checkpoint on disk.

Steps 2-6 of the seed's round: emit the round configs, (check them,) start the Failure
Analyst sidecar, run slime with ``--load`` on the one save dir and ``--num-rollout`` =
this round's end + 1 (an absolute id: slime resumes at tracker+1 by itself), then prune
partial saves and stop the sidecar with the stop-file protocol, waiting for its drain.

While slime runs, the stage follows its progress lines and detects a stall: alive but
no step for k x the median step time (at least ``train.stall_min``). By policy a stalled
trainer is restarted from its last checkpoint. A trainer left running by a crashed
daemon is adopted, never duplicated. Done is judged from the disk, never the exit code,
and only once ShopSim is seen alive after the last save: what was saved while it was dead is
retrained (``ShopsimService.settle_outage``; also settled before a trainer starts).

Every launch that loads the campaign's save dir is checked: its first progress line must show
rollout tracker + 1, slime's resume rule (``start_rollout_id = loaded_rollout_id + 1``). A
trainer that loaded the weights but restarted its rollout count (slime#1558) is stopped at once
and the stage fails with one line, rather than train a round on the wrong data. A launch from the
converted base model is not checked: its numbering is the converter's, not a resume.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import anyio

from shoprld.daemon.foundation.records import bundles
from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.system import logchunks
from shoprld.daemon.foundation.storage import retention
from shoprld.daemon.services import gpus
from shoprld.daemon.round import asyncsave, relaunch, resume, saves
from shoprld.daemon.services.shopsim import request_log
from shoprld.daemon.services.stallsignals import PhaseWatch
from shoprld.daemon.services.commands import port_mismatches
from shoprld.daemon.foundation.storage.disk import log_says_enospc
from shoprld.daemon.foundation.system.errors import PreflightError
from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.foundation.records.store import atomic_write_json
from shoprld.daemon.services.processes import Child
from shoprld.daemon.services.rayjobs import RayJobsError
from shoprld.daemon.services.shopsim import CLIENT_ROLES
from shoprld.daemon.foundation.tools.payload import ToolOutputError, last_json_object, require_keys

from .base import Outcome, RoundContext

STATE = State.TRAIN
ADOPTS: tuple[ChildRole, ...] = (ChildRole.TRAINER, ChildRole.SIDECAR)

def completed(ctx: RoundContext) -> bool:
    """The tracker reached this round's end iteration, that checkpoint is complete, and the
    round's sidecar has drained (issue 27: a daemon that died during the drain drains again on
    its restart, instead of stopping the analysing sidecar as a stray of a later state)."""
    return _trained(ctx) and _drained(ctx)


def _trained(ctx: RoundContext) -> bool:
    return resume.trained(ctx.plan.save_dir_facts(), ctx.end_iteration)


def _drained(ctx: RoundContext) -> bool:
    """The round's sidecar drained (its record, written by :func:`_stop_sidecar`), or none runs."""
    spec = ctx.cfg.sidecar
    if not spec.enabled or not spec.command:
        return True
    # A round exported already was drained by a shoprld from before the record existed.
    return ctx.plan.sidecar_record.exists() or ctx.plan.export_record.exists()


async def run(ctx: RoundContext) -> Outcome:
    """One attempt: adopt or prepare a trainer, launch it from the resume point round/resume.py
    names, follow it, and judge the attempt from the disk."""
    _refuse_trackers_that_are_not_files(ctx)
    problem = await ctx.ensure_inputs(STATE)  # the curriculum a last round skipped, if extended since
    if problem:
        return Outcome.retry(problem)
    if _trained(ctx):  # the job is done; a daemon died during the sidecar's drain: drain again
        return await _finish(ctx, await _start_sidecar(ctx), "the sidecar drained")
    # A trainer a crashed daemon left running is adopted first: it already read this round's
    # YAMLs, which must not be emitted again under it, and its check has passed long ago (and the
    # time those take is time in which the adopted job may finish).
    trainer = ctx.find_child(ChildRole.TRAINER)
    if trainer is None:
        # A live job of this round in Ray (issue 27): a daemon that lost sight of it, or died,
        # must not emit, recover leaks or clear GPUs under it, nor launch a second trainer.
        try:
            trainer = await ctx.reattach(ChildRole.TRAINER, state=STATE)
        except RayJobsError as exc:
            return Outcome.retry(f"{exc}; a live job may be running there, so none is launched")
    if trainer is None:
        refused = await _prepare_launch(ctx)
        if refused is not None:
            return refused
    sidecar = await _start_sidecar(ctx)
    resumed: resume.Resume | None = None
    if trainer is None and _trained(ctx):
        # The round's trainer finished while this attempt prepared (a job that ended during a
        # daemon's restart, seen on a real Ray head): never launch a second one over its end.
        return await _finish(ctx, sidecar, "the trainer ended before the relaunch")
    if trainer is None:
        trainer, resumed = await _launch(ctx)
    before = resumed.load if resumed is not None else ctx.plan.resume_point()
    return await _judge(ctx, await _run_trainer(ctx, trainer, resumed), trainer, sidecar, before)


def _refuse_trackers_that_are_not_files(ctx: RoundContext) -> None:
    """A tracker that is a directory or a FIFO fails every attempt the same way: one line, exit 3."""
    for where in (ctx.layout.save_dir, ctx.cfg.train.base_load if ctx.round == 0 else None):
        bad = ckpt.tracker_not_a_file(where) if where is not None else None
        if bad:
            raise PreflightError(bad)


async def _prepare_launch(ctx: RoundContext) -> Outcome | None:
    """Before a trainer launches: the round's configs emitted and checked, what ShopSim did not
    witness alive retrained, stale clients and leaked leases gone, ShopSim ready, GPUs free.
    None when it may launch; else the attempt's outcome."""
    cfg = ctx.cfg
    if cfg.train.emit_command and not _reused(ctx, ChildRole.EMIT, cfg.train.emit_command):
        fp, t0 = _fingerprint(ctx, cfg.train.emit_command), ctx.clock.monotonic()
        await ctx.run_tool(ChildRole.EMIT, cfg.train.emit_command, cfg.train, state=STATE, timeout=300, secrets=())
        if not (ctx.loop_dir / "slime.yaml").is_file():
            return Outcome.retry(f"{ctx.loop_dir / 'slime.yaml'}: not written by train.emit_command")
        bad = port_mismatches(cfg, ctx.loop_dir)
        if bad:  # the seed hard-codes 5700 and 30000 in the emitted YAMLs: a silent breakage
            return Outcome.fail("; ".join(bad[:3]))
        _remember(ctx, ChildRole.EMIT, fp, t0, outputs=[p for p in ctx.loop_dir.iterdir() if p.is_file()])
    if cfg.train.check_command and not _reused(ctx, ChildRole.CHECK, cfg.train.check_command):
        fp, t0 = _fingerprint(ctx, cfg.train.check_command), ctx.clock.monotonic()
        rc = await ctx.run_tool(ChildRole.CHECK, cfg.train.check_command, cfg.train, state=STATE, timeout=300, secrets=())
        problem = check_verdict(_output_of_last(ctx.log_path(STATE), ChildRole.CHECK), rc)
        if problem is not None:
            relaunch.forget(_record(ctx, ChildRole.CHECK))
            kind, message = problem
            ctx.emit("train.check_failed", reason=message)
            why = f"{message}; see {ctx.log_path(STATE)}"
            return Outcome.retry(why) if kind == "retry" else Outcome.fail(why)
        _remember(ctx, ChildRole.CHECK, fp, t0)
    await ctx.shopsim.settle_outage(ctx.plan, ctx)  # retrain what ShopSim did not witness alive
    await _stop_stale_clients(ctx)
    problem = await ctx.shopsim.recover_leaks(ctx.plan, ctx, reason="before the trainer starts")
    # Never (re)launch against a dead or restarting ShopSim (e.g. the supervisor is still
    # restarting the one that died in this TRAIN): its rollouts would go unscored.
    problem = problem or await ctx.shopsim.wait_ready(ctx.plan, ctx, before="before the trainer starts")
    if problem:
        return Outcome.retry(problem)
    # Settle again now that ShopSim is back: the supervisor (one look a second) may have found it
    # dead only after the settle above (the trainer exits on refused connections at once, and
    # TRAIN's retry is quicker than that look). Left marked, the outage would freeze the witness,
    # and every checkpoint this trainer saves against the live, restarted ShopSim would be rolled
    # back and retrained at the end of TRAIN (a whole round).
    await ctx.shopsim.settle_outage(ctx.plan, ctx)
    problem = await gpus.ensure_free(ctx.plan, ctx, "trainer")  # no straggler of an earlier stage on the GPUs
    return Outcome.retry(problem) if problem else None


async def _launch(ctx: RoundContext) -> tuple[Child, resume.Resume | None]:
    """Repair the tracker (round/resume.py decides), choose the save interval, launch. The
    resume is read before the launch (the trainer may save soon after); None when Ray had the
    job running already (it loaded its checkpoint long before this look)."""
    resumed = _repair_tracker(ctx)
    # The save interval for this launch (issue 17): journaled and recorded for {save_interval}.
    saves.choose_for_launch(ctx.cfg, ctx.layout, ctx.round, log=ctx.log_path(STATE), now=ctx.clock.time(),
                            emit=ctx.emit)
    trainer = await ctx.start(ChildRole.TRAINER, ctx.cfg.train.command, ctx.cfg.train, state=STATE)
    return trainer, (None if trainer.reattached or resumed.load is None else resumed)


async def _run_trainer(ctx: RoundContext, trainer: Child, resumed: resume.Resume | None) -> Followed:
    """Follow the trainer until it exits, stalls or shows a wrong resume; then it is stopped."""
    try:
        followed = await _follow(ctx, trainer, resumed)
        if followed.stalled and trainer.alive() and not trainer.record.job_id:
            # Where it hangs, for the crash bundle: only while it still hangs (issue 18).
            dest = bundles.free_attempt_dir(ctx.layout.logs, ctx.round_id, STATE.value, ctx.attempt)
            await bundles.dump_stacks(dest, trainer.record.pgid, ctx.secrets.redactor)
            ctx.emit("train.stacks_dumped", path=str(dest / bundles.PY_SPY_FILE))
    finally:
        if trainer.alive():
            await trainer.stop(ctx.cfg.train.grace)
        ctx.unregister_child(trainer)
    _warn_if_async_save_disabled(ctx)
    if followed.wrong_resume and resumed is not None and resumed.load is not None:
        # A save it made before the stop (a short save interval) moved the tracker onto its
        # wrongly numbered iteration: the next run must resume from what this launch loaded.
        undo = resume.restore_tracker(ctx.plan.save_dir_facts(), resumed.load.iteration)
        if undo is not None:
            retention.point_tracker(ctx.layout.save_dir, undo.now)
            ctx.emit("checkpoint.tracker_repaired", was=undo.was, now=undo.now)
    return followed


async def _judge(ctx: RoundContext, followed: Followed, trainer: Child, sidecar: Child | None,
                 before: ckpt.Checkpoint | None) -> Outcome:
    """The attempt's outcome, judged from the disk once the trainer has stopped."""
    if followed.wrong_resume:
        return Outcome.fail(followed.wrong_resume)
    facts = ctx.plan.save_dir_facts()  # one look: a settle that changes the disk returns below
    after = facts.resume_point
    progressed = after is not None and (before is None or after.iteration > before.iteration)
    if followed.stalled:
        return Outcome.retry(followed.stalled, progressed=progressed, stall=True)
    # ShopSim must have been alive for the last steps too: check it once more before any
    # later stage uses the checkpoint (the supervisor looks only once a second).
    ctx.shopsim.vouch(ctx.layout.save_dir)
    if await ctx.shopsim.settle_outage(ctx.plan, ctx):
        return Outcome.retry("ShopSim died during the last steps; retraining them from the witnessed checkpoint",
                             progressed=True)
    if resume.trained(facts, ctx.end_iteration):
        _prune_partials(ctx, facts)
        return await _finish(ctx, sidecar)
    tail = _tail(ctx.log_path(STATE))
    if log_says_enospc(tail):  # disk.py's one recogniser (not fooled by the inotify watch limit)
        return Outcome("disk", f"trainer hit ENOSPC (see {ctx.log_path(STATE)})",
                       {"progressed": progressed, "returncode": trainer.returncode})
    return Outcome.retry(
        f"trainer exited (status {trainer.returncode}) before {ctx.plan.checkpoint_name} was complete; "
        f"see {ctx.log_path(STATE)}", progressed=progressed, returncode=trainer.returncode)


async def _finish(ctx: RoundContext, sidecar: Child | None, why: str = "") -> Outcome:
    """The round is trained: drain the sidecar, let a Ray head of ours go with its job (issue 27)."""
    await _stop_sidecar(ctx, sidecar)
    await ctx.launcher.idle()
    return Outcome.done(f"{ctx.plan.checkpoint_name} complete" + (f" ({why})" if why else ""), progressed=True)


async def _stop_stale_clients(ctx: RoundContext) -> None:
    """Stop every ShopSim client of this campaign still registered before a trainer (re)starts.

    While one runs, ``recover_leaks`` takes held leases for legitimate and skips its check; the
    check must run before every (re)launch, whatever is registered (issue 17), or the relaunched
    trainer blocks in ``reset`` until stall timeouts fail the stage. No client is TRAIN's at this
    point: the trainer is not running, the earlier attempt's sidecar is replaced by a fresh one
    below (it analyses what is pending), and another stage's client here is an orphan."""
    cfg = ctx.cfg
    graces = {ChildRole.SIDECAR: cfg.sidecar.grace, ChildRole.VAL: cfg.val.grace, ChildRole.GATE: cfg.gate.grace,
              ChildRole.ANALYZE: cfg.gate.grace}
    for role in CLIENT_ROLES:
        stale = ctx.find_child(role)
        if stale is None:
            continue
        ctx.emit("shopsim.client_stopped_for_recovery", role=role, pid=stale.pid)
        await stale.stop(graces.get(role, cfg.train.grace))
        ctx.unregister_child(stale)


async def _start_sidecar(ctx: RoundContext) -> Child | None:
    spec = ctx.cfg.sidecar
    if not spec.enabled or not spec.command:
        return None
    child = ctx.find_child(ChildRole.SIDECAR)
    if child is not None:
        return child
    ctx.plan.stop_file.unlink(missing_ok=True)
    return await ctx.start(ChildRole.SIDECAR, spec.command, spec, state=STATE)


async def _stop_sidecar(ctx: RoundContext, child: Child | None) -> None:
    """The stop-file protocol: touch the file, wait for the drain, then the group stop.

    A sidecar that died during training missed some triage files: a fresh one started with
    the stop file already present analyses what is pending (it dedupes by group) and exits,
    so the round's failure cards are complete whatever happened to the first one."""
    if child is None:
        return
    stop_file = ctx.plan.stop_file
    stop_file.parent.mkdir(parents=True, exist_ok=True)
    stop_file.touch()
    if not child.alive():
        ctx.emit("sidecar.died", pid=child.pid, returncode=child.returncode)
        ctx.unregister_child(child)
        child = await ctx.start(ChildRole.SIDECAR, ctx.cfg.sidecar.command, ctx.cfg.sidecar, state=STATE)
    with anyio.move_on_after(ctx.cfg.sidecar.drain_timeout):
        await child.wait()
    forced = child.alive()
    if forced:
        ctx.emit("sidecar.drain_timeout", pid=child.pid, timeout_s=ctx.cfg.sidecar.drain_timeout)
        await child.stop(ctx.cfg.sidecar.grace)
    ctx.unregister_child(child)
    stop_file.unlink(missing_ok=True)
    ctx.emit("sidecar.stopped", pid=child.pid)
    record = ctx.plan.sidecar_record
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(record, {"round": ctx.round, "drained_at": ctx.clock.time(), "forced": forced})
    if forced:  # each analysis it was running held a ShopSim lease that nobody will release
        problem = await ctx.shopsim.recover_leaks(ctx.plan, ctx, reason="after the sidecar was stopped")
        if problem:
            ctx.emit("shopsim.recovery_deferred", problem=problem, note="retried before the bare val")


def _repair_tracker(ctx: RoundContext) -> resume.Resume:
    """Make the tracker name the resume point round/resume.py chose (a tracker naming a torn
    save would make Megatron fail to load; one a completion marker overtook would resume too
    early), and prune the torn save's partials. Only ever done while no trainer runs."""
    log = ctx.log_path(STATE)
    seen = _read_progress(log, 0, re.compile(ctx.cfg.train.progress_pattern))[1]
    decided = resume.resume(ctx.plan.save_dir_facts(), seen)
    if decided.repair is not None:
        retention.point_tracker(ctx.layout.save_dir, decided.repair.now,
                                set_aside_as=f"torn-{int(ctx.clock.time())}")
        ctx.emit("checkpoint.tracker_repaired", was=decided.repair.was, now=decided.repair.now)
    if decided.prune:
        retention.delete_checkpoints(decided.prune, save_dir=ctx.layout.save_dir)
    return decided


def _prune_partials(ctx: RoundContext, facts: resume.SaveDir) -> None:
    """The seed's prune, safely: partial iter dirs only, and only now that no trainer runs."""
    decided = resume.retention(facts, resume.Moment.TRAINER_STOPPED)
    if decided.doomed:
        retention.delete_checkpoints(decided.doomed, save_dir=ctx.layout.save_dir)


@dataclass(frozen=True)
class Followed:
    """How following one trainer launch ended (both None: it exited by itself)."""

    stalled: str | None = None       # the stall message: restarted by policy
    wrong_resume: str | None = None  # the resume check's one-line failure: stopped, the stage fails


def _check_resume(ctx: RoundContext, resumed: resume.Resume, first: int) -> str | None:
    """Journal the resume check of one launch; the failure line when ``first`` is not the
    rollout slime must resume at (slime#1558: the weights restored, the rollout count at 0)."""
    assert resumed.load is not None  # only a launch that loads the save dir is checked
    ok = first == resumed.expected
    ctx.emit("train.resume_check", ok=ok, expected=resumed.expected, seen=first,
             checkpoint=str(resumed.load.path), rerun=resumed.rerun)
    if ok:
        return None
    return (f"wrong resume: the trainer loaded {resumed.load.path} but its first rollout was {first}, "
            f"not {resumed.expected} (tracker + 1; slime#1558); stopped at that rollout, before it trains "
            f"a round on the wrong data; fix the trainer's resume (--load, --start-rollout-id), then run "
            f"shoprld again")


async def _judge_stall(ctx: RoundContext, watch: PhaseWatch | None, text: str, now: float, last_step_at: float,
                       step_times: list[float], last_id: int | None, *, exited: bool) -> tuple[str | None, float]:
    """One poll's stall verdict: phase-aware (``watch``, ``train.stall_verdict = "phases"``) or
    the step rule. Journals ``train.stall``; returns the restart message when the policy
    restarts (None: go on) and the step clock (re-armed after an alert-only verdict)."""
    cfg = ctx.cfg.train
    if watch is not None:
        verdict = await watch.poll(text, now, ctx.shopsim.free_slots, ctx.emit)
        if verdict is None or exited:
            return None, last_step_at
        ctx.emit("train.stall", idle_s=verdict.quiet_s, limit_s=verdict.limit_s, last_rollout=last_id,
                 policy=cfg.stall_policy, phase=verdict.phase.value, basis=verdict.basis,
                 signals=verdict.ages, engine_running=watch.signals.running)
        if cfg.stall_policy == "restart":
            return f"{verdict.message()}; restarting from the last checkpoint", last_step_at
        watch.rearm(now)  # alert only: raise it once per limit
        return None, last_step_at
    # Before the first step slime loads the model and warms SGLang up, which takes longer than a
    # step: allow stall_factor x stall_min for that.
    limit = max(cfg.stall_factor * statistics.median(step_times), cfg.stall_min) if step_times \
        else cfg.stall_factor * cfg.stall_min
    idle = now - last_step_at
    if exited or idle <= limit:
        return None, last_step_at
    ctx.emit("train.stall", idle_s=round(idle, 3), limit_s=round(limit, 3), last_rollout=last_id,
             policy=cfg.stall_policy)
    if cfg.stall_policy == "restart":
        return (f"trainer stalled: no step for {idle:.1f}s (limit {limit:.1f}s); restarting from the last "
                f"checkpoint"), last_step_at
    return None, now  # alert only: raise it once per limit


async def _follow(ctx: RoundContext, trainer: Child, resumed: resume.Resume | None = None) -> Followed:
    """Follow the trainer's progress lines until it exits, stalls, or shows a wrong resume
    (checked on its first line when ``resume`` is given)."""
    cfg = ctx.cfg.train
    pattern = re.compile(cfg.progress_pattern)
    log = ctx.log_path(STATE)
    offset = log.stat().st_size if trainer.adopted and log.exists() else _offset_of_last_start(log)
    start_iter = ctx.plan.start_iteration
    step_times: list[float] = []
    last_step_at = ctx.clock.monotonic()
    last_id: int | None = None
    done = anyio.Event()
    watch = PhaseWatch(cfg, now=last_step_at, learned_file=ctx.layout.stall_learned, save_dir=ctx.layout.save_dir,
                       request_log=request_log(ctx.plan), http=ctx.http, adopted=trainer.adopted) \
        if cfg.stall_verdict == "phases" else None

    async def waiter() -> None:
        await trainer.wait()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        while not done.is_set():
            with anyio.move_on_after(cfg.follow_interval):
                await done.wait()
            offset, text = _read_chunk(log, offset)
            ids = [int(m.group(1)) for m in pattern.finditer(text)]
            now = ctx.clock.monotonic()
            if resumed is not None and last_id is None and ids:
                wrong = _check_resume(ctx, resumed, ids[0])
                if wrong:
                    tg.cancel_scope.cancel()
                    return Followed(wrong_resume=wrong)
            newest = max(ids, default=None)
            if newest is not None and (last_id is None or newest > last_id):
                # Lines read in one poll arrived together (a loaded box, a slow status write):
                # the time since the last poll is spread over every step it brought, never a
                # zero-length step per line.
                if last_id is not None:
                    step_times.append((now - last_step_at) / (newest - last_id))
                last_id, last_step_at = newest, now
                step = min(ctx.cfg.campaign.steps_per_round, max(0, newest - start_iter))
                ctx.emit("train.progress", rollout=newest, step=step,
                         step_seconds=statistics.median(step_times) if step_times else None)
            stalled, last_step_at = await _judge_stall(ctx, watch, text, now, last_step_at, step_times, last_id,
                                                       exited=done.is_set())
            if stalled:
                tg.cancel_scope.cancel()
                return Followed(stalled=stalled)
    return Followed()


def _record(ctx: RoundContext, role: ChildRole) -> Path:
    return relaunch.record_path(ctx.layout.artifacts, ctx.round_id, role.value)


def _fingerprint(ctx: RoundContext, template: tuple[str, ...]) -> str | None:
    """What a tool reads: its expanded argv, the recipe's train.env, the files its argv names."""
    argv = ctx.argv(template)
    return relaunch.fingerprint(argv, dict(ctx.cfg.train.env), relaunch.named_files(argv))


def _reused(ctx: RoundContext, role: ChildRole, template: tuple[str, ...]) -> bool:
    """A relaunch in this round skips a tool whose last successful run read the same bytes and
    whose outputs are untouched (daemon/round/relaunch.py); journaled with the seconds saved."""
    path = _record(ctx, role)
    if not path.exists():  # the round's first launch: nothing to compare (and no inputs to hash)
        return False
    rec = relaunch.reusable(path, _fingerprint(ctx, template))
    if rec is None:
        return False
    ctx.emit("train.tool_reused", role=role.value, saved_s=rec.get("seconds"),
             reason="inputs and outputs unchanged since its last successful run in this round")
    return True


def _remember(ctx: RoundContext, role: ChildRole, fp: str | None, t0: float, outputs: list[Path] | None = None) -> None:
    if fp is None:
        relaunch.forget(_record(ctx, role))
        return
    relaunch.remember(_record(ctx, role), fp=fp, seconds=ctx.clock.monotonic() - t0,
                      outputs=relaunch.outputs_digest(outputs or []))


def _warn_if_async_save_disabled(ctx: RoundContext) -> None:
    """Megatron turns ``--async-save`` off with one warning when its worker flag is missing (or
    misspelt: slime ignores unknown flags): journal it, so that the operator sees it and the
    save-interval model stops counting an async lag the trainer does not have."""
    if asyncsave.flags_state(ctx.cfg.train.command, ctx.cfg.saves.async_save) == "off":
        return
    log = ctx.log_path(STATE)
    if asyncsave.log_says_disabled(log, _offset_of_last_start(log)):
        ctx.emit(saves.ASYNC_DISABLED_EVENT, log=str(log),
                 message=f"Megatron disabled --async-save (\"Disabling --async-save\" in {log}): every save "
                         f"blocks for its whole write; fix: pass {asyncsave.WORKER_FLAG} in train.command")


#: One poll reads at most this much of the stage log; the rest waits for the next poll (a
#: quarter second later). A Ray job's log arrives in bursts of engine lines, tens of MiB a round:
#: read whole, one burst would cost the daemon several times its size in memory.
POLL_READ_MAX = 1 << 20


def _read_chunk(log: Path, offset: int) -> tuple[int, str]:
    """The whole lines appended to ``log`` since ``offset`` (at most :data:`POLL_READ_MAX`
    bytes of them), and the offset after them."""
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read(POLL_READ_MAX)
    except FileNotFoundError:
        return offset, ""
    end = chunk.rfind(b"\n") + 1
    if end == 0 and len(chunk) == POLL_READ_MAX:  # one line longer than that: skipped, it is no step
        return offset + len(chunk), ""
    return offset + end, chunk[:end].decode(errors="replace")


def _offset_of_last_start(log: Path) -> int:
    """Progress counts only from this launch's header line on."""
    try:
        return logchunks.last_offset(log, b"=== shoprld ") or 0
    except FileNotFoundError:
        return 0


def _read_progress(log: Path, offset: int, pattern: re.Pattern[str]) -> tuple[int, list[int]]:
    """The rollout ids in the whole lines from ``offset`` on, read a MiB at a time (a re-attach
    may find tens of MiB unread), and the offset past the last whole line."""
    ids: list[int] = []
    end = offset
    try:
        for pos, chunk in logchunks.line_chunks(log, offset):
            ids += [int(m.group(1)) for m in pattern.finditer(chunk.decode(errors="replace"))]
            end = pos + len(chunk)
    except FileNotFoundError:
        return offset, []
    return end, ids


def _tail(log: Path, n: int = 16384) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - n))
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _output_of_last(log: Path, role: str) -> str:
    """What the last launch of ``role`` wrote to the stage log: everything after its
    ``=== shoprld <time> start <role>:`` header (earlier attempts' output is not its verdict)."""
    header = re.compile(rb"^=== shoprld \S+ start " + re.escape(role.encode()) + rb":.*$", re.M)
    try:  # scanned a MiB at a time: the trainer's tens of MiB come before the check's header
        return logchunks.read_from(log, logchunks.after_last_match(log, header) or 0).decode(errors="replace")
    except FileNotFoundError:
        return ""


CHECK = "train.check_command (shopsimrl training check)"


def check_verdict(output: str, returncode: int | None) -> tuple[str, str] | None:
    """None when ``training check`` reported ready, else ``(policy, one-line reason)``.

    The real check prints an indented multi-line JSON payload (``status: "ready"`` and eight
    more keys) and exits 0; it fails with a traceback on stderr and exit 1, never with a JSON
    error. A truncated or missing payload after exit 0 is retried (the output was cut short);
    everything else fails the stage: the check's inputs will not fix themselves.
    """
    if returncode != 0:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        last = lines[-1][:300] if lines else "no output"
        status = "was stopped (timeout)" if returncode is None else f"exited {returncode}"
        return "fail", f"{CHECK} {status}: {last}"
    try:
        verdict = last_json_object(output, source=CHECK)
        require_keys(verdict, ("status",), source=CHECK)
    except ToolOutputError as exc:
        return ("retry" if "truncated" in str(exc) else "fail"), str(exc)
    if verdict["status"] != "ready":
        # What the payload says of why, for the operator (a child's words: redacted where it is
        # persisted, like every failure message).
        why = next((str(verdict[k]) for k in ("detail", "error", "reason", "message") if verdict.get(k)), "")
        return "fail", f"{CHECK}: reported status {verdict['status']!r}, not 'ready'" + (f": {why[:300]}" if why else "")
    return None
