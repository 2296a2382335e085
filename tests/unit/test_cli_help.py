"""Every option of every subcommand says what it does in `--help` (issue 18, item 7)."""

from __future__ import annotations

import argparse

from shoprld.daemon.ops.cli import build_parser


def _walk(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _walk(sub, f"{prefix} {name}")
        elif not isinstance(action, argparse._HelpAction):
            out.append((prefix, action))
    return out


def test_every_option_and_argument_has_a_help_text() -> None:
    """No option is left without help, and none is hidden with SUPPRESS."""
    actions = _walk(build_parser(), "shoprld")
    assert len(actions) > 30  # the walk really reached the subcommands
    missing = [f"{where} {'/'.join(a.option_strings) or a.dest}" for where, a in actions
               if not a.help or a.help == argparse.SUPPRESS or not a.help.strip()]
    assert missing == []
