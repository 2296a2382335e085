"""Prometheus metrics as a node_exporter textfile (``[metrics] textfile = "PATH"``).

The engine calls :meth:`TextfileMetrics.write` with the status document at every status
update; the text goes through the output-path opener (a temp file beside PATH, renamed), so
node_exporter never reads half a file, and a PATH that is a device, a FIFO, a socket or a
directory (``/dev/null`` as "metrics off") or one of the campaign's own files is refused by
``check`` and at start (exit 3) and never replaced by a write. prometheus-client is the optional extra
``shoprld[metrics]``; :func:`extras_problem` turns its absence into one config line at
``check`` and ``run``. A failed write is logged and never stops the campaign.

Metrics (all gauges, labelled ``campaign``)::

    shoprld_state{state}                    1 for the current state, 0 for the others
    shoprld_round                           the 0-based round index
    shoprld_step                            the step within the round
    shoprld_step_seconds                    the median step time (NaN before the first)
    shoprld_eta_seconds                     the rest of this round's TRAIN
    shoprld_disk_free_bytes                 free bytes on the volume
    shoprld_last_checkpoint_iteration       the newest complete checkpoint
    shoprld_restarts_total                  automatic restarts (stage retries, daemon resumes)
    shoprld_stalls_total                    trainer stalls detected
    shoprld_round_metric{round}             each finished round's val metric
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from shoprld.daemon.foundation.outputs import OutputPathError, Protected, resolve_output, write_output

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


def textfile_problem(textfile: Path | None, protected: Protected) -> str | None:
    """One line when ``metrics.textfile`` names something a write must not replace."""
    if textfile is None:
        return None
    try:
        resolve_output(textfile, protected, what="metrics textfile", need_parent=False)  # write() makes it
    except OutputPathError as exc:
        return f"metrics.textfile: {exc}"
    return None


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else NAN


class TextfileMetrics:
    """Writes the status document as a node_exporter textfile at ``path``."""

    def __init__(self, path: Path, campaign: str, protected: Protected = Protected()) -> None:
        self.path, self.campaign, self.protected = path, campaign, protected

    def render(self, doc: Mapping[str, Any], counters: Mapping[str, int]) -> Any:
        """The registry for one status document (exposed for tests)."""
        from prometheus_client import CollectorRegistry, Gauge  # lazy: optional extra [metrics]

        reg = CollectorRegistry()
        c = {"campaign": self.campaign}

        def gauge(name: str, help_: str, value: float, **labels: str) -> None:
            g = Gauge(name, help_, ["campaign", *labels], registry=reg)
            g.labels(**c, **labels).set(value)

        state = Gauge("shoprld_state", "1 for the engine's current state", ["campaign", "state"], registry=reg)
        for s in STATES:
            state.labels(**c, state=s).set(1.0 if doc.get("state") == s else 0.0)
        gauge("shoprld_round", "the 0-based round index", _num(doc.get("round")))
        gauge("shoprld_step", "the step within this round", _num(doc.get("step")))
        gauge("shoprld_step_seconds", "the median step time", _num(doc.get("step_seconds")))
        gauge("shoprld_eta_seconds", "seconds left in this round's TRAIN", _num(doc.get("eta_seconds")))
        disk = doc.get("disk") if isinstance(doc.get("disk"), dict) else {}
        gauge("shoprld_disk_free_bytes", "free bytes on the volume", _num(disk.get("free_bytes")))
        last = doc.get("last_checkpoint") if isinstance(doc.get("last_checkpoint"), dict) else {}
        gauge("shoprld_last_checkpoint_iteration", "the newest complete checkpoint's iteration",
              _num(last.get("iteration")))
        # Gauges named *_total: they survive daemon restarts through state.json, which a
        # Counter's process-local semantics would not describe.
        gauge("shoprld_restarts_total", "automatic restarts (stage retries and daemon resumes)",
              float(counters.get("restarts", 0)))
        gauge("shoprld_stalls_total", "trainer stalls detected", float(counters.get("stalls", 0)))
        metric = Gauge("shoprld_round_metric", "each finished round's val metric", ["campaign", "round"],
                       registry=reg)
        for r in doc.get("rounds_done") or []:
            if isinstance(r, dict) and isinstance(r.get("round"), int):
                metric.labels(**c, round=str(r["round"])).set(_num(r.get("val")))
        return reg

    def write(self, doc: Mapping[str, Any], counters: Mapping[str, int]) -> None:
        """Write the textfile atomically (temp + rename); never raises, never replaces a
        non-regular file or one of the campaign's own (a node swapped in after start is
        refused at this write, and logged)."""
        try:
            from prometheus_client import generate_latest  # lazy: optional extra [metrics]

            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_output(self.path, generate_latest(self.render(doc, counters)), self.protected,
                         what="metrics textfile")
        except Exception as exc:  # ImportError, OSError: metrics must never stop the campaign
            log.warning("metrics.write_failed", path=str(self.path), error=f"{type(exc).__name__}: {exc}")
