"""The ShopSim stand-in against the recorded real ShopSimulator (`shopsim-real.jsonl`).

The transcript (228 lines, recorded from the real service with 3 slots and the synthetic
catalog) is replayed in order against a freshly started stand-in with the same slots and
catalog. Every line is compared: status code, JSON or HTML, the type skeleton (`shape`), and
the values the contract pins (errors, messages, `done`, the action feedback, the page's
actions, `/healthz`). Lease ids and slots are followed through their placeholders. The
PROCESS lines are checked as process behaviours: the port is bound only once the service is
ready, SIGTERM exits at once with status -15, and SIGKILL closes an in-flight request without
an answer.

The transcript is not copied into this repository: it is read from `$SHOPRLD_CONTRACTS` or
`<repo>/../shared/contracts/`, and the test is skipped with the reason when it is absent.
"""

from __future__ import annotations

import http.client as httpc
import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import Proc, Procs, child_env, free_port, http, wait_until  # http: the JSON helper

REPO = Path(__file__).resolve().parents[2]
TRANSCRIPT = "shopsim-real.jsonl"
CATALOG = "synthetic-catalog.json"
LEASE = re.compile(r"<lease_id:(\d+)>")
# Values the contract pins exactly (paths inside the JSON answer); the rest is compared by shape.
EXACT = [("result", "error"), ("result", "message"), ("result", "done"), ("result", "over"),
         ("result", "termination_reason"), ("result", "idx"), ("result", "task_mode"), ("result", "interaction_mode"),
         ("result", "action_feedback", "action"), ("result", "action_feedback", "valid"),
         ("result", "action_feedback", "reason"), ("result", "action_feedback", "message"),
         ("result", "action_feedback", "missing_option_axes"), ("result", "observation_state", "page_type"),
         ("result", "observation_state", "actions"), ("result", "observation_state", "search_available"),
         ("result", "observation_state", "selected_options"), ("result", "observation_state", "total_results"),
         ("result", "purchase", "options"), ("result", "purchase", "price"), ("result", "user_persona"),
         ("result", "goal", "price_upper"), ("result", "reward_detail", "termination_reason"),
         ("result", "reward_detail", "price_resolution", "evidence"), ("result", "reward_detail", "price_resolution", "method")]


def contracts_dir() -> Path | None:
    for cand in (os.environ.get("SHOPRLD_CONTRACTS"), str(REPO.parent / "shared" / "contracts")):
        if cand and (Path(cand) / TRANSCRIPT).is_file() and (Path(cand) / CATALOG).is_file():
            return Path(cand)
    return None


