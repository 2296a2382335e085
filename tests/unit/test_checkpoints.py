"""The checkpoint reader, the round mapping, retention and deletion (shoprld.daemon.foundation.storage.checkpoints)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from shoprld.daemon.foundation.storage.checkpoints import (
    TRACKER_NAME,
    Checkpoint,
    IterationMapping,
    Scan,
    Tracker,
    is_complete,
    iter_dir,
    read_tracker,
    scan,
)
from shoprld.daemon.foundation.storage.ckptwatch import detect_watch_mode
from shoprld.daemon.foundation.storage.deepverify import deep_verify
from shoprld.daemon.foundation.storage.retention import (
    delete_checkpoints,
    delete_iter_dir,
    point_tracker,
)
from shoprld.daemon.round.resume import Moment, SaveDir, Witness, outage_rollback, retention
from shoprld.daemon.foundation.storage.checkpoints import _scan, _ScanCache  # the watcher's incremental scan

METADATA_JSON = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                 "common_backend": "torch", "common_backend_version": 1}  # fmt: skip
ALL_FILES = ("__0_0.distcp", "__1_0.distcp", ".metadata", "common.pt", "metadata.json")


def write_files(save: Path, n: int, files: tuple[str, ...] = ALL_FILES, *, size: int = 32) -> Path:
    """Write iter_N's files in Megatron's order (shards, .metadata, common.pt, metadata.json)."""
    d = iter_dir(save, n)
    d.mkdir(parents=True, exist_ok=True)
    for name in ALL_FILES:
        if name not in files:
            continue
        if name == "metadata.json":
            (d / name).write_text(json.dumps(METADATA_JSON))
        else:
            (d / name).write_bytes(b"x" * size)
    return d


def write_tracker(save: Path, text: str) -> None:
    """A plain, non-atomic write, as Megatron's rank 0 does it."""
    with open(save / TRACKER_NAME, "w") as f:
        f.write(text)


def save(save_dir: Path, n: int) -> Path:
    """One whole Megatron save: files, then the tracker last."""
    d = write_files(save_dir, n)
    write_tracker(save_dir, str(n))
    return d


# -- tracker -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "kind", "iteration"),
    [
        (None, "missing", None),
        ("", "empty", None),
        ("  \n", "empty", None),
        ("40", "ok", 40),
        ("40\n", "ok", 40),
        ("  40 \n", "ok", 40),
        ("iter_40", "ok", 40),
        ("iter_0000040\n", "ok", 40),
        ("4", "ok", 4),  # a torn "40": indistinguishable by content, taken at face value
        ("release", "release", None),
        ("release\n", "release", None),
        ("forty", "garbage", None),
        ("40 50", "garbage", None),
        ("-1", "garbage", None),
        ("+40", "garbage", None),
        ("4_0", "garbage", None),
        ("\x00\x00", "garbage", None),
        ("٤٠", "garbage", None),  # Arabic-Indic digits: int() takes them, Megatron's writer never makes them
        ("iter_", "garbage", None),
    ],
)
def test_tracker_kinds(tmp_path: Path, content: str | None, kind: str, iteration: int | None) -> None:
    """Every tracker content maps to one defined kind and iteration, never an exception."""
    if content is not None:
        (tmp_path / TRACKER_NAME).write_text(content)
    t = read_tracker(tmp_path)
    assert (t.kind, t.iteration) == (kind, iteration)
    if content is not None:
        assert t.raw == content and t.mtime is not None


def test_tracker_oddities_are_garbage_or_missing(tmp_path: Path) -> None:
    """A directory, a FIFO or a huge file at the tracker's name is garbage; no save dir is missing."""
    (tmp_path / TRACKER_NAME).mkdir()
    assert read_tracker(tmp_path).kind == "garbage"
    (tmp_path / TRACKER_NAME).rmdir()
    os.mkfifo(tmp_path / TRACKER_NAME)  # must not block
    assert read_tracker(tmp_path).kind == "garbage"
    (tmp_path / TRACKER_NAME).unlink()
    (tmp_path / TRACKER_NAME).write_text("4" * 10_000)
    assert read_tracker(tmp_path).kind == "garbage"
    assert read_tracker(tmp_path / "nope").kind == "missing"
    (tmp_path / "file").write_text("x")
    assert read_tracker(tmp_path / "file").kind == "missing"


