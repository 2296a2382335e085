"""The engine's reactions to what its sources report, one method per event: an operator's
stop request (and the flags the stages read), a committed checkpoint, a disk level change,
the repo hygiene scan's findings.

Each records what happened in the engine's view (daemon/core/snapshot.py: the journal line,
status) and returns what it means for the machine, an :class:`Occurrence` (or None: nothing),
which the engine hands to ``machine.decide`` and carries out. On disk: a committed checkpoint
lets ``round/resume.py`` decide which of the round's saves it supersedes (``retention.py``
deletes them); a soft or hard disk level reclaims what this campaign may
(``diskwatch.reclaim``). The hygiene findings only show.
"""

from __future__ import annotations

import time

import structlog

from shoprld.daemon.foundation.storage import disk as diskmod
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.storage import retention
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.round import resume
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.round.machine import WORKING_STATES, Occurrence, Machine, State, StopMode
from shoprld.daemon.services.shopsim import ShopsimService
from shoprld.daemon.core.diskwatch import DiskWatch, reclaim
from shoprld.daemon.core.events import CheckpointCommitted, DiskLevelChanged
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.snapshot import Snapshot

log = structlog.get_logger("shoprld.engine")


class Reactions:
    """What an event means for the campaign: an :class:`Occurrence` for ``machine.decide``, or None.
    The config and the round are read from ``view.live`` at each use."""

    def __init__(self, view: Snapshot, *, layout: Layout, machine: Machine, disk: DiskWatch, notifier: Notifier,
                 shopsim: ShopsimService) -> None:
        self.view, self.live, self.layout, self.machine = view, view.live, layout, machine
        self.disk, self.notifier, self.shopsim = disk, notifier, shopsim

    def stop_requested(self, mode: StopMode) -> Occurrence | None:
        """``shoprld stop``: now, or at the next checkpoint, or after the round (``decide`` reads the mode)."""
        self.view.journal("stop.requested", mode=mode)
        if mode == "now":
            return Occurrence("stop")
        self.live.stop_mode = mode  # decide() reads it at the next safe point
        if mode == "checkpoint" and self.machine.state is State.TRAIN:
            self.notifier.extend_timeout(self.live.cfg.train.stall_min)
        return None

    def checkpoint(self, ev: CheckpointCommitted) -> Occurrence:
        cfg = self.live.cfg
        self.view.snap["last_checkpoint"] = {"iteration": ev.iteration, "path": ev.path, "complete": True,
                                             "bytes": ev.bytes or 0, "committed_at": time.time()}
        self.view.journal("checkpoint.committed", iteration=ev.iteration, bytes=ev.bytes, latency_ms=ev.latency_ms)
        self.view.write_status(force=True)
        self.disk.follow_checkpoint(cfg.disk, self.view.checkpoint_bytes())
        if self.machine.state is State.TRAIN:  # issue 17: a save supersedes the round's older ones
            self.shopsim.vouch(self.layout.save_dir)  # a vouched save also supersedes the oldest kept final
            self._supersede(cfg)
        return Occurrence("checkpoint")

    def _supersede(self, cfg: Config) -> None:
        """A save landed in TRAIN: delete what it supersedes (the round's older saves; once
        vouched for, the oldest kept final), so mid-round saves cost one checkpoint's room, the
        one the disk forecast counts.

        Synchronous, as the engine's other deletions: a few large files, and no await between a
        stage's scan and its tracker write can interleave with it. One trade-off: ShopSim's
        witness looks once a second, so a ShopSim death in the second between a save and that
        look rolls back past the pruned save, to the round's previous final: more retraining in
        that rare case, never a wrong checkpoint."""
        facts = RoundPlan(cfg, self.layout, self.live.round).save_dir_facts()
        decided = resume.retention(facts, resume.Moment.TRAINING, keep_finals=cfg.disk.keep_finals)
        if decided.doomed:
            freed = retention.delete_checkpoints(decided.doomed, save_dir=self.layout.save_dir)
            self.view.journal("retention.applied", deleted=[c.iteration for c in decided.doomed], bytes=freed,
                              rule="newest save of the round")

    def disk_level(self, ev: DiskLevelChanged, *, stopping: bool) -> Occurrence | None:
        """The monitor's level change (disk.py's verdict): reclaim what this campaign may, ask
        the same guard whether that lifted the volume out of the level (same rule, same
        hysteresis), and say what the level means now."""
        self.view.journal(ev.event, **ev.journal_fields())  # the monitor already logged it
        if self.machine.state not in WORKING_STATES or stopping:
            return None
        if ev.level is diskmod.Level.OK:
            return Occurrence("disk_ok")
        cfg = self.live.cfg
        reclaim(cfg, self.layout, self.live.round, trainer_running=self.machine.state is State.TRAIN)
        verdict = self.disk.judge()
        if verdict is None:  # no guard before the monitor runs: nothing sent this event
            return None
        if not verdict.holds(ev.level):
            log.info("disk.recovered_by_reclaim", free_bytes=verdict.free_bytes)
            return None
        next_save = int(self.view.checkpoint_bytes() or cfg.disk.checkpoint_estimate)
        reason = verdict.park_reason(self.layout.ephemeral_root, ev.level)
        if ev.level is diskmod.Level.HARD:
            return Occurrence("disk_hard", reason)
        return Occurrence("disk_soft", reason, fits=verdict.fits(next_save))

    def park_waits(self) -> None:
        """After a decision: while a park waits for TRAIN's save, systemd gives the stop time."""
        if self.live.counters.park_pending and self.machine.state is State.TRAIN:
            self.notifier.extend_timeout(self.live.cfg.train.stall_min)

    # -- repo hygiene (issue 9): before the first stage and after each round; never deletes ----------
    def hygiene(self, when: str, found: list[str]) -> None:
        """Journal each new finding once; status shows the current ones."""
        for w in found:
            if w not in self.view.hygiene_warnings:
                log.warning("repo.hygiene", when=when, warning=w)
                self.view.journal("repo.hygiene", when=when, warning=w)
        self.view.hygiene_warnings = found
        self.view.write_status(force=True)
