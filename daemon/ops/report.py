"""``shoprld report``: one self-contained HTML file that explains a campaign's night.

Theory of operation. :func:`gather` READS the campaign's records and nothing else: the
journal (``journal.jsonl``), ``state.json``/``status.json`` and the ledger. It takes no lock
and talks to no daemon, so it works the same while the daemon runs, after it died and after
it finished. A torn last journal line (a daemon killed mid-write) is skipped.

:func:`render` turns that data into HTML with every plot inline as SVG (no script, no
stylesheet or font from the network: the file opens on an air-gapped laptop). The plots
are drawn by matplotlib on its Agg/SVG backend, an optional extra (``pip install
'shoprld[report]'``): only this module imports it, lazily, and the daemon never imports this
module. Without the extra, ``shoprld report`` says so in one line and exits 3.

What the journal gives, and how it is read:

- the timeline: one segment per ``transition`` (until the next one); marks for a daemon that
  came back after dying uncleanly (``crash``), stage retries and ShopSim restarts
  (``restart``), ``train.stall`` (``stall``), PAUSED_DISK (``park``) and FAILED;
- free disk over time: the ``free_bytes`` the engine puts on transitions, checkpoint commits
  and disk-guard events;
- step time per round: the ``step_seconds`` on TRAIN's outcome, else the time between two
  checkpoint commits of that round divided by their iteration gap;
- checkpoint saves: ``checkpoint.committed``.

Every text that reaches the page passes through the campaign's Redactor (.env values).
"""

from __future__ import annotations

import html
import io
import json
import math
import platform
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoprld import __version__

from shoprld.daemon.foundation.config import load_config
from shoprld.daemon.foundation.configvalues import MAX_ROUNDS
from shoprld.daemon.foundation.errors import ConfigError
from shoprld.daemon.foundation.layout import Layout
from shoprld.daemon.foundation.ledger import Ledger
from shoprld.daemon.foundation.outputs import campaign_files, resolve_output, write_output
from shoprld.daemon.foundation.paths import quick_read
from shoprld.daemon.foundation.secrets import load_secrets
from shoprld.daemon.foundation.status import collect
from shoprld.daemon.foundation.units import human_bytes, human_duration

INSTALL_HINT = "pip install 'shoprld[report]'"
FINAL = ("DONE", "STOPPED", "FAILED", "PAUSED_DISK")
# The state colours (colour-blind safe: Okabe-Ito), shared by the timeline and its legend.
STATE_COLOURS = {
    "PREFLIGHT_DISK": "#999999", "START_SHOPSIM": "#56B4E9", "TRAIN": "#0072B2", "EXPORT_HF": "#009E73",
    "VAL": "#F0E442", "GATE": "#E69F00", "INJECT": "#CC79A7", "NEXT_ROUND": "#000000",
    "PAUSED_DISK": "#D55E00", "STOPPED": "#bbbbbb", "FAILED": "#882255", "DONE": "#117733",
}
MARKS = {  # kind: (matplotlib marker, colour, legend label)
    "crash": ("X", "#D55E00", "daemon crash (resumed)"),
    "restart": ("o", "#E69F00", "restart / retry"),
    "stall": ("v", "#CC79A7", "stall"),
    "park": ("s", "#D55E00", "parked for disk"),
    "failed": ("P", "#000000", "failed"),
}
PLOTS = ("timeline", "val", "step-time", "disk")