# -- completeness --------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", [f for f in ALL_FILES[1:] if f != "common.pt"])
def test_each_required_file_is_needed(tmp_path: Path, missing: str) -> None:
    """An iter dir lacking .metadata, metadata.json or every shard is partial."""
    files = tuple(f for f in ALL_FILES if f != missing)
    if missing == "__1_0.distcp":
        files = tuple(f for f in files if not f.endswith(".distcp"))
    write_files(tmp_path, 20, files)
    write_tracker(tmp_path, "20")
    s = scan(tmp_path)
    assert s.latest_complete is None
    assert [c.iteration for c in s.partials] == [20]
    assert not is_complete(tmp_path, 20)


@pytest.mark.parametrize("content", ["", "{", '{"sharded_backend": "torch_di', "[1, 2]", "42", "\xff"])
def test_metadata_json_must_parse_as_an_object(tmp_path: Path, content: str) -> None:
    """A torn or non-object metadata.json makes the dir partial."""
    d = write_files(tmp_path, 20)
    (d / "metadata.json").write_bytes(content.encode("latin-1"))
    write_tracker(tmp_path, "20")
    assert scan(tmp_path).partials[0].iteration == 20
    assert not is_complete(tmp_path, 20)


def test_complete_and_committed(tmp_path: Path) -> None:
    """A full save with the tracker at N is committed: latest_complete, is_complete, size, time."""
    save(tmp_path, 20)
    d = save(tmp_path, 40)
    s = scan(tmp_path)
    assert [c.iteration for c in s.committed] == [20, 40]
    latest = s.latest_complete
    assert latest is not None and latest.iteration == 40 and latest.path == d
    assert latest.bytes == sum(p.stat().st_size for p in d.iterdir())
    assert latest.committed_at == (d / "metadata.json").stat().st_mtime
    assert s.consistent and s.partials == () and s.ahead == ()
    assert is_complete(tmp_path, 20) and is_complete(tmp_path, 40) and not is_complete(tmp_path, 60)
    assert s.get(20) is not None and s.get(30) is None
    assert latest.as_dict()["iteration"] == 40


def test_dir_beyond_tracker_without_metadata_is_partial(tmp_path: Path) -> None:
    """iter_N > tracker with files still being written is partial, and ignored for resume."""
    save(tmp_path, 20)
    write_files(tmp_path, 40, ("__0_0.distcp", ".metadata"))
    s = scan(tmp_path)
    assert s.latest_complete is not None and s.latest_complete.iteration == 20
    assert [c.iteration for c in s.partials] == [40]
    assert s.partials[0].committed_at is None


def test_async_save_tracker_trailing_is_ahead_not_regression(tmp_path: Path) -> None:
    """With the tracker one interval behind complete files, those files are `ahead`, not committed."""
    save(tmp_path, 20)
    write_files(tmp_path, 40)  # async save finished its files, tracker still says 20
    s = scan(tmp_path)
    assert s.latest_complete is not None and s.latest_complete.iteration == 20
    assert [c.iteration for c in s.ahead] == [40]
    assert s.partials == ()
    assert not is_complete(tmp_path, 40)
    write_tracker(tmp_path, "40")
    assert scan(tmp_path).ahead == () and is_complete(tmp_path, 40)


@pytest.mark.parametrize("content", [None, "", "garbage", "release"])
def test_no_iteration_in_tracker_commits_nothing(tmp_path: Path, content: str | None) -> None:
    """Without an iteration in the tracker nothing is committed; complete dirs are `ahead`."""
    write_files(tmp_path, 20)
    if content is not None:
        write_tracker(tmp_path, content)
    s = scan(tmp_path)
    assert s.latest_complete is None and not s.consistent
    assert [c.iteration for c in s.ahead] == [20]


