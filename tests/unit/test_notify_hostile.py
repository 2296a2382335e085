"""Notify delivery never takes the daemon down: hostile receivers on real loopback sockets
(never answers, drips, 600 MiB body, endless body, bad statuses, reset, close, garbage,
redirect), URLs and tokens httpx refuses at send time, and a well-behaved receiver beside
each that must still get every page. Plus alerts.json of any shape."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoprld.daemon.core.alerts import DEDUPE_FILE, Alerts, DedupeRecord
from shoprld.daemon.foundation.config.configsections import NotifySection
from shoprld.daemon.foundation.system.errors import PreflightError
from shoprld.daemon.foundation.config.secrets import with_pattern
from tests.hostile_http import HostileReceiver
from tests.receiver import Receiver

Journal = list[tuple[str, dict[str, Any]]]


def _alerts(tmp_path: Path, bad_url: str, good_url: str, *, token: str = "", **section: Any) -> tuple[Alerts, Journal]:
    """Endpoint 0 is the hostile one, endpoint 1 a receiver that behaves."""
    values = {"BAD_HOOK_URL": bad_url, "GOOD_HOOK_URL": good_url}
    bad: dict[str, Any] = {"kind": "ntfy" if token else "webhook", "url_env": "BAD_HOOK_URL"}
    if token:
        values["BAD_TOKEN"] = token
        bad["token_env"] = "BAD_TOKEN"
    secrets = with_pattern(values, None, extra_keys=tuple(values))
    cfg = NotifySection.model_validate({"endpoints": [bad, {"kind": "webhook", "url_env": "GOOD_HOOK_URL"}],
                                        "backoff": 0.01, "retries": 1, "timeout": 1.0, **section})
    journal: Journal = []
    alerts = Alerts(cfg, secrets, secrets.redactor, tmp_path, "demo",
                    lambda ev, sync=True, **f: journal.append((ev, f)))
    return alerts, journal


def _send(alerts: Alerts, events: list[str]) -> None:
    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(alerts.run)
            for i, event in enumerate(events):
                assert alerts.post(event, f"page {i}", round=i)
            with anyio.fail_after(120):  # a hang guard, not a timing assertion
                await alerts.drain(120)
            tg.cancel_scope.cancel()

    anyio.run(main)


def _failed(journal: Journal) -> list[dict[str, Any]]:
    return [f for e, f in journal if e == "notify.failed"]


MODES = [("silent", "Timeout"), ("drip", "Timeout"), ("endless", None), ("huge", None),
         ("status:500", "HTTPStatus"), ("status:404", "HTTPStatus"), ("status:429", "HTTPStatus"),
         ("reset", None), ("close", None), ("garbage", None), ("redirect", "HTTPStatus")]


@pytest.mark.parametrize(("mode", "error_class"), MODES, ids=[m for m, _ in MODES])
def test_a_hostile_receiver_costs_one_journal_line_and_blocks_nothing(tmp_path: Path, mode: str,
                                                                       error_class: str | None) -> None:
    """Two pages: each is journaled notify.failed at the hostile endpoint (with its class), the
    good endpoint gets both, the worker never raises, the undelivered pages are in alerts.json,
    and a huge or endless answer is never read (the server could send only a sliver of it)."""
    with HostileReceiver(mode, drip_s=0.3) as bad, Receiver() as good:
        alerts, journal = _alerts(tmp_path, bad.url, good.url)
        _send(alerts, ["failed", "stalled"])
    if mode in ("huge", "endless"):
        # A 200 whose body we never read is a delivered page; the body stayed on the wire.
        assert _failed(journal) == [] and [e for e, _ in journal].count("notify.sent") == 4
        assert bad.sent_body < 64 * 1024 * 1024, bad.sent_body
        return
    assert good.events() == ["failed", "stalled"]
    failed = _failed(journal)
    assert [f["endpoint"] for f in failed] == ["notify.endpoints[0] (webhook, BAD_HOOK_URL)"] * 2
    if error_class is not None:
        assert {f["error_class"] for f in failed} == {error_class}
    assert all(bad.url not in json.dumps(f) for f in failed)
    doc = json.loads((tmp_path / DEDUPE_FILE).read_text())
    assert [u["event"] for u in doc["undelivered"]] == ["failed", "stalled"]
    assert doc["sent"] == {}  # an undelivered page does not silence the next one
    if mode.startswith("status:4") and mode != "status:429":
        assert bad.requests == 2  # a 4xx is not asked again
    if mode in ("status:500", "status:429", "silent"):
        assert bad.requests == 4  # retried once each


# Values a .env can hold that httpx refuses only when it sends (check refuses them first;
# this is the delivery's own guard).
BAD_URLS = ["http://127.0.0.1:99999/x", "http://[::1/x", "http://h:80:80/", "http://ex\u00e4mple.com/x",
            "http://h/a b", "ftp://h/x", "http:///x", "not a url", "http://h/\r\nX-Evil: 1", "http://[]/x",
            "http://127.0.0.1:0/x"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_httpx_refuses_is_a_failed_page_not_a_crash(tmp_path: Path, url: str) -> None:
    with Receiver() as good:
        alerts, journal = _alerts(tmp_path, url, good.url)
        _send(alerts, ["failed", "parked"])
    assert good.events() == ["failed", "parked"]
    failed = _failed(journal)
    assert len(failed) == 2 and all(f["error_class"] for f in failed)
    assert all(url not in json.dumps(f) for f in failed)


@pytest.mark.parametrize("token", ["tok\u00e9n-value-123", "token with space", "tok\r\nX-Evil: 1abc",
                                   "t" * 70000])
def test_a_token_no_header_can_hold_is_a_failed_page_not_a_crash(tmp_path: Path, token: str) -> None:
    with Receiver() as bad_but_listening, Receiver() as good:
        alerts, journal = _alerts(tmp_path, bad_but_listening.url, good.url, token=token)
        _send(alerts, ["failed"])
    assert good.events() == ["failed"]
    assert all(b"X-Evil" not in r.body and "X-Evil" not in r.headers for r in bad_but_listening.requests)


def test_rehearsal_marker_is_on_every_page(tmp_path: Path) -> None:
    """`rehearse --notify`: the title and the text say [rehearsal]."""
    with Receiver() as good:
        secrets = with_pattern({"GOOD_HOOK_URL": good.url}, None)
        cfg = NotifySection.model_validate({"endpoints": [{"kind": "webhook", "url_env": "GOOD_HOOK_URL"}]})
        alerts = Alerts(cfg, secrets, secrets.redactor, tmp_path, "demo", lambda *a, **k: None, marker="[rehearsal]")
        _send(alerts, ["done"])
    body = good.requests[0].json()
    assert body["message"].startswith("[rehearsal] ") and body["marker"] == "[rehearsal]"


# -- alerts.json of any shape ---------------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=12)
SHAPED = st.fixed_dictionaries({}, optional={"sent": JSON, "last_digest": JSON, "undelivered": JSON})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=JSON | SHAPED)
def test_alerts_json_of_any_shape_is_rebuilt_never_a_crash(tmp_path: Path, doc: Any) -> None:
    """Valid JSON of any shape: the record loads (rebuilt when the shape is wrong, the old copy
    kept), works, and saves a file of the right shape."""
    path = tmp_path / DEDUPE_FILE
    path.write_text(json.dumps(doc))
    rec = DedupeRecord(path, 3600.0, clock=lambda: 1000.0)
    if rec.problem and "rebuilt" in rec.problem:
        assert rec.problem.startswith(str(path)) and (tmp_path / "alerts.json.bad").exists()
    assert not rec.seen("x", 1000.0)
    rec.mark("x", 1000.0)
    again = DedupeRecord(path, 3600.0, clock=lambda: 1000.0)
    assert again.problem is None and again.seen("x", 1001.0)


@pytest.mark.parametrize("raw", [b"", b"\xff\xfe", b"[1, 2]", b'{"sent": []}', b'{"sent": {"k": "soon"}}',
                                 b'{"sent": {"k": 1e999}}', b"null", b'"text"', b"{" * 100000, b"1" * 2_000_000])
def test_alerts_json_garbage_is_set_aside_in_one_line(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / DEDUPE_FILE
    path.write_bytes(raw)
    rec = DedupeRecord(path, 3600.0)
    assert rec.problem is not None and rec.problem.startswith(f"{path}: ") and "\n" not in rec.problem
    assert (tmp_path / "alerts.json.bad").read_bytes() == raw


def test_dedupe_entries_from_the_future_are_ignored(tmp_path: Path) -> None:
    """A key stamped a day ahead (the clock was wrong, then corrected) does not silence the page."""
    now = 1_700_000_000.0
    path = tmp_path / DEDUPE_FILE
    path.write_text(json.dumps({"sent": {"failed|1|TRAIN|": now + 86400, "stalled|1|TRAIN|": now - 10},
                                "last_digest": now + 86400}))
    rec = DedupeRecord(path, 3600.0, clock=lambda: now)
    assert not rec.seen("failed|1|TRAIN|", now) and rec.seen("stalled|1|TRAIN|", now)
    assert rec.last_digest is None and rec.problem is not None and "future" in rec.problem


@pytest.mark.parametrize("kind", ["dir", "fifo", "symlink"])
def test_alerts_json_that_is_not_a_file_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / DEDUPE_FILE
    if kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(PreflightError) as e:
        DedupeRecord(path, 3600.0)
    assert str(e.value).startswith(f"{path}: ") and "fix: remove it" in str(e.value)
    assert path.exists() or path.is_symlink()  # never replaced
