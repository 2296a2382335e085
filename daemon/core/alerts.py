"""Operator notifications: webhook, Slack and ntfy, sent in the background, deduped, redacted.

Not to be confused with ``notify.py`` (sd_notify, for systemd). This module pages a person.

Theory of operation. The engine calls :meth:`Alerts.post` at the moments that matter
(``done``, ``failed``, ``parked``, ``stopped``, ``stalled``, ``gate_stop``, ``round_done``,
``recovered``); a task sends a ``digest`` once a day at ``notify.digest_at`` (local time).
``post`` never blocks and never raises: it checks the dedupe record, then puts the message
on a bounded queue (a full queue drops it, journaled as ``notify.dropped``). One worker task
sends each message to every endpoint subscribed to its event with httpx, with retries
and exponential backoff. Nothing a receiver does can take the daemon down or hold the queue:

- every attempt is bounded as a whole (connect, headers, body) by ``notify.timeout``
  (``anyio.fail_after``), so a receiver that never answers or drips a byte a second costs
  one timeout per attempt, journaled;
- the response body is never read: only the status line and headers matter, and a 600 MiB
  answer is closed unread (the connection is dropped, not drained);
- every exception of a delivery (an httpx error, a URL or header httpx refuses, anything)
  ends as one ``notify.failed`` journal line with its class, and the worker goes on. The URL
  and token are checked before any page (daemon/foundation/config/endpoints.py, at check, run and
  reload), so those should not happen; this is the belt to that brace.

A message that still fails is journaled (``notify.failed``), listed in ``alerts.json``'s
``undelivered`` (the last :data:`MAX_UNDELIVERED`), and its dedupe key is forgotten so the
next occurrence pages again. Messages still queued when the bounded drain at exit ends are
journaled as ``notify.undelivered`` and listed the same way.

Dedupe. A message's key is ``event|round|state|cause``. Keys sent within
``notify.dedupe_window`` are kept in ``<state_dir>/alerts.json`` (written atomically at
enqueue, so a daemon in a restart loop pages once, not fifty times). The file is parsed
against its schema (:class:`AlertsDoc`): one of another shape is set aside as
``alerts.json.bad`` and rebuilt empty (journaled ``state.rebuilt``, naming the file), and an
entry stamped in the future (a clock that was ahead, then corrected) is ignored, never a
reason to stay silent.

Reload. :meth:`Alerts.reconfigure` swaps the section and the secrets (a SIGHUP); the worker
and the digest task read them at each use. ``notify.queue`` is fixed at start.

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
import os
import socket
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from shoprld.daemon.foundation.config.configsections import NotifyEndpoint, NotifySection
from shoprld.daemon.foundation.system.errors import PreflightError
from shoprld.daemon.foundation.records.paths import round_id
from shoprld.daemon.foundation.config.secrets import Redactor, Secrets
from shoprld.daemon.foundation.records.store import ROUND_DONE_EVENT, atomic_write_json

DEDUPE_FILE = "alerts.json"
# alerts.json is a few KiB; a bigger one is not ours (rebuilt, never read whole).
MAX_DEDUPE_BYTES = 1024 * 1024
MAX_UNDELIVERED = 50
# How much of a clock step forward a dedupe stamp may be ahead of now (two hosts' NTP jitter).
FUTURE_SLACK_S = 60.0
URGENT = frozenset({"failed", "stalled", "parked", "gate_stop", "crashed"})
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
    marker: str = ""  # "[rehearsal]": the page is not about production
    detail: str = ""  # the decisive line of the cause (``KeyError: 'rho'``, the OOM-killer's line)
    advice: str = ""  # the cause's fix

    @property
    def key(self) -> str:
        """The dedupe key: the same event of the same round, state and cause is one page."""
        return f"{self.event}|{self.round}|{self.state}|{self.cause or ''}"

    def title(self) -> str:
        where = f" round-{self.round:03d}" if self.round is not None else ""
        mark = f"{self.marker} " if self.marker else ""
        return f"{mark}shoprld {self.campaign}: {self.event}{where}"

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "campaign": self.campaign, "round": self.round,
                "round_id": f"round-{self.round:03d}" if self.round is not None else None,
                "state": self.state, "message": self.text, "cause": self.cause, "detail": self.detail or None,
                "advice": self.advice or None, "bundle": self.bundle, "host": socket.gethostname(), "time": self.time, **({"marker": self.marker} if self.marker else {})}


def build_request(ep: NotifyEndpoint, msg: Message, url: str, token: str | None,
                  redactor: Redactor) -> tuple[str, dict[str, str], bytes]:
    """(url, headers, body) for one endpoint kind; the body and headers are redacted."""
    if ep.kind == "webhook":
        body = json.dumps(redactor.obj(msg.to_json())).encode()
        return url, {"Content-Type": "application/json"}, body
    detail = msg.text
    if msg.cause and f"cause: {msg.cause}" not in msg.text:
        # The decisive line is the page's point: "cause: python_exception" alone says nothing.
        why = f": {msg.detail}" if msg.detail and msg.detail not in msg.text else ""
        detail += f" (cause: {msg.cause}{why})"
    if msg.advice:
        detail += f"; fix: {msg.advice}"
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
    """HTTP header values are visible ASCII: anything else (non-ASCII, a control character, a
    newline that would split the header) becomes '?'."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:200]