def test_torn_tracker_never_commits_an_incomplete_dir(tmp_path: Path) -> None:
    """A torn tracker ("4" of "40") only makes the resume point older, never a partial one."""
    save(tmp_path, 2)
    write_files(tmp_path, 40)
    write_tracker(tmp_path, "4")
    s = scan(tmp_path)
    assert s.latest_complete is not None and s.latest_complete.iteration == 2
    assert [c.iteration for c in s.ahead] == [40]
    assert not s.consistent  # the tracker names iter 4, which does not exist


def test_scan_ignores_non_canonical_names_and_survives_missing_dir(tmp_path: Path) -> None:
    """Only iter_{N:07d} dirs count; a missing save dir gives an empty scan."""
    save(tmp_path, 20)
    for name in ("iter_40", "iter_00000060", "iter_abc", ".deleting.iter_0000080"):
        shutil.copytree(iter_dir(tmp_path, 20), tmp_path / name)
    (tmp_path / "iter_0000100").write_text("a file, not a dir")
    (tmp_path / "rollout").mkdir()
    assert [c.iteration for c in scan(tmp_path).checkpoints] == [20]
    empty = scan(tmp_path / "nope")
    assert empty.checkpoints == () and empty.tracker.kind == "missing" and empty.latest_complete is None


def test_scan_counts_big_iterations(tmp_path: Path) -> None:
    """Iterations past 9,999,999 (8 digits) are read too."""
    d = save(tmp_path, 12_345_678)
    latest = scan(tmp_path).latest_complete
    assert d.name == "iter_12345678"
    assert latest is not None and (latest.iteration, latest.path) == (12_345_678, d)


# -- the oracle property test ------------------------------------------------------------------

ITER = st.integers(min_value=0, max_value=12)
OPS = st.one_of(
    st.tuples(st.just("complete"), ITER),  # a full save of N, files only (tracker untouched)
    st.tuples(st.just("partial"), ITER, st.integers(0, 3)),  # files up to a stage
    st.tuples(st.just("finish"), ITER),  # finish an existing dir's files
    st.tuples(st.just("tracker"), ITER, st.sampled_from(["{}", "{}\n", "iter_{}", " {} "])),
    st.tuples(st.just("torn"), ITER, st.integers(0, 2)),  # a prefix of str(N)
    st.tuples(st.just("raw"), st.sampled_from(["", "release", "garbage", "\x00", "\n"])),
    st.tuples(st.just("delete"), ITER),
    st.tuples(st.just("bad_json"), ITER),
)
# Files present after each partial stage, in Megatron's write order.
STAGES = ((), ("__0_0.distcp",), ("__0_0.distcp", ".metadata"), ("__0_0.distcp", ".metadata", "common.pt"))


class Oracle:
    """A plain model of the save dir: which files each iter dir has, and the tracker's text."""

    def __init__(self) -> None:
        self.dirs: dict[int, set[str]] = {}
        self.json_ok: dict[int, bool] = {}
        self.tracker: str | None = None

    def tracker_iteration(self) -> int | None:
        if self.tracker is None:
            return None
        text = self.tracker.strip()
        text = text.removeprefix("iter_")
        return int(text) if text.isdigit() and text.isascii() else None

    def files_complete(self, n: int) -> bool:
        f = self.dirs[n]
        return {".metadata", "metadata.json"} <= f and any(
            x.endswith(".distcp") for x in f
        ) and self.json_ok[n]

    def expected(self) -> tuple[int | None, list[int], list[int]]:
        top = self.tracker_iteration()
        complete = sorted(n for n in self.dirs if self.files_complete(n))
        committed = [n for n in complete if top is not None and n <= top]
        ahead = [n for n in complete if n not in committed]
        partials = sorted(n for n in self.dirs if not self.files_complete(n))
        return (committed[-1] if committed else None), partials, ahead


