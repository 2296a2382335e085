"""The data behind ``shoprld report``: the campaign's records, read and checked.

:func:`gather` READS the campaign's records and nothing else: the journal
(``journal.jsonl``), ``state.json``/``status.json``, the round record, the ledger, the rounds'
TRAIN logs (per-step metrics, :mod:`.trainlog`) and the bare val's ``summary.json`` when the
round record lacks its N and s.e. It takes no lock and talks to no daemon, so it works the same
while the daemon runs, after it died and after it finished. A torn last journal line (a daemon
killed mid-write) is skipped.

What the journal gives, and how it is read:

- the timeline: one segment per ``transition`` (until the next one); marks for a daemon that
  came back after dying uncleanly (``crash``), stage retries and ShopSim restarts
  (``restart``), ``train.stall`` (``stall``), PAUSED_DISK (``park``) and FAILED;
- free disk over time: the ``free_bytes`` the engine puts on transitions, checkpoint commits
  and disk-guard events;
- step time per round: the ``step_seconds`` on TRAIN's outcome, else the time between two
  checkpoint commits of that round divided by their iteration gap;
- checkpoint saves: ``checkpoint.committed``;
- failures: ``attempt.failed`` (stage, attempt, cause, its decisive line, advice, bundle).

Every text that reaches the page passes through the campaign's Redactor (.env values).
Standard library only (matplotlib is :mod:`.reportpage`'s).
"""

from __future__ import annotations

import json
import math
import platform
import stat
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoprld import __version__

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.config.configvalues import MAX_ROUNDS
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.ledger import Ledger
from shoprld.daemon.foundation.config.secrets import load_secrets
from shoprld.daemon.foundation.records.paths import round_id
from shoprld.daemon.foundation.records.status import collect
from shoprld.daemon.ops.trainlog import Curves, read_curves

FINAL = ("DONE", "STOPPED", "FAILED", "PAUSED_DISK")

@dataclass
class ReportData:
    """Everything the page shows, read from the campaign's records (see the module docstring)."""

    campaign: str
    experiment: str
    rounds: int
    state: str | None
    segments: list[tuple[float, float, str, int]] = field(default_factory=list)  # (t0, t1, state, round)
    marks: list[tuple[float, int, str, str]] = field(default_factory=list)  # (t, round, kind, text)
    rounds_done: list[dict[str, Any]] = field(default_factory=list)
    step_seconds: dict[int, float] = field(default_factory=dict)
    disk: list[tuple[float, int]] = field(default_factory=list)  # (t, free bytes)
    limits: tuple[int, int] | None = None  # (soft, hard)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    config_text: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    ledger: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # The morning reader's header and the training dashboard.
    span: tuple[float, float] | None = None  # (first journal time, last record or now)
    failures: list[dict[str, Any]] = field(default_factory=list)  # attempt.failed, oldest first
    counts: dict[str, int] = field(default_factory=dict)  # crashes, retries, shopsim_restarts, stalls
    curves: dict[int, Curves] = field(default_factory=dict)  # round -> its TRAIN log's metrics
    vals: dict[int, ValStats] = field(default_factory=dict)  # round -> its bare val's N, means, s.e.
    base: ValStats | None = None  # the base model's bare val, when one was recorded
    base_note: str = ""  # where the base line came from, or why there is none


