"""structlog setup: JSON lines to stdout (journald) and to ``$EXP_DIR/logs/shoprld.log``.

The chain: contextvars (campaign, round, state, attempt) -> level/time -> redaction of
every loaded secret value -> a renderer (JSON, or a console renderer on a TTY). Foreign
stdlib records (httpx, watchdog) go through the same redaction via ProcessorFormatter.

The redaction is the :class:`~.secrets.Redactor` handed to :func:`configure` (``shoprld run``
builds it from the loaded .env) and to :func:`add_file_handler`; it is bound into the
processors and streams built there, not read from a process-wide global. structlog's own
configuration is per process, so a later :func:`configure` replaces the chain and its redactor.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import structlog

from shoprld.daemon.foundation.system.console import CompactHandler, CompactRenderer
from shoprld.daemon.foundation.config.secrets import NO_REDACTION, RedactingStream, Redactor


def redact_processor(redactor: Redactor) -> Callable[[Any, str, dict[str, Any]], dict[str, Any]]:
    """A processor that masks every value ``redactor`` knows anywhere in the event (keys stay)."""

    def value(v: Any) -> Any:
        if isinstance(v, str):
            return redactor.text(v)
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(value(x) for x in v)
        if isinstance(v, (int, float, bool)) or v is None:
            return v
        return redactor.text(str(v))

    def processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        return {k: value(v) for k, v in event_dict.items()}

    return processor


def _shared(redactor: Redactor) -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        redact_processor(redactor),
    ]


def _json_formatter(redactor: Redactor) -> logging.Formatter:
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared(redactor),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    redact_processor(redactor),
                    structlog.processors.JSONRenderer(sort_keys=False)],
    )


def configure(*, log_file: Path | None = None, json_stdout: bool | None = None, level: str = "INFO",
              stream: TextIO | None = None, compact: Any = None, redactor: Redactor = NO_REDACTION) -> None:
    """Configure structlog and the stdlib root logger. Idempotent.

    ``redactor``: what every event, record and written line passes through (``shoprld run``
    hands the one built from the campaign's .env; a one-shot command has none to mask).

    ``compact``: a :class:`~.console.Campaign`; the console then gets the person's compact
    view (daemon/foundation/system/console.py) instead of every event. Only pass it for a terminal (see
    :func:`~.console.terminal_mode`).
    """
    stream = stream or sys.stdout
    if json_stdout is None:
        json_stdout = not stream.isatty()
    structlog.configure(
        processors=[*_shared(redactor), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    json_fmt = _json_formatter(redactor)
    console_fmt = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared(redactor),
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
        out = CompactHandler(RedactingStream(stream, redactor))
        out.setFormatter(structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared(redactor),
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, CompactRenderer(compact)]))
    else:
        out = logging.StreamHandler(RedactingStream(stream, redactor))  # type: ignore[arg-type]
        out.setFormatter(json_fmt if json_stdout else console_fmt)
    out._shoprld = True  # type: ignore[attr-defined]
    root.addHandler(out)
    if log_file is not None:
        add_file_handler(log_file, redactor=redactor)
    root.setLevel(level)
    # A full volume must not turn every log call into a traceback on stderr.
    logging.raiseExceptions = False
    # httpx logs every request at INFO; keep its warnings only.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    logging.getLogger("transitions").setLevel(logging.WARNING)
    logging.getLogger("watchdog").setLevel(logging.WARNING)


def add_file_handler(log_file: Path, *, redactor: Redactor) -> None:
    """Also write JSON lines to ``log_file`` (once the volume's layout exists), through ``redactor``."""
    root = logging.getLogger()
    for h in root.handlers:
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == log_file.resolve():
            return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(log_file, encoding="utf-8")
    fh.setFormatter(_json_formatter(redactor))
    fh._shoprld = True  # type: ignore[attr-defined]
    root.addHandler(fh)


def get_logger(name: str = "shoprld") -> Any:
    return structlog.get_logger(name)
