"""round/resume.py: every checkpoint decision as a table of (disk, records, witness) shapes, plus
the property that the resume point is always a committed save that every keep-set holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.storage.checkpoints import Checkpoint, IterationMapping, Scan, Tracker, iter_dir
from shoprld.daemon.round.resume import (
    Moment,
    SaveDir,
    TrackerRepair,
    Witness,
    exported_ends,
    outage_rollback,
    resume,
    retention,
    trained,
)

SAVE = Path("/save")
M = IterationMapping(steps_per_round=20)  # round r ends at 20 (r + 1): 20, 40, 60, ...


def disk(tracker: int | str | None, complete: tuple[int, ...] = (), partial: tuple[int, ...] = ()) -> Scan:
    """A scan as checkpoints.scan() would return it: ``tracker`` an iteration, a kind name
    (``"garbage"``, ``"empty"``, ``"release"``) or None (missing)."""
    if tracker is None:
        t = Tracker("missing", None, "")
    elif isinstance(tracker, str):
        t = Tracker(tracker, None, "x" if tracker == "garbage" else "")  # type: ignore[arg-type]
    else:
        t = Tracker("ok", tracker, str(tracker))
    dirs = [Checkpoint(i, iter_dir(SAVE, i), True, 100, 1.0) for i in complete]
    dirs += [Checkpoint(i, iter_dir(SAVE, i), False, 10, None) for i in partial]
    return Scan(t, tuple(sorted(dirs, key=lambda c: c.iteration)))


def facts(scan: Scan, round: int = 1, witness: Witness | None = None, exported: tuple[int, ...] = (),
          finalized: tuple[int, ...] = ()) -> SaveDir:
    return SaveDir(scan, M, round, witness, frozenset(exported), frozenset(finalized))


# -- resume: (disk, finalized markers) -> (tracker repair, --load, partials pruned) ---------------
RESUME_TABLE = [
    # name, scan, finalized, repair (was, now) or None, load iteration or None, pruned
    ("empty save dir: the base model", disk(None), (), None, None, ()),
    ("tracker on its complete save", disk(40, (20, 40)), (), None, 40, ()),
    ("async lag: 55 complete, tracker still 40", disk(40, (20, 40, 55)), (), None, 40, ()),
    ("async lag, 55 finalized by its marker", disk(40, (20, 40, 55)), (55,), (40, 55), 55, ()),
    ("marker on a partial save counts for nothing", disk(40, (40,), (55,)), (55,), None, 40, ()),
    ("torn save: tracker names a partial", disk(55, (20, 40), (55,)), (), (55, 40), 40, (55,)),
    ("tracker names a deleted save", disk(55, (20, 40)), (), (55, 40), 40, ()),
    ("torn tracker '4' of '40': below every save", disk(4, (20, 40)), (), (4, None), None, ()),
    ("tracker on a partial, nothing complete", disk(20, (), (20,)), (), (20, None), None, (20,)),
    ("garbage tracker, complete saves: base model", disk("garbage", (20, 40)), (), None, None, ()),
    ("empty tracker (mid-write), complete saves", disk("empty", (20,)), (), None, None, ()),
    ("release tracker", disk("release", (20,)), (), None, None, ()),
    ("missing tracker, a save finalized by marker", disk(None, (20,)), (20,), (None, 20), 20, ()),
    ("tracker beyond the newest save (a torn larger value)", disk(400, (20, 40)), (), (400, 40), 40, ()),
    ("partial newest save, tracker behind it", disk(40, (20, 40), (60,)), (), None, 40, ()),
]


@pytest.mark.parametrize("name,scan,finalized,repair,load,pruned", RESUME_TABLE, ids=[r[0] for r in RESUME_TABLE])
def test_resume_table(name: str, scan: Scan, finalized: tuple[int, ...], repair: tuple[int | None, int | None] | None,
                      load: int | None, pruned: tuple[int, ...]) -> None:
    """Each save-dir shape gives one tracker repair, one --load and the partials it prunes."""
    r = resume(facts(scan, finalized=finalized))
    assert r.repair == (TrackerRepair(*repair) if repair else None)
    assert (r.load.iteration if r.load else None) == load
    assert r.expected == (load + 1 if load is not None else None)
    assert tuple(c.iteration for c in r.prune) == pruned


def test_resume_counts_the_rollouts_retrained_past_the_resume_point() -> None:
    """What the round's log showed past the loaded save is trained again; nothing before it counts."""
    d = facts(disk(40, (20, 40)))
    assert resume(d, [41, 42, 47]).rerun == 7
    assert resume(d, [12, 30]).rerun == 0
    assert resume(d).rerun == 0
    assert resume(facts(disk(None)), [3, 4]).rerun == 0  # base model: nothing of the save dir reruns