class ReportExtraMissing(ConfigError):
    """matplotlib (the ``report`` extra) is not installed."""


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


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


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
    """The timeline, marks, disk series, checkpoints and step times from journal records.

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
    last_t: float | None = None
    skipped = 0
    for rec in journal:
        why = insane(rec)
        if why is not None:
            skipped += 1
            if notes is not None and skipped <= 20:
                notes.append(f"journal record {str(rec.get('event'))[:40]!r}: {why}; skipped")
            continue
        t = _num(rec.get("t"))
        if t is None or not math.isfinite(t):
            continue
        last_t = t
        ev = rec["event"]
        rnd = _int(rec.get("round")) or 0
        free = _int(rec.get("free_bytes"))
        if free is not None:
            disk.append((t, free))
        soft, hard = _int(rec.get("soft_limit_bytes")), _int(rec.get("hard_limit_bytes"))
        if soft is not None and hard is not None:
            limits = (soft, hard)
        if ev == "transition":
            dst = str(rec.get("dst"))
            if open_seg is not None:
                segments.append((open_seg[0], t, open_seg[1], open_seg[2]))
            if rec.get("src") is None and last_state is not None and last_state not in FINAL:
                marks.append((t, rnd, "crash", f"the daemon came back after dying in {last_state}"))
            if rec.get("trigger") == "retry":
                marks.append((t, rnd, "restart", f"{dst} retried: {rec.get('message') or ''}".strip()))
            if dst == "PAUSED_DISK":
                marks.append((t, rnd, "park", str(rec.get("message") or "parked for disk")))
            if dst == "FAILED":
                marks.append((t, rnd, "failed", str(rec.get("message") or "failed")))
            open_seg = (t, dst, rnd)
            last_state = dst
        elif ev == "train.stall":
            marks.append((t, rnd, "stall", f"no step for {rec.get('idle_s')}s"))
        elif ev in ("shopsim.restart", "shopsim.died"):
            marks.append((t, rnd, "restart", ev))
        elif ev == "checkpoint.committed":
            ckpts.append({"t": t, "round": rnd, "iteration": rec.get("iteration"), "bytes": rec.get("bytes"),
                          "latency_ms": rec.get("latency_ms")})
        elif ev == "stage.outcome" and rec.get("state") == "TRAIN":
            s = _num(rec.get("step_seconds"))
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
    return {"segments": segments, "marks": marks, "disk": disk, "checkpoints": ckpts, "step_seconds": steps,
            "limits": limits}


def gather(config_path: Path) -> ReportData:
    """Read the campaign's journal, state, status and ledger (read-only; see the module docstring)."""
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
    disk = status.get("disk") if isinstance(status.get("disk"), dict) else None
    if disk and data.limits is None and _int(disk.get("soft_limit_bytes")) and _int(disk.get("hard_limit_bytes")):
        data.limits = (disk["soft_limit_bytes"], disk["hard_limit_bytes"])
    if disk and _int(disk.get("free_bytes")) is not None and _num(disk.get("sampled_at")):
        data.disk.append((float(disk["sampled_at"]), int(disk["free_bytes"])))
        data.disk.sort()
    # The one Redactor, on every text the page will show.
    data.config_text = red.text(data.config_text)
    data.environment = red.obj(data.environment)
    data.marks = [(t, r, k, red.text(s)) for t, r, k, s in data.marks]
    data.ledger = red.obj(data.ledger)
    data.rounds_done = red.obj(data.rounds_done)
    data.problems = [red.text(p) for p in data.problems]
    return data


# -- plotting ----------------------------------------------------------------------------------


def _pyplot() -> Any:
    """matplotlib on the Agg backend (no display), or one line saying how to install it."""
    try:
        import matplotlib  # lazy: optional extra [report]; missing -> one line
    except ImportError:
        raise ReportExtraMissing(f"shoprld report needs matplotlib (the report extra); fix: {INSTALL_HINT}") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # lazy: after the Agg backend is chosen

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "shoprld", "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _svg(plt: Any, fig: Any) -> str:
    buf = io.StringIO()
    # No metadata: matplotlib's default RDF block names creativecommons/purl URLs.
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: this is inline SVG


def _time_axis(ts: Sequence[float], t0: float) -> tuple[float, str]:
    span = (max(ts) - t0) if ts else 0.0
    if span >= 3 * 3600:
        return 3600.0, "hours since the campaign started"
    if span >= 180:
        return 60.0, "minutes since the campaign started"
    return 1.0, "seconds since the campaign started"


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_timeline(plt: Any, d: ReportData) -> str:
    from matplotlib.lines import Line2D  # lazy: optional extra [report]
    from matplotlib.patches import Patch

    lanes = max([d.rounds, *[s[3] + 1 for s in d.segments], 1])
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.45 * lanes))
    if not d.segments:
        _empty(ax, "no transitions journaled yet")
        return _svg(plt, fig)
    t0 = d.segments[0][0]
    unit, label = _time_axis([s[1] for s in d.segments], t0)
    seen: list[str] = []
    for a, b, state, rnd in d.segments:
        ax.barh(rnd, max((b - a) / unit, 1e-9), left=(a - t0) / unit, height=0.6,
                color=STATE_COLOURS.get(state, "#777777"), edgecolor="none")
        if state not in seen:
            seen.append(state)
    used_marks: list[str] = []
    for t, rnd, kind, _text in d.marks:
        marker, colour, _ = MARKS[kind]
        ax.plot((t - t0) / unit, rnd, marker=marker, color=colour, markersize=9, markeredgecolor="white",
                linestyle="none", zorder=5)
        if kind not in used_marks:
            used_marks.append(kind)
    ax.set_yticks(range(lanes), [f"round-{r:03d}" for r in range(lanes)])
    ax.invert_yaxis()
    ax.set_xlabel(label)
    handles = [Patch(color=STATE_COLOURS.get(s, "#777777"), label=s) for s in seen]
    handles += [Line2D([], [], marker=MARKS[k][0], color=MARKS[k][1], linestyle="none", label=MARKS[k][2])
                for k in used_marks]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return _svg(plt, fig)


