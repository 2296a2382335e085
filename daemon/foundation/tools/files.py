"""Reading the files the real ShopSimRL tools write (``shared/contracts/shopsimrl-tools.md``).

Each reader accepts exactly what the real tool writes, and nothing the tool does not write is
required. What a stage needs from a file is checked here, so a file that is torn (the
tools write atomically but do not fsync, and a killed tool leaves an older file) or is valid
JSON of the wrong shape becomes one :class:`ToolOutputError` line that names the file and
what is missing. The stage then retries or fails by its policy; the engine never crashes.

- ``analysis_summary.json`` (§5): success has **no** ``status`` key; the fallback has
  ``status: "failed"`` and ``error{type, message}`` and writes **no** ``proposal_ledger.jsonl``.
  A missing analyst key (or a wrong ShopSim URL in the analyst's config) gives a
  success-shaped summary with 0 candidates and every card an ``ANALYST_ERROR``: "silent empty".
- bare ``summary.json`` (§6): ``counts.coverage`` (unrounded float), ``primary``; no
  ``weight_version``.
- ``online_gate_manifest.json`` (§7): ``status`` complete | incomplete. Complete even with
  dropped pairs (``contributions.json`` lists them); a pre-rollout error writes no manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shoprld.daemon.foundation.tools.payload import ToolOutputError

ANALYST_ERROR = "ANALYST_ERROR"


def read_tool_json(path: Path) -> dict[str, Any] | None:
    """A tool's JSON object file; None when it does not exist.

    Raises :class:`ToolOutputError` (one line, naming the file) when it is torn or not an object.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolOutputError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        where = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "somewhere"
        # The decoder gave up on the file's last line: the rest is missing (as in payload.py).
        cut = isinstance(exc, json.JSONDecodeError) and exc.pos >= text.rstrip().rfind("\n") + 1
        raise ToolOutputError(f"{path}: {'truncated' if cut else 'not valid JSON'} ({where}); the tool "
                              "was cut short or another program wrote it") from None
    if not isinstance(data, dict):
        raise ToolOutputError(f"{path}: holds a JSON {type(data).__name__}, not the object the tool writes")
    return data


def _int(data: dict[str, Any], key: str, path: Path) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        got = "missing" if key not in data else f"{type(value).__name__} {value!r}"
        raise ToolOutputError(f"{path}: {key!r} must be an integer ({got})")
    return value


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# -- analysis_summary.json --------------------------------------------------------------------------
@dataclass(frozen=True)
class Analysis:
    """What ``training analyze`` left: ``kind`` is ``ok``, ``failed`` (the fallback pool) or
    ``silent_empty`` (success-shaped, 0 candidates, every analysed card an analyst error)."""

    kind: Literal["ok", "failed", "silent_empty"]
    candidates: int
    analyzed_cards: int = 0
    eligible_cards: int = 0
    analyst_errors: int = 0
    error: str | None = None
    ledger: Path | None = None  # the proposal_ledger.jsonl THIS analysis wrote, if any

    def note(self) -> str:
        """A few words for the ledger and status."""
        if self.kind == "failed":
            return f"analysis failed ({self.error}); no proposal ledger"
        if self.kind == "silent_empty":
            return f"analysis silently empty ({self.analyst_errors} analyst errors, 0 candidates)"
        return f"analysis {self.candidates} candidates"


def latest_cards(path: Path) -> dict[str, dict[str, Any]]:
    """``failure_cards.jsonl``, latest line per ``source_trajectory_id`` (a torn line is skipped)."""
    cards: dict[str, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return cards
    for line in lines:
        try:
            card = json.loads(line)
        except ValueError:
            continue
        if isinstance(card, dict) and isinstance(card.get("source_trajectory_id"), str):
            cards[card["source_trajectory_id"]] = card
    return cards


def read_analysis(analysis_dir: Path) -> Analysis | None:
    """``<analysis_dir>/analysis_summary.json`` read by the real tool's rules; None when absent."""
    path = analysis_dir / "analysis_summary.json"
    data = read_tool_json(path)
    if data is None:
        return None
    if data.get("status") == "failed":
        err = data.get("error")
        text = f"{err.get('type')}: {err.get('message')}" if isinstance(err, dict) else str(err or "no error given")
        return Analysis("failed", 0, error=text[:300])
    candidates = _int(data, "candidates", path)
    analyzed = _int(data, "analyzed_cards", path)
    eligible = _int(data, "eligible_cards", path)
    ledger = analysis_dir / "proposal_ledger.jsonl"
    ledger_path = ledger if ledger.is_file() else None
    if candidates == 0 and analyzed > 0 and eligible == 0:
        cards = latest_cards(analysis_dir / "failure_cards.jsonl")
        errors = sum(1 for c in cards.values() if c.get("status") == ANALYST_ERROR)
        # Without the cards file, eligible == 0 < analyzed is the only sign the contract gives.
        if not cards or errors == len(cards):
            return Analysis("silent_empty", 0, analyzed, eligible, errors or analyzed, ledger=ledger_path)
    return Analysis("ok", candidates, analyzed, eligible, ledger=ledger_path)


# -- the bare summary.json ------------------------------------------------------------------------
@dataclass(frozen=True)
class BareSummary:
    """The bare val's ``summary.json``: coverage and the primary metrics."""

    coverage: float
    requested: int
    completed: int
    failed: int
    primary: dict[str, Any] = field(default_factory=dict)


def read_bare_summary(path: Path) -> BareSummary | None:
    """The bare val's ``summary.json``; None when absent."""
    data = read_tool_json(path)
    if data is None:
        return None
    counts = data.get("counts")
    if not isinstance(counts, dict):
        raise ToolOutputError(f"{path}: no 'counts' object (the real run writes counts.coverage)")
    coverage = _number(counts.get("coverage"))
    if coverage is None:
        raise ToolOutputError(f"{path}: counts.coverage must be a number ({counts.get('coverage')!r})")
    primary = data.get("primary") if isinstance(data.get("primary"), dict) else {}
    return BareSummary(coverage, _int(counts, "requested", path), _int(counts, "completed", path),
                       _int(counts, "failed", path), dict(primary))


# -- online_gate_manifest.json ---------------------------------------------------------------------
@dataclass(frozen=True)
class GateResult:
    """The gate's verdict: ``complete`` (possibly with dropped pairs) or ``incomplete``."""

    status: Literal["complete", "incomplete"]
    dropped: int = 0
    observations: int | None = None
    requested: int | None = None


def read_gate(gate_dir: Path) -> GateResult | None:
    """``online_gate_manifest.json`` (written last) and, when complete, ``contributions.json``
    for the dropped pairs; None when no manifest exists (a pre-rollout error writes none)."""
    path = gate_dir / "online_gate_manifest.json"
    data = read_tool_json(path)
    if data is None:
        return None
    status = data.get("status")
    if status not in ("complete", "incomplete"):
        raise ToolOutputError(f"{path}: 'status' must be complete or incomplete ({status!r})")
    if status == "incomplete":
        return GateResult("incomplete")
    contrib = read_tool_json(gate_dir / "contributions.json") or {}
    dropped = contrib.get("dropped_episode_ids")
    obs = contrib.get("observations")
    req = contrib.get("requested_observations")
    return GateResult("complete", len(dropped) if isinstance(dropped, list) else 0,
                      obs if isinstance(obs, int) and not isinstance(obs, bool) else None,
                      req if isinstance(req, int) and not isinstance(req, bool) else None)
