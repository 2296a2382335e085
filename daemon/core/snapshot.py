"""The engine's view of the campaign, and the one way it is written down.

Two dicts make the view: ``state_data`` (what state.json keeps besides the machine's state
and round: first start, starts, the deadline, the restart and stall counters) and ``snap``
(what status.json shows: step, ETA, the last checkpoint, the disk sample, rounds done, the
last error and failure). The engine and its collaborators update them; this module turns
them into the journal's lines (``journal``), state.json (``persist``, through the store,
journal first), status.json plus the metrics textfile (``write_status``), and the
operator's notifications about now (``alert``: the view's round, state and last failure
ride along). It writes nothing itself: every file goes through the store
(daemon/foundation/records/store.py), the metrics writer (daemon/core/metrics.py) or alerts.py.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configvalues import resolve_deadline
from shoprld.daemon.foundation.storage.preflight import forecast_for
from shoprld.daemon.foundation.records.roundlog import ROW_KEY, STATUS_RECENT_ROUNDS
from shoprld.daemon.foundation.config.secrets import Redactor
from shoprld.daemon.foundation.records.status import unsaved_progress
from shoprld.daemon.foundation.records.store import Store
from shoprld.daemon.core.alerts import Alerts
from shoprld.daemon.core.crashpoints import maybe_die
from shoprld.daemon.core.metrics import TextfileMetrics
from shoprld.daemon.core.notify import Notifier
from shoprld.daemon.core.outlook import Outlook, make_outlook
from shoprld.daemon.round.machine import ROUND_STATES, WORKING_STATES, Counters, Machine, State, StopMode
from shoprld.daemon.services.processes import Child, Clock
from shoprld.daemon.services.shopsim import ShopsimService

log = structlog.get_logger("shoprld.engine")


@dataclass
class Live:
    """What changes while the daemon runs: the config (a SIGHUP replaces it), the machine's
    counters (every decision replaces them; the round and the one restart count are in them)
    and the operator's pending stop (``shoprld stop --at-checkpoint``/``--after-round``).
    Only the engine and its reactions assign them; the collaborators read them at each use."""

    cfg: Config
    counters: Counters
    stop_mode: StopMode | None = None

    @property
    def round(self) -> int:
        return self.counters.round


class Snapshot:
    """``state_data`` and ``snap`` (filled once by :meth:`load`, never replaced), the running
    children by role (state.json records them), the journal's sequence number, and their
    writers. The config and the round are read from ``live`` at each use."""

    def __init__(self, store: Store, redactor: Redactor, live: Live, *, machine: Machine, notifier: Notifier,
                 shopsim: ShopsimService, clock: Clock, metrics: TextfileMetrics | None) -> None:
        self.store, self.redactor, self.live, self.machine, self.notifier = store, redactor, live, machine, notifier
        self.shopsim, self.clock, self.metrics = shopsim, clock, metrics
        self.alerts: Alerts | None = None  # the engine's, which journal through this view
        self.children: dict[str, Child] = {}  # daemon/core/children.py keeps it
        self.state_data: dict[str, Any] = {}
        self.snap: dict[str, Any] = {}
        self.seq = 0
        self.hygiene_warnings: list[str] = []  # the repo hygiene guard's current findings
        self.round_started_at: float | None = None  # the current round's (round/round-NNN.json)
        self._last_status_write = 0.0
        # A transition whose state.json and status.json wait for the next stage's spawn (see
        # :meth:`transition`'s ``files_later``); any persist writes them, :meth:`flush_files` too.
        self.files_due = False
        self._plan_warned: set[tuple[int, str]] = set()  # (round, reason) already journaled

    def load(self, save_dir: Path) -> dict[str, Any]:
        """Fill the view from the store (rebuilt from the journal when state.json is corrupt)
        and the save dir; return what was persisted (empty on a first start). The persisted
        round and restart count go into ``live``'s counters."""
        cfg = self.live.cfg
        loaded = self.store.load()
        data = loaded.state if loaded else {}
        if loaded and loaded.warning:
            log.warning("state.rebuilt", warning=loaded.warning, source=loaded.source)
            self.store.append({"event": "state.rebuilt", "warning": loaded.warning})
        for rec in loaded.unrecorded if loaded else []:  # an older state dir's rounds: recorded once
            self.store.append_round(rec)
        # Without their ledger rows (the ledger's rebuild reads them from rounds.jsonl itself).
        rounds = [{k: v for k, v in r.items() if k != ROW_KEY} for r in loaded.rounds] if loaded else []
        self.state_data.update({
            "campaign": cfg.campaign.name, "first_start": data.get("first_start") or self.clock.time(),
            "round_durations": {str(r["round"]): d for r in rounds if (d := num(r.get("duration_seconds"))) is not None},
            "starts": int(data.get("starts", 0)) + 1, "seq": int(data.get("seq", 0)),
            "previous": {"state": data.get("state"), "round": data.get("round")},
            "deadline": data.get("deadline"),
            # The restart count is the machine's (Counters.restarts): state_doc() adds it.
            "counters": {"stalls": int((data.get("counters") or {}).get("stalls", 0)),
                         "failures": _failure_counts((data.get("counters") or {}).get("failures"))},
        })
        restarts = int((data.get("counters") or {}).get("restarts", 0))
        if data.get("state") in {s.value for s in WORKING_STATES}:  # the last daemon died mid-work
            restarts += 1
        self.live.counters = replace(self.live.counters, round=int(data.get("round") or 0), restarts=restarts)
        if self.state_data["deadline"] is None:
            self.state_data["deadline"] = resolve_deadline(cfg.campaign.deadline, self.state_data["first_start"])
        self.seq = self.state_data["seq"]
        self.snap.update({
            "campaign": cfg.campaign.name, "experiment": cfg.campaign.experiment,
            "rounds": cfg.campaign.rounds, "steps_per_round": cfg.campaign.steps_per_round,
            "step": 0, "step_seconds": None, "eta_seconds": None, "last_checkpoint": None, "disk": None,
            "rounds_done": rounds, "last_error": None, "stop_reason": None,
            "last_failure": data.get("last_failure"),
            "warnings": [], "daemon": {"pid": os.getpid(), "started_at": time.time()},
        })
        last = ckpt.scan(save_dir).latest_complete
        if last is not None:
            self.snap["last_checkpoint"] = {"iteration": last.iteration, "path": str(last.path), "complete": True,
                                            "bytes": last.bytes, "committed_at": last.committed_at}
        return data

    def checkpoint_bytes(self) -> int | None:
        """The last committed checkpoint's measured size (None before the first)."""
        return (self.snap.get("last_checkpoint") or {}).get("bytes") or None

    def disk_sampled(self, line: dict[str, Any]) -> None:
        self.snap["disk"] = line

    def alert(self, event: str, text: str, *, failure: bool = True) -> None:
        """Queue an operator notification about now; the last failure's cause rides along."""
        if self.alerts is None:
            return
        lf = self.snap.get("last_failure") or {}
        r = self.live.round
        mine = failure and lf.get("round") == r
        self.alerts.post(event, text, round=r, state=self.machine.state.value if not mine else lf.get("state"),
                         cause=lf.get("cause") if mine else None, bundle=lf.get("bundle") if mine else None,
                         detail=str(lf.get("detail") or "") if mine else "",
                         advice=str(lf.get("advice") or "") if mine else "")

    def journal(self, event: str, *, sync: bool = True, **fields: Any) -> None:
        self.seq += 1
        # The state the event really happens in (the supervisor's ShopSim restart in TRAIN is
        # a TRAIN event); a stage's own events name their state explicitly.
        rec = {"event": event, "seq": self.seq, "round": self.live.round, "state": self.machine.state.value, **fields}
        disk = self.snap.get("disk")
        if event in ("transition", "checkpoint.committed") and isinstance(disk, dict) and "free_bytes" not in rec:
            rec["free_bytes"] = disk.get("free_bytes")  # the last sample: `shoprld report`'s free-disk series
        if event == "transition":
            rec["snapshot"] = self.state_doc()
        self.store.append(rec, sync=sync)

    def state_doc(self) -> dict[str, Any]:
        """The snapshot (state.json, the journal's transitions): its size does not grow with the
        rounds. The per-round facts are in rounds.jsonl, written once; the cursor counts them."""
        return {
            **{k: v for k, v in self.state_data.items() if k != "round_durations"},  # per round: rounds.jsonl
            "counters": self.counters_doc(),
            "state": self.machine.state.value, "round": self.live.round, "seq": self.seq,
            "children": {r: c.record.to_json() for r, c in self.children.items()},
            "rounds_recorded": len(self.snap.get("rounds_done", [])), "stop_reason": self.snap.get("stop_reason"),
            "last_error": self.snap.get("last_error"), "last_failure": self.snap.get("last_failure"),
        }

    def counters_doc(self) -> dict[str, Any]:
        """The campaign's counters as state.json and the metrics keep them: restarts, stalls,
        failed attempts by cause."""
        return {"restarts": self.live.counters.restarts, **self.state_data["counters"]}

    def transition(self, src: State | None, dst: State, trigger: str, *, files_later: bool = False,
                   **fields: Any) -> None:
        """Move the machine (``trigger`` must be the table's; ``src`` None: a (re)start sets
        ``dst``) and record it: the journal line, durable and holding the snapshot, then
        state.json and status.json, then systemd's STATUS= (and READY= once the campaign is up).

        ``files_later``: leave state.json and status.json to whoever writes them next (the next
        stage's child registration persists durably a few ms later, or :meth:`flush_files`), so
        the hand-off to that spawn does not wait for them. Nothing is lost: the journal line,
        fsynced here before anything acts on the new state, already holds this snapshot, and
        ``Store.load`` prefers a journal snapshot newer than state.json (crash-safe as the
        unsynced replace it saves). status.json is advisory and lags by that much."""
        if src is not None and trigger != "start":
            self.machine.fire(trigger)
        else:
            self.machine.set_state(dst)
        assert self.machine.state is dst, (self.machine.state, dst)
        r = self.live.round
        self.snap["state"] = dst.value
        self.snap["round"] = r
        self.journal("transition", src=src.value if src else None, dst=dst.value, trigger=trigger, **fields)
        log.info("transition", src=src.value if src else None, dst=dst.value, trigger=trigger, round=r)
        structlog.contextvars.bind_contextvars(campaign=self.live.cfg.campaign.name, round=r, state=dst.value)
        if files_later:
            self.files_due = True
        else:
            self.persist(durable=False)  # the transition line above, fsynced, holds this snapshot
        maybe_die(dst, "enter", r)
        self.notifier.status_of(self.snap)
        if src is State.START_SHOPSIM and dst in (State.TRAIN, State.DONE):
            self.notifier.ready()

    def redacted_status(self) -> dict[str, Any]:
        """The status document as the control socket answers it."""
        return self.redactor.obj(self.status_doc())

    def persist(self, *, durable: bool = True) -> None:
        """state.json (durably unless the journal just took the same snapshot) and status.json."""
        self.files_due = False  # this write supersedes a transition's deferred one
        self.store.save(self.state_doc(), durable=durable)
        self.write_status(force=True)

    def flush_files(self) -> None:
        """Write the state.json and status.json a ``files_later`` transition left, if no persist
        has written them since (not durably: the transition's journal line holds the snapshot)."""
        if self.files_due:
            self.persist(durable=False)

    def status_doc(self) -> dict[str, Any]:
        cfg = self.live.cfg
        shop = {"url": cfg.shopsim.url, "healthy": self.shopsim.healthy, "free_slots": self.shopsim.free_slots,
                "environment_slots": self.shopsim.environment_slots,
                "slots": cfg.shopsim.slots, "checked_at": self.shopsim.checked_at}
        children = [{"role": c.record.role, "pid": c.pid, "started_at": c.record.started_at, "log": c.record.log}
                    for c in self.children.values()]
        deadline = self.state_data.get("deadline")
        warnings = [*self.snap.get("warnings", []), *self.hygiene_warnings]
        served = self.shopsim.environment_slots
        if served is not None and served != cfg.shopsim.slots:
            warnings.append(f"shopsim at {cfg.shopsim.url} has {served} slots but shopsim.slots = "
                            f"{cfg.shopsim.slots}; fix: make them agree (SHOPSIM_ENV_SLOTS and shopsim.slots)")
        plan = self.outlook()
        warnings += [line for _, line in plan.problems()]
        last = self.snap.get("last_checkpoint") if isinstance(self.snap.get("last_checkpoint"), dict) else {}
        unsaved = unsaved_progress(state=self.machine.state.value, round_index=self.live.round,
                                   step=int(self.snap.get("step") or 0), steps_per_round=cfg.campaign.steps_per_round,
                                   end_offset=cfg.train.end_offset, last_iteration=last.get("iteration"),
                                   step_seconds=self.snap.get("step_seconds"), save_interval=self._save_interval(cfg))
        return {**self.snap, "warnings": warnings, "plan": plan.as_dict(), "shopsim": shop, "children": children,
                "deadline": deadline, "unsaved": unsaved,
                "stop_conditions": {"rounds_done": len(self.snap.get("rounds_done", [])),
                                    "rounds": cfg.campaign.rounds, "deadline": deadline},
                "updated_at": time.time()}

    def write_metrics(self) -> None:
        """The metrics textfile alone (its liveness stamp between status updates)."""
        if self.metrics is None:
            return
        try:
            doc = self.status_doc()
        except Exception as exc:  # a heartbeat must never stop the campaign; write_status shows it
            log.warning("metrics.heartbeat_skipped", error=f"{type(exc).__name__}: {exc}")
            return
        self.metrics.write(self.redactor.obj(doc), self.counters_doc())

    def write_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status_write < 0.5:
            return
        self._last_status_write = now
        doc = self.status_doc()
        self._warn_plan()
        try:
            # The newest rounds only: status.json keeps its size; `shoprld status` reads every
            # round from rounds.jsonl (daemon/foundation/records/roundlog.py).
            self.store.write_status({**doc, "rounds_done": doc["rounds_done"][-STATUS_RECENT_ROUNDS:]})
        except OSError as exc:
            log.warning("status.write_failed", error=str(exc))
        if self.metrics is not None:
            self.metrics.write(self.redactor.obj(doc), self.counters_doc())

    def _save_interval(self, cfg: Config) -> int:
        """The trainer's ``--save-interval`` now: the last launch's (adaptive saves) else the config's."""
        saves = self.snap.get("saves")
        interval = saves.get("interval") if isinstance(saves, dict) else None
        return interval if isinstance(interval, int) and interval > 0 else cfg.train.save_interval

    def outlook(self) -> Outlook:
        """The rest of the campaign (daemon/core/outlook.py), from what the engine already knows."""
        cfg = self.live.cfg
        disk = self.snap.get("disk") if isinstance(self.snap.get("disk"), dict) else {}
        last = self.snap.get("last_checkpoint") or {}
        in_round = self.machine.state in ROUND_STATES
        return make_outlook(
            rounds=cfg.campaign.rounds, current=self.live.round,
            durations=list(self.state_data.get("round_durations", {}).values()) if in_round else [],
            round_started_at=self.round_started_at, now=self.clock.time(),
            train_eta=self.snap.get("eta_seconds"), in_train=self.machine.state is State.TRAIN,
            deadline=self.state_data.get("deadline"), free_bytes=disk.get("free_bytes"),
            hard_limit_bytes=disk.get("hard_limit_bytes"), need_bytes=self._next_round_need(cfg, disk, last))

    @staticmethod
    def _next_round_need(cfg: Config, disk: dict[str, Any], last: dict[str, Any]) -> int:
        """Bytes above the hard limit the next round needs: its save (with everything else of the
        peak on the volume by then, once a checkpoint exists), the margin, and the room up to
        the soft limit, which a save must not end below (the budget of preflight.budget_for)."""
        fc = forecast_for(cfg, last.get("bytes") or None)
        if last.get("bytes"):
            fc = forecast_for(cfg, last["bytes"], present_bytes=fc.peak_bytes - fc.checkpoint_bytes)
        soft, hard = disk.get("soft_limit_bytes"), disk.get("hard_limit_bytes")
        gap = soft - hard if isinstance(soft, int) and isinstance(hard, int) and soft > hard else 0
        return fc.total + gap

    def _warn_plan(self) -> None:
        """Journal each "the next round will not fit" once per round and reason, as soon as it is known."""
        for reason, line in self.outlook().problems():
            if (self.live.round, reason) in self._plan_warned:
                continue
            self._plan_warned.add((self.live.round, reason))
            log.warning("plan.next_round_wont_fit", reason=reason, message=line)
            self.journal("plan.next_round_wont_fit", sync=False, reason=reason, message=line)


def num(v: Any) -> float | None:
    """``v`` as a float when it is a number (not a bool), else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _failure_counts(raw: Any) -> dict[str, int]:
    """state.json's failed attempts by cause; anything else in it is dropped."""
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
