"""The engine's reactions to what its sources report, one method per event: an operator's
stop request (and the flags the stages read), a committed checkpoint, a disk level change,
the repo hygiene scan's findings.

Each records what happened in the engine's view (daemon/core/snapshot.py: the journal line,
status) and hands what it means to the machine through the engine's ``apply`` (which asks
``machine.decide`` and carries the decision out). On disk: a committed checkpoint lets
``round/resume.py`` decide which of the round's saves it supersedes (``retention.py`` deletes
them); a soft or hard disk level reclaims what this campaign may (``diskwatch.reclaim``). The
hygiene scan only reads; it never deletes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from anyio.abc import ObjectSendStream

from shoprld.daemon.foundation import disk as diskmod
from shoprld.daemon.foundation.config import Config
from shoprld.daemon.foundation.layout import Layout
from shoprld.daemon.foundation import retention
from shoprld.daemon.round import resume
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.round.machine import WORKING_STATES, Counters, Ending, Machine, State
from shoprld.daemon.services import hygiene
from shoprld.daemon.core.diskwatch import DiskWatch, reclaim
from shoprld.daemon.core.events import Event, HygieneFound
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.snapshot import Snapshot

log = structlog.get_logger("shoprld.engine")

Apply = Callable[[State, Ending], Awaitable[int | None]]


class StopRequest:
    """The operator's stop request as the stages read it (the StopFlags protocol)."""

    def __init__(self) -> None:
        self.mode: str | None = None  # "now" | "checkpoint" | "round"
        self.reason: str = "requested"

    @property
    def at_checkpoint(self) -> bool:
        return self.mode == "checkpoint"


class Reactions:
    """What an event means for the campaign. ``apply`` is the engine's (the decision, carried
    out; an exit code when the campaign ends); ``counters`` and ``cfg`` are read at each use."""

    def __init__(self, view: Snapshot, *, cfg: Callable[[], Config], layout: Layout, machine: Machine,
                 counters: Callable[[], Counters], disk: DiskWatch, notifier: Notifier, stop: StopRequest,
                 apply: Apply, send: ObjectSendStream[Event], vouch: Callable[[], None]) -> None:
        self.view, self._cfg, self.layout, self.machine, self._counters = view, cfg, layout, machine, counters
        self.disk, self.notifier, self.stop, self._apply, self.send = disk, notifier, stop, apply, send
        self._vouch = vouch  # ShopSim's witness, brought up to date before a prune reads it

    async def stop_requested(self, mode: str) -> int | None:
        """``shoprld stop``: now, or at the next checkpoint, or after the round (``decide`` reads the mode)."""
        self.view.journal("stop.requested", mode=mode)
        if mode == "now":
            return await self._apply(self.machine.state, Ending("stop"))
        self.stop.mode = mode
        if mode == "checkpoint" and self.machine.state is State.TRAIN:
            self.notifier.extend_timeout(self._cfg().train.stall_min)
        return None

    async def checkpoint(self, ev: dict[str, Any]) -> int | None:
        if ev.get("event") != "checkpoint.committed":
            return None
        cfg = self._cfg()
        self.view.snap["last_checkpoint"] = {"iteration": ev["iteration"], "path": ev["path"], "complete": True,
                                             "bytes": ev.get("bytes", 0), "committed_at": time.time()}
        self.view.journal("checkpoint.committed", iteration=ev["iteration"], bytes=ev.get("bytes"),
                          latency_ms=ev.get("latency_ms"))
        self.view.write_status(force=True)
        self.disk.follow_checkpoint(cfg.disk, self.view.checkpoint_bytes())
        if self.machine.state is State.TRAIN:  # issue 17: a save supersedes the round's older ones
            self._vouch()  # issue 25: a vouched save also supersedes the oldest kept final
            self._supersede(cfg)
        return await self._apply(self.machine.state, Ending("checkpoint"))

    def _supersede(self, cfg: Config) -> None:
        """A save landed in TRAIN: delete what it supersedes (the round's older saves; once
        vouched for, the oldest kept final), so mid-round saves cost one checkpoint's room, the
        one the disk forecast counts.

        Synchronous, as the engine's other deletions: a few large files, and no await between a
        stage's scan and its tracker write can interleave with it. One trade-off: ShopSim's
        witness looks once a second, so a ShopSim death in the second between a save and that
        look rolls back past the pruned save, to the round's previous final: more retraining in
        that rare case, never a wrong checkpoint."""
        facts = RoundPlan(cfg, self.layout, self._counters().round).save_dir_facts()
        decided = resume.retention(facts, resume.Moment.TRAINING, keep_finals=cfg.disk.keep_finals)
        if decided.doomed:
            freed = retention.delete_checkpoints(decided.doomed, save_dir=self.layout.save_dir)
            self.view.journal("retention.applied", deleted=[c.iteration for c in decided.doomed], bytes=freed,
                              rule="newest save of the round")

    async def disk_level(self, ev: dict[str, Any], *, stopping: bool) -> int | None:
        """The monitor's level change (disk.py's verdict): reclaim what this campaign may, ask
        the same guard whether that lifted the volume out of the level (same rule, same
        hysteresis), and let the machine decide what the level means now."""
        name = ev["event"]  # the monitor already logged it
        self.view.journal(name, **{k: v for k, v in ev.items() if k != "event"})
        if self.machine.state not in WORKING_STATES or stopping:
            return None
        if name == "disk.ok":
            return await self._apply(self.machine.state, Ending("disk_ok"))
        cfg = self._cfg()
        level = diskmod.Level.HARD if name == "disk.hard_limit" else diskmod.Level.SOFT
        reclaim(cfg, self.layout, self._counters().round, trainer_running=self.machine.state is State.TRAIN)
        verdict = self.disk.judge()
        if verdict is None:  # no guard before the monitor runs: nothing sent this event
            return None
        if not verdict.holds(level):
            log.info("disk.recovered_by_reclaim", free_bytes=verdict.free_bytes)
            return None
        next_save = int(self.view.checkpoint_bytes() or cfg.disk.checkpoint_estimate)
        reason = verdict.park_reason(self.layout.ephemeral_root, level)
        ending = Ending("disk_hard", reason) if level is diskmod.Level.HARD else \
            Ending("disk_soft", reason, fits=verdict.fits(next_save))
        code = await self._apply(self.machine.state, ending)
        if self._counters().park_pending and self.machine.state is State.TRAIN:
            self.notifier.extend_timeout(self._cfg().train.stall_min)
        return code

    # -- repo hygiene (issue 9): before the first stage and after each round; never deletes ----------
    async def hygiene_scan(self, when: str) -> None:
        roots = {self.layout.repo, self.layout.project_root}  # project_root: the tools' default output
        await self.send.send(HygieneFound(when, await hygiene.scan_roots(roots, self._cfg().storage.repo_hygiene_max)))

    def hygiene(self, when: str, found: list[str]) -> None:
        """Journal each new finding once; status shows the current ones."""
        for w in found:
            if w not in self.view.hygiene_warnings:
                log.warning("repo.hygiene", when=when, warning=w)
                self.view.journal("repo.hygiene", when=when, warning=w)
        self.view.hygiene_warnings = found
        self.view.write_status(force=True)
