"""Reading what the ShopSimRL tools print: the payload JSON at the end of their stdout.

Every real ``shopsimrl training …`` subcommand prints its result payload once, at the end,
with ``json.dumps(payload, ensure_ascii=False, indent=2, default=str)``: an indented object
over many lines, possibly after progress lines (``shared/contracts/shopsimrl-tools.md`` §0,
§3.2). A failure prints a traceback on stderr and no JSON at all. Both go to the same stage
log here, so the reader takes the **last complete top-level object**: one that opens with
``{`` at the start of a line and closes at the end of a line. A one-line object still reads.

A truncated payload (a killed tool, a full disk) or no payload at all is a
:class:`ToolOutputError` whose message is one line naming the source and what is missing.
"""

from __future__ import annotations

import json
from typing import Any


class ToolOutputError(ValueError):
    """A tool's output holds no complete JSON object: one line, naming the source."""


def last_json_object(text: str, *, source: str) -> dict[str, Any]:
    """The last complete top-level JSON object in ``text`` (multi-line or one line).

    ``source`` names the command or file in the error message. Raises
    :class:`ToolOutputError` when the output ends inside an object (truncated) or holds none.
    """
    decoder = json.JSONDecoder()
    lines = text.splitlines(keepends=True)
    starts: list[tuple[int, int]] = []  # (line number, offset) of every line opening with "{"
    offset = 0
    for n, line in enumerate(lines, 1):
        if line.startswith("{"):
            starts.append((n, offset))
        offset += len(line)
    stripped = text.rstrip()
    last_line = stripped.rfind("\n") + 1  # where the last non-blank line starts
    for n, start in reversed(starts):
        try:
            obj, end = decoder.raw_decode(text, start)
        except ValueError as exc:
            # The decoder gave up on the output's last line (mid-string, mid-literal or at the
            # end): the payload was cut short. An earlier object is not the tool's verdict, so
            # do not fall back to one.
            if getattr(exc, "pos", 0) >= last_line:
                raise ToolOutputError(
                    f"{source}: the JSON object opened at line {n} of its output is truncated "
                    f"(the output ends before its closing brace)") from None
            continue  # a log line that merely starts with "{"
        nl = text.find("\n", end)
        rest = text[end:nl if nl >= 0 else len(text)]
        if isinstance(obj, dict) and not rest.strip():
            return obj
    raise ToolOutputError(f"{source}: printed no JSON object (expected an indented JSON payload at the end "
                          "of its stdout)")


def require_keys(obj: dict[str, Any], keys: tuple[str, ...], *, source: str) -> None:
    """Raise :class:`ToolOutputError` naming the first of ``keys`` that ``obj`` lacks."""
    for key in keys:
        if key not in obj:
            shown = ", ".join(sorted(map(str, obj))[:12]) or "none"
            raise ToolOutputError(f"{source}: its JSON object has no {key!r} key (keys: {shown})")
