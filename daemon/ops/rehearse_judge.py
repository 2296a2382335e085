"""``shoprld rehearse``'s verdicts: each stage against the tools contract, pass by pass.

A rehearsal may drive the engine more than once (``rehearse.py``): a pass ends where a stage
fails, and the next one resumes with that stage switched off, so that every stage that can
run does. Each pass is judged on its own (its journal lines, the tool records it made); the
passes are then merged: a stage's first mismatch wins, else ``ok`` if it ran fine in some
pass, else ``not reached: needs X`` (X: the input it never got).

A mismatch names the file or printed payload, the field, and what the real tool does, with
the section of ``shared/contracts/shopsimrl-tools.md`` that says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.tools.payload import ToolOutputError, last_json_object

CONTRACT = "tools contract"  # ../shared/contracts/shopsimrl-tools.md, the recorded truth about the real tools
TRAINER = "train.command (slime stand-in)"
STAGES: tuple[tuple[str, str], ...] = (
    ("preflight", "PREFLIGHT_DISK"), ("shopsim", "START_SHOPSIM"), ("train.emit_command", "TRAIN"),
    ("train.check_command", "TRAIN"), ("sidecar.command", "TRAIN"), (TRAINER, "TRAIN"),
    ("export", "EXPORT_HF"), ("val.command", "VAL"), ("gate.analyze_command", "GATE"), ("gate.command", "GATE"),
    ("inject.command", "INJECT"), ("ledger row", "NEXT_ROUND"),
)
TOOLS = ("train.emit_command", "train.check_command", "sidecar.command", "val.command", "gate.analyze_command",
         "gate.command", "inject.command")
# The contract's section on each tool (what a mismatch is measured against).
SECTION = {"train.emit_command": "§2", "train.check_command": "§3.2", "sidecar.command": "§3.1",
           "val.command": "§6", "gate.analyze_command": "§5", "gate.command": "§7", "inject.command": "§8"}
# What a stage needs from the ones before it: said when it is not reached.
NEEDS = {
    "shopsim": "a passed preflight",
    "train.emit_command": "a ready ShopSim",
    "train.check_command": "runs/loop/{rid}/slime.yaml (train.emit_command)",
    "sidecar.command": "runs/loop/{rid}/analysis.yaml (train.emit_command) and a trainer to watch",
    TRAINER: "runs/loop/{rid}/slime.yaml (train.emit_command)",
    "export": "the trainer's final checkpoint",
    "val.command": "this round's HF export",
    "gate.analyze_command": "this round's training, ShopSim and the analyst's API, in GATE (or VAL, overlapped)",
    "gate.command": "a bare val summary.json the daemon accepts (val.command)",
    "inject.command": "GATE's decision, the next SkillBank (gate.command)",
    "ledger row": "INJECT's decision (inject.command)",
}
# slime's own progress lines, whatever prefix Ray gives them (contract §10).
_SLIME_PROGRESS = re.compile(r"- (?:rollout|perf|step) \d+: ")
_TRAINER_START = re.compile(r"^=== shoprld \S+ start trainer", re.M)
# The line a Python traceback ends with (``KeyError: 'rho'``, ``FileNotFoundError: [Errno 2] ...``).
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")


def _rel(path: Path, runs: Path) -> str:
    try:
        return f"runs/{path.relative_to(runs)}"
    except ValueError:
        return str(path)


def read_records(records: Path, names: set[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The tool records under ``records`` (only those named in ``names`` when given), by stage."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(records.glob("*.json")):
        if names is not None and f.name not in names:
            continue
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out.setdefault(doc.get("stage", "?"), []).append(doc)
    return out


def payload_problem(stage: str, rec: dict[str, Any], *, need: tuple[str, ...] = ("status",),
                    status: str | None = None) -> str | None:
    """The tool's final JSON payload per the contract (indented, at the end of stdout)."""
    text = rec.get("stdout", "")
    try:
        obj = last_json_object(text, source=stage)
    except ToolOutputError:
        return (f"{stage} printed no JSON object on stdout (the real tool prints its payload as indented JSON "
                "at the end)")
    tail = text[text.rstrip().rfind("\n{") + 1:] if "\n{" in text else text
    indented = "\n" in tail.strip()
    for key in need:
        if key not in obj:
            shape = "an indented" if indented else "a one-line"
            return f"{stage} printed {shape} JSON object without `{key}` (seen keys: {', '.join(sorted(obj)[:8])})"
    if not indented:
        return f"{stage} printed its JSON payload on one line; the real tool prints it indented ({CONTRACT} §0)"
    if status is not None and obj.get("status") != status:
        return f"{stage} reported status {obj.get('status')!r}, not {status!r}"
    return None