def apply(op: tuple[Any, ...], root: Path, model: Oracle) -> None:
    kind = op[0]
    if kind == "complete":
        n = int(op[1])
        write_files(root, n)
        model.dirs.setdefault(n, set()).update(ALL_FILES)
        model.json_ok[n] = True
    elif kind == "partial":
        n, stage = int(op[1]), int(op[2])
        if n in model.dirs:
            return  # a partial save never overwrites a dir that exists
        write_files(root, n, STAGES[stage])
        model.dirs[n] = set(STAGES[stage])
        model.json_ok[n] = False
    elif kind == "finish":
        n = int(op[1])
        if n in model.dirs:
            apply(("complete", n), root, model)
    elif kind == "tracker":
        text = str(op[2]).format(op[1])
        write_tracker(root, text)
        model.tracker = text
    elif kind == "torn":
        text = str(op[1])[: int(op[2])]
        write_tracker(root, text)
        model.tracker = text
    elif kind == "raw":
        write_tracker(root, str(op[1]))
        model.tracker = str(op[1])
    elif kind == "delete":
        n = int(op[1])
        shutil.rmtree(iter_dir(root, n), ignore_errors=True)
        model.dirs.pop(n, None)
        model.json_ok.pop(n, None)
    elif kind == "bad_json":
        n = int(op[1])
        if n in model.dirs and "metadata.json" in model.dirs[n]:
            (iter_dir(root, n) / "metadata.json").write_text('{"sharded_backend": ')
            model.json_ok[n] = False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=25))
def test_scan_matches_model_oracle(ops: list[tuple[Any, ...]]) -> None:
    """After any sequence of saves, partials, tracker (torn) writes and deletions, scan() equals the oracle."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = Oracle()
        cache: _ScanCache = {}
        for op in ops:
            top = model.tracker_iteration()
            in_place = op[0] == "bad_json" or (
                op[0] in ("complete", "finish") and op[1] in model.dirs and top is not None and int(op[1]) <= top
            )
            apply(op, root, model)
            if in_place:
                cache.clear()  # a committed dir edited in place: the periodic full rescan's job
            s = scan(root)
            assert _scan(root, cache) == s, op  # the watcher's incremental scan agrees
            latest, partials, ahead = model.expected()
            assert (s.latest_complete.iteration if s.latest_complete else None) == latest, op
            assert [c.iteration for c in s.partials] == partials, op
            assert [c.iteration for c in s.ahead] == ahead, op
            assert s.tracker.iteration == model.tracker_iteration(), op
            for n in model.dirs:
                assert is_complete(root, n) == (n in [c.iteration for c in s.committed])


def test_incremental_scan_sees_resave_in_place_above_tracker(tmp_path: Path) -> None:
    """The watcher's cached scan re-checks dirs above the tracker, so an in-place re-save is seen."""
    save(tmp_path, 20)
    d = write_files(tmp_path, 40)  # a leftover complete dir, ahead of the tracker
    cache: _ScanCache = {}
    assert [c.iteration for c in _scan(tmp_path, cache).ahead] == [40]
    write_files(tmp_path, 40, size=99)  # megatron-core saves over it in place...
    meta = d / "metadata.json"
    st = meta.stat()
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # ...at least a tick later
    write_tracker(tmp_path, "40")
    fresh = _scan(tmp_path, cache)
    assert fresh == scan(tmp_path)
    latest = fresh.latest_complete
    assert latest is not None and latest.committed_at == meta.stat().st_mtime
    assert latest.bytes == sum(p.stat().st_size for p in d.iterdir())


# -- the round mapping -------------------------------------------------------------------------


def test_seed_mapping_round_i_ends_at_i_plus_1_times_20() -> None:
    """The seed recipe: round i ends at iter (i+1)*20 and runs with --num-rollout (i+1)*20+1."""
    m = IterationMapping(steps_per_round=20)
    assert [m.end_iteration(r) for r in range(5)] == [20, 40, 60, 80, 100]
    assert [m.num_rollout(r) for r in range(5)] == [21, 41, 61, 81, 101]
    assert [m.round_of(i) for i in (0, 1, 20, 21, 40, 41, 100)] == [0, 0, 0, 1, 1, 2, 4]


