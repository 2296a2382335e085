"""Operator notifications: webhook, Slack and ntfy, sent in the background, deduped, redacted.

Not to be confused with ``notify.py`` (sd_notify, for systemd). This module pages a person.

Theory of operation. The engine calls :meth:`Alerts.post` at the moments that matter
(``done``, ``failed``, ``parked``, ``stopped``, ``stalled``, ``gate_stop``, ``round_done``,
``recovered``); a task sends a ``digest`` once a day at ``notify.digest_at`` (local time).
``post`` never blocks and never raises: it checks the dedupe record, then puts the message
on a bounded queue (a full queue drops it, journaled as ``notify.dropped``). One worker task
sends each message to every endpoint subscribed to its event with httpx, with a timeout
and retries with exponential backoff; a message that still fails is journaled
(``notify.failed``) and forgotten. The campaign never waits for a receiver, except for a
bounded drain at exit so the final ``done``/``failed`` gets out.

Dedupe. A message's key is ``event|round|state|cause``. Keys sent within
``notify.dedupe_window`` are kept in ``<state_dir>/alerts.json`` (written atomically at
enqueue, so a daemon in a restart loop pages once, not fifty times).

Secrets. Endpoint URLs and tokens are read from the loaded .env (``url_env``,
``token_env``) and used only inside this process: never argv (no curl), never a file. Every
payload passes through the daemon's Redactor, and those keys are part of what it masks.

Payloads::

    webhook  POST JSON {"event", "campaign", "round", "round_id", "state", "message",
                        "cause", "bundle", "host", "time"}
    slack    POST JSON {"text": "*shoprld demo*: failed, round-001 TRAIN: ..."}
    ntfy     POST text/plain body; headers Title, Priority (urgent for failed/stalled/parked,
             default otherwise), Tags; Authorization: Bearer <token_env> when set
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import structlog

from shoprld.daemon.foundation.configsections import NotifyEndpoint, NotifySection
from shoprld.daemon.foundation.secrets import Redactor, Secrets
from shoprld.daemon.foundation.store import atomic_write_json

DEDUPE_FILE = "alerts.json"
URGENT = frozenset({"failed", "stalled", "parked", "gate_stop"})
log = structlog.get_logger("shoprld.alerts")

Journal = Callable[..., None]  # journal(event_name, **fields)


@dataclass(frozen=True)
class Message:
    """One notification, before it is shaped for an endpoint kind."""

    event: str
    campaign: str
    text: str
    round: int | None = None
    state: str | None = None
    cause: str | None = None
    bundle: str | None = None
    time: float = field(default_factory=time.time)

    @property
    def key(self) -> str:
        """The dedupe key: the same event of the same round, state and cause is one page."""
        return f"{self.event}|{self.round}|{self.state}|{self.cause or ''}"

    def title(self) -> str:
        where = f" round-{self.round:03d}" if self.round is not None else ""
        return f"shoprld {self.campaign}: {self.event}{where}"

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "campaign": self.campaign, "round": self.round,
                "round_id": f"round-{self.round:03d}" if self.round is not None else None,
                "state": self.state, "message": self.text, "cause": self.cause, "bundle": self.bundle,
                "host": socket.gethostname(), "time": self.time}


def build_request(ep: NotifyEndpoint, msg: Message, url: str, token: str | None,
                  redactor: Redactor) -> tuple[str, dict[str, str], bytes]:
    """(url, headers, body) for one endpoint kind; the body and headers are redacted."""
    if ep.kind == "webhook":
        body = json.dumps(redactor.obj(msg.to_json())).encode()
        return url, {"Content-Type": "application/json"}, body
    detail = msg.text
    if msg.cause:
        detail += f" (cause: {msg.cause})"
    if msg.bundle:
        detail += f"; bundle: {msg.bundle}"
    if ep.kind == "slack":
        body = json.dumps({"text": redactor.text(f"*{msg.title()}*: {detail}")})
        return url, {"Content-Type": "application/json"}, body.encode()
    headers = {"Title": _ascii(redactor.text(msg.title())), "Priority": "urgent" if msg.event in URGENT else "default",
               "Tags": _ascii(msg.event), "Content-Type": "text/plain; charset=utf-8"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return url, headers, redactor.text(detail).encode()


def _ascii(text: str) -> str:
    """HTTP header values are ASCII: anything else becomes '?'."""
    return text.encode("ascii", errors="replace").decode("ascii")[:200]


class DedupeRecord:
    """``<state_dir>/alerts.json``: keys sent recently, and when the last digest went out."""

    def __init__(self, path: Path, window: float) -> None:
        self.path, self.window = path, window
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        sent = data.get("sent") if isinstance(data, dict) else None
        self.sent: dict[str, float] = {k: float(v) for k, v in (sent or {}).items()
                                       if isinstance(k, str) and isinstance(v, (int, float))}
        last = data.get("last_digest") if isinstance(data, dict) else None
        self.last_digest: float | None = float(last) if isinstance(last, (int, float)) else None

    def seen(self, key: str, now: float) -> bool:
        at = self.sent.get(key)
        return at is not None and now - at < self.window

    def mark(self, key: str, now: float) -> None:
        self.sent = {k: v for k, v in self.sent.items() if now - v < self.window}
        self.sent[key] = now
        self.save()

    def save(self) -> None:
        try:
            atomic_write_json(self.path, {"sent": self.sent, "last_digest": self.last_digest}, mode=0o600)
        except OSError as exc:  # a full volume must not stop the page itself
            log.warning("notify.dedupe_unsaved", error=str(exc))


def next_digest(now: datetime, at: str) -> datetime:
    """The next local ``HH:MM`` strictly after ``now`` (a naive local datetime)."""
    hh, mm = (int(x) for x in at.split(":"))
    target = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    return target if target > now else target + timedelta(days=1)


def digest_text(records: Iterable[Mapping[str, Any]], since: float | None) -> str:
    """What happened since ``since`` (epoch seconds; None: since the start), from the journal."""
    rounds: list[str] = []
    failures: dict[str, int] = {}
    counts = {"stalls": 0, "parks": 0, "restarts": 0}
    last_state = None
    for rec in records:
        t = rec.get("t") or rec.get("time") or rec.get("ts")
        if since is not None and isinstance(t, (int, float)) and t < since:
            continue
        ev = rec.get("event")
        if ev == "transition":
            last_state = rec.get("dst")
            if rec.get("trigger") == "retry":
                counts["restarts"] += 1
            if rec.get("dst") == "PAUSED_DISK":
                counts["parks"] += 1
            if rec.get("trigger") == "next_round" or rec.get("trigger") == "finish":
                rounds.append(f"round-{int(rec.get('round') or 0):03d}")
        elif ev == "train.stall":
            counts["stalls"] += 1
        elif ev == "attempt.failed":
            cause = str((rec.get("cause") or {}).get("name", "unknown")) if isinstance(rec.get("cause"), dict) \
                else str(rec.get("cause"))
            failures[cause] = failures.get(cause, 0) + 1
    parts = [f"rounds finished: {', '.join(rounds) if rounds else 'none'}",
             f"failed attempts: {', '.join(f'{k} x{v}' for k, v in sorted(failures.items())) or 'none'}",
             f"stalls {counts['stalls']}, restarts {counts['restarts']}, parks {counts['parks']}",
             f"now: {last_state or 'unchanged'}"]
    return "; ".join(parts)


class Alerts:
    """The notification queue of one daemon. Build it, ``start`` it in the task group, ``post``."""

    def __init__(self, section: NotifySection, secrets: Secrets, redactor: Redactor, state_dir: Path,
                 campaign: str, journal: Journal, *, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.section, self.secrets, self.redactor = section, secrets, redactor
        self.campaign, self.journal, self.clock = campaign, journal, clock
        self._transport = transport
        self.dedupe = DedupeRecord(state_dir / DEDUPE_FILE, section.dedupe_window)
        self._send, self._recv = anyio.create_memory_object_stream[Message](section.queue)
        self._idle = anyio.Event()
        self._idle.set()
        self._pending = 0

    @property
    def enabled(self) -> bool:
        return bool(self.section.endpoints)

    def post(self, event: str, text: str, *, round: int | None = None, state: str | None = None,
             cause: str | None = None, bundle: str | None = None) -> bool:
        """Queue a notification; False when deduped, dropped or nobody listens. Never blocks."""
        if not any(event in ep.events for ep in self.section.endpoints):
            return False
        msg = Message(event, self.campaign, " ".join(text.split())[:1000], round, state, cause, bundle, self.clock())
        if self.dedupe.seen(msg.key, msg.time):
            self.journal("notify.deduped", notify_event=event, key=msg.key)
            return False
        try:
            self._send.send_nowait(msg)
        except anyio.WouldBlock:
            self.journal("notify.dropped", notify_event=event, reason="queue full")
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):  # the worker has ended (shutdown)
            self.journal("notify.dropped", notify_event=event, reason="the sender has stopped")
            return False
        self.dedupe.mark(msg.key, msg.time)
        self._pending += 1
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        return True

    async def run(self) -> None:
        """The worker: sends each queued message to its endpoints, in order."""
        timeout = httpx.Timeout(self.section.timeout)
        async with httpx.AsyncClient(transport=self._transport, trust_env=False, timeout=timeout,
                                     follow_redirects=False) as client:
            async with self._recv:
                async for msg in self._recv:
                    for i, ep in enumerate(self.section.endpoints):
                        if msg.event in ep.events:
                            await self._deliver(client, i, ep, msg)
                    self._pending -= 1
                    if self._pending <= 0:
                        self._idle.set()

    async def _deliver(self, client: httpx.AsyncClient, index: int, ep: NotifyEndpoint, msg: Message) -> None:
        url = self.secrets.values.get(ep.url_env, "")
        token = self.secrets.values.get(ep.token_env) if ep.token_env else None
        where = f"notify.endpoints[{index}] ({ep.kind}, {ep.url_env})"  # never the URL itself
        if not url:
            self.journal("notify.failed", notify_event=msg.event, endpoint=where, error=f"{ep.url_env} is not set")
            return
        target, headers, body = build_request(ep, msg, url, token, self.redactor)
        error = ""
        for attempt in range(self.section.retries + 1):
            if attempt:
                await anyio.sleep(min(60.0, self.section.backoff * 2 ** (attempt - 1)))
            try:
                resp = await client.post(target, content=body, headers=headers)
            except httpx.HTTPError as exc:
                # The exception text may quote the URL: name the kind only, then redact.
                error = f"{type(exc).__name__}"
                continue
            if resp.status_code < 300:
                self.journal("notify.sent", sync=False, notify_event=msg.event, endpoint=where, attempts=attempt + 1)
                return
            error = f"HTTP {resp.status_code}"
            if resp.status_code < 500 and resp.status_code != 429:
                break  # a 4xx will not get better by asking again
        log.warning("notify.failed", notify_event=msg.event, endpoint=where, error=error)
        self.journal("notify.failed", notify_event=msg.event, endpoint=where, error=error,
                     attempts=self.section.retries + 1)

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every queued message was tried."""
        with anyio.move_on_after(timeout):
            await self._idle.wait()

    async def digest_loop(self, read_journal: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        """Send the digest every day at ``notify.digest_at`` local time."""
        at = self.section.digest_at
        if not at or not any("digest" in ep.events for ep in self.section.endpoints):
            return
        while True:
            now = datetime.fromtimestamp(self.clock())
            await anyio.sleep(max(1.0, (next_digest(now, at) - now).total_seconds()))
            self.send_digest(read_journal())

    def send_digest(self, records: Iterable[Mapping[str, Any]]) -> bool:
        """Queue the digest of what the journal holds since the last one."""
        text = digest_text(records, self.dedupe.last_digest)
        now = self.clock()
        # The key carries the day, so one digest a day whatever the restarts.
        sent = self.post("digest", text, cause=datetime.fromtimestamp(now).strftime("%Y-%m-%d"))
        if sent:
            self.dedupe.last_digest = now
            self.dedupe.save()
        return sent

