"""One stage attempt's record (issue 18): where its part of the stage log begins, its argv and
exit, and, when it fails, its classified cause and crash bundle.

The engine starts an attempt before a stage runs and hands each failed one here; what comes
back (the cause) is what ``machine.decide`` weighs (the same OOM twice is not tried a third
time), and the ``last_failure`` line is what ``status`` shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from shoprld.daemon.foundation.records import bundles
from shoprld.daemon.foundation.tools import causes
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.paths import round_id
from shoprld.daemon.foundation.config.secrets import Redactor

log = structlog.get_logger("shoprld.engine")


class Attempts:
    """The running attempt's facts, and the classification of a failed one."""

    def __init__(self, layout: Layout, redactor: Redactor, journal: Callable[..., None]) -> None:
        self.layout, self.redactor, self._journal = layout, redactor, journal
        self.info: dict[str, Any] = {}  # the running attempt: state, log, offset, monotonic, argv, returncode
        self.recovering: str | None = None  # set by a failure or an unclean restart; "recovered" on success

    def started(self, state: str, round_index: int) -> None:
        """Remember where this attempt's part of the stage log begins, and when it began."""
        log_path = self.layout.stage_log(round_index, state)
        try:
            offset = log_path.stat().st_size
        except OSError:
            offset = 0
        self.info = {"state": state, "log": log_path, "offset": offset,
                     "monotonic": time.monotonic(), "argv": [], "returncode": None}

    async def failed(self, state: str, round_index: int, attempt: int, message: str, data: Mapping[str, Any], *,
                     nvidia_smi: str, keep_bundles: int = 3) -> tuple[causes.Cause, dict[str, Any]]:
        """Classify a failed attempt, write its crash bundle and journal it. Returns the cause
        and the ``last_failure`` line for status."""
        info = self.info if self.info.get("state") == state else {}
        log_path: Path = info.get("log") or self.layout.stage_log(round_index, state)
        tail = bundles.read_tail(log_path)
        try:  # only this attempt's part of the log: an earlier attempt's OOM is not this one's cause
            size = log_path.stat().st_size
            tail = tail[max(0, len(tail) - (size - int(info.get("offset", 0)))):]
        except OSError:
            pass
        exit_status = data.get("returncode", info.get("returncode"))
        stalled = bool(data.get("stall"))
        cause = causes.classify(exit_status=exit_status, log_tail=tail, stalled=stalled,
                                kernel_log=causes.kernel_log_since(float(info.get("monotonic", 0.0))))
        rid = round_id(round_index)
        dest = bundles.free_attempt_dir(self.layout.logs, rid, state, attempt)
        problem = await bundles.write_bundle(
            dest, round_id=rid, state=state, attempt=attempt, exit_status=exit_status,
            cause=cause.to_json(), argv=info.get("argv") or [], message=message, log_path=log_path,
            stalled=stalled, redactor=self.redactor, nvidia_smi=nvidia_smi)
        if problem:
            log.warning("bundle.write_failed", error=problem)
        pruned = bundles.prune(self.layout.logs, keep_bundles)
        if pruned:
            self._journal("bundles.pruned", sync=False, cause=cause.name, keep=keep_bundles,
                          bundles=[p.name for p in pruned])
        last_failure = {"round": round_index, "round_id": rid, "state": state, "attempt": attempt,
                        "cause": cause.name, "detail": cause.detail, "advice": cause.advice,
                        "bundle": str(dest), "at": time.time()}
        self._journal("attempt.failed", attempt=attempt, cause=cause.to_json(), exit_status=exit_status,
                      stalled=stalled, bundle=str(dest), message=message)
        # The terminal's line says why: a SIGKILL, a stall and an exception must not look alike.
        log.warning("attempt.failed", state=state, attempt=attempt, cause=cause.name, bundle=str(dest),
                    message=f"{rid} {state} attempt {attempt}: {cause.line()}; bundle {dest}")
        self.recovering = f"{state} failed ({cause.name})"
        return cause, last_failure