class Undelivered(BaseModel):
    """One page that never reached an endpoint (kept in alerts.json for the operator)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    time: float
    event: str
    key: str
    endpoint: str
    error: str


class AlertsDoc(BaseModel):
    """The schema of ``<state_dir>/alerts.json``."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    sent: dict[str, float] = {}
    last_digest: float | None = None
    undelivered: list[Undelivered] = []


class DedupeRecord:
    """``<state_dir>/alerts.json``: keys sent recently, when the last digest went out, and the
    last pages that were never delivered.

    A file that is not valid JSON of :class:`AlertsDoc`'s shape is set aside
    (``alerts.json.bad``) and rebuilt empty; :attr:`problem` says so in one line naming the
    file, for the journal. Something that is not a regular file (a directory, a FIFO) is
    refused (:class:`PreflightError`, exit 3): it is not ours to replace."""

    def __init__(self, path: Path, window: float, clock: Callable[[], float] = time.time) -> None:
        self.path, self.window, self.clock = path, window, clock
        self.problem: str | None = None
        doc = self._load()
        now = clock()
        # Stamps from the future are dropped: they would silence the same page until then.
        self.sent: dict[str, float] = {k: v for k, v in doc.sent.items() if v <= now + FUTURE_SLACK_S}
        if len(self.sent) < len(doc.sent):
            self.problem = (f"{path}: {len(doc.sent) - len(self.sent)} dedupe entries stamped in the future "
                            f"(the clock was ahead) ignored")
        last = doc.last_digest
        self.last_digest: float | None = last if last is not None and last <= now + FUTURE_SLACK_S else None
        self.undelivered: list[Undelivered] = doc.undelivered[-MAX_UNDELIVERED:]

    def _load(self) -> AlertsDoc:
        try:
            # O_NONBLOCK: a FIFO put in its place must not hang the daemon's start.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return AlertsDoc()
        except OSError as exc:
            if os.path.isdir(self.path) or exc.errno == 40:  # ELOOP: a symlink, refused by O_NOFOLLOW
                raise self._refuse("is a directory" if os.path.isdir(self.path) else "is a symlink") from None
            raise self._refuse(f"cannot be read ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._refuse("is not a regular file")
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read(MAX_DEDUPE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            if len(data) > MAX_DEDUPE_BYTES:
                raise ValueError(f"over {MAX_DEDUPE_BYTES} bytes")
            return AlertsDoc.model_validate_json(data)
        except (ValueError, ValidationError) as exc:
            why = f"{exc.error_count()} field(s) of the wrong shape" if isinstance(exc, ValidationError) \
                else "not JSON"
            self._set_aside(why)
            return AlertsDoc()

    def _refuse(self, what: str) -> PreflightError:
        return PreflightError(f"{self.path}: {what}, not the notification record shoprld keeps there; "
                              f"fix: remove it (shoprld rebuilds it)")

    def _set_aside(self, why: str) -> None:
        bad = self.path.with_name(self.path.name + ".bad")
        try:
            os.replace(self.path, bad)
            kept = f"kept as {bad.name}"
        except OSError as exc:
            kept = f"not kept ({exc.strerror})"
        self.problem = f"{self.path}: {why}; rebuilt empty, the old one {kept}"

    def seen(self, key: str, now: float) -> bool:
        at = self.sent.get(key)
        return at is not None and 0.0 <= now - at < self.window

    def mark(self, key: str, now: float) -> None:
        self.sent = {k: v for k, v in self.sent.items() if 0.0 <= now - v < self.window}
        self.sent[key] = now
        self.save()

    def forget(self, key: str) -> None:
        """A page that was never delivered does not silence the next one."""
        if self.sent.pop(key, None) is not None:
            self.save()

    def record_undelivered(self, item: Undelivered) -> None:
        self.undelivered = [*self.undelivered, item][-MAX_UNDELIVERED:]
        self.save()

    def save(self) -> None:
        doc = AlertsDoc(sent=self.sent, last_digest=self.last_digest, undelivered=self.undelivered)
        try:
            atomic_write_json(self.path, doc.model_dump(mode="json"), mode=0o600)
        except OSError as exc:  # a full volume must not stop the page itself
            log.warning("notify.dedupe_unsaved", error=str(exc))


def next_digest(now: datetime, at: str) -> datetime:
    """The next local ``HH:MM`` strictly after ``now`` (a naive local datetime)."""
    hh, mm = (int(x) for x in at.split(":"))
    target = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    return target if target > now else target + timedelta(days=1)


def digest_text(records: Iterable[Mapping[str, Any]], since: float | None) -> str:
    """What happened since ``since`` (epoch seconds; None: since the start), from the journal."""
    rounds: dict[int, str] = {}
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
        elif ev == ROUND_DONE_EVENT and isinstance(rec.get("round"), int):
            # A round's facts are journaled once when it is recorded (the transition that
            # follows names the next round, so it cannot say which round finished).
            val = rec.get("val")
            rounds[rec["round"]] = round_id(rec["round"]) + (f" (val {val:.3g})" if isinstance(val, (int, float)) else "")
        elif ev == "train.stall":
            counts["stalls"] += 1
        elif ev == "attempt.failed":
            cause = str((rec.get("cause") or {}).get("name", "unknown")) if isinstance(rec.get("cause"), dict) \
                else str(rec.get("cause"))
            failures[cause] = failures.get(cause, 0) + 1
    done = [rounds[r] for r in sorted(rounds)]
    parts = [f"rounds finished: {', '.join(done) if done else 'none'}",
             f"failed attempts: {', '.join(f'{k} x{v}' for k, v in sorted(failures.items())) or 'none'}",
             f"stalls {counts['stalls']}, restarts {counts['restarts']}, parks {counts['parks']}",
             f"now: {last_state or 'unchanged'}"]
    return "; ".join(parts)


class Alerts:
    """The notification queue of one daemon. Build it, ``start`` it in the task group, ``post``."""

    def __init__(self, section: NotifySection, secrets: Secrets, redactor: Redactor, state_dir: Path,
                 campaign: str, journal: Journal, *, transport: httpx.AsyncBaseTransport | None = None,
                 clock: Callable[[], float] = time.time, marker: str = "") -> None:
        self.section, self.secrets, self.redactor = section, secrets, redactor
        self.campaign, self.journal, self.clock = campaign, journal, clock
        # "[rehearsal]": prefixed to every page of `shoprld rehearse --notify`.
        self.marker = marker
        self._transport = transport
        self.dedupe = DedupeRecord(state_dir / DEDUPE_FILE, section.dedupe_window, clock)
        self._send, self._recv = anyio.create_memory_object_stream[Message](section.queue)
        self._idle = anyio.Event()
        self._idle.set()
        self._pending = 0
        self._reconfigured: anyio.Event | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.section.endpoints)

    def reconfigure(self, section: NotifySection, secrets: Secrets) -> None:
        """A reload's ``[notify]`` and .env, in effect for every message sent from now on."""
        self.section, self.secrets = section, secrets
        self.dedupe.window = section.dedupe_window
        if self._reconfigured is not None:
            self._reconfigured.set()

    def post(self, event: str, text: str, *, round: int | None = None, state: str | None = None,
             cause: str | None = None, bundle: str | None = None, detail: str = "", advice: str = "") -> bool:
        """Queue a notification; False when deduped, dropped or nobody listens. Never blocks,
        never raises (the engine calls it from its main loop). ``detail``/``advice``: the
        cause's decisive line and fix."""
        try:
            return self._post(event, text, round, state, cause, bundle, " ".join(detail.split())[:300],
                              " ".join(advice.split())[:300])
        except Exception as exc:  # a page is never worth the campaign
            log.warning("notify.failed", notify_event=event, error=f"{type(exc).__name__}: {exc}")
            self.journal("notify.failed", notify_event=event, error_class=type(exc).__name__,
                         error=f"could not queue it ({type(exc).__name__})")
            return False

    def _post(self, event: str, text: str, round: int | None, state: str | None, cause: str | None,
              bundle: str | None, detail: str = "", advice: str = "") -> bool:
        if not any(event in ep.events for ep in self.section.endpoints):
            return False
        text = " ".join(text.split())[:1000]
        if self.marker:
            text = f"{self.marker} {text}"
        msg = Message(event, self.campaign, text, round, state, cause, bundle, self.clock(), self.marker,
                      detail, advice)
        if self.dedupe.seen(msg.key, msg.time):
            self.journal("notify.deduped", notify_event=event, key=msg.key)
            return False
        try:
            self._send.send_nowait(msg)
        except anyio.WouldBlock:
            self._undelivered(msg, "the queue", "queue full", "notify.dropped")
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):  # the worker has ended (shutdown)
            self._undelivered(msg, "the queue", "the sender has stopped", "notify.dropped")
            return False
        self.dedupe.mark(msg.key, msg.time)
        self._pending += 1
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        return True

    def _undelivered(self, msg: Message, endpoint: str, error: str, event: str = "notify.undelivered") -> None:
        self.journal(event, notify_event=msg.event, reason=error)
        self.dedupe.record_undelivered(Undelivered(time=msg.time, event=msg.event, key=msg.key,
                                                   endpoint=endpoint, error=error))

    async def run(self) -> None:
        """The worker: sends each queued message to its endpoints, in order. No delivery's
        error ends it (:meth:`_deliver` catches them all)."""
        if self.dedupe.problem:
            log.warning("state.rebuilt", file=str(self.dedupe.path), reason=self.dedupe.problem)
            self.journal("state.rebuilt", file=str(self.dedupe.path), reason=self.dedupe.problem)
            self.dedupe.problem = None
        async with httpx.AsyncClient(transport=self._transport, trust_env=False, follow_redirects=False,
                                     timeout=httpx.Timeout(self.section.timeout)) as client:
            async with self._recv:
                async for msg in self._recv:
                    delivered = True
                    for i, ep in enumerate(self.section.endpoints):
                        if msg.event in ep.events:
                            delivered = await self._deliver(client, i, ep, msg) and delivered
                    if not delivered:
                        self.dedupe.forget(msg.key)
                    self._pending -= 1
                    if self._pending <= 0:
                        self._idle.set()

    async def send_test(self, text: str) -> list[tuple[str, str | None]]:
        """One page to every endpoint, whatever events it subscribes to, now, bypassing the queue
        and the dedupe (``shoprld notify-test``). Returns (endpoint, error or None) per endpoint."""
        msg = Message("test", self.campaign, text, time=self.clock(), marker=self.marker)
        out: list[tuple[str, str | None]] = []
        async with httpx.AsyncClient(transport=self._transport, trust_env=False, follow_redirects=False,
                                     timeout=httpx.Timeout(self.section.timeout)) as client:
            for i, ep in enumerate(self.section.endpoints):
                where = f"notify.endpoints[{i}] ({ep.kind}, {ep.url_env})"  # never the URL itself
                try:
                    error, _, _ = await self._attempts(client, ep, msg, where)
                except Exception as exc:  # a URL or header httpx refuses: this endpoint's line
                    error = type(exc).__name__
                out.append((where, error))
        return out

    async def _deliver(self, client: httpx.AsyncClient, index: int, ep: NotifyEndpoint, msg: Message) -> bool:
        """Send ``msg`` to one endpoint; True when it was accepted. Never raises (but cancellation)."""
        where = f"notify.endpoints[{index}] ({ep.kind}, {ep.url_env})"  # never the URL itself
        try:
            error, error_class, attempts = await self._attempts(client, ep, msg, where)
        except Exception as exc:  # a URL or header httpx refuses, a bug: one line, and the worker goes on
            error, error_class, attempts = f"{type(exc).__name__}", type(exc).__name__, 1
        if error is None:
            return True
        log.warning("notify.failed", notify_event=msg.event, endpoint=where, error=error, error_class=error_class)
        self.journal("notify.failed", notify_event=msg.event, endpoint=where, error=error,
                     error_class=error_class, attempts=attempts)
        self.dedupe.record_undelivered(Undelivered(time=msg.time, event=msg.event, key=msg.key,
                                                   endpoint=where, error=error))
        return False

    async def _attempts(self, client: httpx.AsyncClient, ep: NotifyEndpoint, msg: Message,
                        where: str) -> tuple[str | None, str, int]:
        """(error or None, its class, attempts made): each attempt bounded as a whole."""
        url = self.secrets.values.get(ep.url_env, "")
        token = self.secrets.values.get(ep.token_env) if ep.token_env else None
        if not url:
            return f"{ep.url_env} is not set", "NotSet", 0
        target, headers, body = build_request(ep, msg, url, token, self.redactor)
        timeout = self.section.timeout
        error, error_class = "", ""
        attempt = 0
        for attempt in range(self.section.retries + 1):
            if attempt:
                await anyio.sleep(min(60.0, self.section.backoff * 2 ** (attempt - 1)))
            try:
                with anyio.fail_after(timeout):
                    # Streamed, and the body never read: only the status matters, and an endless
                    # or huge answer is closed unread.
                    async with client.stream("POST", target, content=body, headers=headers,
                                             timeout=httpx.Timeout(timeout)) as resp:  # a reload's, too
                        code = resp.status_code
            except TimeoutError:
                error, error_class = f"no complete answer within {timeout:g}s", "Timeout"
                continue
            except httpx.TransportError as exc:  # refused, reset, a broken answer: worth another try
                # The exception text may quote the URL: name the kind only.
                error, error_class = type(exc).__name__, type(exc).__name__
                continue
            if code < 300:
                self.journal("notify.sent", sync=False, notify_event=msg.event, endpoint=where, attempts=attempt + 1)
                return None, "", attempt + 1
            error, error_class = f"HTTP {code}", "HTTPStatus"
            if code < 500 and code != 429:
                break  # a 3xx or 4xx will not get better by asking again
        return error, error_class, attempt + 1

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every queued message was tried; what is
        still queued then is journaled ``notify.undelivered`` and listed in alerts.json."""
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        left: list[Message] = []
        while True:
            try:
                left.append(self._recv.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                break
        for msg in left:
            self._undelivered(msg, "the queue", f"still queued when the daemon stopped ({timeout:g}s drain)")

    async def digest_loop(self, read_journal: Callable[[], Iterable[Mapping[str, Any]]]) -> None:
        """Send the digest every day at ``notify.digest_at`` local time (re-read after a reload)."""
        while True:
            self._reconfigured = changed = anyio.Event()
            at = self.section.digest_at
            if not at or not any("digest" in ep.events for ep in self.section.endpoints):
                await changed.wait()
                continue
            now = datetime.fromtimestamp(self.clock())
            with anyio.move_on_after(max(1.0, (next_digest(now, at) - now).total_seconds())):
                await changed.wait()
            if not changed.is_set():
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