@dataclass(frozen=True)
class ValStats:
    """One bare val's numbers, as the val tool wrote them (``summary.json``'s counts/primary)."""

    success_rate: float | None
    reward_mean: float | None
    reward_sem: float | None  # the tool's own s.e. of reward_mean (None below 2 episodes)
    n: int | None  # counts.completed: the episodes the means are over
    requested: int | None

    def success_sem(self) -> float | None:
        """The s.e. of the success rate (a proportion over N episodes): sqrt(p(1-p)/N)."""
        if self.success_rate is None or not self.n or not 0 <= self.success_rate <= 1:
            return None
        return math.sqrt(self.success_rate * (1 - self.success_rate) / self.n)

    @classmethod
    def from_summary(cls, doc: Any) -> ValStats | None:
        """From a val tool's ``summary.json`` (None: not one)."""
        if not isinstance(doc, dict):
            return None
        primary = doc.get("primary") if isinstance(doc.get("primary"), dict) else {}
        counts = doc.get("counts") if isinstance(doc.get("counts"), dict) else {}
        if not primary and not counts:
            return None
        return cls(success_rate=_finite(primary.get("success_rate")), reward_mean=_finite(primary.get("reward_mean")),
                   reward_sem=_finite(primary.get("reward_sem")), n=_count(counts.get("completed")),
                   requested=_count(counts.get("requested")))

    @classmethod
    def from_round(cls, row: Mapping[str, Any]) -> ValStats | None:
        """From a round record that carries them (``val_n``...; None: an older record)."""
        if as_int(row.get("val_n")) is None:
            return None
        return cls(success_rate=_finite(row.get("val")), reward_mean=_finite(row.get("reward_mean")),
                   reward_sem=_finite(row.get("reward_sem")), n=_count(row.get("val_n")),
                   requested=_count(row.get("val_requested")))


# -- reading -----------------------------------------------------------------------------------


