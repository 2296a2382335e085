"""The terminal view for a person (issue 18, item 7): compact on a TTY, JSON for pipes and systemd."""

from __future__ import annotations

import io
import logging
import os
import re

import pytest
import structlog

from shoprld.daemon.foundation.system.console import LIVE, Campaign, CompactRenderer, terminal_mode
from shoprld.daemon.foundation.system.logs import configure


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("tty", "env", "verbose", "mode"), [
    (True, {}, False, "compact"),
    (True, {}, True, "dev"),
    (False, {}, False, "json"),
    (False, {}, True, "json"),
    (True, {"JOURNAL_STREAM": "8:1234"}, False, "json"),
    (True, {"INVOCATION_ID": "0123abcd"}, True, "json"),
])
def test_mode_is_json_when_piped_or_under_systemd(tty: bool, env: dict[str, str], verbose: bool, mode: str) -> None:
    """A terminal gets the compact view (--verbose: every event); a pipe or systemd gets JSON lines."""
    stream = _Tty() if tty else io.StringIO()
    assert terminal_mode(stream, verbose=verbose, environ=env) == mode


def test_lines_name_rounds_one_way_and_keep_floats_short() -> None:
    """State changes and round results are one line each, `round-001 (2 of 5)`; progress is the live line."""
    r = CompactRenderer(Campaign(rounds=5, steps_per_round=20))
    line = r(None, "info", {"event": "transition", "src": "START_SHOPSIM", "dst": "TRAIN", "trigger": "shopsim_ready",
                            "round": 1, "level": "info"})
    assert re.fullmatch(r"\d\d:\d\d:\d\d  round-001 \(2 of 5\)  TRAIN  \(from START_SHOPSIM, shopsim_ready\)", line)
    live = r(None, "info", {"event": "train.progress", "step": 12, "step_seconds": 0.25241874999898334,
                            "round": 1, "rollout": 32, "level": "info"})
    assert live.startswith(LIVE) and "12/20  0.25 s/step  ETA 2s" in live and "0.2524" not in live
    done = r(None, "info", {"event": "round.done", "round": 1, "val": 0.4750000001, "metric_name": "success_rate",
                            "gate": "complete", "branch": "selected", "duration_seconds": 754.2, "level": "info"})
    assert done.endswith("round-001 (2 of 5)  done: success_rate 0.475, gate complete, skillbank selected, 12m")
    assert r(None, "info", {"event": "stage.spawn", "argv": ["python"] * 40, "level": "info"}) == ""
    assert r(None, "warning", {"event": "disk.soft_limit", "message": "free 3 GiB", "level": "warning"}) \
        .endswith("! disk.soft_limit: free 3 GiB")


def test_the_live_line_is_redrawn_in_place_and_other_lines_clear_it() -> None:
    """Through the real logging chain: progress rewrites one line (CR + erase), per-step events
    never add lines, a state change clears it and prints its own line."""
    out = _Tty()
    try:
        configure(stream=out, compact=Campaign(rounds=2, steps_per_round=4))
        log = structlog.get_logger("t")
        log.info("transition", src="START_SHOPSIM", dst="TRAIN", trigger="shopsim_ready", round=0)
        for step in range(1, 5):
            log.info("train.progress", step=step, step_seconds=0.5, round=0)
            log.info("stage.spawn", role="x", argv=["a"] * 30)
        log.info("transition", src="TRAIN", dst="EXPORT_HF", trigger="trained", round=0)
    finally:
        configure(stream=io.StringIO())  # leave no handler on the test's stream
        logging.getLogger().setLevel(logging.WARNING)
    text = out.getvalue()
    lines = text.split("\n")
    assert len(lines) == 3 and lines[-1] == ""  # two state changes; the progress lived inside the second line
    assert lines[1].count("\r\x1b[2K") == 5 and "4/4" in lines[1] and lines[1].endswith("EXPORT_HF  (from TRAIN, trained)")
    assert "stage.spawn" not in text and "{" not in text


def test_cause_lines_are_whole_and_the_fatal_line_is_left_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an 80-column terminal: an `! attempt.failed` line says why and is not cut (its end is
    the bundle's path); the fatal `campaign.failed` line is not drawn here at all, since `shoprld
    run` prints it in full as its last line; an info line is still cut to the width."""
    monkeypatch.setenv("COLUMNS", "80")
    out = _Tty()
    bundle = "/ephemeral/demo/logs/attempts/round-000-TRAIN-1"
    try:
        configure(stream=out, compact=Campaign(rounds=2, steps_per_round=4))
        log = structlog.get_logger("t")
        log.warning("attempt.failed", state="TRAIN", attempt=1, cause="python_exception", bundle=bundle,
                    message=f"round-000 TRAIN attempt 1: python_exception (KeyError: 'rho'); bundle {bundle}")
        log.error("campaign.failed", message="TRAIN failed after 3 attempts: " + "x" * 100, exit_code=6)
        log.info("transition", src="START_SHOPSIM", dst="TRAIN", trigger="shopsim_ready" + "y" * 100, round=0)
    finally:
        configure(stream=io.StringIO())
        logging.getLogger().setLevel(logging.WARNING)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith(f"! attempt.failed: round-000 TRAIN attempt 1: python_exception (KeyError: 'rho'); "
                             f"bundle {bundle}")
    assert len(lines[1]) == 79 and "campaign.failed" not in out.getvalue()
