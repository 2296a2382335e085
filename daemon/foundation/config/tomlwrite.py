"""A minimal TOML writer: tomllib only reads, and a campaign file has no exotic types.

``import-campaign`` writes the re-pointed campaign file with :func:`dump_toml`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import date, datetime
from datetime import time as dtime
from typing import Any


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k, ensure_ascii=False)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (datetime, date, dtime)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dump_toml(data: Mapping[str, Any], header: str = "") -> str:
    """Tables of scalars, arrays and inline tables: what a campaign file holds."""
    lines = [f"# {ln}" if ln else "#" for ln in header.splitlines()]
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, dict)]
    for k, v in scalars:
        lines.append(f"{_toml_key(k)} = {_toml_value(v)}")

    def table(prefix: str, tbl: Mapping[str, Any]) -> None:
        lines.append("")
        lines.append(f"[{prefix}]")
        subs = []
        for k, v in tbl.items():
            if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
                subs.append((k, v))
            else:
                lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in subs:
            table(f"{prefix}.{_toml_key(k)}", v)

    for k, v in data.items():
        if isinstance(v, dict):
            table(_toml_key(k), v)
    return "\n".join(lines) + "\n"
