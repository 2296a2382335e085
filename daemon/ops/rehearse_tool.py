"""``shoprld rehearse``'s wrapper around one ShopSimRL tool command (stdlib only, fast to import).

    python -m shoprld.daemon.ops.rehearse_tool --record DIR --stage KEY [--emit-spec F --loop-dir D]
        [--cwd D] -- ARGV...

It runs ARGV as the stage command would have run (in ``--cwd`` when given: the campaign's
own cwd for it), copies its stdout and stderr through to its
own (the stage log sees exactly what it saw without the wrapper), and writes
``DIR/<n>-<KEY>.json``: the exit status, the whole stdout (up to 4 MiB) and the last lines of
stderr, which rehearse then judges against the contract. A signal to the process group
reaches the tool directly; the wrapper only notes it and waits for the tool, so the tool's
own shutdown (the sidecar's drain) is what is rehearsed, and the record still gets written.

With ``--emit-spec`` (train.emit_command only) it then sizes the emitted YAMLs in ``--loop-dir``
down in place, by line edits that keep the file's format (block YAML or JSON):
the hard-coded ShopSim and val-server host:port become the scratch ones, the two
concurrencies become the rehearsal's, ``trace2skill_config`` points at a scratch copy whose
URLs (ShopSim, the analyst's LLM API) and ``dotenv`` are re-pointed, and ``split_file`` at a
scratch copy whose ``val`` list holds a handful of tasks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

STDOUT_CAP = 4 * 1024 * 1024
STDERR_TAIL = 40


def _pump(src: BinaryIO, dst: BinaryIO, keep: list[bytes], cap: int | None) -> None:
    size = 0
    for chunk in iter(lambda: src.readline(), b""):
        try:
            dst.write(chunk)
            dst.flush()
        except (OSError, ValueError):
            pass
        if cap is None or size < cap:
            keep.append(chunk)
            size += len(chunk)
        if cap is None and len(keep) > STDERR_TAIL:
            del keep[0]


def run_wrapped(argv: list[str], cwd: str | None = None) -> tuple[int, bytes, bytes, list[int], float]:
    """Run ``argv`` (in ``cwd``); returns (returncode, stdout, stderr tail, signals seen, seconds)."""
    seen: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: seen.append(s))
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
    except OSError as exc:
        return 127, b"", f"rehearse: cannot start {argv[0]}: {exc}\n".encode(), seen, 0.0
    out: list[bytes] = []
    err: list[bytes] = []
    assert proc.stdout is not None and proc.stderr is not None
    threads = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, out, STDOUT_CAP), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, err, None), daemon=True)]
    for t in threads:
        t.start()
    while True:
        try:
            rc = proc.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
    for t in threads:
        t.join(timeout=5)
    return rc, b"".join(out), b"".join(err), seen, time.monotonic() - t0


# -- sizing the emitted YAMLs -------------------------------------------------------------------
def _set_int(text: str, key: str, value: int) -> str:
    """``key: N`` (block YAML) or ``"key": N,`` (JSON) lines -> ``value``, format kept."""
    pat = re.compile(rf'^(\s*"?{re.escape(key)}"?\s*:\s*)-?\d+(\s*,?\s*)$', re.M)
    return pat.sub(lambda m: f"{m.group(1)}{value}{m.group(2)}", text)


def _path_value(text: str, key: str) -> str | None:
    m = re.search(rf'^\s*"?{re.escape(key)}"?\s*:\s*"?([^"\n,]+?)"?\s*,?\s*$', text, re.M)
    return m.group(1).strip().strip("'") if m else None


def _set_path(text: str, key: str, value: str) -> str:
    pat = re.compile(rf'^(\s*"?{re.escape(key)}"?\s*:\s*)("?)[^"\n,]+?("?)(\s*,?\s*)$', re.M)
    return pat.sub(lambda m: f"{m.group(1)}{m.group(2)}{value}{m.group(3)}{m.group(4)}", text, count=1)


def _swap_urls(text: str, swaps: list[list[str]]) -> str:
    for old, new in swaps:
        text = re.sub(rf"(//){re.escape(old)}(?![0-9])", rf"\g<1>{new}", text)
    return text


def _cut_split(value: Any, n: int) -> Any:
    """One ``val`` split cut to its first ``n`` tasks, in whichever form the split file uses: a bare
    list, or shopsimrl/tasks.py's record (``{"task_ids": [...]}`` or ``{"start": a, "end": b}``)."""
    if isinstance(value, list):
        return value[:n]
    if isinstance(value, dict):
        if isinstance(value.get("task_ids"), list):
            return {**value, "task_ids": value["task_ids"][:n]}
        start, end = value.get("start"), value.get("end")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
            return {**value, "end": min(end, start + n)}
    return value


def _split_size(value: Any) -> int | None:
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict):
        if isinstance(value.get("task_ids"), list):
            return len(value["task_ids"])
        start, end = value.get("start"), value.get("end")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in (start, end)):
            return max(0, end - start)
    return None


def _trim_val(data: Any, n: int) -> Any:
    """Every split under a key named ``val`` (at any depth) cut to its first ``n`` tasks."""
    if isinstance(data, dict):
        return {k: (_cut_split(v, n) if k == "val" else _trim_val(v, n)) for k, v in data.items()}
    return data


def _val_size(data: Any) -> int | None:
    """The task count of the first split under a key named ``val``, None when there is none."""
    if isinstance(data, dict):
        for k, v in data.items():
            found = _split_size(v) if k == "val" else _val_size(v)
            if found is not None:
                return found
    return None