def test_plain_slime_mapping_end_offset_minus_one() -> None:
    """slime's plain numbering: K rollouts per round save at K-1, 2K-1, ...; --num-rollout is (r+1)K."""
    m = IterationMapping(steps_per_round=20, end_offset=-1)
    assert [m.end_iteration(r) for r in range(3)] == [19, 39, 59]
    assert [m.num_rollout(r) for r in range(3)] == [20, 40, 60]
    assert [m.round_of(i) for i in (0, 19, 20, 39, 40)] == [0, 0, 1, 1, 2]


@given(st.integers(1, 50), st.integers(-1, 5), st.integers(0, 40))
def test_round_of_inverts_end_iteration(steps: int, offset: int, r: int) -> None:
    """round_of(end(r)) == r and round_of(end(r)+1) == r+1, for any mapping."""
    m = IterationMapping(steps_per_round=steps, end_offset=min(offset, steps - 1))
    assert m.round_of(m.end_iteration(r)) == r
    assert m.round_of(m.end_iteration(r) + 1) == r + 1


def test_mapping_rejects_nonsense() -> None:
    """steps_per_round < 1, an offset that ends round 0 before 0, and negative inputs are errors."""
    with pytest.raises(ValueError):
        IterationMapping(steps_per_round=0)
    with pytest.raises(ValueError):
        IterationMapping(steps_per_round=20, end_offset=-21)
    with pytest.raises(ValueError):
        IterationMapping(steps_per_round=20).end_iteration(-1)
    with pytest.raises(ValueError):
        IterationMapping(steps_per_round=20).round_of(-1)


@pytest.mark.parametrize(
    ("offset", "saves", "tracker", "expected"),
    [
        (0, [], None, 0),
        (0, [20], 20, 1),
        (0, [20, 40], 40, 2),  # the seed's RESUME_ROUND=1 case: round-001 trained, resume after it
        (0, [20, 30], 30, 1),  # mid-round save
        (0, [20, 40], 20, 1),  # 40 is ahead of the tracker: not trained yet as far as slime knows
        (0, [100], 100, 5),
        (0, [40], 40, 2),  # round 0's end was deleted by retention: still done
        (-1, [19, 39], 39, 2),
        (-1, [20], 20, 1),
        (-1, [18], 18, 0),
    ],
)
def test_first_incomplete_round(
    tmp_path: Path, offset: int, saves: list[int], tracker: int | None, expected: int
) -> None:
    """Resumption picks the first round whose end is not covered by the committed resume point."""
    for n in saves:
        write_files(tmp_path, n)
    if tracker is not None:
        write_tracker(tmp_path, str(tracker))
    m = IterationMapping(steps_per_round=20, end_offset=offset)
    assert m.first_incomplete_round(scan(tmp_path), rounds=5) == expected


# -- retention -----------------------------------------------------------------------------------


def test_retention_keeps_resume_kept_and_ahead(tmp_path: Path) -> None:
    """Retention on a real save dir proposes old committed ones only: never the resume point,
    the kept, what is ahead, or partials while training."""
    for n in (20, 40, 60):
        save(tmp_path, n)
    write_files(tmp_path, 80)  # ahead (async save)
    write_files(tmp_path, 100, ("__0_0.distcp",))  # partial in progress
    write_files(tmp_path, 10, ("__0_0.distcp",))  # an old, abandoned partial
    d = SaveDir(scan(tmp_path), IterationMapping(steps_per_round=20), round=2)
    running = retention(d, Moment.PRESSURE, trainer_running=True)
    assert [c.iteration for c in running.doomed] == [20]
    stopped = retention(d, Moment.PRESSURE, trainer_running=False)
    assert [c.iteration for c in stopped.doomed] == [10, 20, 100]


