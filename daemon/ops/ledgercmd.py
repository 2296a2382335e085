"""The ``shoprld ledger`` command: the campaign's ledger (daemon/foundation/records/ledger.py) as the
TSV (piped), a table (terminal) or a JSON list. Reads only; rich only for a terminal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.ledger import COLUMNS, Ledger, format_rows

# Columns worth a terminal's width; --json and the piped TSV carry all of them.
_TTY_COLUMNS = ("index", "status", "metric_name", "metric_value", "elapsed_min", "memory_gb", "branch", "commit",
                "description")


def print_ledger(config_path: Path, as_json: bool = False) -> int:
    """``shoprld ledger``: the TSV (piped), a table (terminal) or a JSON list."""
    cfg = load_config(config_path)
    layout = Layout.from_config(cfg)
    ledger = Ledger(layout.ledger, overflow_dir=layout.campaign_root / "ledger")
    rows = ledger.rows()
    out = sys.stdout
    if as_json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return 0
    if not out.isatty():
        out.write(format_rows(rows).decode())
        return 0
    from rich.console import Console  # lazy: rich only for a terminal, as status does
    from rich.table import Table

    console = Console(highlight=False)
    if not rows:
        console.print(f"no rounds recorded yet ({ledger.path})")
        return 0
    table = Table(title=str(ledger.path), title_justify="left", title_style="dim")
    for c in _TTY_COLUMNS:
        table.add_column(c, no_wrap=c != "description", overflow="fold")
    style = {"keep": "green", "discard": "yellow", "crash": "red"}
    for r in rows:
        cells = [r[c][:12] if c == "commit" else r[c] for c in _TTY_COLUMNS]
        table.add_row(*cells, style=style.get(r["status"]))
    console.print(table)
    n = len(rows)
    console.print(f"[dim]{n} row{'' if n == 1 else 's'}; all {len(COLUMNS)} columns: "
                  "shoprld ledger --json, or pipe it[/dim]")
    return 0
