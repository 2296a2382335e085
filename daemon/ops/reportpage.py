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
import math
import time
from collections.abc import Sequence
from typing import Any

from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.system.units import human_bytes, human_duration
from shoprld.daemon.ops.reportdata import ReportData, as_int, as_num
from shoprld.daemon.ops.trainlog import X_ROLLOUT, X_STEP

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
PLOTS = ("timeline", "val", "curves", "step-time", "disk")


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


def _svg(plt: Any, fig: Any, *, wide: bool = False) -> str:
    """The figure as inline SVG. ``wide`` (a time axis): on a phone it keeps a readable width and
    pans sideways in its own box; the others shrink to the screen's width."""
    buf = io.StringIO()
    # No metadata: matplotlib's default RDF block names creativecommons/purl URLs.
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    plt.close(fig)
    text = buf.getvalue()
    # Inline SVG (no XML prolog or DOCTYPE), in a box that pans sideways on a narrow screen.
    return f'<div class="fig{" wide" if wide else ""}">{text[text.index("<svg"):]}</div>'


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
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.42 * lanes))
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
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.6 / (0.75 * (0.9 + 0.42 * lanes))),
              ncol=4, frameon=False)
    return _svg(plt, fig, wide=True)


GATE_COLOURS = {"complete": "#009E73", "incomplete": "#E69F00"}
VAL_COLOUR, REWARD_COLOUR, BASE_COLOUR = "#0072B2", "#CC79A7", "#D55E00"


def plot_val(plt: Any, d: ReportData) -> str:
    """Success rate and reward per round with ±1 s.e. bars from the val tool's own N and s.e.,
    and the base model's line (with its ±1 s.e. band) when one was recorded."""
    from matplotlib.lines import Line2D  # lazy: optional extra [report]

    fig, ax = plt.subplots(figsize=(6.2, 3.4))
    rows = [r for r in d.rounds_done if as_num(r.get("val")) is not None and as_int(r.get("round")) is not None]
    if not rows and d.base is None:
        _empty(ax, "no round validated yet")
        return _svg(plt, fig)
    handles: list[Any] = []
    if rows:
        xs = [r["round"] for r in rows]
        ys = [float(r["val"]) for r in rows]
        errs = [_or_nan(d.vals[x].success_sem() if x in d.vals else None) for x in xs]
        ax.errorbar(xs, ys, yerr=errs, color=VAL_COLOUR, linewidth=1.5, capsize=4, elinewidth=1.2, zorder=3)
        ax.scatter(xs, ys, c=[GATE_COLOURS.get(str(r.get("gate")), "#999999") for r in rows], s=46, zorder=4,
                   edgecolors=VAL_COLOUR, linewidths=1.2)
        handles.append(Line2D([], [], color=VAL_COLOUR, marker="o", label=f"{rows[0].get('metric_name') or 'val'}"
                              " ±1 s.e. (N = counts.completed)"))
        rx = [x for x in xs if x in d.vals and d.vals[x].reward_mean is not None]
        if rx:
            ax.errorbar([x + 0.12 for x in rx], [d.vals[x].reward_mean for x in rx],
                        yerr=[_or_nan(d.vals[x].reward_sem) for x in rx], color=REWARD_COLOUR, marker="s",
                        markersize=4, linewidth=1, linestyle=":", capsize=3, zorder=2)
            handles.append(Line2D([], [], color=REWARD_COLOUR, marker="s", linestyle=":",
                                  label="reward_mean ±1 s.e. (the tool's reward_sem)"))
        for g in sorted({str(r.get("gate")) for r in rows}):
            handles.append(Line2D([], [], color=GATE_COLOURS.get(g, "#999999"), marker="o", linestyle="none",
                                  label=f"gate: {g}"))
        ax.set_xticks(xs, [f"r{x:03d}" for x in xs])
    if d.base is not None and d.base.success_rate is not None:
        b, sem = d.base.success_rate, d.base.success_sem()
        ax.axhline(b, color=BASE_COLOUR, linestyle="--", linewidth=1.2, zorder=1)
        if sem:
            ax.axhspan(b - sem, b + sem, color=BASE_COLOUR, alpha=0.12, linewidth=0, zorder=0)
        handles.append(Line2D([], [], color=BASE_COLOUR, linestyle="--",
                              label=f"base model {b:.3g} ±1 s.e. (N={d.base.n})"))
    ax.set_xlabel("round")
    ax.set_ylabel("val (bare)")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", color="#eeeeee", linewidth=0.8)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return _svg(plt, fig)