def gate_factors(loop_dir: Path) -> int | None:
    """An upper bound on the online gate's regression factors: the enabled chunks of the round's
    SkillBank (analysis.yaml ``current_skillbank_path``) plus ``max_candidates`` (each ADD or
    REWRITE candidate is one column; the real default is 6). The real gate fits them by OLS and
    refuses, before any rollout, when the val split has no more tasks than factors."""
    try:
        text = (loop_dir / "analysis.yaml").read_text(encoding="utf-8")
    except OSError:
        return None
    bank = _path_value(text, "current_skillbank_path")
    raw = _path_value(text, "max_candidates")
    try:
        data = json.loads(Path(bank).read_text(encoding="utf-8")) if bank else None
        cands = int(raw) if raw is not None else 6
    except (OSError, ValueError):
        return None
    skills = data.get("skills") if isinstance(data, dict) else None
    if not isinstance(skills, list):
        return None
    return sum(1 for s in skills if isinstance(s, dict) and s.get("enabled", True) is not False) + cands


def size_down(loop_dir: Path, spec: dict[str, Any], notes: list[str]) -> None:
    """Apply the rehearsal's sizes and scratch endpoints to the emitted files, in place."""
    scratch = Path(spec["scratch"])
    swaps = spec.get("swaps", [])
    for f in sorted(loop_dir.glob("*.yaml")) + sorted(loop_dir.glob("*.json")):
        text = f.read_text(encoding="utf-8")
        new = _swap_urls(text, swaps)
        new = _set_int(new, "shopsim_episode_concurrency", int(spec["episode_concurrency"]))
        if f.stem == "val":
            new = _set_int(new, "concurrency", int(spec["val_concurrency"]))
            split = _path_value(new, "split_file")
            if split and split not in ("null", "~") and Path(split).is_file():
                try:
                    data = json.loads(Path(split).read_text(encoding="utf-8"))
                except ValueError:
                    notes.append(f"{split}: not JSON; the val split is not sized down")
                else:
                    # Small, but larger than the gate's regression: a smaller split makes the
                    # real gate refuse before any rollout, and the gate would not be rehearsed.
                    factors = gate_factors(loop_dir)
                    n = max(int(spec["val_tasks"]), (factors or 0) + 1)
                    copy = scratch / "split_file.json"
                    copy.write_text(json.dumps(_trim_val(data, n), indent=2))
                    new = _set_path(new, "split_file", str(copy))
                    have = _val_size(data)
                    notes.append(f"val split: first {n} tasks of {split}"
                                 + (f" (the gate's regression has up to {factors} factors)" if factors else ""))
                    if factors is not None and have is not None and have <= factors:
                        notes.append(f"val split too small for the gate: {have} val tasks in {split}, the gate's "
                                     f"regression has up to {factors} factors (SkillBank chunks + max_candidates); "
                                     "the real gate refuses before any rollout: `OLS requires more observations "
                                     "than chunk factors`")
        if f.stem == "analysis":
            t2s = _path_value(new, "trace2skill_config")
            if t2s and Path(t2s).is_file():
                src = Path(t2s)
                body = _swap_urls(src.read_text(encoding="utf-8"), swaps)
                dotenv = _path_value(body, "dotenv")
                if dotenv and not Path(dotenv).is_absolute():
                    body = _set_path(body, "dotenv", str((src.parent / dotenv).resolve()))
                if spec.get("analyst_url"):
                    # Every non-loopback base_url in the analyst's config is the LLM API.
                    body = re.sub(r'^(\s*"?base_url"?\s*:\s*)("?)(https?://(?!127\.0\.0\.1|localhost)[^"\s,]+)("?)',
                                  lambda m: f"{m.group(1)}{m.group(2)}{spec['analyst_url']}{m.group(4)}", body,
                                  flags=re.M)
                copy = scratch / src.name
                copy.write_text(body, encoding="utf-8")
                new = _set_path(new, "trace2skill_config", str(copy))
                notes.append(f"analyst config: scratch copy of {src}")
        if new != text:
            f.write_text(new, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print("rehearse_tool: usage: --record DIR --stage KEY [--emit-spec F --loop-dir D] [--cwd D] -- ARGV",
              file=sys.stderr)
        return 2
    split = args.index("--")
    opts, cmd = args[:split], args[split + 1:]
    o = dict(zip(opts[::2], opts[1::2], strict=False))
    record, stage = Path(o["--record"]), o["--stage"]
    rc, out, err, seen, took = run_wrapped(cmd, o.get("--cwd"))
    notes: list[str] = []
    # Whenever the YAMLs are there, even after a failing exit: the round may go on with them
    # (the daemon judges emit by slime.yaml), and must then use the scratch ports and sizes.
    if "--emit-spec" in o and (Path(o["--loop-dir"]) / "slime.yaml").is_file():
        try:
            size_down(Path(o["--loop-dir"]), json.loads(Path(o["--emit-spec"]).read_text()), notes)
        except (OSError, ValueError, KeyError) as exc:
            notes.append(f"sizing the emitted files failed: {type(exc).__name__}: {exc}")
    record.mkdir(parents=True, exist_ok=True)
    n = time.time_ns()  # unique and ordered: the sidecar's record can be written during analyze's
    doc = {"stage": stage, "returncode": rc, "signals": seen, "seconds": round(took, 3),
           "stdout": out.decode("utf-8", "replace"), "stderr_tail": err.decode("utf-8", "replace")[-4000:],
           "notes": notes, "cwd": o.get("--cwd") or os.getcwd()}
    tmp = record / f".{n}-{os.getpid()}-{stage}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, record / f"{n}-{os.getpid()}-{stage}.json")
    return rc


if __name__ == "__main__":
    sys.exit(main())
