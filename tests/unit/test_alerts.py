"""Operator notifications against a real loopback HTTP receiver: each event and endpoint kind,
the retry path, dedupe across restarts, redaction, and the config's one-line errors."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from shoprld.daemon.core.alerts import Alerts, digest_text, next_digest
from shoprld.daemon.foundation.config.config import config_from_dict
from shoprld.daemon.foundation.config.configsections import NOTIFY_EVENTS, NotifySection
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.config.secrets import load_secrets, with_pattern
from tests.receiver import Receiver

SECRET = "wandb-secret-value-123456"


def _alerts(tmp_path: Path, url: str, kind: str = "webhook", **section: Any) -> tuple[Alerts, list[tuple[str, dict[str, Any]]]]:
    secrets = with_pattern({"SHOPRLD_WEBHOOK_URL": url, "WANDB_API_KEY": SECRET, "NTFY_TOKEN": "tok-abcdefgh12"},
                           None, extra_keys=("SHOPRLD_WEBHOOK_URL",))
    ep: dict[str, Any] = {"kind": kind, "url_env": "SHOPRLD_WEBHOOK_URL"}
    if kind == "ntfy":
        ep["token_env"] = "NTFY_TOKEN"
    cfg = NotifySection.model_validate({"endpoints": [ep], "backoff": 0.01, **section})
    journal: list[tuple[str, dict[str, Any]]] = []
    alerts = Alerts(cfg, secrets, secrets.redactor, tmp_path, "demo",
                    lambda ev, sync=True, **f: journal.append((ev, f)))
    return alerts, journal


def _send_all(alerts: Alerts, posts: list[tuple[str, str]]) -> list[bool]:
    out: list[bool] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(alerts.run)
            for event, text in posts:
                out.append(alerts.post(event, text, round=1, state="TRAIN", cause="cuda_oom"))
            with anyio.fail_after(20):
                await alerts.drain(20)
            tg.cancel_scope.cancel()

    anyio.run(main)
    return out


def test_each_event_reaches_a_webhook_as_redacted_json(tmp_path: Path) -> None:
    """Every event is POSTed once as JSON, with its cause, and a secret in the text is masked."""
    with Receiver() as r:
        alerts, journal = _alerts(tmp_path, r.url)
        sent = _send_all(alerts, [(e, f"{e} happened; key {SECRET}") for e in NOTIFY_EVENTS])
    assert all(sent) and r.events() == list(NOTIFY_EVENTS)
    body = r.requests[0].json()
    assert body["campaign"] == "demo" and body["round_id"] == "round-001" and body["cause"] == "cuda_oom"
    assert all(SECRET.encode() not in q.body for q in r.requests) and "***" in body["message"]
    assert [e for e, _ in journal].count("notify.sent") == len(NOTIFY_EVENTS)


def test_slack_and_ntfy_payloads(tmp_path: Path) -> None:
    """Slack gets {"text"}; ntfy gets a text body with Title, Priority and the bearer token."""
    with Receiver() as r:
        alerts, _ = _alerts(tmp_path / "s", r.url, kind="slack")
        _send_all(alerts, [("failed", "TRAIN failed")])
        alerts, _ = _alerts(tmp_path / "n", r.url, kind="ntfy")
        _send_all(alerts, [("failed", "TRAIN failed")])
    slack, ntfy = r.requests
    assert slack.json()["text"].startswith("*shoprld demo: failed round-001*: TRAIN failed (cause: cuda_oom)")
    assert ntfy.headers["Title"] == "shoprld demo: failed round-001" and ntfy.headers["Priority"] == "urgent"
    assert ntfy.headers["Authorization"] == "Bearer tok-abcdefgh12" and ntfy.body.startswith(b"TRAIN failed")


def test_retry_after_two_500s_then_success(tmp_path: Path) -> None:
    """The receiver answers 500 twice, then 200: one message, three requests, journaled sent."""
    with Receiver(fail_first=2) as r:
        alerts, journal = _alerts(tmp_path, r.url)
        _send_all(alerts, [("done", "all rounds done")])
    assert r.answered == [500, 500, 200] and r.events() == ["done"] * 3
    assert ("notify.sent", {"notify_event": "done", "endpoint": "notify.endpoints[0] (webhook, SHOPRLD_WEBHOOK_URL)",
                            "attempts": 3}) in journal


def test_a_receiver_that_keeps_failing_is_journaled_never_raised(tmp_path: Path) -> None:
    """Past the retries, notify.failed is journaled (naming the key, never the URL)."""
    with Receiver(fail_first=100) as r:
        alerts, journal = _alerts(tmp_path, r.url, retries=1)
        _send_all(alerts, [("failed", "x")])
    failed = [f for e, f in journal if e == "notify.failed"]
    assert len(failed) == 1 and failed[0]["error"] == "HTTP 500" and r.url not in str(journal)


def test_dedupe_holds_across_a_restart(tmp_path: Path) -> None:
    """The same event, round, state and cause is sent once per window, even by a new daemon."""
    with Receiver() as r:
        first, _ = _alerts(tmp_path, r.url)
        assert _send_all(first, [("failed", "boom"), ("failed", "boom again")]) == [True, False]
        second, journal = _alerts(tmp_path, r.url)  # a restarted daemon: the record is on disk
        assert _send_all(second, [("failed", "boom")]) == [False]
        third, _ = _alerts(tmp_path, r.url)
        assert _send_all(third, [("stalled", "other event")]) == [True]
    assert r.events() == ["failed", "stalled"]
    assert [e for e, _ in journal][0] == "notify.deduped"
    assert r.url not in (tmp_path / "alerts.json").read_text()


def test_a_full_queue_drops_and_journals_without_blocking(tmp_path: Path) -> None:
    """With nobody draining, the bounded queue refuses the overflow at once."""
    alerts, journal = _alerts(tmp_path, "http://127.0.0.1:9/", queue=1)
    assert alerts.post("failed", "a", round=1) and not alerts.post("stalled", "b", round=1)
    assert journal[-1] == ("notify.dropped", {"notify_event": "stalled", "reason": "queue full"})


def test_next_digest_time() -> None:
    """The next HH:MM strictly after now, today or tomorrow."""
    assert next_digest(datetime(2026, 12, 1, 7, 59), "08:00") == datetime(2026, 12, 1, 8, 0)
    assert next_digest(datetime(2026, 12, 1, 8, 0), "08:00") == datetime(2026, 12, 2, 8, 0)


def test_digest_summarises_the_journal_since_the_last_one() -> None:
    """Rounds, failed attempts by cause, stalls, restarts and parks since ``since``."""
    recs = [{"t": 5, "event": "attempt.failed", "cause": {"name": "cuda_oom"}},
            {"t": 10, "event": "attempt.failed", "cause": {"name": "cuda_oom"}},
            {"t": 11, "event": "train.stall"}, {"t": 12, "event": "transition", "trigger": "retry", "dst": "TRAIN"},
            {"t": 13, "event": "round.done", "round": 0, "val": 0.5},
            {"t": 13, "event": "transition", "trigger": "next_round", "dst": "TRAIN", "round": 1}]
    text = digest_text(recs, since=8)
    assert "cuda_oom x1" in text and "stalls 1, restarts 1" in text
    assert "rounds finished: round-000 (val 0.5);" in text and "round-001" not in text


def test_digest_lists_each_finished_round_once() -> None:
    """A 3-round campaign stopped once in round 1: the journal's transitions name the round
    they enter (next_round names the next one, finish and a resume repeat the last), so only
    the ``round.done`` records say which rounds finished, each once, in order."""
    recs: list[dict[str, Any]] = []
    t = 0

    def add(event: str, **f: Any) -> None:
        nonlocal t
        t += 1
        recs.append({"t": t, "event": event, **f})

    add("transition", trigger="start", dst="TRAIN", round=0)
    add("round.done", round=0, val=0.25)
    add("transition", trigger="next_round", dst="TRAIN", round=1)
    add("transition", trigger="stop", dst="STOPPED", round=1)
    add("transition", trigger="resume", dst="TRAIN", round=1)
    add("round.done", round=1, val=0.375)
    add("transition", trigger="next_round", dst="TRAIN", round=2)
    add("round.done", round=2, val=0.5)
    add("transition", trigger="finish", dst="DONE", round=2)
    text = digest_text(recs, since=None)
    assert text.startswith("rounds finished: round-000 (val 0.25), round-001 (val 0.375), round-002 (val 0.5); ")
    assert text.endswith("now: DONE")
    # Since the second round's record: only the rounds finished from then on.
    assert digest_text(recs, since=6).startswith("rounds finished: round-001 (val 0.375), round-002 (val 0.5); ")


def _cfg(tmp_path: Path, notify: dict[str, Any]) -> Any:
    return config_from_dict({"campaign": {"name": "c", "rounds": 1, "steps_per_round": 1},
                             "train": {"command": ["x"]}, "wandb": {"enabled": False}, "notify": notify}, tmp_path / "c.toml")


def test_config_errors_are_one_line(tmp_path: Path) -> None:
    """An unknown event, or a url_env that is not in .env, is one line naming the key and the fix."""
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, {"endpoints": [{"kind": "webhook", "url_env": "U", "events": ["dnoe"]}]})
    assert str(e.value).startswith(f"{tmp_path / 'c.toml'}: notify.endpoints[0].events: unknown event 'dnoe'")
    cfg = _cfg(tmp_path, {"endpoints": [{"kind": "slack", "url_env": "SHOPRLD_SLACK_URL"}]})
    (tmp_path / ".env").write_text("OTHER=1\n")
    secrets = load_secrets(tmp_path / ".env", extra_keys=cfg.required_secrets())
    with pytest.raises(ConfigError) as e:
        secrets.require(cfg.required_secrets())
    assert str(e.value) == (f"{tmp_path / '.env'}: SHOPRLD_SLACK_URL is not set (required by "
                            f"notify.endpoints[0].url_env); fix: add a line SHOPRLD_SLACK_URL=... to that file")


def _send_failed(alerts: Alerts, text: str) -> None:
    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(alerts.run)
            alerts.post("failed", text, round=0, state="INJECT", cause="python_exception",
                        bundle="/e/logs/attempts/round-000-INJECT-3", detail="KeyError: 'rho'",
                        advice="fix the error above")
            with anyio.fail_after(20):
                await alerts.drain(20)
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_failed_page_says_why_on_every_endpoint_kind(tmp_path: Path) -> None:
    """The decisive line (the exception), the advice and the bundle: structured fields in the
    webhook JSON, one readable line on Slack and ntfy, the cause said once."""
    text = "INJECT failed after 3 attempts: curriculum.json: not written by inject.command"
    with Receiver() as r:
        for kind in ("webhook", "slack", "ntfy"):
            alerts, _ = _alerts(tmp_path / kind, r.url, kind=kind)
            _send_failed(alerts, text)
    hook, slack, ntfy = r.requests
    body = hook.json()
    assert (body["cause"], body["detail"], body["advice"]) == ("python_exception", "KeyError: 'rho'", "fix the error above")
    assert body["bundle"] == "/e/logs/attempts/round-000-INJECT-3" and body["message"] == text
    line = (f"{text} (cause: python_exception: KeyError: 'rho'); fix: fix the error above; "
            f"bundle: /e/logs/attempts/round-000-INJECT-3")
    assert slack.json()["text"] == f"*shoprld demo: failed round-000*: {line}"
    assert ntfy.body.decode() == line
    # A message that already names the cause and its line (the machine's "failed after" line) keeps it once.
    with Receiver() as r:
        alerts, _ = _alerts(tmp_path / "again", r.url, kind="slack")
        _send_failed(alerts, f"{text} (cause: python_exception: KeyError: 'rho')")
    assert r.requests[0].json()["text"].count("KeyError") == 1
