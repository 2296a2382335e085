"""Hostile state files (issue 15): right syntax but wrong types, torn journals, fuzzed contents.

``Store.load`` never raises for what is in the files: a state.json that parses but has the
wrong types is rebuilt from the newest valid journal snapshot (as garbage bytes already were),
and an append after a torn journal tail starts on a fresh line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.core.engine import Engine
from shoprld.daemon.foundation.system.errors import ShoprldError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.round.machine import State
from shoprld.daemon.foundation.config.secrets import Secrets
from shoprld.daemon.foundation.records.roundlog import ROUNDS_FILE
from shoprld.daemon.foundation.records.store import JOURNAL_FILE, ROUND_DONE_EVENT, STATE_FILE, Store
from tests.demotree import make_tree


def _snap(seq: int, /, **over: Any) -> dict[str, Any]:
    doc = {"campaign": "demo", "first_start": 1000.0, "round_durations": {"0": 12.5}, "starts": 1, "seq": seq,
           "previous": {"state": None, "round": None}, "deadline": None, "state": "TRAIN", "round": 1,
           "children": {"trainer": {"role": "trainer", "pid": 4242, "pgid": 4242, "start_ticks": 77,
                                    "started_at": 1001.0, "log": "/e/logs/t.log", "argv": ["x"]}},
           "rounds_done": [{"round": 0, "val": 0.5}], "stop_reason": None, "last_error": None}
    doc.update(over)
    return doc


def _record(seq: int, /, **over: Any) -> str:
    return json.dumps({"event": "transition", "seq": seq, "snapshot": _snap(seq, **over)})


WRONG_TYPES = [
    ("round", "abc"), ("round", True), ("round", -1), ("round", 1.5), ("children", []),
    ("children", {"trainer": {"pid": "x"}}), ("rounds_done", {}), ("rounds_done", [{"round": "0"}]),
    ("first_start", "yesterday"), ("deadline", math.nan), ("round_durations", {"0": "fast"}),
    ("previous", []), ("seq", "7"), ("starts", None), ("state", 3), ("last_error", {"x": 1}),
]


@pytest.mark.parametrize("key,value", WRONG_TYPES)
def test_state_json_with_the_wrong_type_is_rebuilt_from_the_journal(tmp_path: Path, key: str, value: Any) -> None:
    """A state.json that parses but has a wrong-typed key is rebuilt from the journal, and the
    warning names the key."""
    s = Store(tmp_path)
    s.append(json.loads(_record(3)))
    (tmp_path / STATE_FILE).write_text(json.dumps({**_snap(9), key: value, "schema": 1}))
    loaded = s.load()
    assert loaded is not None and loaded.source == "journal" and loaded.state["seq"] == 3
    assert f"state.json: {key}" in (loaded.warning or "") and "rebuilt from the journal" in (loaded.warning or "")


@pytest.mark.parametrize("key,value", WRONG_TYPES)
def test_a_wrong_typed_journal_snapshot_falls_back_to_the_previous_valid_one(tmp_path: Path, key: str,
                                                                           value: Any) -> None:
    """The newest VALID snapshot wins: a wrong-typed later one is skipped like a torn line."""
    (tmp_path / JOURNAL_FILE).write_text(_record(2) + "\n" + _record(5, **{key: value}) + "\n")
    loaded = Store(tmp_path).load()
    assert loaded is not None and loaded.state["seq"] == 2


def test_an_append_after_a_torn_tail_starts_on_a_fresh_line(tmp_path: Path) -> None:
    """A crash mid-append leaves a torn line; the next record is not fused onto it (it is readable)."""
    (tmp_path / JOURNAL_FILE).write_text(_record(1) + "\n" + '{"event": "transition", "snap')
    s = Store(tmp_path)
    s.append(json.loads(_record(2)))
    s.append({"event": "note"})
    events = [(r.get("seq"), r["event"]) for r in s.journal()]
    assert events == [(1, "transition"), (2, "transition"), (None, "note")]
    assert s.load() is not None and s.load().state["seq"] == 2  # type: ignore[union-attr]
    lines = (tmp_path / JOURNAL_FILE).read_text().splitlines()
    assert lines[1] == '{"event": "transition", "snap' and len(lines) == 4


# -- fuzzing ---------------------------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
# Values that are wrong for every key of the snapshot (so a mutated snapshot is never valid).
_wrong = st.sampled_from([[[]], [1], {"a": [], "round": "x"}, "abc", -5, 1.5, math.inf])
_keys = st.sampled_from(["round", "children", "rounds_done", "seq", "starts", "previous", "round_durations"])


@st.composite
def _hostile_line(draw: st.DrawFn, seq: int) -> str:
    kind = draw(st.sampled_from(["garbage", "torn", "wrong", "json", "event"]))
    if kind == "garbage":
        return draw(st.binary(max_size=40)).decode("latin-1").replace("\n", " ")
    if kind == "torn":
        full = _record(seq)
        return full[: draw(st.integers(0, len(full) - 1))]
    if kind == "wrong":
        return _record(seq, **{draw(_keys): draw(_wrong)})
    if kind == "json":
        return json.dumps(draw(_json))
    return json.dumps({"event": "stage.spawn", "seq": seq, "snapshot": draw(_json.filter(lambda v: not isinstance(v, dict)))})


@st.composite
def _state_files(draw: st.DrawFn) -> tuple[bytes, str, int | None]:
    """(state.json bytes, journal text, seq of the last valid snapshot in the journal or None).

    The journal is a valid prefix, then a hostile tail (torn, garbage, wrong-typed, other JSON);
    state.json is hostile too (garbage, truncated, wrong-typed or not an object)."""
    n = draw(st.integers(0, 3))
    prefix = [_record(i + 1) for i in range(n)]
    tail = [draw(_hostile_line(n + 1 + i)) for i in range(draw(st.integers(0, 4)))]
    text = "\n".join(prefix + tail)
    if draw(st.booleans()):
        text += "\n"
    good = json.dumps({**_snap(99), "schema": 1})
    state = draw(st.one_of(
        st.binary(max_size=60),
        st.integers(0, len(good) - 1).map(lambda k: good[:k].encode()),
        st.tuples(_keys, _wrong).map(lambda kv: json.dumps({**_snap(99), kv[0]: kv[1], "schema": 1}).encode()),
        _json.map(lambda v: json.dumps(v).encode()),
    ))
    return state, text, (n if n else None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=_state_files())
def test_load_never_raises_and_recovers_the_valid_journal_prefix(tmp_path: Path,
                                                               files: tuple[bytes, str, int | None]) -> None:
    """Whatever state.json and the journal hold, load() returns; when state.json is unusable the
    newest valid snapshot of the journal's valid prefix is what it recovers."""
    state, text, last_valid = files
    d = tmp_path / "s"
    d.mkdir(exist_ok=True)
    (d / STATE_FILE).write_bytes(state)
    (d / JOURNAL_FILE).write_text(text)
    loaded = Store(d).load()
    assert loaded is not None
    if loaded.source == STATE_FILE:  # fuzzed JSON that happens to be a valid state (all defaults)
        assert json.loads(state)["schema"] == 1
    elif last_valid is None:
        assert loaded.state == {} and loaded.source == "none"
    else:
        assert loaded.source == "journal" and loaded.state["seq"] == last_valid
    # An append after whatever tail is there lands on a line of its own and is read back.
    Store(d).append({"event": "probe", "seq": 1000})
    assert list(Store(d).journal())[-1]["event"] == "probe"