# -- retention: (disk, moment, witness, exports) -> keep-set, deleted ----------------------------
RETENTION_TABLE = [
    # name, scan, round, moment, keep_finals, trainer_running, witness, exported, keep, doomed
    ("save lands: the round's older save goes", disk(31, (20, 25, 31)), 1, Moment.TRAINING, 1, True,
     Witness(25), (), {20, 31}, (25,)),
    ("save lands, vouched: the old final goes too", disk(31, (20, 25, 31)), 1, Moment.TRAINING, 1, True,
     Witness(31), (), {31}, (20, 25)),
    ("save lands, vouched, keep_finals=2: the final stays", disk(31, (20, 31)), 1, Moment.TRAINING, 2, True,
     Witness(31), (), {20, 31}, ()),
    ("save lands, no witness file: vouched", disk(31, (20, 31)), 1, Moment.TRAINING, 1, True,
     None, (), {31}, (20,)),
    ("save lands, witness in outage: not vouched", disk(31, (20, 31)), 1, Moment.TRAINING, 1, True,
     Witness(31, outage=True), (), {20, 31}, ()),
    ("save lands, unreadable witness: not vouched", disk(31, (20, 31)), 1, Moment.TRAINING, 1, True,
     Witness(None, readable=False), (), {20, 31}, ()),
    ("save lands ahead of the tracker (async): the tracker's save stays", disk(25, (20, 25, 31)), 1,
     Moment.TRAINING, 1, True, Witness(31), (), {25, 31}, (20,)),
    ("save lands while a partial is written: the partial stays", disk(31, (20, 31), (35,)), 1,
     Moment.TRAINING, 1, True, Witness(20), (), {20, 31}, ()),
    ("nothing of the round yet: nothing superseded", disk(20, (20,)), 1, Moment.TRAINING, 1, True,
     Witness(20), (), {20}, ()),
    ("round end: the last final only", disk(40, (20, 31, 40), (45,)), 1, Moment.ROUND_END, 1, False,
     None, (), {40}, (20, 31, 45)),
    ("round end, keep_finals=2", disk(40, (20, 31, 40)), 1, Moment.ROUND_END, 2, False,
     None, (), {20, 40}, (31,)),
    ("round end with a tracker behind: the resume point stays", disk(31, (20, 31, 40)), 1, Moment.ROUND_END, 1,
     False, None, (), {31, 40}, (20,)),
    ("pressure mid-round: previous final and newest save", disk(35, (0, 20, 31, 35), (38,)), 1, Moment.PRESSURE,
     3, True, None, (), {20, 35}, (0, 31)),
    ("pressure, no trainer: partials go", disk(35, (20, 35), (38,)), 1, Moment.PRESSURE, 1, False,
     None, (), {20, 35}, (38,)),
    ("pressure after the export: what it read stays", disk(40, (20, 40)), 1, Moment.PRESSURE, 1, False,
     None, (40,), {20, 40}, ()),
    ("pressure: an older round's export is not kept", disk(40, (0, 20, 40)), 1, Moment.PRESSURE, 1, False,
     None, (0,), {20, 40}, (0,)),
    ("pressure in round 0: nothing before it", disk(15, (5, 15)), 0, Moment.PRESSURE, 1, False,
     None, (), {15}, (5,)),
    ("trainer stopped: only partials go", disk(40, (20, 40), (45, 50)), 1, Moment.TRAINER_STOPPED, 1, False,
     None, (), {20, 40}, (45, 50)),
    ("garbage tracker: every complete save is ahead, kept", disk("garbage", (20, 40)), 2, Moment.ROUND_END, 1,
     False, None, (), {20, 40, 60}, ()),
]