def test_retention_with_torn_tracker_deletes_nothing_complete(tmp_path: Path) -> None:
    """An empty (torn) tracker commits nothing, so no complete checkpoint is proposed."""
    for n in (20, 40):
        save(tmp_path, n)
    write_tracker(tmp_path, "")
    d = SaveDir(scan(tmp_path), IterationMapping(steps_per_round=20), round=3)
    assert all(retention(d, moment, trainer_running=True).doomed == () for moment in Moment)


def test_retention_under_pressure_deletes_the_superseded_saves_on_disk(tmp_path: Path) -> None:
    """Under pressure in round 2: the previous final and the round's newest save stay; round 2's
    older mid-round saves and round 0's final go, from the real save dir."""
    for n in (20, 40, 45, 50, 55):  # finals of rounds 0 and 1, then round 2's mid-round saves
        save(tmp_path, n)
    d = SaveDir(scan(tmp_path), IterationMapping(steps_per_round=20), round=2)
    decided = retention(d, Moment.PRESSURE, trainer_running=True)
    assert [c.iteration for c in decided.doomed] == [20, 45, 50]
    delete_checkpoints(decided.doomed, save_dir=tmp_path)
    assert [c.iteration for c in scan(tmp_path).checkpoints] == [40, 55]


def test_outage_rollback_deletes_what_followed_the_witness_and_repoints_the_tracker(tmp_path: Path) -> None:
    """The outage rollback carried out on a real save dir: complete saves after the witnessed one
    go, the tracker names the witnessed one; with nothing witnessed, every save goes and the
    tracker is set aside."""
    for n in (20, 40, 60):
        save(tmp_path, n)
    m = IterationMapping(steps_per_round=20)
    for witnessed, gone, tracker in ((40, (60,), 40), (None, (20, 40), None)):
        done = outage_rollback(SaveDir(scan(tmp_path), m, round=2, witness=Witness(witnessed, outage=True)))
        assert done is not None and tuple(c.iteration for c in done.delete) == gone and done.tracker == tracker
        delete_checkpoints(done.delete, save_dir=tmp_path)
        point_tracker(tmp_path, done.tracker, set_aside_as="rolled-back-1000")
    assert not iter_dir(tmp_path, 60).exists() and not iter_dir(tmp_path, 20).exists()
    assert not (tmp_path / TRACKER_NAME).exists() and (tmp_path / f"{TRACKER_NAME}.rolled-back-1000").exists()


def test_delete_iter_dir_deletes_by_path_and_refuses_what_is_not_an_iter_dir(tmp_path: Path) -> None:
    """clean's way in: an iter_N dir named by its path goes (complete or partial); a symlink to one
    or a dir of another name is refused and stays."""
    save(tmp_path, 20)
    write_files(tmp_path, 40, ("__0_0.distcp",))
    other = tmp_path / "elsewhere"
    other.mkdir()
    (tmp_path / "iter_0000060").symlink_to(iter_dir(tmp_path, 20))
    assert delete_iter_dir(iter_dir(tmp_path, 40)) > 0 and not iter_dir(tmp_path, 40).exists()
    assert delete_iter_dir(other) == 0 and other.exists()
    assert delete_iter_dir(tmp_path / "iter_0000060") == 0 and iter_dir(tmp_path, 20).exists()


def test_delete_frees_bytes_and_logs(tmp_path: Path) -> None:
    """delete_checkpoints removes the dirs, returns their bytes and logs checkpoint.deleted each."""
    for n in (20, 40, 60):
        save(tmp_path, n)
    write_files(tmp_path, 80, ("__0_0.distcp",))
    s = scan(tmp_path)
    plan = [c for c in s.checkpoints if c.iteration in (20, 80)]
    with capture_logs() as logs:
        freed = delete_checkpoints(plan, save_dir=tmp_path)
    assert freed == sum(c.bytes for c in plan) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000040", "iter_0000060", TRACKER_NAME]
    deleted = [e for e in logs if e["event"] == "checkpoint.deleted"]
    got = [(e["iteration"], e["partial"], e["bytes"]) for e in deleted]
    assert got == [(20, False, plan[0].bytes), (80, True, plan[1].bytes)]


