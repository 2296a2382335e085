"""The campaign's volume as the engine sees it. disk.py judges (one rule, one hysteresis);
this module wires that judge to a campaign: the guard the monitor feeds, limits that follow
the measured checkpoint size, what status shows of the last sample, the verdict after a
reclaim, an ENOSPC a stage met, and the wait for space while parked; and the reclaim itself:
what this campaign may delete under pressure (round/resume.py decides, retention.py deletes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from anyio.abc import ObjectSendStream

from shoprld.daemon.foundation.storage import disk, diskbudget, retention
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configsections import DiskSection
from shoprld.daemon.foundation.storage.reclaim import clear_dir_contents
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.round import resume
from shoprld.daemon.round.plan import RoundPlan
from shoprld.daemon.core.events import DiskLevelChanged, Event

log = structlog.get_logger("shoprld.engine")


class DiskWatch:
    """One volume (the ephemeral root) and the guard that follows it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.guard: disk.Guard | None = None  # the monitor's, once it runs (after PREFLIGHT_DISK)

    def limits(self, cfg: DiskSection, checkpoint_bytes: int | None) -> diskbudget.Limits:
        """The limits for the measured checkpoint size (the configured estimate before one)."""
        size = int(checkpoint_bytes or cfg.checkpoint_estimate)
        return diskbudget.limits(disk.sample(self.root).total_bytes, size, soft_override=cfg.soft_limit,
                                 hard_override=cfg.hard_limit)

    def limit_fields(self, cfg: DiskSection, checkpoint_bytes: int | None) -> dict[str, int]:
        lim = self.limits(cfg, checkpoint_bytes)
        return {"soft_limit_bytes": lim.soft_bytes, "hard_limit_bytes": lim.hard_bytes}

    def follow_checkpoint(self, cfg: DiskSection, checkpoint_bytes: int | None) -> None:
        """A checkpoint was committed: the limits follow its measured size."""
        if self.guard is not None:
            self.guard.limits = self.limits(cfg, checkpoint_bytes)

    def enospc(self, reason: str, cfg: DiskSection, checkpoint_bytes: int | None) -> dict[str, Any] | None:
        """A stage met a full volume before the monitor's next sample. That is a hard-limit
        crossing in its own right: the guard agrees. Returns the ``disk.hard_limit`` journal
        fields when it is news (the guard was not HARD yet), else None."""
        if self.guard is None or self.guard.force_hard(reason) is None:
            return None
        return {"reason": reason, "free_bytes": disk.sample(self.root).avail_bytes,
                **self.limit_fields(cfg, checkpoint_bytes)}

    def judge(self) -> disk.Verdict | None:
        """A fresh sample judged by the guard's rule from its level (None before the monitor runs)."""
        return self.guard.verdict(disk.sample(self.root)) if self.guard is not None else None

    async def wait_for_space(self, cfg: DiskSection, checkpoint_bytes: int | None,
                             monotonic: Callable[[], float]) -> None:
        """Parked with ``--wait-for-space``: until the guard's rule says OK for ``disk.settle`` s."""
        guard = self.guard or disk.Guard(self.limits(cfg, checkpoint_bytes), hysteresis_bytes=cfg.hysteresis_bytes)
        await disk.wait_for_space(self.root, guard, settle=cfg.settle, interval=cfg.interval, monotonic=monotonic)

    async def monitor(self, cfg: DiskSection, checkpoint_bytes: int | None,
                      on_sample: Callable[[dict[str, Any]], None], send: ObjectSendStream[Event]) -> None:
        """Run the monitor: each sample's status line to ``on_sample``; each level change, as the
        guard judged it, to the engine's queue (:class:`DiskLevelChanged`)."""
        guard = self.guard = disk.Guard(self.limits(cfg, checkpoint_bytes), hysteresis_bytes=cfg.hysteresis_bytes)

        async def emit(ev: dict[str, Any]) -> None:
            if ev["event"] != "disk.sample":
                await send.send(DiskLevelChanged.of(guard.level, ev))
                return
            lim = guard.limits
            on_sample({"path": str(self.root), "total_bytes": ev.get("total_bytes"),
                       "free_bytes": ev.get("free_bytes"), "inodes_free": ev.get("inodes_free"),
                       "soft_limit_bytes": lim.soft_bytes, "hard_limit_bytes": lim.hard_bytes,
                       "level": guard.level.name.lower(), "sampled_at": time.time()})

        await disk.monitor(self.root, guard, emit, interval=cfg.interval)


def reclaim(cfg: Config, layout: Layout, round: int, *, trainer_running: bool) -> int:
    """Delete what this campaign may (round/resume.py's keep-set under pressure: what a resume
    and this round's export need), partials only when no trainer runs, and the campaign's own
    tmp. Never the shared cache or other campaigns."""
    facts = RoundPlan(cfg, layout, round).save_dir_facts()
    decided = resume.retention(facts, resume.Moment.PRESSURE, trainer_running=trainer_running)
    freed = retention.delete_checkpoints(decided.doomed, save_dir=layout.save_dir) if decided.doomed else 0
    if layout.tmp.exists():
        freed += clear_dir_contents(layout.tmp, within=layout.exp_dir)
    if freed:
        log.info("disk.reclaimed", bytes=freed, deleted=[c.iteration for c in decided.doomed])
    return freed