@pytest.mark.parametrize("name,scan,round,moment,finals,running,witness,exported,keep,doomed", RETENTION_TABLE,
                         ids=[r[0] for r in RETENTION_TABLE])
def test_retention_table(name: str, scan: Scan, round: int, moment: Moment, finals: int, running: bool,
                         witness: Witness | None, exported: tuple[int, ...], keep: set[int],
                         doomed: tuple[int, ...]) -> None:
    """Each moment's keep-set, and what it lets go (oldest first)."""
    r = retention(facts(scan, round, witness, exported), moment, keep_finals=finals, trainer_running=running)
    on_disk = {c.iteration for c in scan.checkpoints}
    assert r.keep & on_disk == keep & on_disk
    assert tuple(c.iteration for c in r.doomed) == doomed


# -- the outage rollback: (disk, witness, exports) -> what goes, the tracker, the witness ---------
ROLLBACK_TABLE = [
    # name, scan, witness, exported, (delete, tracker, witness, used) or None
    ("no witness file: ShopSim not ours", disk(40, (20, 40)), None, (), None),
    ("witness without an outage", disk(40, (20, 40)), Witness(40), (), None),
    ("unreadable witness: nothing undone", disk(40, (20, 40)), Witness(None, readable=False), (), None),
    ("outage after the last save: nothing to undo", disk(40, (20, 40)), Witness(40, True), (), ((), 40, 40, ())),
    ("outage: saves after the witness go", disk(35, (20, 31, 35)), Witness(20, True), (), ((31, 35), 20, 20, ())),
    ("outage mid-round, a save in between is kept", disk(35, (20, 25, 31, 35)), Witness(25, True), (),
     ((31, 35), 25, 25, ())),
    ("outage: the witnessed save was pruned, the older one is named", disk(35, (20, 35)), Witness(31, True), (),
     ((35,), 20, 20, ())),
    ("outage before any witnessed save: tracker set aside", disk(20, (20,)), Witness(None, True), (),
     ((20,), None, None, ())),
    ("outage, an ahead save (async) is a suspect too", disk(31, (20, 31, 35)), Witness(31, True), (),
     ((35,), 31, 31, ())),
    ("outage after a later stage used the weights: nothing undone", disk(40, (20, 40)), Witness(20, True), (40,),
     ((), 40, 40, (40,))),
    ("outage, partial saves are never suspects", disk(31, (20, 31), (35,)), Witness(31, True), (),
     ((), 31, 31, ())),
]


@pytest.mark.parametrize("name,scan,witness,exported,expected", ROLLBACK_TABLE, ids=[r[0] for r in ROLLBACK_TABLE])
def test_outage_rollback_table(name: str, scan: Scan, witness: Witness | None, exported: tuple[int, ...],
                               expected: tuple[tuple[int, ...], int | None, int | None, tuple[int, ...]] | None,
                               ) -> None:
    """Each (disk, witness, export) shape settles one way."""
    r = outage_rollback(facts(scan, witness=witness, exported=exported))
    if expected is None:
        assert r is None
        return
    assert r is not None
    delete, tracker, witnessed, used = expected
    assert (tuple(c.iteration for c in r.delete), r.tracker, r.witness, r.used) == (delete, tracker, witnessed, used)
    assert r.rolls_back is bool(delete)


