"""The ``shoprld`` command line: parse arguments, call the runtime, map errors to exit codes.

argparse (the standard library's mature CLI parser) rather than click/typer: ``shoprld
status --json`` has a 100 ms budget, and click alone costs ~60 ms to import on the target
box. Every handler imports what it needs lazily, so the status path stays on the stdlib.

Exit codes (SPEC §6): 0 done or stopped on request, 2 usage, 3 config/lock/preflight,
4 parked for disk, 5 stopped by the gate policy, 6 a stage failed after retries,
130 interrupted (Ctrl-C), 141 stdout closed early (``| head``; nothing on stderr),
1 anything unexpected (a bug; rerun with --debug for the traceback).
"""

from __future__ import annotations

import os
import sys


def _interrupted_at_import(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    """Ctrl-C while this module (and so ``main``) is still being imported: one line, exit 130.

    Installed before the heavy imports below; :func:`main` handles every later interrupt. The
    interpreter's own start-up (site, .pth files) runs before any shoprld code and is out of reach.
    """
    if issubclass(exc_type, KeyboardInterrupt):
        sys.stderr.write("shoprld: interrupted during start-up; nothing was started\n")
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    sys.__excepthook__(exc_type, exc, tb)


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
if sys.excepthook is sys.__excepthook__:  # never replace a hook someone else (pytest, an IDE) installed
    sys.excepthook = _interrupted_at_import

import argparse  # noqa: E402  (after the hook: an interrupt during these imports is one line too)
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from shoprld import __version__  # noqa: E402  (the package: already imported)

from shoprld.daemon.foundation.system.errors import EXIT_BUG, EXIT_OK, EXIT_PIPE, EXIT_USAGE, ConfigError, ShoprldError  # noqa: E402

DEFAULT_CONFIG = "campaign.toml"


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line too (and exit 2), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _config_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument(
        "-c", "--config", metavar="FILE", required=required,
        default=None if required else os.environ.get("SHOPRLD_CONFIG", DEFAULT_CONFIG),
        help="the campaign TOML file (default: $SHOPRLD_CONFIG or ./campaign.toml)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shoprld",
        description="The ShopSimRL campaign daemon: runs multi-round slime RL campaigns, "
        "resumes after any crash, stops before /ephemeral fills up.",
        epilog="Exit codes: 0 done/stopped, 2 usage, 3 config/lock/preflight, 4 disk park, "
        "5 gate stop, 6 stage failed, 130 interrupted, 141 stdout closed early, 1 bug.",
    )
    parser.add_argument("--version", action="version", version=f"shoprld {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND")

    p = sub.add_parser("run", help="run the campaign daemon in the foreground (systemd's ExecStart)")
    _config_arg(p)
    p.add_argument("--wait-for-space", action="store_true",
                   help="when parked for disk, stay alive and resume once space is back")
    p.add_argument("--adopt-state", action="store_true",
                   help="take over a state dir that records another campaign (other repo, volume or "
                        "experiment) instead of refusing it")
    p.add_argument("--verbose", action="store_true",
                   help="on a terminal, print every log event (the developer's log) instead of the compact view")

    p = sub.add_parser("demo", help="run a whole campaign on the built-in demo stack")
    p.add_argument("--dir", metavar="D", help="where to put the demo tree (default: a new temp dir)")
    p.add_argument("--fast", action="store_true", help="shortest step times (for tests)")
    p.add_argument("--verbose", action="store_true",
                   help="on a terminal, print every log event (the developer's log) instead of the compact view")
    p.add_argument("--no-run", action="store_true",
                   help="write the demo tree and stop, so its campaign.toml can be edited first")
    p.add_argument("--rounds", type=int, default=None, metavar="N", help="run N rounds instead of the recipe's")

    p = sub.add_parser("status", help="where the campaign stands (works with or without the daemon)")
    _config_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable (schema in README)")
    p.add_argument("--watch", action="store_true", help="refresh live")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes with --watch (default 1)")

    p = sub.add_parser("stop", help="ask the daemon to stop gracefully")
    _config_arg(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--at-checkpoint", action="store_true", help="stop TRAIN after its next checkpoint commits")
    g.add_argument("--after-round", action="store_true", help="stop once the current round is recorded")

    p = sub.add_parser("check", help="validate the config and preflight, with no side effects")
    _config_arg(p)
    p.add_argument("--print-commands", action="store_true", help="print every stage's resolved command")
    p.add_argument("--placeholders", action="store_true", help="list the known {placeholders}")

    p = sub.add_parser("notify-test", help="send one [test] page to every notify endpoint; exit 3 if any fails")
    _config_arg(p)

    p = sub.add_parser("notify-crashed", help="page 'crashed' unless the daemon runs (for systemd OnFailure= or a "
                                              "supervisor's listener)")
    _config_arg(p)
    p.add_argument("--reason", default="", help="a line saying what noticed the death (e.g. 'start limit hit')")
    p.add_argument("--systemd", action="store_true",
                   help="judge the death from systemd's $SERVICE_RESULT/$EXIT_* (ExecStopPost=) or $MONITOR_* "
                        "(OnFailure=) first; no page for an exit the daemon reported itself")
    p.add_argument("--seen-dead", action="store_true",
                   help="the caller saw it die (a supervisor's listener): page even if the next daemon already runs")
    p.add_argument("--gave-up", action="store_true",
                   help="nothing restarts it (start limit, FATAL): a page of its own, not deduped with a crash's")

    p = sub.add_parser("rehearse", help="run one tiny round of this campaign's real tools on stand-ins for slime, "
                                        "the val server and the analyst API; a verdict per stage")
    _config_arg(p)
    p.add_argument("--keep", action="store_true", help="keep the scratch dir (stage logs, records) afterwards")
    p.add_argument("--real-analyst", action="store_true",
                   help="use the analyst's real LLM API (at your cost) instead of the local stand-in")
    p.add_argument("--notify", action="store_true",
                   help="send the rehearsal's pages to the campaign's [notify] endpoints, marked [rehearsal] "
                        "(default: no page at all)")

    p = sub.add_parser("init", help="write a commented campaign template")
    p.add_argument("path", nargs="?", default=DEFAULT_CONFIG, help="where to write it (default ./campaign.toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")

    p = sub.add_parser("ledger", help="print the campaign's ledger")
    _config_arg(p)
    p.add_argument("--json", action="store_true", help="every column of every row, as a JSON list")

    p = sub.add_parser("clean", help="write a reproducibility record, then delete this campaign's heavy dirs")
    _config_arg(p)
    p.add_argument("--dry-run", action="store_true", help="list what would go, with sizes; change nothing")
    p.add_argument("--keep-final", action="store_true", help="keep the final checkpoint (resumable)")
    p = sub.add_parser("export-campaign", help="bundle the small state for another machine")
    _config_arg(p)
    p.add_argument("out", metavar="OUT.tar", help="the bundle to write (a tar file)")
    p = sub.add_parser("import-campaign", help="re-point an exported campaign at this machine's roots")
    p.add_argument("bundle", metavar="OUT.tar", help="a bundle written by export-campaign")
    p.add_argument("--repo", required=True, metavar="R", help="this machine's checkout of the repo")
    p.add_argument("--ephemeral-root", required=True, metavar="E", help="this machine's volume (the ephemeral root)")
    p.add_argument("--state-dir", metavar="S", help="the daemon's state dir here (default: the usual one for the campaign)")
    p.add_argument("--config-out", metavar="FILE", help="default: the old place relative to the repo")

    p = sub.add_parser("report", help="write one self-contained HTML report of the campaign (needs the report extra)")
    _config_arg(p)
    p.add_argument("-o", "--output", metavar="OUT.html",
                   help="where to write it (default: <campaign file's dir>/<campaign>-report.html)")
    p.add_argument("--base", metavar="SUMMARY.json",
                   help="the val tool's summary.json of the base model (or its dir): the val plot's base line "
                        "(default: <runs>/base-bare-val/summary.json when it exists)")

    p = sub.add_parser("install-service", help="render the systemd unit for this machine and print the systemctl commands")
    _config_arg(p)
    p.add_argument("--user", action="store_true", help="a user unit (~/.config/systemd/user) instead of a system one")
    p.add_argument("--write", action="store_true", help="write the unit file instead of printing it (never runs systemctl)")
    p.add_argument("--supervisor", metavar="OUT.conf",
                   help="no systemd (a container): write a supervisord config to OUT.conf instead (supervisord -c OUT.conf)")

    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; every outcome is an exit code and at most one stderr line (no traceback
    unless ``--debug``), including Ctrl-C (130) and a reader that left early (EXIT_PIPE)."""
    try:
        rc = _main(argv)
        # Flush here, not at interpreter exit: a reader that left early (`| head -1`) must
        # surface as BrokenPipeError below, not as "Exception ignored ..." on stderr.
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # https://docs.python.org/3/library/signal.html#note-on-sigpipe: point stdout at
        # /dev/null so that the interpreter's final flush cannot fail a second time.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_PIPE
    except KeyboardInterrupt:
        print("shoprld: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.cmd:
        parser.print_help()
        return EXIT_USAGE
    handler = globals()[f"cmd_{args.cmd.replace('-', '_')}"]
    try:
        return int(handler(args) or 0)
    except ShoprldError as exc:
        if args.debug:
            raise
        print(f"shoprld: {exc}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, BrokenPipeError):
        raise  # main's: the same answer wherever they happen
    except Exception as exc:  # a bug: one line unless --debug
        if args.debug:
            raise
        print(f"shoprld: unexpected error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_BUG


# -- commands ------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.check import run_check  # lazy: the status path stays on the stdlib

    return run_check(Path(args.config), print_commands=args.print_commands, placeholders=args.placeholders)


def cmd_rehearse(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.rehearse import run_rehearse  # lazy: the status path stays on the stdlib

    return run_rehearse(Path(args.config), keep=args.keep, real_analyst=args.real_analyst, debug=args.debug,
                        notify=args.notify)


def cmd_notify_test(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.notifytest import run_notify_test  # lazy: the status path stays on the stdlib

    return run_notify_test(Path(args.config))


def cmd_notify_crashed(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.notifytest import run_notify_crashed  # lazy: the status path stays on the stdlib

    return run_notify_crashed(Path(args.config), reason=args.reason, gave_up=args.gave_up,
                              seen_dead=args.seen_dead, systemd=args.systemd)


def cmd_init(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.initcmd import write_template  # lazy: the status path stays on the stdlib

    path = Path(args.path)
    write_template(path, force=args.force)
    print(f"wrote {path}; edit it, then: shoprld check -c {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.run import run_campaign  # lazy: the status path stays on the stdlib

    return run_campaign(Path(args.config), debug=args.debug, wait_for_space=args.wait_for_space,
                        adopt_state=args.adopt_state, verbose=args.verbose)


def cmd_demo(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.demo import run_demo  # lazy: the status path stays on the stdlib

    return run_demo(Path(args.dir) if args.dir else None, fast=args.fast, debug=args.debug, rounds=args.rounds,
                    verbose=args.verbose, no_run=args.no_run)


def cmd_status(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.statuscmd import run_status  # lazy: the status path stays on the stdlib

    return run_status(Path(args.config), as_json=args.json, watch=args.watch, interval=args.interval)


def cmd_stop(args: argparse.Namespace) -> int:
    from shoprld.daemon.core.control import request_stop  # lazy: the status path stays on the stdlib

    mode = "checkpoint" if args.at_checkpoint else "round" if args.after_round else "now"
    return request_stop(Path(args.config), mode)


def cmd_ledger(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.ledgercmd import print_ledger  # lazy: the status path stays on the stdlib

    return print_ledger(Path(args.config), as_json=args.json)


def _oneshot_logs(args: argparse.Namespace) -> None:
    """One-shot commands print their own report: library events from WARNING only, on stderr."""
    from shoprld.daemon.foundation.system.logs import configure  # lazy: the status path stays on the stdlib

    configure(level="DEBUG" if args.debug else "WARNING", stream=sys.stderr)


def cmd_clean(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.clean import clean  # lazy: the status path stays on the stdlib

    _oneshot_logs(args)
    return int(clean(Path(args.config), dry_run=args.dry_run, keep_final=args.keep_final))


def cmd_export_campaign(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.campaignexport import export_campaign  # lazy: the status path stays on the stdlib

    _oneshot_logs(args)
    return int(export_campaign(Path(args.config), Path(args.out)))


def cmd_import_campaign(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.campaignimport import import_campaign  # lazy: the status path stays on the stdlib

    def opt(v: str | None) -> Path | None:
        return Path(v) if v else None

    _oneshot_logs(args)
    return int(import_campaign(Path(args.bundle), Path(args.repo), Path(args.ephemeral_root),
                               opt(args.state_dir), config_out=opt(args.config_out)))


def cmd_report(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops.report import run_report  # lazy: the status path stays on the stdlib

    return run_report(Path(args.config), Path(args.output) if args.output else None,
                      base=Path(args.base) if args.base else None)


def cmd_install_service(args: argparse.Namespace) -> int:
    from shoprld.daemon.ops import supervise  # lazy: the status path stays on the stdlib
    from shoprld.daemon.ops.unit import install_service, shoprld_command

    config = Path(os.path.abspath(args.config))
    if args.supervisor is not None:
        if args.user or args.write:
            raise ConfigError("--supervisor writes a supervisord config; --user and --write are for systemd units; "
                              "fix: drop them")
        out = Path(args.supervisor)
        where = supervise.write_config(config, out, command=shoprld_command(), python=sys.executable)
        print(f"wrote {os.path.abspath(out)} (supervisord's own files: {where})")
        print(f"now run:  supervisord -c {os.path.abspath(out)}")
        print(f"after an instance restart, e.g. in tmux:  tmux new -d -s shoprld 'supervisord -n -c {os.path.abspath(out)}'")
        print(f"watch:    shoprld status --watch -c {config}")
        try:
            import supervisor  # noqa: F401  (only to say whether it is installed)
        except ImportError:
            print("shoprld: warning: supervisor is not installed here; fix: pip install 'shoprld[supervisor]'",
                  file=sys.stderr)
        return EXIT_OK
    if not supervise.systemd_running():
        raise ConfigError(supervise.no_systemd_message(config))
    return install_service(config, user=args.user, write=args.write)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
