"""STAND-IN for a Ray head's Jobs REST API (ray/dashboard/modules/job/job_head.py), so the
Ray Jobs launcher can be tested in seconds without Ray. No cluster: each job is a local
process.

What it keeps from Ray 2.x, because shoprld relies on it:
- ``POST /api/jobs/`` {entrypoint, submission_id?, runtime_env: {env_vars}, metadata?} returns
  {job_id, submission_id}; a submission id Ray already holds is HTTP 400 "... already exists";
- the entrypoint runs through `/bin/sh -c` (as Ray runs it) in a new session, stdout+stderr to the
  job's log, which starts with "Running entrypoint for job <id>: <entrypoint>"; env_vars
  override the head's environment, and ``${VAR}`` in a value expands from it;
- ``GET /api/jobs/{id}`` (404 when unknown), ``GET /api/jobs/`` (a list), ``GET
  /api/jobs/{id}/logs`` ({"logs": the whole log}), ``POST /api/jobs/{id}/stop`` ({"stopped":
  bool}: SIGTERM to the entrypoint's process group, SIGKILL after 3 s);
- statuses PENDING -> RUNNING -> SUCCEEDED | FAILED | STOPPED, with start/end times in ms;
- ``GET /api/version``. Jobs outlive the client that submitted them.

Usage: rayjobs_standin.py --port P --logs-dir D [--host 127.0.0.1] [--pending-seconds S]
SIGTERM stops every running job (by process group) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import _common as c

STOP_WAIT_S = 3.0  # RAY_JOB_STOP_WAIT_TIME_S
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class Job:
    def __init__(self, sid: str, entrypoint: str, runtime_env: dict[str, Any], metadata: dict[str, str],
                 log: Path) -> None:
        self.sid, self.entrypoint, self.runtime_env, self.metadata, self.log = sid, entrypoint, runtime_env, metadata, log
        self.status = "PENDING"
        self.message = "Job has not started yet."
        self.start_time = int(time.time() * 1000)
        self.end_time: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.stop_requested = False
        self.lock = threading.Lock()

    def details(self) -> dict[str, Any]:
        return {"type": "SUBMISSION", "job_id": None, "submission_id": self.sid, "driver_info": None,
                "status": self.status, "entrypoint": self.entrypoint, "message": self.message,
                "error_type": None, "start_time": self.start_time, "end_time": self.end_time,
                "metadata": self.metadata, "runtime_env": self.runtime_env, "driver_agent_http_address": None,
                "driver_node_id": None, "driver_exit_code": self.exit_code}


class Head:
    def __init__(self, logs_dir: Path, pending: float) -> None:
        self.logs_dir, self.pending = logs_dir, pending
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()

    def submit(self, body: dict[str, Any]) -> tuple[int, Any]:
        entrypoint = body.get("entrypoint")
        if not isinstance(entrypoint, str):
            return 400, "entrypoint must be a string"
        sid = body.get("submission_id") or f"raysubmit_{uuid.uuid4().hex[:16]}"
        runtime_env = body.get("runtime_env") or {}
        with self.lock:
            if sid in self.jobs:
                return 400, (f"Traceback (most recent call last):\nValueError: Job with submission_id {sid} "
                             "already exists. Please use a different submission_id.")
            job = Job(sid, entrypoint, runtime_env, dict(body.get("metadata") or {}),
                      self.logs_dir / f"job-driver-{sid}.log")
            self.jobs[sid] = job
        threading.Thread(target=self._run, args=(job,), daemon=True).start()
        return 200, {"job_id": None, "submission_id": sid}

    def _run(self, job: Job) -> None:
        time.sleep(self.pending)
        env = dict(os.environ)
        for k, v in (job.runtime_env.get("env_vars") or {}).items():
            env[k] = re.sub(r"\$\{(\w+)\}", lambda m: os.environ.get(m.group(1), ""), str(v))
        with job.lock:
            if job.stop_requested:
                job.status, job.message, job.end_time = "STOPPED", "Job was intentionally stopped.", _ms()
                return
            with open(job.log, "a") as out:
                out.write(f"Running entrypoint for job {job.sid}: {job.entrypoint}\n")
                out.flush()
                job.proc = subprocess.Popen(["/bin/sh", "-c", job.entrypoint], start_new_session=True, stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            with open(self.logs_dir / "pids.txt", "a") as f:
                f.write(f"{job.proc.pid}\n")
            job.status, job.message = "RUNNING", "Job is currently running."
        rc = job.proc.wait()
        with job.lock:
            job.exit_code, job.end_time = rc, _ms()
            if job.stop_requested:
                job.status, job.message = "STOPPED", "Job was intentionally stopped."
            elif rc == 0:
                job.status, job.message = "SUCCEEDED", "Job finished successfully."
            else:
                job.status, job.message = "FAILED", f"Job entrypoint command failed with exit code {rc}"

    def stop(self, job: Job) -> bool:
        with job.lock:
            if job.status in TERMINAL:
                return False
            job.stop_requested = True
            proc = job.proc
        if proc is not None:
            _killpg(proc.pid, signal.SIGTERM)
            threading.Thread(target=self._escalate, args=(proc,), daemon=True).start()
        return True

    @staticmethod
    def _escalate(proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for job in list(self.jobs.values()):
            self.stop(job)
        deadline = time.monotonic() + STOP_WAIT_S + 2
        for job in list(self.jobs.values()):
            if job.proc is not None:
                try:
                    job.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _killpg(job.proc.pid, signal.SIGKILL)


def _ms() -> int:
    return int(time.time() * 1000)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def make_handler(head: Head) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, payload: Any) -> None:
            c.send_reply(self, status, payload)

        def _job(self, sid: str) -> Job | None:
            job = head.jobs.get(sid)
            if job is None:
                self._send(404, f"Job {sid} does not exist")
            return job

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/api/version":
                return self._send(200, {"version": "4", "ray_version": "standin", "ray_commit": "standin"})
            if path in ("/api/jobs/", "/api/jobs"):
                return self._send(200, [j.details() for j in head.jobs.values()])
            m = re.fullmatch(r"/api/jobs/([^/]+)(/logs)?", path)
            if not m:
                return self._send(404, "not found")
            job = self._job(m.group(1))
            if job is None:
                return None
            if m.group(2):
                try:
                    text = job.log.read_text(errors="replace")
                except FileNotFoundError:
                    text = ""
                return self._send(200, {"logs": text})
            return self._send(200, job.details())

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = self.path.split("?")[0]
            if path in ("/api/jobs/", "/api/jobs"):
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    return self._send(400, "invalid JSON")
                status, payload = head.submit(body if isinstance(body, dict) else {})
                return self._send(status, payload)
            m = re.fullmatch(r"/api/jobs/([^/]+)/stop", path)
            if not m:
                return self._send(404, "not found")
            job = self._job(m.group(1))
            if job is None:
                return None
            return self._send(200, {"stopped": head.stop(job)})

    return Handler


def main() -> int:
    p = argparse.ArgumentParser(description="Ray Jobs REST API stand-in (demo/tests)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--logs-dir", required=True)
    p.add_argument("--pending-seconds", type=float, default=0.05)
    a = p.parse_args()
    logs = Path(a.logs_dir)
    logs.mkdir(parents=True, exist_ok=True)
    head = Head(logs, a.pending_seconds)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(head))
    server.daemon_threads = True

    def on_term(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"rayjobs stand-in on http://{a.host}:{a.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        head.stop_all()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
