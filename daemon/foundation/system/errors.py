"""The exception tree and the exit codes of ``shoprld run`` (SPEC §6).

    ShoprldError                 exit_code 1 unless a subclass says otherwise
    ├── ConfigError              3  bad campaign file, bad .env, missing secret
    ├── LockError                3  another daemon holds the campaign's state dir
    ├── PreflightError           3  the volume or the repo is not fit to start on
    ├── NoSpace                  4  a write of the daemon's own (state dir, log) did not fit
    └── StageFailed              6  a stage failed after its retries

A park for disk pressure (4) and the gate policy's stop (5) are not errors: the machine
decides them (daemon/round/machine.py) and the engine exits with their codes.

Every message is ONE line for the operator: what, where, and the fix. The CLI prints
``shoprld: <message>`` and exits with ``exit_code``; a traceback only with ``--debug``.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_DISK = 4
EXIT_GATE = 5
EXIT_STAGE = 6
# Not errors of the campaign: the reader of stdout left early (`shoprld check | head -1`). 128 +
# SIGPIPE, what a shell reports for a program that SIGPIPE ended; nothing is printed.
EXIT_PIPE = 141


class ShoprldError(Exception):
    """Base of every error shoprld reports to the operator as one line."""

    exit_code = EXIT_BUG

    def __init__(self, message: str) -> None:
        # Collapse to one line: a multi-line message would break journald and the
        # "one line that says what and where" contract.
        super().__init__(" ".join(str(message).split()))


class ConfigError(ShoprldError):
    """The campaign file, the .env file or a required secret is wrong or missing."""

    exit_code = EXIT_CONFIG


class LockError(ShoprldError):
    """Another daemon already runs this campaign."""

    exit_code = EXIT_CONFIG


class PreflightError(ShoprldError):
    """The volume or the repo is not fit for the next round."""

    exit_code = EXIT_CONFIG


class NoSpace(ShoprldError):
    """A file of the daemon's own (the state dir's record, its log) could not be written: its
    filesystem is full. The campaign stopped; free space, then run again (it resumes)."""

    exit_code = EXIT_DISK


class StageFailed(ShoprldError):
    """A stage failed after all its retries."""

    exit_code = EXIT_STAGE
