"""structlog setup: JSON lines to stdout (journald) and to ``$EXP_DIR/logs/shoprld.log``.

The chain: contextvars (campaign, round, state, attempt) -> level/time -> redaction of
every loaded secret value -> a renderer (JSON, or a console renderer on a TTY). Foreign
stdlib records (httpx, watchdog) go through the same redaction via ProcessorFormatter.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

from shoprld.daemon.foundation.console import CompactHandler, CompactRenderer
from shoprld.daemon.foundation.secrets import Secrets, install, installed


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return installed().text(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_value(v) for v in value)
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return installed().text(str(value))


def redact_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Mask every known secret value anywhere in the event (keys stay)."""
    return {k: _redact_value(v) for k, v in event_dict.items()}


def set_secrets(secrets: Secrets) -> None:
    """Register the values to redact from now on: installs their Redactor for the whole
    process (logs, and every writer that was not handed one), so there is one."""
    install(secrets.redactor)


class _RedactingStream:
    """A text stream that redacts each write: the last line of defence for the log file."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(installed().text(text))

    def flush(self) -> None:
        self._stream.flush()


def _shared() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_processor,
    ]


def _json_formatter() -> logging.Formatter:
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    redact_processor,
                    structlog.processors.JSONRenderer(sort_keys=False)],
    )


def configure(*, log_file: Path | None = None, json_stdout: bool | None = None, level: str = "INFO",
              stream: TextIO | None = None, compact: Any = None) -> None:
    """Configure structlog and the stdlib root logger. Idempotent.

    ``compact``: a :class:`~.console.Campaign`; the console then gets the person's compact
    view (daemon/foundation/console.py) instead of every event. Only pass it for a terminal (see
    :func:`~.console.terminal_mode`).
    """
    stream = stream or sys.stdout
    if json_stdout is None:
        json_stdout = not stream.isatty()
    structlog.configure(
        processors=[*_shared(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    json_fmt = _json_formatter()
    console_fmt = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared(),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.dev.ConsoleRenderer(colors=True)],
    )
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_shoprld", False):
            root.removeHandler(h)
            h.close()
    out: logging.Handler
    if compact is not None:
        out = CompactHandler(_RedactingStream(stream))
        out.setFormatter(structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared(),
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, CompactRenderer(compact)]))
    else:
        out = logging.StreamHandler(_RedactingStream(stream))  # type: ignore[arg-type]
        out.setFormatter(json_fmt if json_stdout else console_fmt)
    out._shoprld = True  # type: ignore[attr-defined]
    root.addHandler(out)
    if log_file is not None:
        add_file_handler(log_file)
    root.setLevel(level)
    # A full volume must not turn every log call into a traceback on stderr.
    logging.raiseExceptions = False
    # httpx logs every request at INFO; keep its warnings only.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    logging.getLogger("transitions").setLevel(logging.WARNING)
    logging.getLogger("watchdog").setLevel(logging.WARNING)


def add_file_handler(log_file: Path) -> None:
    """Also write JSON lines to ``log_file`` (once the volume's layout exists)."""
    root = logging.getLogger()
    for h in root.handlers:
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == log_file.resolve():
            return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(log_file, encoding="utf-8")
    fh.setFormatter(_json_formatter())
    fh._shoprld = True  # type: ignore[attr-defined]
    root.addHandler(fh)


def get_logger(name: str = "shoprld") -> Any:
    return structlog.get_logger(name)
