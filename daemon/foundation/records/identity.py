"""Which campaign a state dir belongs to (issue 15, bug 1).

The default state dir is ``$XDG_STATE_HOME/shoprld/<name>`` (or ``/var/lib/shoprld/<name>``),
so two campaigns with the same name, in different repos or on different volumes, would share
one: the second inherited the first's first start, deadline and finished rounds, and exited
DONE with 0 rounds trained. So the state dir carries ``identity.json``::

    {"campaign": ..., "experiment": ..., "repo": ..., "ephemeral_root": ...,
     "creation_id": <uuid4 hex, made when the state dir is first used>, "created_at": ...}

``shoprld run`` checks it before it reads any state (:func:`ensure`); ``shoprld status``
checks it before it shows any (:func:`status_problem`). A mismatch is one line, exit 3
(:class:`StateMismatch`), naming the dir and the way out. Only ``shoprld run --adopt-state``
or ``shoprld import-campaign`` writes an identity over a foreign one.

A state dir written before identities existed (state, no ``identity.json``) is checked on
what it does record: the campaign name in state.json and status.json, the experiment in
status.json, and that the paths it recorded (checkpoint, child logs) lie under this
campaign's ephemeral root. If those agree, it is adopted and the identity written.

Standard library only: ``shoprld status --json`` imports this module (100 ms budget).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, ShoprldError

IDENTITY_FILE = "identity.json"
# What must match; creation_id only tells two campaigns with equal fields apart in records.
FIELDS = ("campaign", "experiment", "repo", "ephemeral_root")
_STATE_FILES = ("state.json", "journal.jsonl")


class StateMismatch(ShoprldError):
    """The state dir belongs to another campaign (name, experiment, repo or ephemeral root differ)."""

    exit_code = EXIT_CONFIG


def expected(campaign: str, experiment: str, repo: Path | str, ephemeral_root: Path | str) -> dict[str, str]:
    """This campaign's identity fields, as compared (absolute, normalised paths)."""
    return {"campaign": campaign, "experiment": experiment,
            "repo": os.path.normpath(os.path.abspath(str(repo))),
            "ephemeral_root": os.path.normpath(os.path.abspath(str(ephemeral_root)))}


def read(state_dir: Path) -> dict[str, Any] | None:
    """The recorded identity, or None when there is none (or it is unreadable: then the state
    is checked like one from before identities, see the module docstring)."""
    try:
        doc = json.loads((state_dir / IDENTITY_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in FIELDS):
        return None
    return doc


def _same_path(a: str, b: str) -> bool:
    return a == b or os.path.realpath(a) == os.path.realpath(b)


def differences(found: Mapping[str, Any], want: Mapping[str, str]) -> list[str]:
    """The identity fields that differ."""
    out = []
    for k in FIELDS:
        a, b = str(found.get(k)), want[k]
        if not (_same_path(a, b) if k in ("repo", "ephemeral_root") else a == b):
            out.append(k)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _recorded_paths(doc: Mapping[str, Any]) -> list[str]:
    """Absolute paths a state or status document recorded on the volume."""
    out: list[str] = []
    last = doc.get("last_checkpoint")
    if isinstance(last, dict) and isinstance(last.get("path"), str):
        out.append(last["path"])
    children = doc.get("children")
    items = children.values() if isinstance(children, dict) else children if isinstance(children, list) else []
    for c in items:
        if isinstance(c, dict) and isinstance(c.get("log"), str):
            out.append(c["log"])
    return [p for p in out if os.path.isabs(p)]


def _under(path: str, root: str) -> bool:
    for p, r in ((path, root), (os.path.realpath(path), os.path.realpath(root))):
        if os.path.normpath(p) == r or os.path.normpath(p).startswith(r.rstrip("/") + "/"):
            return True
    return False


def legacy_differences(state_dir: Path, want: Mapping[str, str], *,
                       status_doc: Mapping[str, Any] | None = None) -> dict[str, str]:
    """For a state dir without an identity: {field: what it recorded} where that disagrees."""
    state = _read_json(state_dir / "state.json")
    status = dict(status_doc) if status_doc is not None else _read_json(state_dir / "status.json")
    out: dict[str, str] = {}
    for doc in (state, status):
        name = doc.get("campaign")
        if isinstance(name, str) and name and name != want["campaign"]:
            out["campaign"] = name
    exp = status.get("experiment")
    if isinstance(exp, str) and exp and exp != want["experiment"]:
        out["experiment"] = exp
    for p in _recorded_paths(state) + _recorded_paths(status):
        if not _under(p, want["ephemeral_root"]):
            out["ephemeral_root"] = f"a path outside it ({p})"
            break
    return out


def has_state(state_dir: Path) -> bool:
    return any((state_dir / f).exists() for f in _STATE_FILES)


def mismatch_message(state_dir: Path, found: Mapping[str, str], want: Mapping[str, str], *,
                     command: str = "shoprld run") -> str:
    """The one line for a state dir that belongs to another campaign."""
    what = "; ".join(f"{k} {found[k]!r} there, {want[k]!r} here" for k in found)
    return (f"{state_dir}: this state dir belongs to another campaign ({what}); refusing to reuse its state; "
            f"fix: give this campaign its own storage.state_dir, or remove that dir if its campaign is over, "
            f"or `{command} --adopt-state` to take that state over on purpose")


def write(state_dir: Path, want: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    """Write a new identity (new creation id) for this campaign; returns it."""
    from shoprld.daemon.foundation.records.store import atomic_write_json  # not at import time: status stays light

    doc = {**want, "creation_id": uuid.uuid4().hex, "created_at": time.time(), **extra}
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_json(state_dir / IDENTITY_FILE, doc, mode=0o600)
    return doc


def ensure(state_dir: Path, want: Mapping[str, str], *, adopt: bool = False) -> str | None:
    """Called by the daemon, with the lock held, before it reads any state.

    Returns None when the dir is this campaign's, else what was done ("created", "adopted
    <old creation id>", "legacy"), for the journal. Raises :class:`StateMismatch`.
    """
    found = read(state_dir)
    if found is not None:
        diff = differences(found, want)
        if not diff:
            return None
        if not adopt:
            raise StateMismatch(mismatch_message(state_dir, {k: str(found[k]) for k in diff}, want))
        write(state_dir, want, adopted_from={k: found.get(k) for k in (*FIELDS, "creation_id")})
        return f"adopted {found.get('creation_id')}"
    if not has_state(state_dir):
        write(state_dir, want)
        return "created"
    legacy = legacy_differences(state_dir, want)
    if legacy and not adopt:
        raise StateMismatch(mismatch_message(state_dir, legacy, want))
    write(state_dir, want, adopted_from="legacy" if not legacy else {"legacy": legacy})
    return "legacy" if not legacy else "adopted legacy"


def status_problem(state_dir: Path, want: Mapping[str, str], status_doc: Mapping[str, Any] | None) -> str | None:
    """For ``shoprld status``: the mismatch line, or None when the state is this campaign's
    (or there is none yet)."""
    found = read(state_dir)
    if found is not None:
        diff = differences(found, want)
        return mismatch_message(state_dir, {k: str(found[k]) for k in diff}, want) if diff else None
    if status_doc is None and not has_state(state_dir):
        return None
    legacy = legacy_differences(state_dir, want, status_doc=status_doc)
    return mismatch_message(state_dir, legacy, want) if legacy else None
