"""``rounds.jsonl``: each finished round's facts, written once (issue 16).

Why a file of its own. The facts about a finished round (its val metric, the gate's decision,
the branch, how long it took) used to ride in every snapshot: every state.json write, every
status.json write and every journal transition carried the whole ``rounds_done`` list. A
1,000-round soak made a 509 MB journal and a 14 s restart. Now a round's facts are one line
appended here when the round finishes (by :meth:`~.store.Store.append_round`, fsynced, through
the Redactor), and the snapshots carry only a cursor: ``rounds_recorded``, how many rounds the
file held when the snapshot was taken. So the journal, state.json and status.json stay the same
size whatever the campaign's age, and a restart reads the last snapshot plus this small file.

Reading rules. One well-formed line per round is the norm; a round finished twice (a crash
between this append and the next transition makes NEXT_ROUND run again) has two lines and the
last one wins. A torn last line (a crash mid-append) and lines that are not an object with an
integer ``round`` are skipped, as the journal's are.

Standard library only: ``shoprld status --json`` (a 100 ms budget) reads this file too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROUNDS_FILE = "rounds.jsonl"
# A round record's copy of its ledger row: the ledger in the repo is rebuilt from it (ledger.py).
ROW_KEY = "ledger_row"
MAX_ROUND = 1_000_000  # statedoc.MAX_ROUND: the same bound on a round index
# status.json (rewritten at every transition) keeps the newest rounds only, so its size does
# not grow with the campaign; `shoprld status` and the report read every round from this file.
STATUS_RECENT_ROUNDS = 20


def round_of(rec: Any) -> int | None:
    """The round index a record names, or None when it is not a round record."""
    if not isinstance(rec, dict):
        return None
    r = rec.get("round")
    if isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_ROUND:
        return r
    return None


def merge(*sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of ``sources`` by round, a later source's record (and a later line) winning;
    sorted by round."""
    by_round: dict[int, dict[str, Any]] = {}
    for source in sources:
        for rec in source:
            r = round_of(rec)
            if r is not None:
                by_round[r] = rec
    return [by_round[r] for r in sorted(by_round)]


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """Every well-formed JSON object line of an append-only file (the journal, this one); a torn
    last line (a crash mid-append), a fused or a hostile one is skipped. Nothing when the file is
    missing or unreadable."""
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except OSError:
        return
    with fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(rec, dict):
                yield rec


def read(state_dir: Path, *, with_rows: bool = False) -> list[dict[str, Any]] | None:
    """Every round's last record, sorted by round; None when the file does not exist (an
    engine older than this file, or a campaign that never finished a round). Each record's
    ledger row (``ROW_KEY``) only ``with_rows``: only the ledger's rebuild reads it, and status
    and the report stay the size they were."""
    path = state_dir / ROUNDS_FILE
    if not path.exists():
        return None
    drop = ("t",) if with_rows else ("t", ROW_KEY)
    return merge([{k: v for k, v in rec.items() if k not in drop} for rec in json_lines(path)
                  if round_of(rec) is not None])
