"""Prometheus metrics as a node_exporter textfile (``[metrics] textfile = "PATH"``).

The engine calls :meth:`TextfileMetrics.write` with the status document at every status
update; the text goes through the output-path opener (a temp file beside PATH, renamed), so
node_exporter never reads half a file, and a PATH that is a device, a FIFO, a socket or a
directory (``/dev/null`` as "metrics off") or one of the campaign's own files is refused by
``check`` and at start (exit 3) and never replaced by a write. prometheus-client is the optional extra
``shoprld[metrics]``; :func:`extras_problem` turns its absence into one config line at
``check`` and ``run``. A failed write is logged and never stops the campaign.

``check`` tests the textfile's directory (:func:`textfile_problem`); a write that fails is
logged once as a warning, then at most once per :data:`WARN_EVERY_S` with the count since.

The engine also rewrites the textfile every :data:`HEARTBEAT_S` between status updates, so
``shoprld_last_write_timestamp_seconds`` goes stale only when the daemon is gone (a SIGKILL
leaves the file as it was: alert on ``time() - shoprld_last_write_timestamp_seconds``).

Metrics (labelled ``campaign``)::

    shoprld_info{version}                        1: the daemon's version
    shoprld_state{state}                         1 for the current state, 0 for the others
    shoprld_last_write_timestamp_seconds         when this file was written (the daemon's heartbeat)
    shoprld_daemon_start_timestamp_seconds       when this daemon started
    shoprld_round                                the 0-based round index
    shoprld_step                                 the step within the round
    shoprld_step_seconds                         the median step time (NaN before the first)
    shoprld_eta_seconds                          the rest of this round's TRAIN
    shoprld_campaign_eta_seconds                 the rest of the campaign (NaN when unknown)
    shoprld_disk_free_bytes                      free bytes on the volume
    shoprld_disk_soft_limit_bytes                the disk soft limit (free bytes)
    shoprld_disk_hard_limit_bytes                the disk hard limit (free bytes)
    shoprld_last_checkpoint_iteration            the newest complete checkpoint
    shoprld_last_checkpoint_timestamp_seconds    when it was committed
    shoprld_restarts_total (counter)             automatic restarts (stage retries, daemon resumes)
    shoprld_stalls_total (counter)               trainer stalls detected
    shoprld_failures_total{cause} (counter)      failed stage attempts by cause
    shoprld_round_metric{round}                  each finished round's val metric

The counters are kept in state.json, so they survive daemon restarts and only grow, as a
Prometheus counter must (a new campaign starts them at 0: a counter reset, which ``rate``
handles).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from shoprld.daemon.foundation.records.outputs import OutputPathError, Protected, resolve_output, write_output
from shoprld import __version__

log = structlog.get_logger("shoprld.metrics")

STATES = ("PREFLIGHT_DISK", "START_SHOPSIM", "TRAIN", "EXPORT_HF", "VAL", "GATE", "INJECT", "NEXT_ROUND",
          "PAUSED_DISK", "STOPPED", "FAILED", "DONE")
NAN = float("nan")


def extras_problem(textfile: Path | None) -> str | None:
    """One line when ``metrics.textfile`` is set but prometheus-client is not installed."""
    if textfile is None:
        return None
    try:
        import prometheus_client  # noqa: F401  (lazy: optional extra [metrics], checked here)
    except ImportError:
        return (f"metrics.textfile = {textfile}: needs the prometheus-client package; "
                f"fix: pip install 'shoprld[metrics]', or remove metrics.textfile")
    return None


WARN_EVERY_S = 3600.0  # a bad textfile path: one warning, then one an hour with the count
HEARTBEAT_S = 30.0     # the engine's rewrite period between status updates


def textfile_problem(textfile: Path | None, protected: Protected) -> str | None:
    """One line when ``metrics.textfile`` names something a write must not replace, or a place
    this user cannot write (its directory, or the nearest existing parent a write would create
    it under: write() makes a missing directory)."""
    if textfile is None:
        return None
    try:
        resolve_output(textfile, protected, what="metrics textfile", need_parent=False)  # write() makes it
    except OutputPathError as exc:
        return f"metrics.textfile: {exc}"
    d = textfile.parent
    while not d.exists() and d != d.parent:
        d = d.parent
    if not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
        return (f"metrics.textfile = {textfile}: {d} is not a directory this user can write; "
                f"fix: make it writable (chown/chmod) or change metrics.textfile")
    return None


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else NAN


def _dict(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


class _Families:
    """A collector that yields the families of one status document (no ``_created`` samples:
    the counters' origin is the campaign's state.json, not this process)."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


