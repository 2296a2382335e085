"""``shoprld report``: one self-contained HTML file that explains a campaign's night.

The data are read by :mod:`.reportdata` (the campaign's records, read-only, no daemon needed)
and drawn by :mod:`.reportpage` (matplotlib, the optional ``report`` extra, inline SVG; nothing
fetched). This module writes the file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.outputs import campaign_files, resolve_output, write_output
from shoprld.daemon.foundation.records.paths import quick_read
from shoprld.daemon.ops.reportdata import (FINAL, ReportData, analyse, gather, insane, read_journal,
                                           sane_rounds)
from shoprld.daemon.ops.reportpage import (INSTALL_HINT, MARKS, PLOTS, STATE_COLOURS, ReportExtraMissing,
                                           _pyplot, render)

__all__ = ["FINAL", "INSTALL_HINT", "MARKS", "PLOTS", "STATE_COLOURS", "ReportData", "ReportExtraMissing",
           "analyse", "default_output", "gather", "insane", "read_journal", "render", "run_report",
           "sane_rounds", "write_report"]


def default_output(config_path: Path) -> Path:
    """``<campaign file's dir>/<campaign>-report.html`` (the campaign name from the file)."""
    name = str((quick_read(config_path).get("campaign") or {}).get("name") or "campaign")
    return config_path.resolve().parent / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-report.html"


def write_report(config_path: Path, out: Path | None = None, *, base: Path | None = None) -> Path:
    """Gather, render and write the report atomically; returns its path."""
    _pyplot()  # fail first, in one line, when the extra is missing
    cfg = load_config(config_path)
    own = campaign_files(cfg.source, Layout.from_config(cfg))
    dest = out or default_output(config_path)
    if dest.parent.is_dir():  # refused before any work: a device, a FIFO, the journal, .env, ...
        resolve_output(dest, own, what="report")
    data = gather(config_path, base=base)
    page = render(data)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest = write_output(dest, page.encode("utf-8"), own, what="report")
    except OSError as exc:
        raise ConfigError(f"{dest}: cannot write the report ({exc.strerror}); fix: pick another -o path") from None
    return dest


def run_report(config_path: Path, out: Path | None = None, *, base: Path | None = None) -> int:
    """The ``shoprld report`` command (``base``: the base model's val summary, see :func:`gather`)."""
    dest = write_report(config_path, out, base=base)
    print(f"wrote {dest}", file=sys.stdout)
    return 0