def read_journal(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The journal's records in order, and a note for each line that could not be read."""
    out: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return out, [f"{path}: no journal yet (the campaign never started)"]
    except OSError as exc:
        return out, [f"{path}: cannot read ({exc.strerror})"]
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            notes.append(f"{path}:{n}: not a JSON line (a torn write?); skipped")
            continue
        if isinstance(rec, dict) and isinstance(rec.get("event"), str):
            out.append(rec)
    return out, notes


def as_num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def as_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


VAL_MAX = 1e6  # a val number beyond this is no rate or reward (a damaged summary): not drawn


def _finite(v: Any) -> float | None:
    f = as_num(v)
    return f if f is not None and math.isfinite(f) and abs(f) <= VAL_MAX else None


def _count(v: Any) -> int | None:
    n = as_int(v)
    return n if n is not None and 0 <= n <= COUNT_MAX else None


# What a journal record may hold and still be drawn: a round index below the config's ceiling,
# a count (step, iteration, bytes) that is not negative nor beyond 2**62, a time in 2000..2099
# (absolute: a clock that was ahead, or a journal read on a machine whose clock is behind, still
# draws), finite numbers. A record outside these
# (a hand-edited or damaged journal: `"round": 10**30` would build a label per round) is skipped
# with a note, never drawn.
ROUND_MAX = MAX_ROUNDS
COUNT_MAX = 2**62
T_MIN = 946_684_800.0  # 2000-01-01
T_MAX = 4_102_444_800.0  # 2100-01-01
_COUNTS = ("step", "iteration", "bytes", "free_bytes", "soft_limit_bytes", "hard_limit_bytes")
_FLOATS = ("step_seconds", "latency_ms", "idle_s", "duration_seconds")


def insane(rec: Mapping[str, Any]) -> str | None:
    """Why the record's values are out of any sane range (None: they are not)."""
    t = rec.get("t")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and not T_MIN <= t < T_MAX:
        return f"t={str(t)[:40]} is not a time in 2000..2099"
    r = rec.get("round")
    if r is not None and not (isinstance(r, int) and not isinstance(r, bool) and 0 <= r < ROUND_MAX):
        return f"round={str(r)[:40]} is not a round index (0..{ROUND_MAX - 1})"
    for key in _COUNTS:
        v = rec.get(key)
        if isinstance(v, bool) or (isinstance(v, int) and not 0 <= v <= COUNT_MAX) or \
                (isinstance(v, float) and not (math.isfinite(v) and 0 <= v <= COUNT_MAX)):
            return f"{key}={str(v)[:40]} is out of range"
    for key in _FLOATS:
        v = rec.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (math.isfinite(v) and 0 <= v <= COUNT_MAX):
            return f"{key}={str(v)[:40]} is out of range"
    return None


def sane_rounds(rows: Sequence[Mapping[str, Any]], notes: list[str], where: str) -> list[dict[str, Any]]:
    """``rounds_done`` rows whose round index is sane; a note for each one dropped."""
    out: list[dict[str, Any]] = []
    for r in rows:
        idx = r.get("round")
        if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < ROUND_MAX:
            out.append(dict(r))
        else:
            notes.append(f"{where}: a finished round with round={str(idx)[:40]} (not 0..{ROUND_MAX - 1}); skipped")
    return out


def analyse(journal: Sequence[Mapping[str, Any]], *, now: float, alive: bool,
            notes: list[str] | None = None) -> dict[str, Any]:
    """The timeline, marks, disk series, checkpoints, step times, failures, counts and the
    campaign's wall-clock span from journal records.

    A record with a value out of any sane range (:func:`insane`) is skipped, with a line in
    ``notes`` (the first 20, then a count)."""
    segments: list[tuple[float, float, str, int]] = []
    marks: list[tuple[float, int, str, str]] = []
    disk: list[tuple[float, int]] = []
    ckpts: list[dict[str, Any]] = []
    steps: dict[int, float] = {}
    limits: tuple[int, int] | None = None
    open_seg: tuple[float, str, int] | None = None
    last_state: str | None = None
    first_t: float | None = None
    last_t: float | None = None
    failures: list[dict[str, Any]] = []
    counts = {"crashes": 0, "retries": 0, "shopsim_restarts": 0, "stalls": 0}
    skipped = 0
    for rec in journal:
        why = insane(rec)
        if why is not None:
            skipped += 1
            if notes is not None and skipped <= 20:
                notes.append(f"journal record {str(rec.get('event'))[:40]!r}: {why}; skipped")
            continue
        t = as_num(rec.get("t"))
        if t is None or not math.isfinite(t):
            continue
        last_t = t
        first_t = t if first_t is None else first_t
        ev = rec["event"]
        rnd = as_int(rec.get("round")) or 0
        free = as_int(rec.get("free_bytes"))
        if free is not None:
            disk.append((t, free))
        soft, hard = as_int(rec.get("soft_limit_bytes")), as_int(rec.get("hard_limit_bytes"))
        if soft is not None and hard is not None:
            limits = (soft, hard)
        if ev == "transition":
            dst = str(rec.get("dst"))
            if open_seg is not None:
                segments.append((open_seg[0], t, open_seg[1], open_seg[2]))
            if rec.get("src") is None and last_state is not None and last_state not in FINAL:
                marks.append((t, rnd, "crash", f"the daemon came back after dying in {last_state}"))
                counts["crashes"] += 1
            if rec.get("trigger") == "retry":
                counts["retries"] += 1
                marks.append((t, rnd, "restart", f"{dst} retried: {rec.get('message') or ''}".strip()))
            if dst == "PAUSED_DISK":
                marks.append((t, rnd, "park", str(rec.get("message") or "parked for disk")))
            if dst == "FAILED":
                marks.append((t, rnd, "failed", str(rec.get("message") or "failed")))
            open_seg = (t, dst, rnd)
            last_state = dst
        elif ev == "train.stall":
            marks.append((t, rnd, "stall", f"no step for {rec.get('idle_s')}s"))
            counts["stalls"] += 1
        elif ev in ("shopsim.restart", "shopsim.died"):
            marks.append((t, rnd, "restart", ev))
            counts["shopsim_restarts"] += int(ev == "shopsim.restart")
        elif ev == "attempt.failed":
            failures.append(_failure(rec, t, rnd))
        elif ev == "checkpoint.committed":
            ckpts.append({"t": t, "round": rnd, "iteration": rec.get("iteration"), "bytes": rec.get("bytes"),
                          "latency_ms": rec.get("latency_ms")})
        elif ev == "stage.outcome" and rec.get("state") == "TRAIN":
            s = as_num(rec.get("step_seconds"))
            if s:
                steps[rnd] = s
    if notes is not None and skipped > 20:
        notes.append(f"journal: {skipped - 20} more records out of range; skipped")
    if open_seg is not None:
        end = now if alive and open_seg[1] not in FINAL else (last_t or open_seg[0])
        segments.append((open_seg[0], max(end, open_seg[0]), open_seg[1], open_seg[2]))
    # Rounds without a measured step time: from two checkpoint commits of that round.
    by_round: dict[int, list[dict[str, Any]]] = {}
    for c in ckpts:
        by_round.setdefault(c["round"], []).append(c)
    for rnd, cs in by_round.items():
        if rnd in steps or len(cs) < 2:
            continue
        rates = [(b["t"] - a["t"]) / (b["iteration"] - a["iteration"]) for a, b in zip(cs, cs[1:])
                 if isinstance(a["iteration"], int) and isinstance(b["iteration"], int)
                 and b["iteration"] > a["iteration"]]
        if rates:
            steps[rnd] = statistics.median(rates)
    span = None
    if first_t is not None and last_t is not None:
        span = (first_t, max(now if alive and last_state not in FINAL else last_t, last_t))
    return {"segments": segments, "marks": marks, "disk": disk, "checkpoints": ckpts, "step_seconds": steps,
            "limits": limits, "failures": failures, "counts": counts, "span": span}


def _failure(rec: Mapping[str, Any], t: float, rnd: int) -> dict[str, Any]:
    """One failed attempt as the page shows it: where, the cause, its decisive line, the fix, the bundle."""
    cause = rec.get("cause") if isinstance(rec.get("cause"), dict) else {}
    return {"t": t, "round": rnd, "state": str(rec.get("state") or ""), "attempt": as_int(rec.get("attempt")),
            "cause": str(cause.get("name") or "unknown"), "detail": str(cause.get("detail") or ""),
            "advice": str(cause.get("advice") or ""), "bundle": str(rec.get("bundle") or ""),
            "exit_status": rec.get("exit_status") if as_int(rec.get("exit_status")) is not None else None,
            "message": str(rec.get("message") or "")}


MAX_SUMMARY = 16 << 20  # a val summary is a few KiB
BASE_VAL_DIR = "base-bare-val"  # <runs>/base-bare-val/summary.json: the base model's bare val


def gather(config_path: Path, base: Path | None = None) -> ReportData:
    """Read the campaign's journal, state, status, ledger, TRAIN logs and val summaries
    (read-only; see the module docstring). ``base``: the base model's val ``summary.json`` (or
    its dir); without it, ``<runs>/base-bare-val/summary.json`` when that exists."""
    cfg = load_config(config_path)
    layout = Layout.from_config(cfg)
    red = load_secrets(layout.env_file, extra_keys=cfg.required_secrets()).redactor
    status = collect(config_path)
    journal, problems = read_journal(layout.state_dir / "journal.jsonl")
    alive = bool((status.get("daemon") or {}).get("alive"))
    found = analyse(journal, now=time.time(), alive=alive, notes=problems)
    try:
        state_doc = json.loads((layout.state_dir / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state_doc = {}
    done = status.get("rounds_done") or (state_doc.get("rounds_done") if isinstance(state_doc, dict) else None)
    try:
        ledger = Ledger(layout.ledger, overflow_dir=layout.campaign_root / "ledger").rows()
    except Exception as exc:  # a broken ledger must not cost the rest of the report  # noqa: BLE001
        ledger = []
        problems.append(f"{layout.ledger}: {exc}")
    try:
        config_text = Path(config_path).read_text(encoding="utf-8")
    except OSError:
        config_text = ""
    last = ledger[-1] if ledger else {}
    env = {
        "shoprld": __version__, "python": platform.python_version(), "platform": platform.platform(),
        "host": platform.node(), "state dir": str(layout.state_dir), "volume": str(layout.ephemeral_root),
        "experiment dir": str(layout.exp_dir), "ledger": str(layout.ledger),
        "repo branch": last.get("branch", ""), "repo commit": last.get("commit", ""),
        "daemon starts": str(state_doc.get("starts", "")) if isinstance(state_doc, dict) else "",
        "daemon": "alive" if alive else "not running",
    }
    data = ReportData(
        campaign=cfg.campaign.name, experiment=cfg.campaign.experiment, rounds=cfg.campaign.rounds,
        state=status.get("state"),
        rounds_done=sane_rounds([r for r in (done or []) if isinstance(r, dict)], problems, "status"),
        config_text=config_text, environment={k: v for k, v in env.items() if v}, ledger=ledger,
        problems=problems, **found,
    )
    data.vals = read_vals(layout.runs, data.rounds_done, problems)
    data.base, data.base_note = read_base(base, layout.runs)
    current = as_int(status.get("round"))
    last_round = max([r["round"] for r in data.rounds_done] + [current if current is not None else -1]
                     + [s[3] for s in data.segments])
    for r in range(0, min(last_round, ROUND_MAX - 1) + 1):
        curves = read_curves(layout.stage_log(r, "TRAIN"))
        if curves is not None and curves.lines:
            data.curves[r] = curves
    disk = status.get("disk") if isinstance(status.get("disk"), dict) else None
    if disk and data.limits is None and as_int(disk.get("soft_limit_bytes")) and as_int(disk.get("hard_limit_bytes")):
        data.limits = (disk["soft_limit_bytes"], disk["hard_limit_bytes"])
    if disk and as_int(disk.get("free_bytes")) is not None and as_num(disk.get("sampled_at")):
        data.disk.append((float(disk["sampled_at"]), int(disk["free_bytes"])))
        data.disk.sort()
    # The one Redactor, on every text the page will show.
    data.config_text = red.text(data.config_text)
    data.environment = red.obj(data.environment)
    data.marks = [(t, r, k, red.text(s)) for t, r, k, s in data.marks]
    data.ledger = red.obj(data.ledger)
    data.rounds_done = red.obj(data.rounds_done)
    data.failures = red.obj(data.failures)
    data.problems = [red.text(p) for p in data.problems]
    data.base_note = red.text(data.base_note)
    return data


def _read_summary(path: Path) -> tuple[ValStats | None, str]:
    """A val tool's summary.json: (its numbers, '') or (None, why not)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read, a device is never a summary
            return None, f"{path}: not a regular file"
        if st.st_size > MAX_SUMMARY:
            return None, f"{path}: {st.st_size} bytes, too large for a val summary"
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, f"{path}: no such file"
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"{path}: not a readable JSON file ({str(exc)[:80]})"
    stats = ValStats.from_summary(doc)
    return stats, "" if stats else f"{path}: not a val summary (no counts/primary)"


def read_vals(runs: Path, rounds_done: Sequence[Mapping[str, Any]], notes: list[str]) -> dict[int, ValStats]:
    """Each finished round's val numbers: from its record, else (a record written before the
    record carried N and s.e.) from ``<runs>/round-NNN-bare-val/summary.json`` when still there."""
    out: dict[int, ValStats] = {}
    missing: list[str] = []
    for row in rounds_done:
        r = row["round"]
        stats = ValStats.from_round(row)
        if stats is None:
            stats, why = _read_summary(runs / f"{round_id(r)}-bare-val" / "summary.json")
            if stats is None:
                missing.append(f"{round_id(r)} ({why})")
                continue
        out[r] = stats
    if missing:
        more = f" and {len(missing) - 3} more rounds" if len(missing) > 3 else ""
        notes.append(f"no N or s.e. for the val of {'; '.join(missing[:3])}{more}: their points have no error bars")
    return out


def read_base(base: Path | None, runs: Path) -> tuple[ValStats | None, str]:
    """The base model's val: ``base`` (a summary.json or its dir; unreadable: ConfigError, since
    the user named it) or the conventional place (missing: None and the reason)."""
    if base is None:
        path = runs / BASE_VAL_DIR / "summary.json"
        if not path.exists():
            return None, (f"no base-model val recorded (the ShopSimRL loop never validates the base model): run "
                          f"the val tool on it into {runs / BASE_VAL_DIR}, or pass --base SUMMARY.json")
    else:
        path = base / "summary.json" if base.is_dir() else base
    stats, why = _read_summary(path)
    if stats is None and base is not None:
        raise ConfigError(f"--base {why}; fix: name the val tool's summary.json of the base model (or its dir)")
    if stats is not None and stats.success_rate is None:
        return None, f"{path}: the base model's val completed no episode (counts.completed={stats.n}): no line"
    return stats, str(path) if stats else why
