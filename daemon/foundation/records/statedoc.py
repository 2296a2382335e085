"""The schema of ``state.json`` and of the journal's snapshots (issue 15: right syntax, wrong types).

``Store.load`` validates what it reads with :func:`validate`; a document that parses as
JSON but has the wrong types (``"round": "abc"``, ``"children": []``) is treated like a
corrupt one: the newest valid snapshot in the journal replaces it, else the disk decides.
Types are strict (no ``"3"`` -> 3, no ``true`` -> 1): the engine writes exact types, so
anything else was not written by it. Unknown keys are kept (a newer engine may add some).

A snapshot no longer carries the per-round facts (issue 16): they live in
``rounds.jsonl`` (:mod:`.roundlog`) and the snapshot holds the cursor ``rounds_recorded``.
``rounds_done`` and ``round_durations`` stay in the schema for state dirs written by an older
engine, which :meth:`~.store.Store.load` still reads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_ROUND = 1_000_000
MAX_COUNT = 2**62


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class ChildDoc(_Doc):
    role: str
    # 0 for a Ray job (the Jobs launcher's record has no local process: job_id names it)
    pid: int = Field(ge=0, le=2**31)
    pgid: int = Field(ge=0, le=2**31)
    start_ticks: int | None = Field(default=None, ge=0)
    started_at: float
    log: str
    argv: list[str] = []
    job_id: str = ""
    tag: str = ""


class RoundDoneDoc(_Doc):
    round: int = Field(ge=0, le=MAX_ROUND)


class PreviousDoc(_Doc):
    state: str | None = None
    round: int | None = Field(default=None, ge=0, le=MAX_ROUND)


class StateDoc(_Doc):
    """What ``Snapshot.state_doc`` (daemon/core/snapshot.py) writes (``schema`` is added by ``Store.save``)."""

    campaign: str | None = None
    first_start: float | None = None
    round_durations: dict[str, float] = {}  # an older engine's; see the module docstring
    starts: int = Field(default=0, ge=0, le=MAX_COUNT)
    seq: int = Field(default=0, ge=0, le=MAX_COUNT)
    previous: PreviousDoc | None = None
    deadline: float | None = None
    state: str | None = None
    round: int = Field(default=0, ge=0, le=MAX_ROUND)
    children: dict[str, ChildDoc] = {}
    rounds_done: list[RoundDoneDoc] = []  # an older engine's; see the module docstring
    # How many rounds rounds.jsonl held when this snapshot was written (None: an older engine).
    rounds_recorded: int | None = Field(default=None, ge=0, le=MAX_ROUND + 1)
    stop_reason: str | None = None
    last_error: str | None = None


def validate(doc: Any, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the validated document, None) or (None, one line naming the first bad key)."""
    if not isinstance(doc, dict):
        return None, f"{where} is not a JSON object"
    try:
        model = StateDoc.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top)"
        return None, f"{where}: {key}: {err['msg'].lower()} (got {_short(err.get('input'))})"
    return model.model_dump(), None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
