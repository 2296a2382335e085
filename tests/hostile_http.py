"""A real loopback HTTP receiver that misbehaves on purpose, for the notify hostile cases.

``with HostileReceiver("drip") as h: ... h.url ...``. Each mode is a way a webhook can hurt
its caller:

- ``silent``: accepts, reads the request, never answers (holds the connection);
- ``drip``: answers ``HTTP/1.1 200 OK`` one byte per ``drip_s`` seconds, forever;
- ``huge``: answers 200 with a 600 MiB body, generated lazily (one 64 KiB buffer sent again
  and again: nothing of that size is ever allocated), until the client stops reading;
- ``endless``: answers 200 with a chunked body that never ends;
- ``status:<N>``: answers status N with a small body;
- ``reset``: reads the request, then resets the connection (RST, SO_LINGER 0);
- ``close``: reads the request, then closes without a byte;
- ``garbage``: answers bytes that are not HTTP;
- ``redirect``: answers 302 to another URL (never followed: a redirect is not delivery).

It counts requests and the body bytes it managed to send (``sent_body``), so a test can show
the client stopped reading long before 600 MiB.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

HUGE_BYTES = 600 * 1024 * 1024
_CHUNK = b"\0" * 65536


@dataclass
class HostileReceiver:
    """A loopback server with one misbehaviour (``mode``); see the module docstring."""

    mode: str
    drip_s: float = 1.0
    requests: int = 0
    sent_body: int = 0
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> HostileReceiver:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        host, port = self._sock.getsockname()[:2]
        self._url = f"http://{host}:{port}/hook/s3cr3t-path-token"
        self._sock.settimeout(0.2)
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accept.join(5)
        self._sock.close()
        for t in self._threads:
            t.join(5)

    @property
    def url(self) -> str:
        return self._url

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _read_request(self, conn: socket.socket) -> bool:
        conn.settimeout(5)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                got = conn.recv(65536)
                if not got:
                    return False
                data += got
            head, _, body = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            while len(body) < length:
                got = conn.recv(65536)
                if not got:
                    return False
                body += got
        except (OSError, ValueError):
            return False
        with self._lock:
            self.requests += 1
        return True

    def _send_body(self, conn: socket.socket, total: int | None) -> None:
        """Zeros, ``total`` bytes (None: chunked, forever), until the client stops reading."""
        conn.settimeout(30)
        sent = 0
        try:
            while not self._stop.is_set() and (total is None or sent < total):
                if total is None:
                    conn.sendall(b"10000\r\n" + _CHUNK + b"\r\n")
                else:
                    conn.sendall(_CHUNK[: min(len(_CHUNK), total - sent)])
                sent += len(_CHUNK)
                with self._lock:
                    self.sent_body += len(_CHUNK)
        except OSError:
            return

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            if not self._read_request(conn):
                return
            mode = self.mode
            try:
                if mode == "silent":
                    self._stop.wait()
                elif mode == "drip":
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
                        if self._stop.wait(self.drip_s):
                            return
                        conn.sendall(bytes([byte]))
                elif mode == "huge":
                    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {HUGE_BYTES}\r\n\r\n".encode())
                    self._send_body(conn, HUGE_BYTES)
                elif mode == "endless":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    self._send_body(conn, None)
                elif mode.startswith("status:"):
                    code = int(mode.split(":", 1)[1])
                    conn.sendall(f"HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno".encode())
                elif mode == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif mode == "close":
                    pass
                elif mode == "garbage":
                    conn.sendall(b"\x16\x03\x01 this is not HTTP at all\r\n\r\n")
                    time.sleep(0.05)
                elif mode == "redirect":
                    conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere\r\n"
                                 b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                else:
                    raise ValueError(f"unknown mode {mode!r}")
            except OSError:
                return
