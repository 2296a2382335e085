"""The ``shoprld status`` command: the status document as JSON (``--json``, NDJSON with
``--watch``), or the human view (daemon/foundation/records/statusview.py) on a terminal or a pipe.

It reads only what :mod:`shoprld.daemon.foundation.records.status` reads and writes nothing but
stdout. Like the view, it imports only the standard library at module level: rich only for a
terminal (the CLI imports this module lazily, so `shoprld status` stays fast).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.records.status import collect
from shoprld.daemon.foundation.records.statusview import render_plain, render_rich, view


def _unicode_ok(stream: Any) -> bool:
    enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    return enc.startswith("utf")


def run_status(config_path: Path, as_json: bool = False, watch: bool = False, interval: float = 1.0) -> int:
    """The ``shoprld status`` command. Returns the exit code (0; config errors raise)."""
    interval = max(0.05, float(interval))
    out = sys.stdout
    try:
        if as_json:
            if not watch:
                out.write(json.dumps(collect(config_path), indent=2) + "\n")
                return 0
            while True:  # one compact object per line (NDJSON), for `| jq`
                out.write(json.dumps(collect(config_path), separators=(",", ":")) + "\n")
                out.flush()
                time.sleep(interval)
        tty = out.isatty()
        if not tty:
            unicode = _unicode_ok(out)
            while True:
                out.write(render_plain(view(collect(config_path), time.time(), unicode=unicode, config=config_path)))
                if not watch:
                    return 0
                out.write("\n")  # frames are separated by one blank line
                out.flush()
                time.sleep(interval)
        from rich.console import Console  # lazy: rich only for a terminal (module docstring)

        console = Console(highlight=False)
        unicode = not console.options.ascii_only

        def frame() -> Any:
            return render_rich(view(collect(config_path), time.time(), unicode=unicode, config=config_path), console)

        if not watch:
            console.print(frame())
            return 0
        from rich.live import Live  # lazy: as Console above

        with Live(frame(), console=console, auto_refresh=False, redirect_stdout=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:  # Ctrl-C ends --watch: that is how one leaves it
        return 0
    except BrokenPipeError:  # `shoprld status | head`: the reader left, which is fine
        # Point stdout at /dev/null so the interpreter's exit flush does not complain
        # (https://docs.python.org/3/library/signal.html#note-on-sigpipe).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
