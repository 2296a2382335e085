"""STAND-IN for the Failure Analyst's LLM API (Bailian's OpenAI-compatible endpoint), used by
`shoprld rehearse` so that a rehearsal costs nothing. No model runs.

`POST /v1/chat/completions` (also `/chat/completions`): when the request offers tools, the
answer is ONE tool call of the tool the request forces (`tool_choice`), else of the first
tool offered, with arguments built from that tool's JSON schema: every required property,
the first `enum` value, strings "rehearsal", numbers 0.5, integers 1, booleans false, arrays
of `minItems` (at least one) items. The real analyst asks for `submit_failure_card` and
`submit_online_candidates` calls (contracts/shopsimrl-tools.md, appendix), so its answers are
well-formed by construction. Without tools the answer is the text "rehearsal".
`GET /v1/models` lists one model; `GET /health` is 200. The `Authorization` header is
accepted and never logged. SIGTERM/SIGINT: exit 0.

Usage: analyst_llm.py --port P [--host 127.0.0.1]. Prints `analyst stand-in on URL` once
it listens. Exit codes: 0 stopped, 1 port in use, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "rehearsal-analyst"


def example(schema: Any, depth: int = 0) -> Any:
    """A value that satisfies the common JSON-schema keywords of ``schema``."""
    if not isinstance(schema, dict) or depth > 8:
        return "rehearsal"
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        need = schema.get("required") or list(props)
        return {k: example(props.get(k, {}), depth + 1) for k in need}
    if kind == "array":
        n = max(1, int(schema.get("minItems") or 1))
        return [example(schema.get("items", {}), depth + 1) for _ in range(n)]
    if kind == "integer":
        return max(1, int(schema.get("minimum") or 1))
    if kind == "number":
        return 0.5 if schema.get("minimum") is None else max(0.5, float(schema["minimum"]))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    n = int(schema.get("minLength") or 0)
    return "rehearsal" + "x" * max(0, n - 9)


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion for one request."""
    tools = [t.get("function", {}) for t in body.get("tools") or [] if isinstance(t, dict)]
    choice = body.get("tool_choice")
    forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    fn = next((t for t in tools if t.get("name") == forced), tools[0] if tools else None)
    if fn:
        args = example(fn.get("parameters") or {"type": "object"})
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{int(time.time() * 1000)}", "type": "function",
            "function": {"name": fn.get("name", "tool"), "arguments": json.dumps(args)}}]}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": "rehearsal"}, "stop"
    return {"id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or MODEL, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: no headers, no keys
        pass

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/health", "/v1/health"):
            self._send(200, {"ok": True})
        elif self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON"}})
            return
        self._send(200, answer(body if isinstance(body, dict) else {}))


def main() -> int:
    p = argparse.ArgumentParser(prog="analyst_llm", description="the analyst LLM API stand-in")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    a = p.parse_args()
    try:
        srv = ThreadingHTTPServer((a.host, a.port), Handler)
    except OSError as exc:
        print(f"analyst_llm: cannot listen on {a.host}:{a.port}: {exc}", file=sys.stderr)
        return 1
    srv.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start())
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=srv.shutdown, daemon=True).start())
    print(f"analyst stand-in on http://{a.host}:{a.port}/v1", flush=True)
    srv.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