def _or_nan(v: float | None) -> float:
    return float("nan") if v is None else v


# The trainer's metrics worth a chart first (slime's names; the stand-in logs rollout/reward), in
# this order; then eval/* and the rest alphabetically, up to MAX_CURVES charts. The rest are named.
PREFERRED_CURVES = ("rollout/raw_reward", "rollout/rewards", "rollout/reward", "perf/step_time", "train/loss",
                    "train/pg_loss", "train/grad_norm", "train/kl_loss", "train/ppo_kl", "train/entropy_loss",
                    "rollout/response_len/mean", "rollout/response_lengths", "rollout/truncated_ratio",
                    "perf/rollout_time")
MAX_CURVES = 8
SMOOTH_FROM = 12  # a round with this many points gets a running mean over its raw line


def running_mean(ys: Sequence[float], window: int) -> list[float]:
    """The trailing mean of the last ``window`` values (fewer at the start)."""
    out: list[float] = []
    total = 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= window:
            total -= ys[i - window]
        out.append(total / min(i + 1, window))
    return out


def pick_curves(d: ReportData) -> tuple[list[tuple[str, str]], list[str]]:
    """([(x kind, metric)] to chart, [the other metric names]) over every round's TRAIN log."""
    found: dict[str, str] = {}
    for c in d.curves.values():
        for key in c.step:
            found.setdefault(key, X_STEP)
        for key in c.rollout:
            found[key] = X_ROLLOUT  # a name in both: the rollout axis (the campaign's own)
    order = [k for k in PREFERRED_CURVES if k in found]
    order += sorted(k for k in found if k.startswith("eval/") and k not in order)
    order += sorted(k for k in found if k not in order)
    return [(found[k], k) for k in order[:MAX_CURVES]], order[MAX_CURVES:]


def plot_curve(plt: Any, d: ReportData, kind: str, key: str) -> str:
    """One metric over the campaign: a line per round (x: slime's rollout id, or optimizer step)."""
    from matplotlib import colormaps  # lazy: optional extra [report]

    fig, ax = plt.subplots(figsize=(5.2, 2.7))
    rounds = sorted(r for r, c in d.curves.items() if key in (c.step if kind == X_STEP else c.rollout))
    cmap = colormaps["viridis"]
    smoothed = 0
    for i, r in enumerate(rounds):
        series = (d.curves[r].step if kind == X_STEP else d.curves[r].rollout)[key]
        xs = sorted(series)
        colour = cmap(0.85 * i / max(len(rounds) - 1, 1))
        ys = [series[x] for x in xs]
        if len(xs) < SMOOTH_FROM:
            ax.plot(xs, ys, color=colour, linewidth=1.2, marker=".", markersize=3, label=f"r{r:03d}")
            continue
        # Per-rollout values are noisy (a batch of episodes each): thin raw line, thick running mean.
        window = max(3, len(xs) // 10)
        ax.plot(xs, ys, color=colour, linewidth=0.7, alpha=0.35)
        ax.plot(xs, running_mean(ys, window), color=colour, linewidth=1.8, label=f"r{r:03d}")
        smoothed = max(smoothed, window)
    if smoothed:
        ax.text(0.0, 1.0, f"thin: each value; thick: running mean of {smoothed}", fontsize=7, color="#666666",
                transform=ax.transAxes, va="bottom", ha="left")
    ax.set_title(key, fontsize=9, loc="left", pad=12 if smoothed else 4)
    ax.set_xlabel("optimizer step" if kind == X_STEP else "rollout (slime's rollout id)")
    ax.grid(color="#eeeeee", linewidth=0.8)
    if len(rounds) <= 8:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=min(len(rounds), 4), frameon=False,
                  fontsize=8)
    else:
        ax.text(1.0, -0.32, f"{len(rounds)} rounds; colour: early (dark) to late (light)", fontsize=8,
                ha="right", transform=ax.transAxes, color="#555555")
    return _svg(plt, fig)