@pytest.fixture(scope="module")
def demo_campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Layout]:
    campaign = make_tree(tmp_path_factory.mktemp("tree"), rounds=2)
    cfg = load_config(campaign)
    return campaign, cfg, Layout.from_config(cfg)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=_state_files())
def test_the_engine_starts_from_any_state_files(demo_campaign: tuple[Path, Any, Layout],
                                                files: tuple[bytes, str, int | None]) -> None:
    """The daemon's start-up (identity check, then load) on fuzzed state files either succeeds or
    raises a one-line ShoprldError (a documented exit code), never anything else."""
    _, cfg, layout = demo_campaign
    d = layout.state_dir
    d.mkdir(parents=True, exist_ok=True)
    for f in d.iterdir():
        if f.is_file():
            f.unlink()
    state, text, _ = files
    (d / STATE_FILE).write_bytes(state)
    (d / JOURNAL_FILE).write_text(text)
    engine = Engine(cfg, layout, Secrets())
    try:
        engine._check_identity()
        engine._load()
    except ShoprldError as exc:
        assert exc.exit_code in (3,) and "\n" not in str(exc)
    else:
        assert isinstance(engine.round, int) and engine.round >= 0
        assert isinstance(engine.state_data["first_start"], float | int)


@pytest.mark.slow
@seed(20261201)
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=_state_files())
def test_load_fuzz_many_examples(tmp_path: Path, files: tuple[bytes, str, int | None]) -> None:
    """The slow suite: the load property above with many more examples and a fixed seed."""
    test_load_never_raises_and_recovers_the_valid_journal_prefix.hypothesis.inner_test(tmp_path, files)  # type: ignore[attr-defined]


