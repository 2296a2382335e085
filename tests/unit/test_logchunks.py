"""Bounded reads of a stage log (foundation/system/logchunks.py) against the whole-file reads they
replace: the same answers for any log, piece size and offset, and memory bounded by the piece
size rather than the log (issue 27: the daemon's RSS stays flat under tens of MiB of log)."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.system import logchunks
from shoprld.daemon.round.saves import save_timings

LINES = st.lists(st.sampled_from([
    b"=== shoprld 2026-12-05T01:02:03 start trainer: ray job x\n", b"=== shoprld 2026-12-05T01:02:04 start check:\n",
    b"[t] train_metric_utils.py:0 - rollout 7: {}\n", b"Timer save_model end (elapsed: 2.5s)\n", b"x" * 300 + b"\n",
    b"\n", b"=== shoprld ", b"partial line without newline", b"\xff\xfe bytes\n",
]), max_size=40)


@settings(max_examples=150, deadline=None)
@given(lines=LINES, size=st.integers(1, 400), cut=st.integers(0, 10_000))
def test_the_chunked_scans_agree_with_whole_file_reads(tmp_path_factory, lines: list[bytes], size: int,  # type: ignore[no-untyped-def]
                                                        cut: int) -> None:
    data = b"".join(lines)
    path = tmp_path_factory.mktemp("log") / "r000-train.log"
    path.write_bytes(data)
    offset = min(cut, len(data))
    whole = data[:data.rfind(b"\n") + 1]  # only whole lines, as the scans promise
    pieces = list(logchunks.line_chunks(path, offset, size))
    assert b"".join(c for _, c in pieces) == whole[offset:] if offset <= len(whole) else pieces == []
    assert all(c.endswith(b"\n") and data[p:p + len(c)] == c for p, c in pieces)
    i = whole.rfind(b"=== shoprld ")
    assert logchunks.last_offset(path, b"=== shoprld ") == (i if i >= 0 else None)
    header = re.compile(rb"^=== shoprld \S+ start check:.*$", re.M)
    found = list(header.finditer(whole))
    want = found[-1].end() + 1 if found else None
    assert logchunks.after_last_match(path, header) == want
    assert [t for p, c in logchunks.line_chunks(path, 0, size) for t in save_timings(c, base_offset=p)] == \
        save_timings(whole)


def test_a_scan_of_a_large_log_holds_a_piece_not_the_log(tmp_path: Path) -> None:
    """32 MiB of engine lines scanned for the last header: traced memory stays near a MiB."""
    path = tmp_path / "big.log"
    line = b'[DP0 TP0] INFO: 127.0.0.1 - "POST /generate HTTP/1.1" 200 OK ' + b"x" * 100 + b"\n"
    with open(path, "wb") as fh:
        fh.write(b"=== shoprld 2026-12-05T01:02:03 start check:\n")
        for _ in range(32):
            fh.write(line * (2**20 // len(line)))
        fh.write(b"=== shoprld 2026-12-05T01:02:04 start check:\ncheck ok\n")
    tracemalloc.start()
    try:
        start = logchunks.after_last_match(path, re.compile(rb"^=== shoprld \S+ start check:.*$", re.M))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert start is not None and logchunks.read_from(path, start) == b"check ok\n"
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB scanning a 32 MiB log"
