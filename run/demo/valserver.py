"""STAND-IN for SGLang's server (`python -m sglang.launch_server ...`). No model runs:
"generation" is a hash of the served weights and the prompt, so metrics are reproducible.

Like SGLang, the process you start (the HTTP front end) spawns a child "scheduler" process
that holds the weights and answers generate requests (over a loopback socket of its own).
The scheduler stays in the parent's process group, and if the parent is SIGKILLed it keeps
running as an orphan that holds its port (it gives up only after DEMO_VAL_ORPHAN_SECONDS,
default 3600): kill the process group, not just the pid.

HTTP surface (SGLang's names):
- `GET /health`, `GET /health_generate`: 503 while loading, then 200;
- `GET /v1/models`: 200 at once, before the weights are loaded (a wrong readiness probe);
- `GET /get_model_info`: {model_path, served_model_name, weight_version, weights_fingerprint};
- `POST /generate {text | input_ids, sampling_params}` -> {text, meta_info};
  `POST /v1/chat/completions` (OpenAI shape) gives the same text;
- `POST /update_weights_from_disk {model_path, weight_version?}`: validates the HF dir; on
  success swaps (200, success=true); on a bad dir keeps the old weights (400, success=false);
- `POST /release_memory_occupation`, `/resume_memory_occupation`, `/flush_cache` -> success.
`--api-key K` requires `Authorization: Bearer K` (not on /health*). The log line
"The server is fired up and ready to roll!" marks health. SIGTERM/SIGINT: stop the
scheduler, exit 0.

Knobs: DEMO_VAL_LOAD_SECONDS (0.3), DEMO_VAL_NEVER_HEALTHY=1, DEMO_VAL_CRASH_AFTER=n (the
scheduler dies after answering n generate calls; the server then exits 1),
DEMO_VAL_ORPHAN_SECONDS (3600). Exit codes: 0 after SIGTERM/SIGINT; 1 when the model dir is
invalid at start, the port cannot be bound, or the scheduler died; 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import _common as c

PROG = "valserver"
FIRED_UP = "The server is fired up and ready to roll!"


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", flush=True)


def generated_text(fingerprint: str, prompt: str) -> str:
    h = hashlib.sha256(f"{fingerprint}\n{prompt}".encode("utf-8")).hexdigest()
    return f"I will buy the best match.\nAction: click[item-{h[:8]}]"


# ---------------------------------------------------------------- scheduler (child)

def scheduler_main(model_path: str) -> int:
    """The child: load weights, then answer one JSON line per connection, serially."""

    def slog(msg: str) -> None:
        print(f"{PROG}[scheduler {os.getpid()}]: {msg}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the group; the parent decides
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    try:
        fingerprint = c.validate_hf_dir(model_path)
    except (ValueError, OSError) as exc:
        print(f"ERROR {exc}", flush=True)
        return 1
    time.sleep(c.env_float("DEMO_VAL_LOAD_SECONDS", 0.3))
    state = {"model_path": model_path, "fingerprint": fingerprint, "generates": 0}
    print("READY " + json.dumps({"fingerprint": fingerprint}), flush=True)
    crash_after = c.env_int("DEMO_VAL_CRASH_AFTER", None)
    orphan_s = c.env_float("DEMO_VAL_ORPHAN_SECONDS", 3600.0)
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        slog(f"parent {parent} is gone; orphaned, still holding weights and port (exits after {orphan_s:.0f}s)")
        time.sleep(orphan_s)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    while True:
        conn, _ = sock.accept()
        with conn:
            try:
                req = json.loads(conn.makefile("rb").readline())
                reply, after = handle(req, state)
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except (OSError, ValueError) as exc:
                slog(f"bad request: {exc}")
                continue
        if after == "exit":
            return 0
        if req.get("op") == "generate":
            state["generates"] += 1
            if crash_after is not None and state["generates"] >= crash_after:
                slog(f"[demo fault] crashing after {state['generates']} generate call(s)")
                time.sleep(0.2)  # let the front end deliver the last answer
                os._exit(1)


def handle(req: dict[str, Any], state: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    op = req.get("op")
    if op == "generate":
        return {"text": generated_text(state["fingerprint"], str(req.get("prompt", "")))}, None
    if op == "load":
        try:
            fingerprint = c.validate_hf_dir(req["model_path"])
        except (ValueError, OSError, KeyError) as exc:
            return {"success": False, "message": f"Failed to update weights: {exc}. Rolled back to the old weights."}, None
        state.update(model_path=req["model_path"], fingerprint=fingerprint)
        return {"success": True, "message": "Succeeded to update model weights.", "fingerprint": fingerprint}, None
    if op == "shutdown":
        return {"ok": True}, "exit"
    return {"error": f"unknown op {op!r}"}, None


# ---------------------------------------------------------------- front end (parent)

class Front:
    """The parent's view of the scheduler and the served weights."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.model_path = args.model_path
        self.served_name = args.served_model_name or args.model_path
        self.weight_version = args.weight_version
        self.fingerprint: str | None = None
        self.sched_port: int | None = None
        self.healthy = False
        self.stopping = False
        self.fatal: str | None = None
        self.lock = threading.Lock()
        self.child: subprocess.Popen[bytes] | None = None

    def call(self, req: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        if self.sched_port is None:
            raise OSError("scheduler not started")
        with self.lock, socket.create_connection(("127.0.0.1", self.sched_port), timeout=timeout) as s:
            s.sendall(json.dumps(req).encode() + b"\n")
            line = s.makefile("rb").readline()
        if not line:
            raise OSError("scheduler closed the connection")
        return json.loads(line)


class Handler(BaseHTTPRequestHandler):
    server: "ValServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _send(self, status: int, body: Any) -> None:
        c.send_reply(self, status, body)

    def _authorized(self, path: str) -> bool:
        key = self.server.front.args.api_key
        if not key or path.startswith("/health"):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        return body

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        front = self.server.front
        if not self._authorized(path):
            return
        if path == "/health":
            self._send(200 if front.healthy else 503, {} if front.healthy else {"error": "loading"})
        elif path == "/health_generate":
            if not front.healthy:
                self._send(503, {"error": "loading"})
                return
            try:
                front.call({"op": "generate", "prompt": "health"}, timeout=10)
                self._send(200, {})
            except (OSError, ValueError):
                self._send(503, {"error": "scheduler not answering"})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": front.served_name, "object": "model", "owned_by": "sglang", "root": front.model_path}]})
        elif path == "/get_model_info":
            self._send(200, {"model_path": front.model_path, "tokenizer_path": front.model_path,
                             "is_generation": True, "served_model_name": front.served_name,
                             "weight_version": front.weight_version, "weights_fingerprint": front.fingerprint})
        else:
            self._send(404, {"error": f"no route {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        front = self.server.front
        if not self._authorized(path):
            return
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError) as exc:
            self._send(400, {"error": f"malformed JSON body: {exc}"})
            return
        if path in {"/release_memory_occupation", "/resume_memory_occupation", "/flush_cache"}:
            self._send(200, {"success": True, "message": f"{path[1:]} done"})
            return
        if path not in {"/generate", "/v1/chat/completions", "/update_weights_from_disk"}:
            self._send(404, {"error": f"no route {path}"})
            return
        if front.fingerprint is None:
            self._send(503, {"error": "the model is still loading"})
            return
        try:
            if path == "/update_weights_from_disk":
                self._update(front, body)
            elif path == "/generate":
                self._generate(front, body)
            else:
                self._chat(front, body)
        except (OSError, ValueError) as exc:
            self._send(500, {"error": f"scheduler failed: {exc}"})

    def _update(self, front: Front, body: dict[str, Any]) -> None:
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            self._send(400, {"success": False, "message": "model_path is required"})
            return
        reply = front.call({"op": "load", "model_path": path}, timeout=300)
        if reply.get("success"):
            front.model_path, front.fingerprint = path, reply["fingerprint"]
            if body.get("weight_version") is not None:
                front.weight_version = str(body["weight_version"])
            log(f"updated weights from {path} (weight_version={front.weight_version})")
            self._send(200, {"success": True, "message": reply["message"], "num_paused_requests": 0})
        else:
            log(f"update_weights_from_disk refused {path}: {reply.get('message')}")
            self._send(400, {"success": False, "message": reply.get("message"), "num_paused_requests": 0})

    def _generate(self, front: Front, body: dict[str, Any]) -> None:
        if isinstance(body.get("text"), str):
            prompt = body["text"]
        elif isinstance(body.get("input_ids"), list):
            prompt = " ".join(str(t) for t in body["input_ids"])
        else:
            self._send(400, {"error": "generate needs text or input_ids"})
            return
        text = front.call({"op": "generate", "prompt": prompt})["text"]
        rid = hashlib.sha256(f"{front.fingerprint}:{prompt}".encode()).hexdigest()[:32]
        self._send(200, {"text": text, "meta_info": {
            "id": rid, "prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()),
            "finish_reason": {"type": "stop"}, "weight_version": front.weight_version}})

    def _chat(self, front: Front, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            self._send(400, {"error": "messages must be a list"})
            return
        prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        text = front.call({"op": "generate", "prompt": prompt})["text"]
        self._send(200, {"id": "chatcmpl-demo", "object": "chat.completion", "model": front.served_name,
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}],
                         "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()),
                                   "total_tokens": len(prompt.split()) + len(text.split())}})


class ValServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], front: Front):
        super().__init__(addr, Handler)
        self.front = front


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="SGLang launch_server stand-in (demo)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name")
    p.add_argument("--tp", "--tp-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--tool-call-parser")
    p.add_argument("--reasoning-parser")
    p.add_argument("--enable-memory-saver", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--weight-version", default="default")
    p.add_argument("--scheduler", action="store_true", help=argparse.SUPPRESS)
    args, _unknown = p.parse_known_args(argv)  # other SGLang flags are accepted and ignored
    return args


def main() -> int:
    args = parse_args(sys.argv[1:])
    if args.scheduler:
        return scheduler_main(args.model_path)
    front = Front(args)
    try:
        srv = ValServer((args.host, args.port), front)
    except OSError as exc:
        raise c.DemoError(f"cannot bind {args.host}:{args.port}: {exc.strerror or exc}", 1) from None

    def stop(reason: str | None = None) -> None:
        if reason and not front.stopping:
            front.fatal = reason
        front.stopping = True
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, lambda *_: stop())
    signal.signal(signal.SIGINT, lambda *_: stop())
    child = subprocess.Popen(
        [sys.executable, *(["-S"] if sys.flags.no_site else []), os.path.abspath(__file__),
         "--scheduler", "--model-path", args.model_path],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    front.child = child
    log(f"listening on http://{args.host}:{srv.server_address[1]} pid={os.getpid()} scheduler pid={child.pid} "
        f"tp={args.tp_size} dp={args.dp_size} model={args.model_path}")

    def read_scheduler() -> None:
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("PORT "):
                front.sched_port = int(line.split()[1])
            elif line.startswith("READY "):
                front.fingerprint = json.loads(line[6:])["fingerprint"]
                if c.env_flag("DEMO_VAL_NEVER_HEALTHY"):
                    log("[demo fault] weights loaded but never becoming healthy (DEMO_VAL_NEVER_HEALTHY=1)")
                else:
                    front.healthy = True
                    log(FIRED_UP)
            elif line.startswith("ERROR "):
                stop(f"cannot load model from {args.model_path}: {line[6:]}")

    def watch_scheduler() -> None:
        code = child.wait()
        time.sleep(0.3)  # a group-wide SIGTERM reaches the scheduler first at times
        if not front.stopping:
            front.healthy = False
            stop(f"scheduler process {child.pid} exited with code {code}; shutting down")

    threading.Thread(target=read_scheduler, daemon=True).start()
    threading.Thread(target=watch_scheduler, daemon=True).start()
    try:
        srv.serve_forever(poll_interval=0.1)
    finally:
        srv.server_close()
        front.healthy = False
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    if front.fatal:
        raise c.DemoError(front.fatal, 1)
    log("stopped")
    return 0


if __name__ == "__main__":
    c.run_main(PROG, main)