def test_every_child_record_the_launchers_write_validates(tmp_path: Path) -> None:
    """A local child and a Ray job (pid 0, its submission id in job_id) both load as written: a
    schema that refused the Ray record would drop it, and a restarted daemon could not adopt
    the running job (found by the real-Ray test)."""
    from shoprld.daemon.services.processes import ChildRecord

    local = ChildRecord(role="sidecar", pid=4242, pgid=4242, start_ticks=123, started_at=1.0, log="/l", argv=["x"])
    ray = ChildRecord(role="trainer", pid=0, pgid=0, start_ticks=None, started_at=2.0, log="/t", argv=["y"],
                      job_id="shoprld-demo-exp-round-000-1")
    store = Store(tmp_path)
    store.save(_snap(3, children={"sidecar": local.to_json(), "trainer": ray.to_json()}))
    loaded = store.load()
    assert loaded is not None and loaded.warning is None, loaded and loaded.warning
    assert loaded.state["children"]["trainer"]["job_id"] == "shoprld-demo-exp-round-000-1"
    assert loaded.state["children"]["sidecar"]["pid"] == 4242


# -- persistence that grows linearly (issue 16, step 5) -----------------------------------------------


def _round(r: int, **over: Any) -> dict[str, Any]:
    return {"round": r, "val": 0.5, "metric_name": "success_rate", "gate": "complete", "analysis": "ok",
            "branch": f"b{r}", "duration_seconds": 10.0 + r, **over}


def test_rounds_file_keeps_each_rounds_last_record_and_skips_a_torn_line(tmp_path: Path) -> None:
    """rounds.jsonl: a round finished twice reads as its last record; a torn last line is skipped,
    and the next append lands on a line of its own."""
    s = Store(tmp_path)
    s.append_round(_round(1))
    s.append_round(_round(0))
    s.append_round(_round(1, gate="incomplete"))
    with open(tmp_path / ROUNDS_FILE, "a") as fh:
        fh.write('{"round": 2, "val"')  # a crash mid-append
    assert [(r["round"], r["gate"]) for r in s.rounds()] == [(0, "complete"), (1, "incomplete")]
    Store(tmp_path).append_round(_round(2))
    assert [r["round"] for r in Store(tmp_path).rounds()] == [0, 1, 2]


def test_a_state_dir_of_the_previous_version_loads_and_its_rounds_are_recorded_once(
        demo_campaign: tuple[Path, Any, Layout]) -> None:
    """An older engine's state.json (rounds_done and round_durations in every snapshot) loads with
    every round; the engine records them in rounds.jsonl once, and its next snapshot carries the
    cursor instead of the rounds."""
    _, cfg, layout = demo_campaign
    d = layout.state_dir
    d.mkdir(parents=True, exist_ok=True)
    for f in d.iterdir():
        if f.is_file():
            f.unlink()
    old = _snap(4, rounds_done=[{"round": 0, "val": 0.5, "gate": "complete"}, {"round": 1, "val": 0.6}],
                round_durations={"0": 12.5, "1": 20.0}, children={})
    (d / STATE_FILE).write_text(json.dumps({**old, "schema": 1}))
    engine = Engine(cfg, layout, Secrets())
    engine._check_identity()
    engine._load()
    assert [(r["round"], r["duration_seconds"]) for r in Store(d).rounds()] == [(0, 12.5), (1, 20.0)]
    assert engine.state_data["round_durations"] == {"0": 12.5, "1": 20.0}
    doc = engine.view.state_doc()
    assert "rounds_done" not in doc and "round_durations" not in doc and doc["rounds_recorded"] == 2
    engine2 = Engine(cfg, layout, Secrets())  # a second start records nothing twice
    engine2._load()
    assert len((d / ROUNDS_FILE).read_text().splitlines()) == 2