def test_delete_refuses_symlink_escape(tmp_path: Path) -> None:
    """A path outside the save dir, a symlinked iter dir, or a mislabelled one is refused and kept."""
    save_dir = tmp_path / "save"
    outside = tmp_path / "precious"
    save(save_dir, 20)
    save(outside, 40)
    save(save_dir, 60)
    # iter_0000040 in the save dir is a symlink to another campaign's checkpoint.
    os.symlink(iter_dir(outside, 40), iter_dir(save_dir, 40))
    # the save dir reached through a symlinked parent is still the same save dir
    alias = tmp_path / "alias"
    os.symlink(save_dir, alias)
    s = scan(save_dir)
    link = s.get(40)
    assert link is not None
    forged = [
        link,
        Checkpoint(40, iter_dir(outside, 40), True, 1, 1.0),  # outside
        Checkpoint(60, iter_dir(save_dir, 20), True, 1, 1.0),  # path does not match iteration
        Checkpoint(0, save_dir, True, 1, 1.0),  # the save dir itself
    ]
    with capture_logs() as logs:
        assert delete_checkpoints(forged, save_dir=alias) == 0
    assert sum(e["event"] == "checkpoint.delete_refused" for e in logs) == 4
    assert is_complete(outside, 40) and iter_dir(save_dir, 20).is_dir() and iter_dir(save_dir, 60).is_dir()
    ok = s.get(20)
    assert ok is not None and delete_checkpoints([ok], save_dir=alias) == ok.bytes


def test_delete_sweeps_trash_left_by_a_crash(tmp_path: Path) -> None:
    """A half-deleted dir from a crash (renamed to trash) is swept on the next delete."""
    save(tmp_path, 20)
    trash = tmp_path / ".deleting.iter_0000010"
    shutil.copytree(iter_dir(tmp_path, 20), trash)
    assert [c.iteration for c in scan(tmp_path).checkpoints] == [20]  # trash is invisible
    delete_checkpoints([], save_dir=tmp_path)
    assert not trash.exists() and iter_dir(tmp_path, 20).is_dir()


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(1, 4),
    offset=st.sampled_from([0, -1]),
    interval=st.integers(1, 4),
    rounds=st.integers(1, 5),
    crash_after=st.integers(0, 40),
    ahead=st.booleans(),
    partial=st.booleans(),
    running=st.booleans(),
)
def test_retention_never_deletes_resume_export_or_kept(
    steps: int, offset: int, interval: int, rounds: int, crash_after: int, ahead: bool, partial: bool, running: bool
) -> None:
    """Over random round histories with retention after every save, resume/export/kept checkpoints survive."""
    m = IterationMapping(steps_per_round=steps, end_offset=offset)
    # The history: every save slime would make (each `interval`, plus the forced one at each
    # round's end), cut short by a crash after `crash_after` saves.
    history = []
    for r in range(rounds):
        start = 0 if r == 0 else m.end_iteration(r - 1) + 1
        end = m.end_iteration(r)
        history += [(r, i) for i in range(start, end + 1) if (i + 1) % interval == 0 or i == end]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r, i in history[:crash_after]:
            save(root, i)
            if ahead:
                write_files(root, i + 1000)  # an async save whose tracker never came
            if partial:
                write_files(root, i + 2000, ("__0_0.distcp",))
            s = scan(root)
            latest = s.latest_complete
            assert latest is not None and latest.iteration == i
            current = [c.iteration for c in s.committed if m.round_of(c.iteration) == r]
            keep = {max(current)}
            if r > 0:
                keep.add(m.end_iteration(r - 1))  # the previous round's final = the export's
            before = {c.iteration for c in s.checkpoints}
            plan = retention(SaveDir(s, m, r), Moment.PRESSURE, trainer_running=running).doomed
            proposed = {c.iteration for c in plan}
            assert latest.iteration not in proposed
            assert not proposed & keep
            assert not proposed & {c.iteration for c in s.ahead}
            if running:
                assert all(c.complete for c in plan)
            delete_checkpoints(plan, save_dir=root)
            after = scan(root)
            assert after.latest_complete == latest  # the resume point is untouched
            assert {c.iteration for c in after.checkpoints} == before - proposed
            assert all(after.get(k) is not None for k in keep if k in before)


