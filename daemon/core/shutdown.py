"""Every ending of a campaign (stop, park, fail, finish, exit) goes through one ordered
:meth:`Shutdown.run`, as uvicorn's ``Server.shutdown`` does: stop taking work, drain the
children, record the end, tell the operator.

It takes the machine's :class:`Decision` as it is: the end state and the trigger that leads
there are the decision's (``decide`` chose them), the action says why. It owns the engine's
``stopping`` flag (no stage may start or finish once it is set) and the one line ``shoprld
run`` prints on a non-zero exit. A disk park releases the ballast (disk.py) and reclaims what
this campaign may (``diskwatch.reclaim``); the end is recorded through the view's transition
(journal, state.json, status.json). With ``--wait-for-space`` a park waits for the volume and
goes back to PREFLIGHT_DISK, whose stage the engine then starts.
"""

from __future__ import annotations

from typing import Any

import structlog

from shoprld.daemon.foundation.storage import disk as diskmod
from shoprld.daemon.foundation.storage.ballast import Ballast
from shoprld.daemon.foundation.system.errors import EXIT_DISK, EXIT_OK
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.round.machine import END_ACTIONS, Decision, Exit, Fail, Finish, Park, State, Stop
from shoprld.daemon.services.processes import Clock
from shoprld.daemon.core.children import Children
from shoprld.daemon.core.diskwatch import DiskWatch, reclaim
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.snapshot import Snapshot
from shoprld.daemon.core.stages import RunningStage

log = structlog.get_logger("shoprld.engine")


class Shutdown:
    """The ending path: the running stage to cancel, the children to drain, the view to record in."""

    def __init__(self, view: Snapshot, *, layout: Layout, disk: DiskWatch, notifier: Notifier, clock: Clock,
                 children: Children, stage: RunningStage, wait_for_space: bool) -> None:
        self.view, self.live, self.layout, self.disk, self.notifier = view, view.live, layout, disk, notifier
        self.clock, self.children, self.stage, self.wait_for_space = clock, children, stage, wait_for_space
        self.stopping = False
        self.final_message: str | None = None  # the one line `shoprld run` prints on a non-zero exit

    async def run(self, d: Decision, src: State) -> int | None:
        """Carry out an ending decision made in ``src``. Returns the exit code, or None when a
        disk park with ``--wait-for-space`` went back to PREFLIGHT_DISK (its stage is the engine's to start)."""
        ending, cfg = d.action, self.live.cfg
        assert isinstance(ending, END_ACTIONS), ending
        # 1. Stop taking work: no stage may start or finish from now on.
        if isinstance(ending, Stop):
            self.notifier.stopping()
        if isinstance(ending, Park) and ending.enospc:
            crossing = self.disk.enospc(ending.reason, cfg.disk, self.view.checkpoint_bytes())
            if crossing is not None:  # journaled as the monitor's crossings are
                self.view.journal("disk.hard_limit", **crossing)
        self.stopping = True
        self.stage.cancel()
        # 2. Drain: the children stop (trainer first); a park frees what it may.
        fields: dict[str, Any] = {"resume_from": {"round": self.live.round, "state": src.value}} \
            if isinstance(ending, Stop) else {}
        if isinstance(ending, Park):
            Ballast(self.layout.ballast, cfg.disk.ballast_bytes).release()
        if not isinstance(ending, Exit):  # a stage's configuration error leaves ShopSim for the next start
            await self.children.stop_all()
        if isinstance(ending, Park):
            freed = reclaim(cfg, self.layout, self.live.round, trainer_running=False)
            sample = diskmod.sample(self.layout.ephemeral_root)
            fields = {"free_bytes": sample.avail_bytes, "inodes_free": sample.inodes_free, "reclaimed_bytes": freed,
                      **self.disk.limit_fields(cfg.disk, self.view.checkpoint_bytes())}
        # 3. Record: the end in status, the journal and state.json.
        self._record(d, src, fields)
        # 4. Tell: the log, the operator's notification, the line `shoprld run` prints.
        return await self._tell(ending, fields)

    def _record(self, d: Decision, src: State, fields: dict[str, Any]) -> None:
        snap, ending = self.view.snap, d.action
        match ending:
            case Exit(message, code):  # no transition: the campaign stays where the operator must act
                snap["last_error"] = message
                self.view.journal("stage.error", state=src.value, error=message, exit_code=code)
                self.view.write_status(force=True)
                return
            case Stop(reason):
                snap["stop_reason"] = reason
                fields = {"message": reason, **fields}
            case Fail(message, code, reason):
                snap["last_error"], snap["stop_reason"] = message, reason
                fields = {"message": message, "exit_code": code}
            case Park(reason):
                snap["last_error"], snap["stop_reason"] = reason, "disk"
                fields = {"message": reason, **fields}
            case Finish(reason, message):
                snap["stop_reason"] = reason
                snap["last_error"] = None  # recovered from; the journal keeps the history
                fields = {"message": message} if message else {}
        assert d.trigger is not None, d
        self.view.transition(src, d.next, d.trigger, **fields)
        self.view.write_status(force=True)

    async def _tell(self, ending: Park | Stop | Fail | Finish | Exit, fields: dict[str, Any]) -> int | None:
        cfg, alert = self.live.cfg, self.view.alert
        match ending:
            case Stop(reason, code):
                resume = fields["resume_from"]
                alert("stopped", f"stopped ({reason}); resumes from {resume['state']}", failure=False)
                log.info("daemon.stopped", reason=reason, resume_from=resume)
                return code
            case Fail(message, code, reason):
                log.error("campaign.failed", message=message, exit_code=code)
                alert("gate_stop" if reason == "gate" else "failed", message, failure=reason != "gate")
                self.final_message = message
                return code
            case Finish(reason):
                log.info("campaign.done", reason=reason, rounds=cfg.campaign.rounds)
                alert("done", f"done ({reason}): {len(self.view.snap.get('rounds_done', []))} of "
                      f"{cfg.campaign.rounds} rounds", failure=False)
                return EXIT_OK
            case Exit(message, code):
                log.error("stage.error", state=self.view.machine.state.value, error=message)
                alert("failed", message)
                self.final_message = message
                return code
        log.warning("disk.parked", reason=ending.reason, **fields)
        alert("parked", f"parked in PAUSED_DISK: {ending.reason}", failure=False)
        if not self.wait_for_space:
            self.final_message = (f"parked in PAUSED_DISK: {ending.reason}; fix: free space on "
                                  f"{self.layout.ephemeral_root}, then run again (or use --wait-for-space)")
            return EXIT_DISK
        await self.disk.wait_for_space(cfg.disk, self.view.checkpoint_bytes(), self.clock.monotonic)
        self.stopping = False
        self.view.transition(State.PAUSED_DISK, State.PREFLIGHT_DISK, "resume", message="space is back")
        return None