def exit_problem(stage: str, rec: dict[str, Any], want: int = 0) -> str | None:
    rc = rec.get("returncode")
    if rc == want:
        return None
    line = decisive_line(str(rec.get("stderr_tail", "")))
    return f"{stage} exited {rc}{f' ({line})' if line else ''}, expected {want}"


def decisive_line(text: str) -> str:
    """The line that says why a program died: a traceback's exception line, else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("=== shoprld")]
    exc = [ln for ln in lines if _EXCEPTION.match(ln)]
    return (exc[-1] if exc else lines[-1] if lines else "")[:240]


def _has_exception(text: str) -> bool:
    return any(_EXCEPTION.match(ln.strip()) for ln in text.splitlines())


def latest(path: Path) -> Path | None:
    """``path``, or when the daemon archived it (``<name>.archived-N``, e.g. GATE archives an
    unreadable ``analysis_summary.json`` before it retries) its newest archived copy."""
    if path.exists():
        return path
    copies = [p for p in path.parent.glob(f"{path.name}.archived-*") if p.name.rsplit("-", 1)[-1].isdigit()]
    return max(copies, key=lambda p: int(p.name.rsplit("-", 1)[-1]), default=None)


def lacks(path: Path, keys: tuple[str, ...], runs: Path) -> str | None:
    """The first of ``keys`` (dotted) missing from the JSON file ``path`` (or its archived copy)."""
    found = latest(path)
    if found is None:
        # A whole run dir archived: runs/<dir>.archived-N/<file>.
        parent = latest(path.parent)
        found = parent / path.name if parent is not None and (parent / path.name).exists() else None
    if found is None:
        return f"{path.name} was not written ({_rel(path, runs)})"
    where = _rel(found, runs) + ("" if found == path else ", archived by the daemon")
    try:
        data = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{path.name} is not valid JSON ({type(exc).__name__}; {where})"
    for dotted in keys:
        cur: Any = data
        seen = "the file"
        for part in dotted.split("."):
            if not isinstance(cur, dict) or part not in cur:
                has = ", ".join(sorted(cur)[:10]) if isinstance(cur, dict) else f"a {type(cur).__name__}"
                return f"{path.name} lacks `{dotted}` ({where}; {seen} has: {has or 'nothing'})"
            cur, seen = cur[part], f"`{part}`"
    return None


def analyst_errors(cards: Path) -> str | None:
    """ANALYST_ERROR failure cards (latest per retry trace): the analyst never judged those
    retries, yet the sidecar and analyze still exit 0 with success-shaped counts (contract: a
    failed analysis is silent), so the round would get 0 candidates from them unnoticed."""
    found: dict[str, dict[str, Any]] = {}
    try:
        lines = cards.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for ln in lines:
        try:
            card = json.loads(ln)
        except ValueError:
            continue
        if isinstance(card, dict) and isinstance(card.get("source_trajectory_id"), str):
            found[card["source_trajectory_id"]] = card
    errs = [c for c in found.values() if c.get("status") == "ANALYST_ERROR"]
    if not errs:
        return None
    err = errs[0].get("error") if isinstance(errs[0].get("error"), dict) else {}
    return (f"the analyst failed on {len(errs)} of {len(found)} full-skill retry traces (ANALYST_ERROR "
            f"{err.get('type', '?')}: {str(err.get('message', ''))[:240]}); their cards count as analyzed but "
            "give no candidates")


@dataclass
class Pass:
    """One engine run of a rehearsal: its config, journal lines and tool records."""

    cfg: Config
    layout: Layout
    journal: list[dict[str, Any]]
    records: dict[str, list[dict[str, Any]]]
    trainer_log: str = ""  # the train log written during this pass
    verdicts: dict[str, str] = field(default_factory=dict)
    blamed: str | None = None  # the stage the engine failed in (or "engine")
    message: str = ""
    stopped: bool = False  # the engine was stopped (the time limit, a signal), not failed


def tool_verdicts(p: Pass) -> dict[str, str | None]:
    """Each tool that ran in this pass against the contract (None: it matches)."""
    runs, rid, nxt = p.layout.runs, "round-000", "round-001"
    out: dict[str, str | None] = {}

    def last(stage: str) -> dict[str, Any] | None:
        return p.records.get(stage, [None])[-1]

    if (r := last("train.emit_command")) is not None:
        lines = [ln for ln in r["stdout"].splitlines() if ln.strip()]
        missing = [n for n in ("slime", "analysis", "val", "gate") if not (runs / "loop" / rid / f"{n}.yaml").is_file()]
        out["train.emit_command"] = exit_problem("train.emit_command", r) or (
            f"train.emit_command did not write {', '.join(f'{n}.yaml' for n in missing)} in runs/loop/{rid}"
            if missing else None) or (
            f"train.emit_command printed {len(lines)} lines; the real emitter prints one (the loop dir)"
            if len(lines) != 1 else None) or next(
            (f"train.emit_command: {n}" for n in r.get("notes", []) if "failed" in n), None)
    if (r := last("train.check_command")) is not None:
        out["train.check_command"] = exit_problem("train.check_command", r) or payload_problem(
            "train.check_command", r, status="ready")
    if (r := last("sidecar.command")) is not None:
        out["sidecar.command"] = exit_problem("sidecar.command", r) or payload_problem(
            "sidecar.command", r, status="watched")
    if (r := last("val.command")) is not None:
        out["val.command"] = exit_problem("val.command", r) or lacks(
            runs / f"{rid}-bare-val" / "summary.json",
            ("schema_version", "counts.requested", "counts.completed", "counts.failed", "counts.coverage",
             "primary.reward_mean", "primary.success_rate"), runs)
    if (r := last("gate.analyze_command")) is not None:
        adir = runs / f"{rid}-online-analysis"
        summary = latest(adir / "analysis_summary.json")
        try:
            failed_shape = summary is not None and json.loads(summary.read_text()).get("status") == "failed"
        except (OSError, ValueError, AttributeError):
            failed_shape = False
        keys = ("schema_version", "error.type", "error.message") if failed_shape else (
            "schema_version", "triage_groups", "analyzed_cards", "eligible_cards", "candidates")
        out["gate.analyze_command"] = exit_problem("gate.analyze_command", r) or payload_problem(
            "gate.analyze_command", r, need=()) or lacks(adir / "analysis_summary.json", keys, runs) or lacks(
            adir / "candidate_pool.json", ("schema_version", "candidates"), runs) or analyst_errors(
            adir / "failure_cards.jsonl")
    if (r := last("gate.command")) is not None:
        out["gate.command"] = _gate_verdict(p, r, last("train.emit_command") or {})
    if (r := last("inject.command")) is not None:
        out["inject.command"] = exit_problem("inject.command", r) or payload_problem(
            "inject.command", r, need=()) or lacks(runs / nxt / "curriculum.json",
                                                   ("schema_version", "round_id", "state_id", "chunks"), runs)
    return out


def _gate_verdict(p: Pass, r: dict[str, Any], emit: dict[str, Any]) -> str | None:
    runs = p.layout.runs
    gdir = runs / "round-000-online-gate"
    manifest = latest(gdir / "online_gate_manifest.json") or gdir / "online_gate_manifest.json"
    bad = lacks(manifest, ("schema_version", "status", "input", "summary"), runs)
    if bad is not None and not manifest.exists() and r.get("returncode") != 0:
        # The real gate's pre-rollout errors (contract: exit 1, traceback, no manifest): name
        # the error itself, and why the rehearsal's split provoked it when it did.
        small = next((n for n in emit.get("notes", []) if n.startswith("val split too small")), None)
        line = decisive_line(str(r.get("stderr_tail", "")))
        return (f"gate.command exited {r.get('returncode')}" + (f" ({line})" if line else "")
                + " and wrote no online_gate_manifest.json" + (f"; {small}" if small else ""))
    if bad is not None:
        return bad
    status = json.loads(manifest.read_text()).get("status")
    want = 0 if status == "complete" else 1
    if r["returncode"] != want:
        return (f"gate.command exited {r['returncode']} but online_gate_manifest.json says {status!r} (the real "
                f"gate exits 0 when complete, 1 when incomplete)")
    if status == "complete":
        bad = lacks(manifest.parent / "selected_skillbank.json", ("skills",), runs)
    return bad or payload_problem("gate.command", r)


def _trainer_verdict(p: Pass, train_failed: str | None) -> str | None:
    """The trainer's own error first (it died: its decisive line), and only when it ran fine
    and printed no progress line does ``train.progress_pattern`` get the blame."""
    rec = p.records.get(TRAINER, [None])[-1]
    if rec is not None:  # its own output (the stage log has the sidecar's lines in between)
        err, run = str(rec.get("stderr_tail", "")), str(rec.get("stdout", "")) + "\n" + str(rec.get("stderr_tail", ""))
    else:
        starts = list(_TRAINER_START.finditer(p.trainer_log))
        if not starts:
            return None
        err = run = p.trainer_log[starts[-1].start():]
    if train_failed and "trainer exited" in train_failed:
        line = (decisive_line(err) if _has_exception(err) else "") or decisive_line(run)
        return f"the trainer died on its own: {line!r} ({train_failed.split(';')[0]})"
    if re.search(p.cfg.train.progress_pattern, run):
        return None
    example = next((ln for ln in run.splitlines() if _SLIME_PROGRESS.search(ln)), "")[:120]
    if not example and train_failed:
        # No progress line of any shape: the trainer hung or was cut short, whatever the pattern.
        return (f"the trainer printed no progress line (its last line: {decisive_line(run)!r}); "
                f"{train_failed.split(';')[0]}")
    return (f"train.progress_pattern {p.cfg.train.progress_pattern!r} never matched slime's progress lines "
            f"(e.g. {example!r}); the daemon would restart a healthy trainer as stalled")


def judge_pass(p: Pass) -> Pass:
    """This pass's verdict per stage: ``ok`` (it ran and matches), ``skipped (not configured)``,
    ``not reached``, or the mismatch; and which stage the engine failed in."""
    j = p.journal
    trans = [e for e in j if e.get("event") == "transition"]
    failed = next((e for e in trans if e.get("dst") == "FAILED"), None)
    stopped = next((e for e in trans if e.get("dst") == "STOPPED"), None)
    done = any(e.get("dst") == "DONE" for e in trans)
    entered = {e.get("dst") for e in trans}
    error = next((e for e in j if e.get("event") == "stage.error"), None)
    blame = failed.get("src") if failed else error.get("state") if error else stopped.get("src") if stopped else None
    message = str((failed or {}).get("message") or (error or {}).get("error")
                  or (stopped and f"stopped: {stopped.get('message')}") or "failed")
    cfg = p.cfg
    configured = {"train.check_command": bool(cfg.train.check_command),
                  "sidecar.command": cfg.sidecar.enabled and bool(cfg.sidecar.command),
                  "inject.command": bool(cfg.inject.command), "gate.analyze_command": bool(cfg.gate.analyze_command),
                  "gate.command": bool(cfg.gate.command), "train.emit_command": bool(cfg.train.emit_command)}
    found = tool_verdicts(p)
    for name, recs in p.records.items():
        if name == TRAINER:
            continue  # a trainer stopped as stalled is judged by its progress, below
        # A tool the daemon stopped (its stage ended: e.g. the sidecar when the trainer died) is
        # not judged by an exit it did not choose; a later pass may still run it whole.
        rc, sigs = recs[-1].get("returncode"), recs[-1].get("signals") or []
        if isinstance(rc, int) and rc < 0 and -rc in sigs:
            found[name] = f"not judged: stopped by the daemon (signal {-rc}) as its stage ended"
    trainer_ran = TRAINER in p.records or bool(_TRAINER_START.search(p.trainer_log))
    found[TRAINER] = _trainer_verdict(p, message if blame == "TRAIN" else None)
    ran = {n for n in TOOLS if n in p.records} | {"preflight", "shopsim", "export", "ledger row"}
    if trainer_ran:
        ran.add(TRAINER)
    states = [s for _, s in STAGES]
    blamed_stage = None
    if blame in states:
        in_state = [n for n, s in STAGES if s == blame and configured.get(n, True)]
        ran_here = [n for n in in_state if n in ran]
        blamed_stage = (ran_here or in_state or [None])[-1]
        # A trainer that died is its own error, whatever ran before it in TRAIN.
        if blame == "TRAIN" and trainer_ran and "trainer exited" in message:
            blamed_stage = TRAINER
    after = False
    for name, state in STAGES:
        if not configured.get(name, True):
            p.verdicts[name] = "skipped (not configured)"
            continue
        bad = found.get(name)
        if name == blamed_stage:
            p.verdicts[name] = bad or message
            after = True
        elif bad:
            p.verdicts[name] = bad
        elif after or state not in entered or (blame is None and not done and state not in entered):
            p.verdicts[name] = "not reached"
        elif name in TOOLS and name not in p.records:
            p.verdicts[name] = "not reached"  # its state was skipped (done in an earlier pass)
        elif name == TRAINER and not trainer_ran:
            p.verdicts[name] = "not reached"
        else:
            p.verdicts[name] = "ok"
    p.blamed = blamed_stage if blamed_stage is not None else ("engine" if blame is not None else None)
    p.message = message
    p.stopped = stopped is not None and failed is None
    return p


def merge(passes: list[Pass], rid: str = "round-000") -> list[tuple[str, str]]:
    """One verdict per stage over every pass (see the module doc), plus an ``engine`` line when
    the engine failed outside any stage."""
    out: list[tuple[str, str]] = []
    for name, _ in STAGES:
        seen = [p.verdicts.get(name, "not reached") for p in passes]
        bad = [v for v in seen if v != "ok" and not v.startswith(("not ", "skipped"))]
        judged = [v for v in seen if v.startswith("not judged")]
        if bad:
            verdict = bad[0]
        elif any(v.startswith("ok") for v in seen):
            verdict = "ok"
        elif seen and seen[0].startswith("skipped"):
            verdict = seen[0]
        elif judged:
            verdict = judged[0]
        else:
            stop = next((p.blamed for p in reversed(passes) if p.blamed), None)
            verdict = (f"not reached{f' (the rehearsal stopped at {stop})' if stop else ''}: needs "
                       f"{NEEDS.get(name, 'the stages before it').format(rid=rid)}")
        if verdict not in ("ok",) and not verdict.startswith(("not ", "skipped")) and name in SECTION \
                and CONTRACT not in verdict:
            verdict += f" [{CONTRACT} {SECTION[name]}]"
        out.append((name, verdict))
    engine = next((p.message for p in passes if p.blamed == "engine"), None)
    if engine:
        out.append(("engine", engine))
    return out
