"""Hostile checkpoint trees and trackers, generated (issue 15: fuzz what parses the outside world).

The model-oracle test in test_checkpoints.py drives *well-formed* saves. Here hypothesis builds
save dirs a crashed writer, another user or a hostile bundle could leave: iter dirs that are
files, FIFOs or symlinks (to each other and out of the save dir), ``metadata.json`` that is a
dir, a FIFO, a list or huge, trackers that are binary, dirs, FIFOs or symlinks, names with
non-ASCII digits. The invariants:

- ``read_tracker`` and ``scan`` never raise and never block (a FIFO is never opened blocking);
- what ``scan`` calls committed really has the files Megatron writes (through a symlink too:
  Megatron's loader follows one);
- deleting the whole retention plan never touches anything outside the save dir (a sentinel
  tree beside it, the target of the symlinks, is unchanged) and never the resume point.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.storage.checkpoints import TRACKER_NAME, read_tracker, scan
from shoprld.daemon.foundation.storage.checkpoints import IterationMapping
from shoprld.daemon.foundation.storage.retention import delete_checkpoints
from shoprld.daemon.round.resume import Moment, SaveDir, retention

NAMES = st.one_of(
    st.integers(0, 60).map(lambda n: f"iter_{n:07d}"),
    st.sampled_from(["iter_", "iter_-1", "iter_0000001 ", "iter_٣", "iter_00000x1", "iter_" + "9" * 40,
                     "release", ".trash-iter_0000003", "iter_0000002.tmp"]),
)
TRACKERS = st.one_of(
    st.none(),
    st.integers(-5, 80).map(str),
    st.sampled_from(["", "release", "iter_0000010", "+4", "4_0", "٣", " 7 \n", "\x00\x01", "10\n20"]),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
    st.just("<dir>"), st.just("<fifo>"), st.just("<link-out>"),
)
KINDS = st.sampled_from(["complete", "no-shard", "meta-dir", "meta-fifo", "meta-list", "meta-huge",
                         "file", "fifo", "link-out", "link-sibling", "empty-dir", "meta-link-out"])
TREES = st.lists(st.tuples(NAMES, KINDS), max_size=10, unique_by=lambda t: t[0])


def _complete(d: Path) -> None:
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"x" * 16)
    (d / ".metadata").write_bytes(b"m")
    (d / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')


def _build(save: Path, outside: Path, tree: list[tuple[str, str]], tracker: str | None) -> None:
    for name, kind in tree:
        p = save / name
        if kind == "complete":
            _complete(p)
        elif kind == "no-shard":
            p.mkdir()
            (p / ".metadata").write_bytes(b"m")
            (p / "metadata.json").write_text("{}")
        elif kind in ("meta-dir", "meta-fifo", "meta-list", "meta-huge", "meta-link-out"):
            p.mkdir()
            (p / "__0_0.distcp").write_bytes(b"x")
            (p / ".metadata").write_bytes(b"m")
            meta = p / "metadata.json"
            if kind == "meta-dir":
                meta.mkdir()
            elif kind == "meta-fifo":
                os.mkfifo(meta)
            elif kind == "meta-list":
                meta.write_text("[1, 2]")
            elif kind == "meta-link-out":
                meta.symlink_to(outside / "metadata.json")
            else:
                meta.write_text('{"pad": "' + "x" * (2 << 20) + '"}')
        elif kind == "file":
            p.write_text("not a dir")
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "link-out":
            p.symlink_to(outside, target_is_directory=True)
        elif kind == "link-sibling":
            p.symlink_to(save / "iter_0000001", target_is_directory=True)
        else:
            p.mkdir()
    t = save / TRACKER_NAME
    if tracker == "<dir>":
        t.mkdir()
    elif tracker == "<fifo>":
        os.mkfifo(t)
    elif tracker == "<link-out>":
        t.symlink_to(outside / "tracker")
    elif tracker is not None:
        t.write_bytes(tracker.encode("utf-8", "surrogatepass"))


def _digest(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREES, tracker=TRACKERS)
def test_hostile_trees_never_raise_and_never_reach_outside(tree: list[tuple[str, str]], tracker: str | None) -> None:
    """Any save dir: scan never raises, committed means real files, retention stays inside."""
    with tempfile.TemporaryDirectory() as tmp:
        save, outside = Path(tmp) / "megatron", Path(tmp) / "someone-else"
        save.mkdir()
        _complete(outside)  # looks like a complete checkpoint: a symlink to it must not count
        (outside / "tracker").write_text("50")
        before = _digest(outside)
        _build(save, outside, tree, tracker)

        t = read_tracker(save)
        assert t.kind in ("missing", "empty", "garbage", "release", "ok")
        assert (t.iteration is not None) == (t.kind == "ok")
        s = scan(save)
        for c in s.committed:
            # An iter dir may be a symlink (Megatron's loader follows it, so may a resume), but
            # what it names must hold the files a save writes, metadata.json last.
            assert c.path.is_dir(), c
            assert (c.path / "metadata.json").is_file() and (c.path / ".metadata").exists()
            assert t.iteration is not None and c.iteration <= t.iteration
        latest = s.latest_complete
        doomed = retention(SaveDir(s, IterationMapping(10), round=9), Moment.ROUND_END).doomed
        delete_checkpoints(doomed, save_dir=save)

        assert _digest(outside) == before
        if latest is not None:
            assert latest.path.is_dir(), "the resume point was deleted"
