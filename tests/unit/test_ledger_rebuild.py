"""The ledger is derived data (issue 26): rebuilt from the state dir's record when git deletes,
cuts, garbles, rolls back or replaces it; a ledger path that is not a file is refused in one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.records import roundlog
from shoprld.daemon.foundation.records.ledger import (
    ROW_KEY, Ledger, LedgerError, format_rows, make_row, rebuild_from_record, read_bytes,
)


def row(i: int, **over: str) -> dict[str, str]:
    base = dict(index=str(i), branch="main", commit=f"c0ffee{i}", recipe="demo", metric_name="success_rate",
                metric_value=f"0.{40 + i}", elapsed_min="118.0", launcher="local", command="python train.py",
                log_path=f"/ephemeral/exp/logs/r{i:03d}-train.log", status="keep" if i % 2 else "discard",
                description=f"round-{i:03d}: gate pass", exp_dir="/ephemeral/exp")
    base.update(over)
    return make_row(**base)


def record(i: int, *, with_row: bool = True) -> dict[str, object]:
    rec: dict[str, object] = {"round": i, "val": [0.4, 0.41, 0.42, 0.43, 0.44, 0.45][i % 6], "metric_name": "success_rate", "gate": "pass",
                              "branch": "selected" if i % 2 else "rejected", "duration_seconds": 60.0}
    if with_row:
        rec[ROW_KEY] = row(i)
    return rec


def write_record(state: Path, recs: list[dict[str, object]]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / roundlog.ROUNDS_FILE).write_text("".join(json.dumps({"t": 1.0, **r}) + "\n" for r in recs))


def setup(tmp_path: Path, n: int) -> tuple[Ledger, Path, list[dict[str, object]]]:
    led = Ledger(tmp_path / "repo" / "reports" / "demo.tsv", overflow_dir=tmp_path / "vol" / "ledger")
    state = tmp_path / "state"
    recs = [record(i) for i in range(n)]
    write_record(state, recs)
    return led, state, recs


def rebuild(led: Ledger, state: Path) -> str | None:
    return rebuild_from_record(led, roundlog.read(state, with_rows=True) or [], state_dir=state)


def damaged(led: Ledger) -> list[Path]:
    return sorted(led.path.parent.glob(f"{led.path.name}.damaged-*"))


def test_a_sound_ledger_is_left_alone(tmp_path: Path) -> None:
    led, state, _ = setup(tmp_path, 3)
    for i in range(3):
        led.append(row(i))
    before = led.path.read_bytes()
    assert rebuild(led, state) is None
    assert led.path.read_bytes() == before and not damaged(led)


def test_the_next_rounds_row_the_record_lacks_yet_is_kept(tmp_path: Path) -> None:
    """A daemon that died between NEXT_ROUND's append and the round's record: not damage."""
    led, state, _ = setup(tmp_path, 2)
    for i in range(3):
        led.append(row(i))
    assert rebuild(led, state) is None
    assert [r["index"] for r in led.rows()] == ["0", "1", "2"]


@pytest.mark.parametrize("damage, says", [
    ("missing", "was missing"),
    ("cut", "cut or garbled"),
    ("garbage", "garbled"),
    ("rolled_back", "behind the record (rolled back? it lacks round(s) 3, 4)"),
    ("edited", "different from the record"),
    ("ahead", "ahead of the record"),
    ("empty", "cut or garbled"),
    ("header_only", "behind the record"),
    ("crlf", "cut or garbled"),
])
def test_a_damaged_ledger_is_rebuilt_equal_to_the_record_and_its_copy_kept(tmp_path: Path, damage: str,
                                                                           says: str) -> None:
    led, state, _ = setup(tmp_path, 5)
    for i in range(5):
        led.append(row(i))
    good = led.path.read_bytes()
    bad = {
        "cut": good[: len(good) - 40],
        "garbage": b"\x00\xff\xfe garbage \x80\n" * 3,
        "rolled_back": format_rows([row(i) for i in range(3)]),
        "edited": good.replace(b"round-002: gate pass", b"round-002: I was here"),
        "ahead": format_rows([row(i) for i in range(5)] + [row(6), row(7)]),
        "empty": b"",
        "header_only": format_rows([]),
        "crlf": good.replace(b"\n", b"\r\n"),
    }
    if damage == "missing":
        led.path.unlink()
    else:
        led.path.write_bytes(bad[damage])
    note = rebuild(led, state)
    assert note is not None and says in note and str(led.path) in note
    assert led.path.read_bytes() == good  # byte for byte: round 0's row is the original
    kept = damaged(led)
    if damage == "missing":
        assert not kept
    else:
        assert len(kept) == 1 and kept[0].read_bytes() == bad[damage] and str(kept[0]) in note
    assert rebuild(led, state) is None  # once


def test_with_nothing_recorded_the_ledger_is_the_only_trace_and_stays(tmp_path: Path) -> None:
    """A new campaign or a lost state dir: nothing to rebuild from, so nothing is touched."""
    led, state, _ = setup(tmp_path, 0)
    led.path.parent.mkdir(parents=True)
    led.path.write_bytes(format_rows([row(0), row(1)]) + b"garbage")
    assert rebuild(led, state) is None
    assert led.path.read_bytes().endswith(b"garbage") and not damaged(led)


def test_an_older_records_rounds_keep_the_ledgers_sound_rows_or_get_a_summary(tmp_path: Path) -> None:
    """Records written before they carried the row: the ledger's sound row of that round stays; a
    round the ledger lost gets a summary row from the record (never nothing, never round 0 again)."""
    led, state, _ = setup(tmp_path, 0)
    write_record(state, [record(i, with_row=False) for i in range(3)])
    led.path.parent.mkdir(parents=True)
    led.path.write_bytes(format_rows([row(0), row(1)]) + b"2\tmain\tcut mid-ro")
    note = rebuild(led, state)
    assert note is not None and "cut or garbled" in note
    rows = led.rows()
    assert rows[:2] == [row(0), row(1)]
    assert rows[2]["index"] == "2" and rows[2]["status"] == "discard" and rows[2]["metric_value"] == "0.42"
    assert "rebuilt from the state dir's record" in rows[2]["description"]


def test_overflowed_ledger_with_its_full_file_gone_is_rebuilt(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "repo" / "demo.tsv", overflow_dir=tmp_path / "vol" / "ledger", max_bytes=2000,
                 summary_rows=2)
    state = tmp_path / "state"
    write_record(state, [record(i) for i in range(12)])
    for i in range(12):
        led.append(row(i))
    assert led.overflow_path.exists()
    assert rebuild(led, state) is None
    led.overflow_path.unlink()
    note = rebuild(led, state)
    assert note is not None and "the full ledger is missing" in note
    assert led.rows() == [row(i) for i in range(12)]


@pytest.mark.parametrize("kind", ["directory", "fifo", "directory_with_files"])
def test_a_ledger_path_that_is_not_a_file_is_one_line_and_untouched(tmp_path: Path, kind: str) -> None:
    led, state, _ = setup(tmp_path, 2)
    led.path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(led.path)
    else:
        led.path.mkdir()
        if kind == "directory_with_files":
            (led.path / "notes.txt").write_text("mine")
    with pytest.raises(LedgerError) as err:
        rebuild(led, state)
    msg = str(err.value)
    assert "\n" not in msg and str(led.path) in msg and "not a file" in msg and "fix:" in msg
    assert err.value.exit_code == 3
    assert (led.path.is_fifo() if kind == "fifo" else led.path.is_dir()) and not damaged(led)
    with pytest.raises(LedgerError):  # the stage's reads say the same, and never block on a FIFO
        led.rows()


def test_read_bytes_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f")
    with pytest.raises(LedgerError, match="a FIFO"):
        read_bytes(tmp_path / "f")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=600), n=st.integers(min_value=1, max_value=4),
       keep_prefix=st.booleans())
def test_any_bytes_in_the_ledger_are_rebuilt_to_the_record(tmp_path: Path, garbage: bytes, n: int,
                                                          keep_prefix: bool) -> None:
    """Whatever bytes replace the ledger (or follow a sound prefix of it), the ledger afterwards
    holds exactly the recorded rounds' rows, and a second pass finds nothing to do."""
    root = tmp_path / f"case-{os.urandom(4).hex()}"
    led, state, _ = setup(root, n)
    expected = format_rows([row(i) for i in range(n)])
    led.path.parent.mkdir(parents=True)
    led.path.write_bytes((expected[: len(expected) // 2] if keep_prefix else b"") + garbage)
    rebuild(led, state)
    assert led.path.read_bytes() == expected
    assert rebuild(led, state) is None
    shutil.rmtree(root)