class TextfileMetrics:
    """Writes the status document as a node_exporter textfile at ``path``."""

    def __init__(self, path: Path, campaign: str, protected: Protected = Protected(), *,
                 clock: Callable[[], float] = time.time) -> None:
        self.path, self.campaign, self.protected, self.clock = path, campaign, protected, clock
        self._failing_since: float | None = None  # the first failure of the current run of them
        self._last_warn = 0.0
        self._suppressed = 0

    def render(self, doc: Mapping[str, Any], counters: Mapping[str, Any]) -> Any:
        """The registry for one status document (exposed for tests)."""
        from prometheus_client import CollectorRegistry  # lazy: optional extra [metrics]
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        c = self.campaign
        fams: list[Any] = []

        def gauge(name: str, help_: str, value: float) -> None:
            g = GaugeMetricFamily(name, help_, labels=["campaign"])
            g.add_metric([c], value)
            fams.append(g)

        def counter(name: str, help_: str, value: float) -> None:
            k = CounterMetricFamily(name, help_, labels=["campaign"])
            k.add_metric([c], value)
            fams.append(k)

        info = InfoMetricFamily("shoprld", "the daemon's version", labels=["campaign"])
        info.add_metric([c], {"version": __version__})
        fams.append(info)
        state = GaugeMetricFamily("shoprld_state", "1 for the engine's current state", labels=["campaign", "state"])
        for s in STATES:
            state.add_metric([c, s], 1.0 if doc.get("state") == s else 0.0)
        fams.append(state)
        gauge("shoprld_last_write_timestamp_seconds", "when the daemon last wrote this file (its heartbeat)", self.clock())
        gauge("shoprld_daemon_start_timestamp_seconds", "when this daemon started",
              _num(_dict(doc.get("daemon")).get("started_at")))
        gauge("shoprld_round", "the 0-based round index", _num(doc.get("round")))
        gauge("shoprld_step", "the step within this round", _num(doc.get("step")))
        gauge("shoprld_step_seconds", "the median step time", _num(doc.get("step_seconds")))
        gauge("shoprld_eta_seconds", "seconds left in this round's TRAIN", _num(doc.get("eta_seconds")))
        gauge("shoprld_campaign_eta_seconds", "seconds left in the campaign",
              _num(_dict(doc.get("plan")).get("campaign_eta_seconds")))
        disk = _dict(doc.get("disk"))
        gauge("shoprld_disk_free_bytes", "free bytes on the volume", _num(disk.get("free_bytes")))
        gauge("shoprld_disk_soft_limit_bytes", "the disk soft limit in free bytes", _num(disk.get("soft_limit_bytes")))
        gauge("shoprld_disk_hard_limit_bytes", "the disk hard limit in free bytes", _num(disk.get("hard_limit_bytes")))
        last = _dict(doc.get("last_checkpoint"))
        gauge("shoprld_last_checkpoint_iteration", "the newest complete checkpoint's iteration", _num(last.get("iteration")))
        gauge("shoprld_last_checkpoint_timestamp_seconds", "when the newest complete checkpoint was committed",
              _num(last.get("committed_at")))
        counter("shoprld_restarts", "automatic restarts (stage retries and daemon resumes)",
                float(counters.get("restarts", 0)))
        counter("shoprld_stalls", "trainer stalls detected", float(counters.get("stalls", 0)))
        failures = CounterMetricFamily("shoprld_failures", "failed stage attempts by cause", labels=["campaign", "cause"])
        for cause, n in sorted(_dict(counters.get("failures")).items()):
            failures.add_metric([c, str(cause)], float(n))
        fams.append(failures)
        metric = GaugeMetricFamily("shoprld_round_metric", "each finished round's val metric", labels=["campaign", "round"])
        for r in doc.get("rounds_done") or []:
            if isinstance(r, dict) and isinstance(r.get("round"), int):
                metric.add_metric([c, str(r["round"])], _num(r.get("val")))
        fams.append(metric)
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Families(fams))
        return reg

    def write(self, doc: Mapping[str, Any], counters: Mapping[str, Any]) -> bool:
        """Write the textfile atomically (temp + rename); never raises, never replaces a
        non-regular file or one of the campaign's own (a node swapped in after start is
        refused at this write, and logged). False: not written."""
        try:
            from prometheus_client import generate_latest  # lazy: optional extra [metrics]

            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_output(self.path, generate_latest(self.render(doc, counters)), self.protected,
                         what="metrics textfile")
        except Exception as exc:  # ImportError, OSError: metrics must never stop the campaign
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        if self._failing_since is not None:
            log.info("metrics.write_recovered", path=str(self.path), failed_writes=self._suppressed + 1)
            self._failing_since, self._suppressed = None, 0
        return True

    def _failed(self, error: str) -> None:
        """A failed write warns once, then once per WARN_EVERY_S: written every status update,
        a bad path would otherwise fill the log with hundreds of lines a night."""
        now = self.clock()
        if self._failing_since is not None and now - self._last_warn < WARN_EVERY_S:
            self._suppressed += 1
            return
        repeated = self._failing_since is not None
        self._failing_since = self._failing_since if repeated else now
        self._last_warn = now
        log.warning("metrics.write_failed", path=str(self.path), error=error,
                    **({"failed_since_last_warning": self._suppressed + 1} if repeated else {}),
                    fix="make the textfile's directory exist and writable, or change metrics.textfile")
        self._suppressed = 0