def test_a_lost_rounds_file_is_rebuilt_from_the_journals_round_records(tmp_path: Path) -> None:
    """When rounds.jsonl holds fewer rounds than the snapshot's cursor says, the journal's round.done
    records (each round once) fill the gap, with a warning."""
    s = Store(tmp_path)
    for r in range(3):
        s.append({"event": ROUND_DONE_EVENT, "seq": r, "state": "NEXT_ROUND", **_round(r)})
    s.save(_snap(9, rounds_done=[], round_durations={}, rounds_recorded=3))
    s.append_round(_round(2))  # rounds 0 and 1 lost
    loaded = Store(tmp_path).load()
    assert loaded is not None and "holds 1 of the 3 rounds" in (loaded.warning or "")
    assert [r["round"] for r in loaded.rounds] == [0, 1, 2]
    assert [r["round"] for r in loaded.unrecorded] == [0, 1]
    assert loaded.rounds[0] == _round(0)


def test_snapshots_and_status_do_not_grow_with_the_rounds(demo_campaign: tuple[Path, Any, Layout]) -> None:
    """The snapshot (state.json, each journal transition) and status.json are the same size after 30
    rounds and after 300; `status --json` still lists every round, from rounds.jsonl."""
    from shoprld.daemon.foundation.records.status import collect

    campaign, cfg, layout = demo_campaign
    d = layout.state_dir
    sizes = {}
    for n in (30, 300):
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            if f.is_file():
                f.unlink()
        s = Store(d)
        for r in range(n):
            s.append_round(_round(r))
        engine = Engine(cfg, layout, Secrets())
        engine._check_identity()
        engine._load()
        engine._journal("transition", src=None, dst="TRAIN", trigger="start")
        engine.view.persist()
        engine.store.flush_status()
        line = (d / JOURNAL_FILE).read_text().splitlines()[-1]
        sizes[n] = (len(line), (d / STATE_FILE).stat().st_size, (d / "status.json").stat().st_size)
        engine.store.release_lock()
        assert [r["round"] for r in collect(campaign)["rounds_done"]] == list(range(n))
        assert json.loads((d / "status.json").read_text())["stop_conditions"]["rounds_done"] == n
    # The cursor's digits and the newest rounds' indices may differ: a few bytes, not 300 rounds' worth.
    assert all(abs(a - b) < 200 for a, b in zip(sizes[30], sizes[300])), sizes


def test_a_rounds_file_ahead_of_the_snapshot_is_the_truth(tmp_path: Path) -> None:
    """A crash between the rounds.jsonl append and the state.json write leaves the file ahead of the
    cursor: the round it records is kept, without a warning (it did finish)."""
    s = Store(tmp_path)
    s.save(_snap(9, rounds_done=[], round_durations={}, rounds_recorded=1))
    s.append_round(_round(0))
    s.append_round(_round(1))
    loaded = Store(tmp_path).load()
    assert loaded is not None and loaded.warning is None and loaded.unrecorded == []
    assert [r["round"] for r in loaded.rounds] == [0, 1]


@pytest.mark.parametrize("left", [b"", b'{"schema": 1, "state": "PREF', None], ids=["emptied", "torn", "old"])
def test_a_transitions_state_json_is_not_fsynced_and_a_host_crash_loses_nothing(
        demo_campaign: tuple[Path, Config, Layout], left: bytes | None) -> None:
    """A transition writes state.json without fsync (issue 17: two fsyncs off every hand-off):
    the transition's journal line, fsynced first, carries the same snapshot. So whatever a host
    crash leaves of state.json (emptied or torn by the unsynced replace, or the previous file
    when the rename was lost) loads back as exactly that snapshot, from the journal."""
    _, cfg, layout = demo_campaign
    d = layout.state_dir
    engine = Engine(cfg, layout, Secrets())
    engine._check_identity()
    engine._load()
    before = (d / STATE_FILE).read_bytes() if (d / STATE_FILE).exists() else None
    engine._transition(None, State.PREFLIGHT_DISK, "start")
    engine.store.flush_status()
    engine.store.release_lock()
    intact = Store(d).load()
    assert intact is not None and intact.source == "state.json"
    if left is None:  # the rename never reached the disk: the file before it
        if before is None:
            (d / STATE_FILE).unlink()
        else:
            (d / STATE_FILE).write_bytes(before)
    else:
        (d / STATE_FILE).write_bytes(left)
    loaded = Store(d).load()
    assert loaded is not None and loaded.source == "journal", loaded
    assert loaded.state == {k: v for k, v in intact.state.items() if k != "schema"}  # the file's own stamp
