"""``shoprld status``'s human view: the document as a terminal or a pipe shows it.

:func:`view` turns the document (:func:`.status.collect`) into rows of styled parts; one
:func:`layout` feeds both renderers, so a terminal and a pipe show the same text, aligned the
same. The command itself (``--json``, ``--watch``) is ``daemon/ops/statuscmd.py``.

Speed budget: see :mod:`.status`. This module imports only the standard library at module
level too. rich is imported lazily, and only for a terminal: piped or redirected output gets
a plain-text rendering of the same view, which is faster, greppable and stable for scripts.
The numbers are written by :mod:`.units`, as everywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.records.status import (
    ACTIVE_STATES,
    FINAL_STATES,
    NOT_STARTED,
    PARKED_STATES,
    STOP_REASONS,
    stop_cost_line,
)
from shoprld.daemon.foundation.system.units import human_bytes, human_count, human_duration, round_label

Part = tuple[str, str]  # (text, rich style); the plain renderer ignores the style
# A view item: ("kv", label, parts) or ("table", label, headers, rows of cells of parts).
Item = tuple[Any, ...]


# -- formatting ------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _ago(t: Any, now: float) -> str:
    v = _num(t)
    return "never" if v is None else f"{human_duration(now - v)} ago"


def _bar(frac: float, width: int, unicode: bool) -> list[Part]:
    frac = min(1.0, max(0.0, frac))
    full = int(frac * width + 0.5)
    on, off = ("█", "░") if unicode else ("#", "-")
    return [(on * full, "green"), (off * (width - full), "dim")]


def _style_for_state(state: Any) -> str:
    if state in FINAL_STATES:
        return {"DONE": "bold green", "STOPPED": "bold yellow", "FAILED": "bold red"}[state]
    if state in PARKED_STATES:
        return "bold red"
    if state in ACTIVE_STATES:
        return "bold cyan"
    return "bold"


# The config's ceiling on rounds (configvalues.MAX_ROUNDS; not imported: this module stays on
# the standard library for status's speed budget) and on counts.
ROUND_MAX = 10_000
COUNT_MAX = 2**62


def _sane_round(r: Mapping[str, Any]) -> bool:
    """A finished round's row has a round index in 0..ROUND_MAX-1 (its numbers are shown as
    ``-`` when not finite)."""
    idx = r.get("round")
    return isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < ROUND_MAX


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def view(st: Mapping[str, Any], now: float, *, unicode: bool = True, config: Path | None = None) -> list[Item]:
    """The human view as data: rows of (text, style) parts, shared by both renderers.
    ``config``: the campaign file, for the resume command of a STOPPED or FAILED campaign.

    It never raises on a malformed snapshot: every field is read defensively, because an
    operator's status command must work even against a buggy engine.
    """
    items: list[Item] = []

    def kv(label: str, *parts: Part) -> None:
        items.append(("kv", label, [p for p in parts if p[0]]))

    d = _dict(st.get("daemon"))
    state = _str(st.get("state"))
    alive = d.get("alive") is True

    kv("campaign", (str(st.get("campaign") or "?"), "bold"), (" / ", "dim"), (str(st.get("experiment") or "?"), "bold"))

    # the daemon
    if alive:
        started = _num(d.get("started_at"))
        up = f", up {human_duration(now - started)}" if started is not None else ""
        kv("daemon", ("alive", "bold green"), (f" (pid {d.get('pid')}{up})", ""))
    elif _num(d.get("last_seen")) is not None:
        last_pid = f" (last pid {d.get('pid')})" if d.get("pid") else ""
        kv("daemon", ("not running", "bold yellow" if state in FINAL_STATES else "bold red"),
           (f", last seen {_ago(d.get('last_seen'), now)}{last_pid}", ""))
    else:
        where = st.get("state_dir") or "the state dir"
        kv("daemon", ("not running", "bold yellow"), (f", never started (no status in {where})", "dim"))

    # state and round: `round 3/5 (round-002)` for the 0-based round 2
    rounds = _int(st.get("rounds"))
    rnd = _int(st.get("round"))
    insane = [f"{k}={str(st.get(k))[:30]}" for k, hi in (("round", ROUND_MAX - 1), ("step", COUNT_MAX))
              if not 0 <= _int(st.get(k)) <= hi]
    if insane:  # a damaged status.json: shown as round 0 / step 0, with a note, never drawn as is
        kv("skipped", (f"{', '.join(insane)} out of range; see the journal", "yellow"))
        rnd = rnd if 0 <= rnd < ROUND_MAX else 0
    shown = min(rnd, rounds - 1) if rounds > 0 else rnd
    if state == NOT_STARTED:
        round_text = f"  {rounds} rounds planned"
    else:
        round_text = f"  {round_label(shown, rounds)}"
    stale = "  (as last seen; the daemon is not running)" if not alive and state in ACTIVE_STATES else ""
    kv("state", (state or "unknown", _style_for_state(state)), (round_text, ""), (stale, "yellow"))

    # step progress, with the rate and the ETA
    step = _int(st.get("step"))
    step = step if 0 <= step <= COUNT_MAX else 0
    spr = _int(st.get("steps_per_round"))
    if spr > 0 and state != NOT_STARTED:
        # A rate and an ETA only while something trains: a stopped, failed or dead campaign has none.
        running = alive and state in ACTIVE_STATES
        step_s = _num(st.get("step_seconds")) if running else None
        eta = _num(st.get("eta_seconds")) if running else None
        if eta is None and step_s is not None:
            eta = max(0, spr - step) * step_s
        rate = ""
        if step_s:
            rate = f"  {step_s:.1f} s/step" if step_s >= 1 else f"  {1 / step_s:.1f} steps/s"
        kv("step", *_bar(step / spr, 24, unicode), (f" {step}/{spr}", "bold"),
           (f"  {100 * max(0, min(step, spr)) // spr}%", ""), (rate, "dim"),
           (f"  ETA {human_duration(eta)}" if eta is not None else "", ""))

    # what a plain stop would lose now (TRAIN only), and the stop that loses nothing
    cost = stop_cost_line(st.get("unsaved")) if alive else None
    if cost:
        kv("unsaved", (cost, "yellow"))

    # the last checkpoint
    ck = st.get("last_checkpoint")
    if isinstance(ck, dict):
        kv("checkpoint", (f"iteration {ck.get('iteration')}", "bold"),
           (f", {_ago(ck.get('committed_at'), now)}, {human_bytes(_num(ck.get('bytes')))}", ""),
           ("  INCOMPLETE" if ck.get("complete") is False else "", "bold yellow"))
        if ck.get("path"):
            kv("", (str(ck.get("path")), "dim"))
    else:
        kv("checkpoint", ("none yet", "dim"))

    # the volume
    disk = st.get("disk")
    if isinstance(disk, dict):
        level = _str(disk.get("level")) or "?"
        lstyle = {"ok": "green", "soft": "bold yellow", "hard": "bold red"}.get(level, "")
        total = _num(disk.get("total_bytes"))
        kv("disk", (f"{disk.get('path')}  free ", ""), (human_bytes(_num(disk.get("free_bytes"))), lstyle or "bold"),
           (f" of {human_bytes(total)}" if total else "", "dim"),
           (f"  (soft {human_bytes(_num(disk.get('soft_limit_bytes')))}, "
            f"hard {human_bytes(_num(disk.get('hard_limit_bytes')))})", ""),
           (f"  {human_count(_num(disk.get('inodes_free')))} inodes free", "dim"),
           ("  [", ""), (level, lstyle), ("]", ""),
           (f"  sampled {_ago(disk.get('sampled_at'), now)}" if _num(disk.get("sampled_at")) else "", "dim"))
    else:
        kv("disk", ("not sampled yet", "dim"))

    # ShopSim
    shop = _dict(st.get("shopsim"))
    healthy = shop.get("healthy")
    health: Part = (("healthy", "green") if healthy is True else ("UNHEALTHY", "bold red") if healthy is False
                    else ("not checked yet", "dim"))
    # The last check is history once the campaign ended or its daemon is gone: the daemon
    # stopped ShopSim with it (or no longer watches it), so "healthy" would be a lie.
    over = state in FINAL_STATES or state in PARKED_STATES
    if over or (not alive and state in ACTIVE_STATES):
        health = (f"not running (stopped with the campaign, {state})" if over
                  else "unknown (the daemon is not running)", "dim")
        shop = {**shop, "free_slots": None, "checked_at": None}
    # The service's own slot count (environment_slots) when it reported one, else the config's.
    served = shop.get("environment_slots") if shop.get("environment_slots") is not None else shop.get("slots")
    slots = f", {shop.get('free_slots')}/{served} slots free" if shop.get("free_slots") is not None else ""
    checked = f" (checked {_ago(shop.get('checked_at'), now)})" if _num(shop.get("checked_at")) else ""
    mismatch: Part = ("", "")
    if isinstance(shop.get("environment_slots"), int) and isinstance(shop.get("slots"), int) \
            and shop["environment_slots"] != shop["slots"]:
        mismatch = (f"  WARNING: the service has {shop['environment_slots']} slots, the config says "
                    f"shopsim.slots = {shop['slots']}", "bold yellow")
    kv("shopsim", (f"{shop.get('url') or '?'}  ", ""), health, (slots, ""), (checked, "dim"), mismatch)

    # children
    kids = _dicts(st.get("children"))
    if kids:
        rows = []
        for c in kids:
            started = _num(c.get("started_at"))
            rows.append([(str(c.get("role", "?")), "bold"), (str(c.get("pid", "?")), ""),
                         (human_duration(now - started) if started is not None else "?", ""),
                         (str(c.get("log") or ""), "dim")])
        items.append(("table", "children", ["role", "pid", "uptime", "log"], rows))
    else:
        kv("children", ("none", "dim"))

    # one row per finished round; a row whose round index or numbers are out of any sane range
    # (a damaged rounds.jsonl or status.json: `"round": 10**30`, NaN) is skipped with a note
    done_all = _dicts(st.get("rounds_done"))
    done = [r for r in done_all if _sane_round(r)]
    if len(done) < len(done_all):
        kv("skipped", (f"{len(done_all) - len(done)} finished round(s) with a round index out of range "
                       f"(not 0..{ROUND_MAX - 1}); see rounds.jsonl", "yellow"))
    if done:
        rows = []
        for r in done:
            val = _num(r.get("val"))
            val = val if val is not None and abs(val) <= COUNT_MAX else None  # NaN, inf: "-"
            gate = _str(r.get("gate"))
            analysis = _str(r.get("analysis"))
            if gate and analysis in ("failed", "silent_empty"):  # the analysis gave the gate nothing
                gate = f"{gate} (analysis {analysis.replace('_', ' ')})"
            idx = r.get("round")
            dur = _num(r.get("duration_seconds"))
            rows.append([(f"round-{idx:03d}" if isinstance(idx, int) else str(idx), ""),
                         (f"{val:.4g}" if val is not None else "-", "bold"), (str(r.get("metric_name") or ""), "dim"),
                         (gate or "-", {"complete": "green", "incomplete": "bold yellow"}.get(gate or "", "bold yellow" if gate else "dim")),
                         (str(r.get("branch") or "-"), ""), (human_duration(dur) if dur is not None else "-", "")])
        items.append(("table", "rounds", ["round", "val", "metric", "gate", "branch", "duration"], rows))
    else:
        kv("rounds", ("none finished yet", "dim"))

    # the stop conditions
    reason = _str(st.get("stop_reason"))
    sc = _dict(st.get("stop_conditions"))
    deadline = _num(sc.get("deadline")) or _num(st.get("deadline"))
    if reason:
        style = "bold green" if reason == "done" else "bold yellow"
        kv("stop", (f"stopped: {STOP_REASONS.get(reason, reason)}", style))
    elif state in FINAL_STATES or state in PARKED_STATES:
        kv("stop", (f"stopped ({state})", "bold yellow"))
    if state in ("STOPPED", "FAILED") and not alive:
        cmd = f"shoprld run -c {config}" if config is not None else "shoprld run -c <campaign file>"
        unit = f"shoprld@{config.stem}" if config is not None else "shoprld@NAME"
        first = "fix the cause above, then " if state == "FAILED" else ""
        kv("resume", (f"{first}{cmd}", "bold"), (f"  (under systemd: systemctl start {unit})", "dim"))
    else:
        n_done = _int(sc.get("rounds_done"), len(done))
        n_all = _int(sc.get("rounds"), rounds)
        if deadline is None:
            left = "no deadline"
        elif deadline > now:
            left = f"{human_duration(deadline - now)} left"
        else:
            left = f"deadline passed {human_duration(now - deadline)} ago"
        kv("stop", (f"stop condition not yet met: {n_done}/{n_all} rounds, {left}", ""))

    plan = _dict(st.get("plan"))
    if plan and state in ACTIVE_STATES:
        med = _num(plan.get("median_round_seconds"))
        eta = _num(plan.get("campaign_eta_seconds"))
        parts: list[Part] = [(f"campaign ETA {human_duration(eta)}" if eta is not None else
                              "campaign ETA unknown until a round finishes", "bold" if eta is not None else "dim")]
        if med is not None:
            parts.append((f"  (~{human_duration(med)} a round)", "dim"))
        nxt = plan.get("next_round")
        if isinstance(nxt, int):
            def yes_no(v: Any) -> Part:
                return ("yes", "green") if v is True else ("NO", "bold red") if v is False else ("?", "dim")

            has_deadline = _num(_dict(st.get("stop_conditions")).get("deadline")) or _num(st.get("deadline"))
            parts += [(f"  next {round_label(nxt, rounds)} fits: deadline ", ""),
                      yes_no(plan.get("fits_deadline")) if has_deadline else ("none set", "dim"),
                      (", disk ", ""), yes_no(plan.get("fits_disk"))]
        kv("plan", *parts)

    saves = _dict(st.get("saves"))  # issue 17: the last launch's save interval (daemon/round/saves.py)
    if saves.get("summary"):
        kv("saves", (str(saves["summary"]), "" if saves.get("mid_round") or saves.get("mode") == "fixed" else "yellow"))
    err = st.get("last_error")
    kv("last error", (str(err), "red") if err else ("none", "dim"))
    lf = _dict(st.get("last_failure"))
    if lf:  # issue 18: the last failed attempt, its cause and its crash bundle
        kv("failure", (f"{lf.get('round_id', '?')} {lf.get('state', '?')} attempt {lf.get('attempt', '?')}: "
                       f"{lf.get('cause', 'unknown')}" + (f" ({lf['detail']})" if lf.get("detail") else ""), "red"))
        if lf.get("advice"):
            kv("", (f"fix: {lf['advice']}", ""))
        kv("", (f"bundle: {lf.get('bundle', '?')}", "dim"))
    warnings = st.get("warnings")
    for i, w in enumerate(warnings if isinstance(warnings, list) else []):
        kv("warnings" if i == 0 else "", (f"! {w}", "yellow"))
    return items


# -- renderers -------------------------------------------------------------------------

LABEL_WIDTH = 11


def layout(items: list[Item]) -> list[list[Part]]:
    """The view laid out as lines of styled parts: a label column, then the value.

    Both renderers use it, so a terminal and a pipe show the same text, aligned the same.
    (Not rich's Table: laying out by hand keeps rich.table's import and its ~15 ms layout
    pass off the 200 ms budget.)
    """
    lines: list[list[Part]] = []
    for item in items:
        if item[0] == "kv":
            _, label, parts = item
            lines.append([(f"{label:<{LABEL_WIDTH}}", "bold"), *parts])
            continue
        _, label, headers, rows = item
        grid: list[list[Part]] = [[(h, "dim") for h in headers], *rows]
        widths = [max(len(r[i][0]) for r in grid) for i in range(len(headers))]
        for n, row in enumerate(grid):
            line: list[Part] = [(f"{label if n == 0 else '':<{LABEL_WIDTH}}", "bold")]
            for i, (text, style) in enumerate(row):
                line.append((text if i == len(row) - 1 else text.ljust(widths[i]) + "  ", style))
            lines.append(line)
    return lines


def render_plain(items: list[Item]) -> str:
    """The view as plain text (pipes, files, scripts)."""
    return "".join("".join(t for t, _ in line).rstrip() + "\n" for line in layout(items))


def render_rich(items: list[Item], console: Any) -> Any:
    """The view as a rich renderable for ``console`` (colour, NO_COLOR, Live).

    Long values wrap under the value column (a hanging indent), not under the labels.
    """
    from rich.console import Group  # lazy: rich only for a terminal (module docstring)
    from rich.text import Text

    indent = Text(" " * LABEL_WIDTH)
    out: list[Any] = []
    for label, *parts in layout(items):
        body = Text.assemble(*parts)
        for n, piece in enumerate(body.wrap(console, max(20, console.width - LABEL_WIDTH))):
            out.append(Text.assemble(Text(*label) if n == 0 else indent, piece))
    return Group(*out)
