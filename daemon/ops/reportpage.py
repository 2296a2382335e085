"""The page of ``shoprld report``: the plots (matplotlib, inline SVG) and the HTML around them.

:func:`render` turns a :class:`~.reportdata.ReportData` into HTML with every plot inline as SVG
(no script, no stylesheet or font from the network: the file opens on an air-gapped laptop).
The plots are drawn by matplotlib on its Agg/SVG backend, an optional extra (``pip install
'shoprld[report]'``): only this module imports it, lazily, and the daemon never imports it.
Without the extra, ``shoprld report`` says so in one line and exits 3.
"""

from __future__ import annotations

import html
import io
import time
from collections.abc import Sequence
from typing import Any

from shoprld.daemon.foundation.errors import ConfigError
from shoprld.daemon.foundation.statusview import fmt_bytes, fmt_duration
from shoprld.daemon.ops.reportdata import ReportData, as_int, as_num

INSTALL_HINT = "pip install 'shoprld[report]'"
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
    rows = [r for r in d.rounds_done if as_num(r.get("val")) is not None and as_int(r.get("round")) is not None]
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
    v = as_num(t)
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
                  r.get("branch"), fmt_duration(as_num(r.get("duration_seconds")))) for r in d.rounds_done])
                + "</section>")
    parts.append('<section id="checkpoints"><h2>Checkpoint saves</h2>' + (_table(
        ["when", "round", "iteration", "size", "commit latency"],
        [(_when(c["t"]), f"round-{c['round']:03d}", c["iteration"], fmt_bytes(as_num(c["bytes"])),
          f"{c['latency_ms']:.0f} ms" if as_num(c.get("latency_ms")) is not None else "") for c in d.checkpoints])
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