@pytest.mark.parametrize("doc,expected", [
    ({"iteration": 31, "outage": False}, Witness(31)),
    ({"iteration": 31, "outage": True}, Witness(31, outage=True)),
    ({"iteration": None, "outage": False}, Witness(None)),
    ({"iteration": True}, Witness(None)),
    ({"iteration": -3}, Witness(None)),
    ({"outage": True}, Witness(None, readable=False)),
    ([31], Witness(None, readable=False)),
    ("31", Witness(None, readable=False)),
])
def test_witness_documents(doc: object, expected: Witness) -> None:
    """The witness document's shapes: only a mapping with an iteration is a witness; a bool, a
    negative or a missing number vouches for nothing."""
    w = Witness.from_doc(doc)
    assert w == expected
    assert w.vouches(31) is (expected == Witness(31))


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
                       max_size=4))
def test_any_witness_document_parses_without_raising(doc: dict[str, object]) -> None:
    """Whatever the witness file holds, it parses, and vouches only with a non-negative int."""
    w = Witness.from_doc(doc)
    if w.vouches(0):
        assert isinstance(doc.get("iteration"), int) and not doc.get("outage")


def test_trained_and_exported_ends() -> None:
    """The round is trained once its end save is complete and committed (or passed)."""
    assert trained(facts(disk(40, (20, 40))), 40)
    assert not trained(facts(disk(31, (20, 31, 40))), 40)  # 40 ahead of the tracker
    assert trained(facts(disk(31, (20, 31, 40)), finalized=(40,)), 40)
    assert not trained(facts(disk(55, (20, 55))), 40)  # the end save itself is gone
    assert exported_ends(M, [0, 2]) == {20, 60}


# -- the property --------------------------------------------------------------------------------
@st.composite
def save_dirs(draw: st.DrawFn) -> SaveDir:
    iterations = draw(st.lists(st.integers(0, 90), unique=True, max_size=8))
    complete = tuple(i for i in iterations if draw(st.booleans()))
    partial = tuple(i for i in iterations if i not in complete)
    tracker = draw(st.one_of(st.none(), st.sampled_from(["garbage", "empty", "release"]), st.integers(0, 95),
                             st.sampled_from(iterations) if iterations else st.just(0)))
    finalized = tuple(draw(st.lists(st.sampled_from(iterations), unique=True)) if iterations else [])
    witness = draw(st.one_of(st.none(), st.builds(Witness, st.one_of(st.none(), st.integers(0, 95)), st.booleans(),
                                                  st.booleans())))
    exported = tuple(i for i in complete if i % 20 == 0 and draw(st.booleans()))
    round_index = draw(st.integers(0, 4))
    return facts(disk(tracker, complete, partial), round_index, witness, exported, finalized)


@settings(max_examples=300, deadline=None)
@given(save_dirs(), st.sampled_from(list(Moment)), st.integers(1, 3), st.booleans(), st.lists(st.integers(0, 99)))
def test_the_resume_point_is_a_committed_save_every_keep_set_holds(d: SaveDir, moment: Moment, finals: int,
                                                                     running: bool, seen: list[int]) -> None:
    """Whatever the disk and the records: the resume point is complete and finalized (by the
    tracker or its marker), never a save ahead of both; the repair makes the tracker name it;
    no moment's retention deletes it or anything ahead; a running trainer's partials survive."""
    r = resume(d, seen)
    top = d.scan.tracker.iteration
    if r.load is not None:
        assert r.load.complete and r.load in d.committed
        assert (top is not None and r.load.iteration <= top) or r.load.iteration in d.finalized
        assert r.load.iteration == max(c.iteration for c in d.committed)
    else:
        assert d.committed == ()
    assert (r.repair.now if r.repair else top) == (r.load.iteration if r.load else top if r.repair is None else None)
    assert all(not c.complete for c in r.prune)
    kept = retention(d, moment, keep_finals=finals, trainer_running=running)
    doomed = {c.iteration for c in kept.doomed}
    if r.load is not None:
        assert r.load.iteration in kept.keep and r.load.iteration not in doomed
    assert not doomed & {c.iteration for c in d.ahead}
    assert not doomed & kept.keep
    if running or moment is Moment.TRAINING:
        assert all(c.complete for c in kept.doomed)
    back = outage_rollback(d)
    if back is not None:
        assert all(c.complete for c in back.delete)
        assert back.tracker not in {c.iteration for c in back.delete}
        assert not back.used or not back.delete