GATE_COLOURS = {"complete": "#009E73", "incomplete": "#E69F00"}


def plot_val(plt: Any, d: ReportData) -> str:
    from matplotlib.patches import Patch  # lazy: optional extra [report]

    fig, ax = plt.subplots(figsize=(8, 3.2))
    rows = [r for r in d.rounds_done if _num(r.get("val")) is not None and _int(r.get("round")) is not None]
    if not rows:
        _empty(ax, "no round validated yet")
        return _svg(plt, fig)
    xs = [r["round"] for r in rows]
    ys = [float(r["val"]) for r in rows]
    colours = [GATE_COLOURS.get(str(r.get("gate")), "#999999") for r in rows]
    ax.bar(xs, ys, color=colours, width=0.6)
    ax.plot(xs, ys, color="#0072B2", marker="o", linewidth=1.5)
    for x, y in zip(xs, ys):
        ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(0, 5), ha="center")
    ax.set_xticks(xs, [f"round-{x:03d}" for x in xs])
    ax.set_ylabel(str(rows[0].get("metric_name") or "val metric"))
    ax.set_ylim(0, max(ys) * 1.2 or 1)
    gates = sorted({str(r.get("gate")) for r in rows})
    ax.legend(handles=[Patch(color=GATE_COLOURS.get(g, "#999999"), label=f"gate: {g}") for g in gates],
              loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return _svg(plt, fig)


def plot_step_time(plt: Any, d: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(8, 3.0))
    if not d.step_seconds:
        _empty(ax, "no step time measured yet")
        return _svg(plt, fig)
    xs = sorted(d.step_seconds)
    ys = [d.step_seconds[x] for x in xs]
    ax.bar(xs, ys, color="#0072B2", width=0.6)
    for x, y in zip(xs, ys):
        ax.annotate(f"{y:.3g}s", (x, y), textcoords="offset points", xytext=(0, 4), ha="center")
    ax.set_xticks(xs, [f"round-{x:03d}" for x in xs])
    ax.set_ylabel("seconds per step (median)")
    ax.set_ylim(0, max(ys) * 1.25)
    return _svg(plt, fig)


def plot_disk(plt: Any, d: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    if not d.disk:
        _empty(ax, "no disk sample journaled yet")
        return _svg(plt, fig)
    t0 = min([d.disk[0][0], *[s[0] for s in d.segments[:1]]])
    unit, label = _time_axis([t for t, _ in d.disk], t0)
    gib = float(1 << 30)
    ax.plot([(t - t0) / unit for t, _ in d.disk], [b / gib for _, b in d.disk], color="#0072B2",
            marker=".", linewidth=1.5, label="free")
    if d.limits:
        ax.axhline(d.limits[0] / gib, color="#E69F00", linestyle="--", linewidth=1, label="soft limit")
        ax.axhline(d.limits[1] / gib, color="#D55E00", linestyle="--", linewidth=1, label="hard limit")
    for n, c in enumerate(d.checkpoints):
        ax.axvline((c["t"] - t0) / unit, color="#009E73", linewidth=0.8, alpha=0.6,
                   label="checkpoint saved" if n == 0 else None)
    ax.set_xlabel(label)
    ax.set_ylabel("free GiB")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return _svg(plt, fig)


# -- the page ----------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{color:#555;font-weight:600}pre{background:#f6f6f6;padding:10px;overflow:auto;font-size:12px}
.plot svg{max-width:100%;height:auto}.dim{color:#666}.warn{color:#a33}
/* report.html#plot-NAME shows that plot alone (used by the screenshot test; no script needed) */
body:has(section:target) section:not(:target){display:none}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _when(t: Any) -> str:
    v = _num(t)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v)) if v is not None else ""


def render(d: ReportData) -> str:
    """The report as one HTML document (needs matplotlib; see :func:`_pyplot`)."""
    plt = _pyplot()
    plots = {"timeline": ("Timeline: states per round", plot_timeline(plt, d)),
             "val": ("Validation metric and gate decision per round", plot_val(plt, d)),
             "step-time": ("Step time per round", plot_step_time(plt, d)),
             "disk": ("Free disk over time, with checkpoint saves", plot_disk(plt, d))}
    parts = [f"<h1>shoprld campaign report: {_e(d.campaign)} / {_e(d.experiment)}</h1>",
             f"<p class=dim>state {_e(d.state)}; {len(d.rounds_done)} of {d.rounds} rounds done; "
             f"written {_e(_when(time.time()))}</p>"]
    for p in d.problems:
        parts.append(f"<p class=warn>{_e(p)}</p>")
    for key, (title, svg) in plots.items():
        parts.append(f'<section id="plot-{key}" class=plot><h2>{_e(title)}</h2>{svg}</section>')
        if key == "timeline" and d.marks:
            parts.append('<section id="marks"><h2>Crashes, restarts, stalls and parks</h2>' + _table(
                ["when", "round", "what", "detail"],
                [(_when(t), f"round-{r:03d}", k, s) for t, r, k, s in d.marks]) + "</section>")
        if key == "val" and d.rounds_done:
            parts.append('<section id="rounds"><h2>Rounds</h2>' + _table(
                ["round", "val", "metric", "gate", "branch", "duration"],
                [(f"round-{r.get('round', 0):03d}", r.get("val"), r.get("metric_name"), r.get("gate"),
                  r.get("branch"), human_duration(_num(r.get("duration_seconds")))) for r in d.rounds_done])
                + "</section>")
    parts.append('<section id="checkpoints"><h2>Checkpoint saves</h2>' + (_table(
        ["when", "round", "iteration", "size", "commit latency"],
        [(_when(c["t"]), f"round-{c['round']:03d}", c["iteration"], human_bytes(_num(c["bytes"])),
          f"{c['latency_ms']:.0f} ms" if _num(c.get("latency_ms")) is not None else "") for c in d.checkpoints])
        if d.checkpoints else "<p class=dim>none journaled yet</p>") + "</section>")
    if d.ledger:
        cols = ["index", "status", "metric_name", "metric_value", "elapsed_min", "branch", "commit", "description"]
        parts.append('<section id="ledger"><h2>Ledger</h2>' + _table(
            cols, [[r.get(c, "")[:12] if c == "commit" else r.get(c, "") for c in cols] for r in d.ledger])
            + "</section>")
    parts.append('<section id="environment"><h2>Environment</h2>'
                 + _table(["", ""], list(d.environment.items())) + "</section>")
    parts.append(f'<section id="config"><h2>Campaign file (secrets masked)</h2><pre>{_e(d.config_text)}</pre>'
                 "</section>")
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>shoprld report: {_e(d.campaign)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(parts) + "\n</body></html>\n")


def default_output(config_path: Path) -> Path:
    """``<campaign file's dir>/<campaign>-report.html`` (the campaign name from the file)."""
    name = str((quick_read(config_path).get("campaign") or {}).get("name") or "campaign")
    return config_path.resolve().parent / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-report.html"


def write_report(config_path: Path, out: Path | None = None) -> Path:
    """Gather, render and write the report atomically; returns its path."""
    _pyplot()  # fail first, in one line, when the extra is missing
    cfg = load_config(config_path)
    own = campaign_files(cfg.source, Layout.from_config(cfg))
    dest = out or default_output(config_path)
    if dest.parent.is_dir():  # refused before any work: a device, a FIFO, the journal, .env, ...
        resolve_output(dest, own, what="report")
    data = gather(config_path)
    page = render(data)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest = write_output(dest, page.encode("utf-8"), own, what="report")
    except OSError as exc:
        raise ConfigError(f"{dest}: cannot write the report ({exc.strerror}); fix: pick another -o path") from None
    return dest


def run_report(config_path: Path, out: Path | None = None) -> int:
    """The ``shoprld report`` command."""
    dest = write_report(config_path, out)
    print(f"wrote {dest}", file=sys.stdout)
    return 0
