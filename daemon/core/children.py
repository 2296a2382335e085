"""The daemon's children: those it runs (recorded in state.json) and those a crashed daemon
left behind (adoptable), found, adopted and stopped in one order.

Every child runs in its own session and carries this campaign's ``SHOPRLD_CHILD`` tag (the
engine launches through :class:`TaggingLauncher`, which adds it), so a restarted daemon
finds a child even when the crash lost its record. A round state adopts the roles it names
(``ADOPTS``); the others are stopped before it runs. At the end the trainer stops first: it
holds the GPUs and writes the volume.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.system.proctable import environ, pids
from shoprld.daemon.round.plan import RoundValues
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.services.processes import CHILD_TAG, Child, ChildRecord, Launcher, pid_alive, proc_start_ticks
from shoprld.daemon.services.shopsim import ShopsimService
from shoprld.daemon.core.crashpoints import maybe_die
from shoprld.daemon.core.snapshot import Snapshot

log = structlog.get_logger("shoprld.engine")

# A child adopted from a crashed daemon has no configured grace of its own.
ADOPTED_GRACE_S = 10.0


def grace_of(cfg: Config, role: str) -> float:
    """How long ``role`` gets between SIGTERM and SIGKILL."""
    return {ChildRole.TRAINER: cfg.train.grace, ChildRole.SHOPSIM: cfg.shopsim.grace,
            ChildRole.VAL_SERVER: cfg.val.server_grace, ChildRole.SIDECAR: cfg.sidecar.grace}.get(role, ADOPTED_GRACE_S)


class Children:
    """The running children by role (the view's, which state.json records), the adoptable
    records, and how each is let go.

    A registered child is persisted at once (state.json names it before anything else
    happens); a forgotten one only leaves status (a stale record is harmless, since adoption
    checks pid + start time). ShopSim (``shopsim``) vouches for the saves in ``save_dir``
    before it stops.
    """

    def __init__(self, launcher: Launcher, view: Snapshot, *, shopsim: ShopsimService, save_dir: Path) -> None:
        self.launcher, self.view, self.shopsim, self.save_dir = launcher, view, shopsim, save_dir
        self.running: dict[str, Child] = view.children
        self.adoptable: dict[str, ChildRecord] = {}

    def find_left(self, recorded: Mapping[str, Any], state_dir: Path) -> None:
        """At start-up: the recorded children still alive (or Ray jobs, which their launcher
        re-attaches), plus session leaders carrying this campaign's tag whose record a crash lost."""
        for role, raw in recorded.items():
            try:
                rec = ChildRecord.from_json(raw)
            except (TypeError, KeyError):
                continue
            if rec.job_id or pid_alive(rec.pid, rec.start_ticks):
                self.adoptable[role] = rec
        for role, rec in tagged_session_leaders(f"{state_dir}|").items():
            self.adoptable.setdefault(role, rec)
        if self.adoptable:
            log.info("children.found", roles={r: c.pid for r, c in self.adoptable.items()})

    def register(self, child: Child) -> None:
        self.running[child.record.role] = child
        self.view.persist()
        state, r = self.view.machine.state, self.view.live.round
        maybe_die(state, "mid", r)
        maybe_die(state, f"spawn-{child.record.role}", r)

    def unregister(self, child: Child) -> None:
        if self.running.get(child.record.role) is child:
            del self.running[child.record.role]
            self.view.write_status(force=True)

    def find(self, role: str) -> Child | None:
        """The live child in ``role``: a running one, or one a crashed daemon left (adopted now)."""
        child = self.running.get(role)
        if child is not None and child.alive():
            return child
        rec = self.adoptable.pop(role, None)
        if rec is not None:
            adopted = self.launcher.adopt(rec)
            if adopted is not None:
                log.info("child.adopted", role=role, pid=rec.pid)
                self.view.journal("child.adopted", role=role, pid=rec.pid)
                self.register(adopted)
                return adopted
        return None

    async def stop_strays(self, adopts: tuple[str, ...]) -> None:
        """Stop the children a crashed daemon left that the starting round state will not adopt
        (ShopSim is always adopted)."""
        for role in list(self.adoptable):
            if role == ChildRole.SHOPSIM or role in adopts:
                continue
            rec = self.adoptable.pop(role)
            child = self.launcher.adopt(rec)
            if child is not None:
                log.info("child.stray_stopped", role=role, pid=rec.pid)
                await child.stop(ADOPTED_GRACE_S)

    async def stop_all(self, *, force: bool = False) -> None:
        """Stop every child (trainer first), each with its configured grace. ShopSim vouches
        for the checkpoints first (all the trainer saved ran against it) and is left running
        when it was not ours."""
        cfg, shopsim = self.view.live.cfg, self.shopsim
        shopsim.closing = True
        order = sorted(self.running.values(), key=lambda c: (c.record.role != ChildRole.TRAINER, c.record.role))
        failed: Exception | None = None
        for child in order:
            if child.record.role == ChildRole.SHOPSIM:
                try:
                    shopsim.vouch(self.save_dir)
                except OSError as exc:  # a full state dir: unvouched saves are retrained, which is safe
                    log.warning("shopsim.vouch_failed", error=str(exc))
                if shopsim.external:
                    continue
            try:  # one child's failure to stop must not leave the next one running
                if force:
                    child.signal_group(signal.SIGKILL)
                await child.stop(0.0 if force else grace_of(cfg, child.record.role))
            except Exception as exc:
                failed = failed or exc
        self.running.clear()
        for rec in list(self.adoptable.values()):
            adopted = self.launcher.adopt(rec)
            if adopted is not None:
                await adopted.stop(0.0 if force else ADOPTED_GRACE_S)
        self.adoptable.clear()
        if failed is not None:
            raise failed

    def kill_all(self) -> None:
        """A second SIGINT while stopping: SIGKILL every running child's group at once."""
        for child in list(self.running.values()):
            child.signal_group(signal.SIGKILL)


class TaggingLauncher:
    """Wraps a launcher so every child carries this campaign's tag in its environment."""

    def __init__(self, inner: Launcher, tag: str) -> None:
        self._inner, self._tag = inner, tag

    async def start(self, role: ChildRole, argv: Any, *, env: Any, cwd: Path | None, log: Path, redacted_argv: Any,
                    round: RoundValues | None = None) -> Child:
        tag = f"{self._tag}|{role}"
        child = await self._inner.start(role, argv, env={**env, CHILD_TAG: tag}, cwd=cwd, log=log,
                                        redacted_argv=redacted_argv, round=round)
        child.record.tag = tag
        return child

    def adopt(self, record: ChildRecord) -> Child | None:
        return self._inner.adopt(record)

    async def live(self, role: ChildRole, *, log: Path, round: RoundValues) -> Child | None:
        return await self._inner.live(role, log=log, round=round)

    async def idle(self) -> None:
        await self._inner.idle()


def tagged_session_leaders(tag_prefix: str) -> dict[str, ChildRecord]:
    """Session leaders whose ``SHOPRLD_CHILD`` starts with ``tag_prefix``, by role (the rest of the tag)."""
    want = f"{CHILD_TAG}={tag_prefix}".encode()
    found: dict[str, ChildRecord] = {}
    for pid in pids():
        try:
            if os.getsid(pid) != pid:
                continue
        except OSError:
            continue
        for item in environ(pid):
            if item.startswith(want):
                role = item[len(want):].decode(errors="replace")
                found[role] = ChildRecord(role, pid, pid, proc_start_ticks(pid), time.time(), "", [],
                                          tag=item[len(CHILD_TAG) + 1:].decode(errors="replace"))
    return found
