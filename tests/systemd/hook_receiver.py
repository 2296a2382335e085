"""Inside the nspawn container: a loopback webhook receiver for the pages the units send.

Appends each POST body (the webhook's JSON) as one line to FILE; answers 200. Started by
run.sh with `systemd-run`, so the container's systemd owns (and, at poweroff, stops) it.
Usage: python hook_receiver.py PORT FILE
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main(port: int, out: Path) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                line = json.dumps(json.loads(body))
            except ValueError:
                line = json.dumps({"raw": body.decode(errors="replace")})
            with out.open("a") as f:
                f.write(line + "\n")
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
