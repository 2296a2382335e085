"""A real loopback HTTP receiver for notification tests: records every request, and can be
told to answer 500 a number of times first (the retry path)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """``with Receiver() as r: ... r.url ... r.requests``; ``fail_first`` 500s come before 200s."""

    fail_first: int = 0
    requests: list[Received] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)

    def __enter__(self) -> Receiver:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                with owner._lock:
                    owner.requests.append(Received(self.path, dict(self.headers.items()), body))
                    code = 500 if owner.fail_first > 0 else 200
                    owner.fail_first -= 1 if owner.fail_first > 0 else 0
                    owner.answered.append(code)
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/hook/s3cr3t-path-token"

    def events(self) -> list[str]:
        """The ``event`` of every webhook JSON received, in order."""
        out = []
        for r in self.requests:
            try:
                out.append(r.json()["event"])
            except (ValueError, KeyError, TypeError):
                continue
        return out