# -- deep verify (file level here; tests/deep runs the megatron path) ---------------------------


def test_deep_verify_file_level(tmp_path: Path) -> None:
    """Without megatron-core, deep_verify checks the files: ok for a full save, not for an empty shard."""
    d = save(tmp_path, 20)
    v = deep_verify(d)
    assert v.method in ("files", "megatron")
    if v.method == "files":
        assert v.ok, v.detail
        (d / "__1_0.distcp").write_bytes(b"")
        bad = deep_verify(d)
        assert not bad.ok and "__1_0.distcp is empty" in bad.detail
    assert not deep_verify(tmp_path / "iter_0000099").ok


# -- watch mode detection ------------------------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /ephemeral rw,relatime shared:2 - xfs /dev/nvme0n1 rw
31 22 0:41 / /mnt/nfs rw - nfs4 server:/export rw,vers=4.2
32 22 0:42 / /mnt/gcs rw - fuse.gcsfuse bucket rw
33 22 0:43 / /mnt/lus rw - lustre 10.0.0.1@tcp:/fs rw
34 31 0:44 / /mnt/nfs/local rw - tmpfs tmpfs rw
35 22 0:45 / /mnt/my\\040disk rw - cifs //srv/share rw
36 22 0:46 / /mnt/nfsish rw - ext4 /dev/sdb rw
"""


@pytest.mark.parametrize(
    ("path", "mode"),
    [
        ("/ephemeral/save", "inotify"),
        ("/mnt/nfs/save", "poll"),
        ("/mnt/nfs", "poll"),
        ("/mnt/nfsish/save", "inotify"),  # prefix of a name is not a parent
        ("/mnt/nfs/local/save", "inotify"),  # longest mount point wins
        ("/mnt/gcs/x", "poll"),
        ("/mnt/lus/x/y", "poll"),
        ("/mnt/my disk/x", "poll"),  # octal-escaped mount point
        ("/home/u", "inotify"),
    ],
)
def test_detect_watch_mode(tmp_path: Path, path: str, mode: str) -> None:
    """Network, FUSE and cluster filesystems are polled; local ones use inotify."""
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert detect_watch_mode(Path(path), mountinfo=info) == mode


def test_detect_watch_mode_real_and_unreadable(tmp_path: Path) -> None:
    """This machine's tmp dir is local (inotify); unreadable mountinfo falls back to inotify."""
    assert detect_watch_mode(tmp_path) == "inotify"
    assert detect_watch_mode(tmp_path, mountinfo=tmp_path / "nope") == "inotify"


def test_scan_is_a_plain_value(tmp_path: Path) -> None:
    """Scan and Tracker are frozen values that can be built by hand (the engine's tests do)."""
    t = Tracker("ok", 40, "40")
    s = Scan(t, (Checkpoint(40, tmp_path / "iter_0000040", True, 1, 1.0),))
    assert s.latest_complete is not None and s.consistent
    with pytest.raises(AttributeError):
        s.tracker = t  # type: ignore[misc]


def test_megatron_core_0_19_layout_without_common_pt_is_complete(tmp_path: Path) -> None:
    """megatron-core 0.19 writes no common.pt: shards + .metadata + metadata.json is complete."""
    write_files(tmp_path, 20, ("__0_0.distcp", "__1_0.distcp", ".metadata", "metadata.json"))
    write_tracker(tmp_path, "20")
    assert is_complete(tmp_path, 20)
    assert scan(tmp_path).latest_complete is not None
