"""Every checkpoint decision, in one pure place: what is kept, and where a round resumes.

Theory of operation
===================
One scan of the save dir (:func:`checkpoints.scan`, the one scanner) and the records that bear
on it are gathered into a :class:`SaveDir` (``RoundPlan.save_dir_facts`` reads them); the
functions here turn that into decisions, and the callers only carry them out
(``retention.delete_checkpoints`` deletes, ``retention.point_tracker`` writes the tracker):

- :func:`retention`: the keep-set at each :class:`Moment` (a save landed while the round trains,
  the round ended, the disk is under pressure, the trainer stopped) and what may go;
- :func:`resume`: the tracker repair, what ``--load`` restores (the resume point) and the first
  rollout the launch must show (slime's ``start_rollout_id = loaded + 1``);
- :func:`outage_rollback`: after a ShopSim outage, what is deleted and where the tracker points,
  from the witness and the export records.

*Committed* means finalized: the files are complete, and either the tracker names the save or a
later one (Megatron writes it last), or the save's completion marker says it finished
(:attr:`SaveDir.finalized`; with ``--async-save`` iteration k's tracker lands only when save
k+1 starts, so the newest complete save may be finalized by its marker alone). A complete save
that is neither (``ahead`` of the tracker) is never the resume point, and never deleted: it may
become one. The resume point is always the newest committed save, and every keep-set holds it.

Nothing here reads a file or a clock: the scan, the witness, the export records and the
rollouts the TRAIN log showed are arguments (``tests/unit/test_resume.py`` is a table of them).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shoprld.daemon.foundation.storage.checkpoints import Checkpoint, IterationMapping, Scan

__all__ = [
    "Moment",
    "Resume",
    "Retention",
    "Rollback",
    "SaveDir",
    "TrackerRepair",
    "Witness",
    "exported_ends",
    "outage_rollback",
    "resume",
    "restore_tracker",
    "retention",
    "trained",
]


@dataclass(frozen=True)
class Witness:
    """What ``<state_dir>/shopsim.witness`` says (services/shopsim.py writes it): the newest
    checkpoint our live ShopSim was seen serving, and whether it died since (``outage``)."""

    iteration: int | None
    outage: bool = False
    readable: bool = True  # False: present but unusable; trusted for nothing

    @classmethod
    def from_doc(cls, doc: object) -> Witness:
        """The witness a parsed JSON document holds; an unusable one vouches for nothing."""
        if not isinstance(doc, Mapping) or "iteration" not in doc:
            return cls(None, readable=False)
        seen = doc.get("iteration")
        iteration = seen if isinstance(seen, int) and not isinstance(seen, bool) and seen >= 0 else None
        return cls(iteration, outage=bool(doc.get("outage")))

    def vouches(self, iteration: int) -> bool:
        """No outage can roll back past ``iteration``: the live ShopSim was seen after it."""
        return self.readable and not self.outage and self.iteration is not None and self.iteration >= iteration


@dataclass(frozen=True)
class SaveDir:
    """One scan of the save dir and the records every checkpoint decision reads."""

    scan: Scan
    mapping: IterationMapping
    round: int                              # the round in progress (or just finished, at ROUND_END)
    witness: Witness | None = None          # None: no witness file (ShopSim is not ours: no rollback)
    exported: frozenset[int] = frozenset()  # rounds' end iterations an EXPORT_HF record says were read
    finalized: frozenset[int] = frozenset()  # iterations whose save's completion marker exists

    def _finalized(self, c: Checkpoint) -> bool:
        top = self.scan.tracker.iteration
        return c.complete and ((top is not None and c.iteration <= top) or c.iteration in self.finalized)

    @property
    def committed(self) -> tuple[Checkpoint, ...]:
        """Complete and finalized (tracker or completion marker), oldest first."""
        return tuple(c for c in self.scan.checkpoints if self._finalized(c))

    @property
    def resume_point(self) -> Checkpoint | None:
        """The newest committed save: what a launch resumes from. None: the base model."""
        committed = self.committed
        return committed[-1] if committed else None

    @property
    def ahead(self) -> tuple[Checkpoint, ...]:
        """Complete but not finalized: maybe the next resume point, never deleted, never loaded."""
        return tuple(c for c in self.scan.checkpoints if c.complete and not self._finalized(c))

    @property
    def complete(self) -> tuple[int, ...]:
        return tuple(c.iteration for c in self.scan.checkpoints if c.complete)

    def vouched(self, iteration: int) -> bool:
        """No outage can roll back past ``iteration`` (no witness at all: nothing is rolled back)."""
        return self.witness is None or self.witness.vouches(iteration)


# -- what is kept -------------------------------------------------------------------------------
class Moment(enum.Enum):
    """When retention runs; each has its own keep-set."""

    TRAINING = "training"         # a save landed while the round trains (the engine's reaction)
    ROUND_END = "round_end"       # NEXT_ROUND: the round is recorded
    PRESSURE = "pressure"         # the disk crossed a limit: keep only what a resume needs
    TRAINER_STOPPED = "stopped"   # TRAIN's end or a tracker repair: only abandoned partials go


@dataclass(frozen=True)
class Retention:
    """The keep-set at one moment, and what may be deleted (oldest first)."""

    moment: Moment
    keep: frozenset[int]
    doomed: tuple[Checkpoint, ...]


def _finals(d: SaveDir, last: int, count: int) -> set[int]:
    return {d.mapping.end_iteration(last - back) for back in range(count) if last - back >= 0}


def _keep_training(d: SaveDir, keep_finals: int) -> set[int]:
    # The newest complete save of the round, and every complete checkpoint outside the round (the
    # finals the round-end retention left, which --load needs). The round's older saves are
    # superseded: a fault resumes from the newest (issue 17). Once ShopSim vouched for that newest
    # save, no outage rolls back past it, so it counts as one of keep_finals and the oldest final
    # goes (issue 25): keep_finals checkpoints between saves, one more while a save lands.
    complete = d.complete
    mine = [i for i in complete if d.mapping.round_of(i) == d.round]
    others = sorted(i for i in complete if d.mapping.round_of(i) != d.round)
    if not mine:
        return set(others)
    newest = max(mine)
    if d.vouched(newest):
        older = [i for i in others if i < newest]
        later = [i for i in others if i > newest]
        others = later + older[max(0, len(older) - (keep_finals - 1)):]
    return {*others, newest}


def _keep(d: SaveDir, moment: Moment, keep_finals: int) -> set[int]:
    if moment is Moment.TRAINING:
        return _keep_training(d, keep_finals)
    if moment is Moment.TRAINER_STOPPED:
        return set(d.complete)
    if moment is Moment.ROUND_END:
        return _finals(d, d.round, keep_finals)
    # Under pressure: the previous round's final only (not the configured finals), the round's
    # newest complete save, and what this round's export read.
    keep = _finals(d, d.round - 1, 1)
    mine = [i for i in d.complete if d.mapping.round_of(i) == d.round]
    if mine:
        keep.add(max(mine))
    keep.update(i for i in d.exported if d.mapping.round_of(i) == d.round)
    return keep


def retention(d: SaveDir, moment: Moment, *, keep_finals: int = 1, trainer_running: bool = False) -> Retention:
    """What is kept at ``moment`` and what may go.

    Always kept, whatever the moment: the resume point and everything ahead of it (an
    unfinalized save may become the next resume point). Partials go only while no trainer runs
    (``trainer_running``; always the case at ``TRAINING``, never at ``ROUND_END``): while one
    runs, a partial may be the save being written.
    """
    running = trainer_running or moment is Moment.TRAINING
    keep = _keep(d, moment, keep_finals)
    point = d.resume_point
    if point is not None:
        keep.add(point.iteration)
    keep.update(c.iteration for c in d.ahead)
    doomed = tuple(c for c in d.scan.checkpoints
                   if c.iteration not in keep and (c.complete or not running))
    return Retention(moment, frozenset(keep), doomed)


# -- where a round resumes ----------------------------------------------------------------------
@dataclass(frozen=True)
class TrackerRepair:
    """Point the tracker at ``now`` (None: set it aside; the next launch loads the base model)."""

    was: int | None
    now: int | None


@dataclass(frozen=True)
class Resume:
    """Where the next launch resumes, and what must be done first (only while no trainer runs)."""

    repair: TrackerRepair | None     # the tracker does not name the resume point: rewrite it
    load: Checkpoint | None          # what --load restores from the save dir; None: the base model
    rerun: int                       # rollouts the log showed past that checkpoint: trained again
    prune: tuple[Checkpoint, ...]    # partials left by the torn save the repair steps over

    @property
    def expected(self) -> int | None:
        """The launch's first rollout id: slime's ``start_rollout_id = loaded_rollout_id + 1``."""
        return None if self.load is None else self.load.iteration + 1


def resume(d: SaveDir, rollouts_seen: Iterable[int] = ()) -> Resume:
    """The resume point and the tracker repair that makes Megatron load it.

    Megatron loads the iteration the tracker names, so the tracker must name the resume point:
    a tracker on a torn or missing save is pointed back at the newest committed one (or set
    aside when there is none), and one a completion marker has overtaken is pointed forward.
    A tracker that holds no iteration while nothing is finalized is left alone: ``--load`` is
    then the base model, as for a first launch. ``rollouts_seen``: the ids this round's log
    showed so far (how much is retrained).
    """
    point = d.resume_point
    want = point.iteration if point is not None else None
    have = d.scan.tracker.iteration
    repair = TrackerRepair(have, want) if have != want else None
    prune = tuple(c for c in d.scan.checkpoints if not c.complete) if repair is not None else ()
    seen = list(rollouts_seen)
    rerun = 0 if point is None else max(0, max(seen, default=point.iteration) - point.iteration)
    return Resume(repair, point, rerun, prune)


def restore_tracker(d: SaveDir, loaded: int) -> TrackerRepair | None:
    """After a launch with a wrong resume was stopped: the tracker names what it loaded again (a
    save it made before the stop moved the tracker onto its wrongly numbered iteration, and the
    next launch must not resume from that)."""
    have = d.scan.tracker.iteration
    return None if have == loaded else TrackerRepair(have, loaded)


def trained(d: SaveDir, end_iteration: int) -> bool:
    """The round's training is done on disk: its end save is complete and committed, or a
    committed save lies past it (a resume would not retrain the round)."""
    point = d.resume_point
    end = d.scan.get(end_iteration)
    return point is not None and point.iteration >= end_iteration and end is not None and end.complete


# -- the ShopSim outage ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Rollback:
    """How an outage settles: what goes, where the tracker points, what the witness says next."""

    witnessed: int | None            # the newest checkpoint ShopSim was seen serving before it died
    suspects: tuple[int, ...]        # complete saves after it: may hold a partly unscored rollout
    used: tuple[int, ...]            # suspects a later stage already used (exported): not retrained
    delete: tuple[Checkpoint, ...]   # what goes (empty: nothing is rolled back)
    tracker: int | None              # where the tracker points once ``delete`` is done (None: aside)
    witness: int | None              # the witness once settled: what is retrained is witnessed anew

    @property
    def rolls_back(self) -> bool:
        return bool(self.delete)

    def as_event(self) -> dict[str, Any]:
        return {"iterations": list(self.suspects), "witnessed": self.witnessed}


def outage_rollback(d: SaveDir) -> Rollback | None:
    """The outage rollback, or None when there is no outage to settle (no witness, or no outage
    marked in it). Suspects are the complete saves after the witnessed one. When a later stage
    already used one (EXPORT_HF recorded it), nothing is undone and the witness moves to the
    tracker; else they go and the tracker names the newest complete save at or before the
    witnessed one (set aside when there is none), so only unwitnessed steps are retrained."""
    w = d.witness
    if w is None or not w.readable or not w.outage:
        return None
    safe = w.iteration
    suspects = tuple(c for c in d.scan.checkpoints if c.complete and (safe is None or c.iteration > safe))
    used = tuple(c.iteration for c in suspects if c.iteration in d.exported)
    ids = tuple(c.iteration for c in suspects)
    if used:
        return Rollback(safe, ids, used, (), d.scan.tracker.iteration, d.scan.tracker.iteration)
    if not suspects:
        return Rollback(safe, (), (), (), d.scan.tracker.iteration, safe)
    kept = [c.iteration for c in d.scan.checkpoints if c.complete and safe is not None and c.iteration <= safe]
    back = kept[-1] if kept else None
    return Rollback(safe, ids, (), suspects, back, back)


def exported_ends(mapping: IterationMapping, rounds: Iterable[int]) -> frozenset[int]:
    """The end iterations of ``rounds`` (those with an EXPORT_HF record): :attr:`SaveDir.exported`."""
    return frozenset(mapping.end_iteration(r) for r in rounds if r >= 0)