def shape(value: Any) -> Any:
    """The transcript's type skeleton: objects by key, a list by its first element, scalar type names."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if value is None:
        return "None"
    return type(value).__name__


def dig(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return KeyError
        obj = obj[key]
    return obj


class Replay:
    """Sends transcript lines to the instances and compares the answers."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self.leases: dict[str, str] = {}  # "<lease_id:N>" -> the stand-in's id
        self.slots: dict[str, dict[int, int]] = {}  # instance -> recorded env_idx -> the stand-in's
        self.failures: list[str] = []
        self.passed = 0

    # -- placeholders

    def _sub(self, value: Any, instance: str) -> Any:
        if isinstance(value, str):
            return LEASE.sub(lambda m: self.leases.get(m.group(0), m.group(0)), value)
        if isinstance(value, dict):
            out = {k: self._sub(v, instance) for k, v in value.items()}
            slot = out.get("env_idx")
            if isinstance(slot, int) and not isinstance(slot, bool) and "lease_id" in value:
                out["env_idx"] = self.slots.get(instance, {}).get(slot, slot)
            return out
        return value

    def _expect(self, value: Any, instance: str) -> Any:
        """The recorded answer with placeholders and slot numbers turned into the stand-in's."""
        if isinstance(value, str):
            value = LEASE.sub(lambda m: self.leases.get(m.group(0), m.group(0)), value)
            return re.sub(r"(nvironment )(-?\d+)", lambda m: m.group(1) + str(self.slots.get(instance, {}).get(
                int(m.group(2)), int(m.group(2)))), value)
        if isinstance(value, dict):
            return {k: self._expect(v, instance) for k, v in value.items()}
        if isinstance(value, list):
            return [self._expect(v, instance) for v in value]
        return value

    def _learn(self, line: dict[str, Any], got: Any) -> None:
        """Map the lease ids and slots a reset answered to the recorded placeholders."""
        rec = line["response"]
        if not (isinstance(rec, dict) and isinstance(rec.get("result"), dict) and isinstance(got, dict)):
            return
        rec_r, got_r = rec["result"], got.get("result") or {}
        lease = rec_r.get("lease_id")
        if isinstance(lease, str) and LEASE.fullmatch(lease) and lease not in self.leases and "lease_id" in got_r:
            self.leases[lease] = got_r["lease_id"]
            if isinstance(rec_r.get("env_idx"), int) and isinstance(got_r.get("env_idx"), int):
                self.slots.setdefault(line["instance"], {})[rec_r["env_idx"]] = got_r["env_idx"]

    # -- requests

    def send(self, line: dict[str, Any], timeout: float = 10.0) -> tuple[int | None, str | None, Any, str | None]:
        """(status, content type, parsed body or text, client-side error name)."""
        req = line["request"]
        conn = httpc.HTTPConnection("127.0.0.1", self.ports[line["instance"]], timeout=timeout)
        try:
            headers: dict[str, str] = {}
            data: bytes | None = None
            if req["method"] == "POST":
                headers = dict(self._sub(req.get("headers") or {}, line["instance"]))
                body = req.get("body")
                data = body.encode() if isinstance(body, str) else json.dumps(self._sub(body, line["instance"])).encode()
            conn.request(req["method"], req["path"], body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read().decode("utf-8")
            ctype = resp.getheader("Content-Type")
        except (OSError, httpc.HTTPException) as exc:
            return None, None, None, type(exc).__name__
        finally:
            conn.close()
        try:
            parsed: Any = json.loads(raw) if ctype == "application/json" else raw
        except ValueError:
            parsed = raw
        return resp.status, ctype, parsed, None

    def check(self, line: dict[str, Any], got: tuple[int | None, str | None, Any, str | None]) -> None:
        status, ctype, body, error = got
        problems = []
        if status != line["status"]:
            problems.append(f"status {status} != {line['status']} ({error or body!r:.200})")
        elif status is not None:
            self._learn(line, body)
            want = self._expect(line["response"], line["instance"])
            if ctype != line["content_type"]:
                problems.append(f"content type {ctype} != {line['content_type']}")
            if isinstance(want, str):
                if body != want and "<path>" not in want:
                    problems.append(f"text {body!r:.80} != {want!r:.80}")
            else:
                if shape(body) != line["shape"]:
                    problems.append(f"shape {json.dumps(shape(body), ensure_ascii=False)} != "
                                    f"{json.dumps(line['shape'], ensure_ascii=False)}")
                for path in EXACT if "result" in want else [(k,) for k in want if k != "runs_root"]:
                    w, g = dig(want, path), dig(body, path)
                    if w is not KeyError and w != g:
                        problems.append(f"{'.'.join(path)} {g!r} != {w!r}")
        self.record(line, problems)

    def record(self, line: dict[str, Any], problems: list[str]) -> None:
        if problems:
            self.failures.append(f"{line['seq']} {line['case']}: " + "; ".join(problems))
        else:
            self.passed += 1


def start(procs: Procs, catalog: Path, name: str, slots: int = 3) -> tuple[Proc, int]:
    port = free_port()
    proc = procs.start("shopsim.py", "--catalog", str(catalog), name=name,
                       env=child_env(SHOPSIM_ENV_SLOTS=str(slots), SHOPSIM_PORT=str(port)))
    return proc, port


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_transcript_of_the_real_shopsimulator_replays_line_by_line(procs: Procs, tmp_path: Path) -> None:
    """Every line of shopsim-real.jsonl gets the recorded status, shape and pinned values from the stand-in."""
    where = contracts_dir()
    if where is None:
        pytest.skip(f"no contracts: set SHOPRLD_CONTRACTS to the folder holding {TRANSCRIPT} and {CATALOG} "
                    f"(looked in $SHOPRLD_CONTRACTS and {REPO.parent / 'shared' / 'contracts'})")
    lines = [json.loads(x) for x in (where / TRANSCRIPT).read_text(encoding="utf-8").splitlines() if x.strip()]
    catalog = where / CATALOG
    rp = Replay()
    main_proc, rp.ports["main"] = start(procs, catalog, "main")
    wait_until(lambda: http("GET", f"http://127.0.0.1:{rp.ports['main']}/healthz")[0] == 200, what="main ready")
    # A line answered while later lines ran (a queued reset) is sent before the lines its `why` names.
    queued = {ln["seq"]: ln for ln in lines if "still_pending_after_ms" in ln}
    launch_before = {seq - 2: seq for seq in queued}
    pending: dict[int, tuple[threading.Thread, dict[str, Any]]] = {}
    probes: dict[str, Proc] = {}
    for line in lines:
        seq, inst = line["seq"], line["instance"]
        if seq in launch_before:
            q = queued[launch_before[seq]]
            box: dict[str, Any] = {}
            t = threading.Thread(target=lambda q=q, box=box: box.update(got=rp.send(q)), daemon=True)
            t.start()
            time.sleep(0.3)
            pending[q["seq"]] = (t, box)
            if not t.is_alive():
                rp.failures.append(f"{q['seq']} {q['case']}: answered at once, not queued")
        if seq in pending:
            t, box = pending.pop(seq)
            t.join(5)
            rp.check(line, box.get("got", (None, None, None, "no answer")))
            continue
        if inst not in rp.ports:  # an extra instance the recorder started: a fresh stand-in
            probes[inst], rp.ports[inst] = start(procs, catalog, inst)
            if inst == "startup-probe":
                # The port is bound only once every slot is built: the first answer is already ready, all free.
                refused_polls = 0
                deadline = time.monotonic() + 15
                while refused(rp.ports[inst]) and time.monotonic() < deadline:
                    refused_polls += 1
                    time.sleep(0.02)
            else:
                wait_until(lambda: not refused(rp.ports[inst]), what=f"{inst} bound")
        if line["request"]["method"] == "PROCESS":
            proc = probes[inst]
            t0 = time.monotonic()
            proc.popen.send_signal(signal.SIGTERM)
            code = proc.wait(5)
            took = time.monotonic() - t0
            problems = [] if code == line["exit_returncode"] else [f"exit {code} != {line['exit_returncode']}"]
            if took > 2:
                problems.append(f"SIGTERM took {took:.1f}s")
            if refused(rp.ports[inst]) != line["connect_refused_after"]:
                problems.append("the port still accepts connections after SIGTERM")
            rp.record(line, problems)
            continue
        if line.get("in_flight_before_kill"):
            box = {}
            t = threading.Thread(target=lambda line=line, box=box: box.update(got=rp.send(line)), daemon=True)
            t.start()
            time.sleep(0.4)
            problems = [] if t.is_alive() else ["the reset was answered, not queued"]
            probes[inst].popen.send_signal(signal.SIGKILL)
            t.join(5)
            error = box.get("got", (None, None, None, "no answer"))[3]
            want = line["error"].split(":")[0]
            if error != want:
                problems.append(f"client saw {error} != {want}")
            rp.record(line, problems)
            probes[inst].wait(5)
            continue
        if line.get("sleep_before_ms"):
            time.sleep(line["sleep_before_ms"] / 1000)
        if line.get("timed_out"):
            got = rp.send(line, timeout=1.0)  # the recorder waited 2 s; 1 s shows the same
            rp.record(line, [] if got[3] in ("TimeoutError", "timeout") else [f"not a client timeout: {got}"])
            continue
        got = rp.send(line)
        if line.get("error", "").startswith("ConnectionRefusedError"):
            rp.record(line, [] if got[3] == "ConnectionRefusedError" else [f"not refused: {got}"])
            continue
        rp.check(line, got)
    report = f"transcript replay: {rp.passed}/{len(lines)} lines pass"
    print(report)
    (tmp_path / "replay-report.txt").write_text(report + "\n" + "\n".join(rp.failures) + "\n")
    assert not rp.failures, report + "\n" + "\n".join(rp.failures)
    assert rp.passed == len(lines)
    assert main_proc.alive()
