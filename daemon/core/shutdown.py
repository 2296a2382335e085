"""Every ending of a campaign (stop, park, fail, finish, exit) goes through one ordered
:meth:`Shutdown.run`, as uvicorn's ``Server.shutdown`` does: stop taking work, drain the
children, record the end, tell the operator.

It owns the engine's ``stopping`` flag (no stage may start or finish once it is set) and the
one line ``shoprld run`` prints on a non-zero exit. A disk park releases the ballast
(disk.py) and reclaims what this campaign may (``diskwatch.reclaim``); the end is recorded
through the engine's transition (journal, state.json, status.json). With
``--wait-for-space`` a park waits for the volume and resumes at PREFLIGHT_DISK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from shoprld.daemon.foundation import disk as diskmod
from shoprld.daemon.foundation.ballast import Ballast
from shoprld.daemon.foundation.config import Config
from shoprld.daemon.foundation.errors import EXIT_DISK, EXIT_OK
from shoprld.daemon.foundation.layout import Layout
from shoprld.daemon.round.machine import Exit, Fail, Finish, Machine, Park, State, Stop
from shoprld.daemon.services.processes import Clock
from shoprld.daemon.core.diskwatch import DiskWatch, reclaim
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.snapshot import Snapshot

log = structlog.get_logger("shoprld.engine")

EndAction = Park | Stop | Fail | Finish | Exit


class Shutdown:
    """The ending path. From the engine: ``cancel_stage`` (the running stage's scope),
    ``stop_children``, ``transition`` and ``spawn`` (to resume after a park)."""

    def __init__(self, view: Snapshot, *, cfg: Callable[[], Config], layout: Layout, machine: Machine,
                 round: Callable[[], int], disk: DiskWatch, notifier: Notifier, clock: Clock,
                 wait_for_space: bool, cancel_stage: Callable[[], None],
                 stop_children: Callable[[], Awaitable[None]], transition: Callable[..., None],
                 spawn: Callable[[State], None]) -> None:
        self.view, self._cfg, self.layout, self.machine, self._round = view, cfg, layout, machine, round
        self.disk, self.notifier, self.clock, self._alert = disk, notifier, clock, view.alert
        self.wait_for_space = wait_for_space
        self._cancel_stage, self._stop_children = cancel_stage, stop_children
        self._transition, self._spawn = transition, spawn
        self.stopping = False
        self.final_message: str | None = None  # the one line `shoprld run` prints on a non-zero exit

    async def run(self, ending: EndAction, src: State, trigger: str | None) -> int | None:
        """Returns the exit code, or None when a disk park with ``--wait-for-space`` resumed."""
        cfg = self._cfg()
        # 1. Stop taking work: no stage may start or finish from now on.
        if isinstance(ending, Stop):
            self.notifier.stopping()
        if isinstance(ending, Park) and ending.enospc:
            crossing = self.disk.enospc(ending.reason, cfg.disk, self.view.checkpoint_bytes())
            if crossing is not None:  # journaled as the monitor's crossings are
                self.view.journal("disk.hard_limit", **crossing)
        self.stopping = True
        self._cancel_stage()
        # 2. Drain: the children stop (trainer first); a park frees what it may.
        fields: dict[str, Any] = {"resume_from": {"round": self._round(), "state": src.value}} \
            if isinstance(ending, Stop) else {}
        if isinstance(ending, Park):
            Ballast(self.layout.ballast, cfg.disk.ballast_bytes).release()
        if not isinstance(ending, Exit):  # a stage's configuration error leaves ShopSim for the next start
            await self._stop_children()
        if isinstance(ending, Park):
            freed = reclaim(cfg, self.layout, self._round(), trainer_running=False)
            sample = diskmod.sample(self.layout.ephemeral_root)
            fields = {"free_bytes": sample.avail_bytes, "inodes_free": sample.inodes_free, "reclaimed_bytes": freed,
                      **self.disk.limit_fields(cfg.disk, self.view.checkpoint_bytes())}
        # 3. Record: the end in status, the journal and state.json.
        self._record(ending, src, trigger, fields)
        # 4. Tell: the log, the operator's notification, the line `shoprld run` prints.
        return await self._tell(ending, fields)

    def _record(self, ending: EndAction, src: State, trigger: str | None, fields: dict[str, Any]) -> None:
        snap = self.view.snap
        if isinstance(ending, Stop):
            snap["stop_reason"] = ending.reason
            self._transition(src, State.STOPPED, "stop", message=ending.reason, **fields)
        elif isinstance(ending, Fail):
            snap["last_error"] = ending.message
            snap["stop_reason"] = ending.reason
            self._transition(src, State.FAILED, "fail", message=ending.message, exit_code=ending.code)
        elif isinstance(ending, Park):
            snap["stop_reason"] = "disk"
            snap["last_error"] = ending.reason
            self._transition(src, State.PAUSED_DISK, "park_disk", message=ending.reason, **fields)
        elif isinstance(ending, Finish):
            snap["stop_reason"] = ending.reason
            snap["last_error"] = None  # recovered from; the journal keeps the history
            extra = {"message": ending.message} if ending.message else {}
            self._transition(src, State.DONE, trigger or "finish", **extra)
        else:
            snap["last_error"] = ending.message
            self.view.journal("stage.error", state=src.value, error=ending.message, exit_code=ending.code)
        self.view.write_status(force=True)

    async def _tell(self, ending: EndAction, fields: dict[str, Any]) -> int | None:
        cfg = self._cfg()
        if isinstance(ending, Stop):
            resume = fields["resume_from"]
            self._alert("stopped", f"stopped ({ending.reason}); resumes from {resume['state']}", failure=False)
            log.info("daemon.stopped", reason=ending.reason, resume_from=resume)
            return ending.code
        if isinstance(ending, Fail):
            log.error("campaign.failed", message=ending.message, exit_code=ending.code)
            self._alert("gate_stop" if ending.reason == "gate" else "failed", ending.message,
                        failure=ending.reason != "gate")
            self.final_message = ending.message
            return ending.code
        if isinstance(ending, Finish):
            log.info("campaign.done", reason=ending.reason, rounds=cfg.campaign.rounds)
            self._alert("done", f"done ({ending.reason}): {len(self.view.snap.get('rounds_done', []))} of "
                        f"{cfg.campaign.rounds} rounds", failure=False)
            return EXIT_OK
        if isinstance(ending, Exit):
            log.error("stage.error", state=self.machine.state.value, error=ending.message)
            self._alert("failed", ending.message)
            self.final_message = ending.message
            return ending.code
        log.warning("disk.parked", reason=ending.reason, **fields)
        self._alert("parked", f"parked in PAUSED_DISK: {ending.reason}", failure=False)
        if not self.wait_for_space:
            self.final_message = (f"parked in PAUSED_DISK: {ending.reason}; fix: free space on "
                                  f"{self.layout.ephemeral_root}, then run again (or use --wait-for-space)")
            return EXIT_DISK
        await self.disk.wait_for_space(cfg.disk, self.view.checkpoint_bytes(), self.clock.monotonic)
        self.stopping = False
        self._transition(State.PAUSED_DISK, State.PREFLIGHT_DISK, "resume", message="space is back")
        self._spawn(State.PREFLIGHT_DISK)
        return None