def plot_step_time(plt: Any, d: ReportData) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
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
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
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
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)
    return _svg(plt, fig, wide=True)


# -- the page ----------------------------------------------------------------------------------

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;padding:0 12px;max-width:1100px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px;overflow-wrap:anywhere}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{color:#555;font-weight:600}pre{background:#f6f6f6;padding:10px;overflow:auto;font-size:12px;max-width:100%}
.scroll{overflow-x:auto;max-width:100%}
.fig{overflow-x:auto;max-width:100%}.fig svg{max-width:100%;height:auto;display:block}
.scroll td{white-space:nowrap}.scroll td:last-child{white-space:normal;min-width:14em;overflow-wrap:anywhere}.dim{color:#666}.warn{color:#a33}
p,li,dd,.card{overflow-wrap:anywhere}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(160px,1fr));gap:8px}
.card{border:1px solid #ddd;border-radius:6px;padding:6px 10px}.card b{display:block;color:#555;font-size:12px}
.card.bad{border-color:#D55E00}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:10px}
.failure{border-left:4px solid #D55E00;padding:4px 10px;margin:8px 0;background:#fdf6f2}
.failure code{font-size:12px;overflow-wrap:anywhere;white-space:pre-wrap}
@media (max-width:600px){body{margin:10px auto;padding:0 8px;font-size:13px}h1{font-size:18px}
  .grid{grid-template-columns:1fr}td,th{padding:2px 6px 2px 0}
  /* a plot is never shrunk below readable: it pans sideways in its own box, the page does not */
  .fig svg{width:100%}.fig.wide svg{width:540px;max-width:none}}
/* report.html#plot-NAME shows that plot alone (used by the screenshot test; no script needed) */
body:has(section:target) section:not(:target){display:none}
"""

SMALL_N = 30  # below this many val episodes the page says the error bars are wide


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table in a box that scrolls sideways by itself, so a narrow screen never scrolls the page."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div class=scroll><table><tr>{head}</tr>{body}</table></div>"


def _when(t: Any) -> str:
    v = as_num(t)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v)) if v is not None else ""


def _pm(v: float | None, sem: float | None) -> str:
    if v is None:
        return ""
    return f"{v:.3f} ± {sem:.3f}" if sem is not None else f"{v:.3f}"


def best_round(d: ReportData) -> str:
    """The best validated round, its ±1 s.e., and the rounds (and base) it cannot be told from."""
    rows = [r for r in d.rounds_done if as_num(r.get("val")) is not None]
    if not rows:
        return "none validated yet"
    best = max(rows, key=lambda r: float(r["val"]))
    b, st = float(best["val"]), d.vals.get(best["round"])
    sem = st.success_sem() if st else None
    text = f"round-{best['round']:03d}: {_pm(b, sem)}" + (f" (N={st.n})" if st and st.n is not None else "")
    if sem:
        close = [f"round-{r['round']:03d}" for r in rows if r is not best and float(r["val"]) >= b - sem]
        if close:
            text += f"; within 1 s.e. of {', '.join(close[:4])}{' ...' if len(close) > 4 else ''}"
    if d.base is not None and d.base.success_rate is not None:
        text += f"; base model {_pm(d.base.success_rate, d.base.success_sem())}"
    return text


def header(d: ReportData) -> str:
    """What a morning reader wants first: where it stands, how long, the best round, and what went wrong."""
    c = d.counts
    wall = human_duration(d.span[1] - d.span[0]) if d.span else "not started"
    since = f" since {_when(d.span[0])}" if d.span else ""
    by_cause: dict[str, int] = {}
    for f in d.failures:
        by_cause[f["cause"]] = by_cause.get(f["cause"], 0) + 1
    causes = ", ".join(f"{k} ×{n}" for k, n in sorted(by_cause.items(), key=lambda kv: -kv[1]))
    cards = [("state", f"{d.state or 'unknown'}: {len(d.rounds_done)} of {d.rounds} rounds done", False),
             ("wall time", f"{wall}{since}", False),
             ("best round", best_round(d), False),
             ("restarts", f"{c.get('crashes', 0)} daemon crash(es) resumed, {c.get('retries', 0)} stage "
                          f"retries, {c.get('shopsim_restarts', 0)} ShopSim restarts",
              bool(c.get("crashes") or c.get("retries"))),
             ("stalls", str(c.get("stalls", 0)), bool(c.get("stalls"))),
             ("failed attempts", f"{len(d.failures)}" + (f": {causes}" if causes else ""), bool(d.failures))]
    out = ['<section id="summary"><div class=cards>']
    out += [f'<div class="card{" bad" if bad else ""}"><b>{_e(k)}</b>{_e(v)}</div>' for k, v, bad in cards]
    out.append("</div>")
    if d.failures:
        out.append("<h2>Failures</h2>")
        for f in d.failures[-30:]:
            exit_status = f" exit {f['exit_status']}" if f.get("exit_status") is not None else ""
            out.append(
                f"<div class=failure><b>round-{f['round']:03d} {_e(f['state'])} attempt {_e(f['attempt'])}</b> "
                f"<span class=dim>{_e(_when(f['t']))}{_e(exit_status)}</span><br>"
                f"cause <b>{_e(f['cause'])}</b>" + (f": <code>{_e(f['detail'][:400])}</code>" if f["detail"] else "")
                + (f"<br>fix: {_e(f['advice'])}" if f["advice"] else "")
                + (f"<br>bundle: <code>{_e(f['bundle'])}</code>" if f["bundle"] else "") + "</div>")
        if len(d.failures) > 30:
            out.append(f"<p class=dim>{len(d.failures) - 30} older failures: see the journal</p>")
    out.append("</section>")
    return "\n".join(out)


def val_notes(d: ReportData) -> str:
    """The caption that says how much the val plot can be trusted."""
    ns = sorted({v.n for v in d.vals.values() if v.n})
    parts = ["Bars: ±1 standard error. Success rate: √(p(1−p)/N) over the val tool's N "
             "(<code>counts.completed</code>); reward: the tool's own <code>primary.reward_sem</code>."]
    if ns:
        typical = min(ns)
        parts.append(f"With N={typical} one s.e. of a success rate near 0.5 is {math.sqrt(0.25 / typical):.2f}: "
                     f"differences smaller than about twice that are noise.")
    small = [f"round-{r:03d} (N={v.n})" for r, v in sorted(d.vals.items()) if v.n is not None and v.n < SMALL_N]
    if small:
        parts.append(f'<span class=warn>Small N (under {SMALL_N} episodes): {_e(", ".join(small[:10]))}; '
                     "its bars are wide, read its points as rough.</span>")
    if d.vals and not ns:
        parts.append("<span class=warn>No episode completed in any val: the points carry no weight.</span>")
    parts.append(_e(f"Base model: {d.base_note}") if d.base_note else "")
    return "<p class=dim>" + " ".join(p for p in parts if p) + "</p>"


def curves_section(plt: Any, d: ReportData) -> str:
    """The per-step charts (a grid: two or three a row on a desktop, one on a phone)."""
    chosen, others = pick_curves(d)
    if not chosen:
        fig, ax = plt.subplots(figsize=(7.5, 2.0))
        _empty(ax, "no trainer metric line in any TRAIN log yet")
        return _svg(plt, fig)
    out = ["<div class=grid>"] + [f"<div>{plot_curve(plt, d, kind, key)}</div>" for kind, key in chosen]
    out.append("</div>")
    lines = sum(c.lines for c in d.curves.values())
    out.append(f"<p class=dim>From slime's own metric lines (<code>perf N</code>, <code>rollout N</code>, "
               f"<code>step N</code>) in {len(d.curves)} round(s)' TRAIN logs: {lines} lines read.")
    if others:
        out.append(f" Also logged: {_e(', '.join(others[:40]))}{' ...' if len(others) > 40 else ''}.")
    dropped = sum(c.dropped_keys + c.dropped_points for c in d.curves.values())
    if dropped:
        out.append(f" {dropped} values over the per-round limits were not kept.")
    out.append("</p>")
    return "".join(out)


def render(d: ReportData) -> str:
    """The report as one HTML document (needs matplotlib; see :func:`_pyplot`)."""
    plt = _pyplot()
    plots = {"timeline": ("Timeline: states per round", plot_timeline(plt, d)),
             "val": ("Validation per round (bare val), with the base model", plot_val(plt, d)),
             "curves": ("Training curves per step (from the TRAIN logs)", curves_section(plt, d)),
             "step-time": ("Step time per round", plot_step_time(plt, d)),
             "disk": ("Free disk over time, with checkpoint saves", plot_disk(plt, d))}
    parts = [f"<h1>shoprld campaign report: {_e(d.campaign)} / {_e(d.experiment)}</h1>",
             f"<p class=dim>written {_e(_when(time.time()))}</p>", header(d)]
    for p in d.problems:
        parts.append(f"<p class=warn>{_e(p)}</p>")
    for key, (title, svg) in plots.items():
        caption = val_notes(d) if key == "val" else ""
        parts.append(f'<section id="plot-{key}" class=plot><h2>{_e(title)}</h2>{svg}{caption}</section>')
        if key == "timeline" and d.marks:
            parts.append('<section id="marks"><h2>Crashes, restarts, stalls and parks</h2>' + _table(
                ["when", "round", "what", "detail"],
                [(_when(t), f"round-{r:03d}", k, s) for t, r, k, s in d.marks]) + "</section>")
        if key == "val" and d.rounds_done:
            parts.append('<section id="rounds"><h2>Rounds</h2>' + _table(
                ["round", "success ±1 s.e.", "reward ±1 s.e.", "N", "gate", "branch", "duration"],
                [(f"round-{r['round']:03d}", _pm(as_num(r.get("val")), _sem(d, r["round"])),
                  _pm(d.vals[r["round"]].reward_mean, d.vals[r["round"]].reward_sem) if r["round"] in d.vals else "",
                  _n(d, r["round"]), r.get("gate"), r.get("branch"), human_duration(as_num(r.get("duration_seconds"))))
                 for r in d.rounds_done]) + "</section>")
    parts.append('<section id="checkpoints"><h2>Checkpoint saves</h2>' + (_table(
        ["when", "round", "iteration", "size", "commit latency"],
        [(_when(c["t"]), f"round-{c['round']:03d}", c["iteration"], human_bytes(as_num(c["bytes"])),
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
            '<meta name=viewport content="width=device-width, initial-scale=1">'
            f"<title>shoprld report: {_e(d.campaign)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(parts) + "\n</body></html>\n")


def _sem(d: ReportData, r: int) -> float | None:
    return d.vals[r].success_sem() if r in d.vals else None


def _n(d: ReportData, r: int) -> str:
    v = d.vals.get(r)
    if v is None or v.n is None:
        return ""
    return f"{v.n} of {v.requested}" if v.requested is not None else str(v.n)
