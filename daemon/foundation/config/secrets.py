"""Secrets from ``<repo>/.env``: a mapping for the children that need it, never os.environ.

The file is parsed with python-dotenv's parser (``export`` prefixes, quotes, CRLF line
endings, multi-line quoted values), but read by shoprld itself, so every problem is one
line that names the file and the line: a line the parser rejects (an unterminated quote,
text after a closing quote), a file that is not UTF-8, a FIFO or a device in its place
(refused from ``stat`` and an ``O_NONBLOCK`` open: reading a FIFO would hang), and a secret
shorter than :data:`MIN_SECRET_LEN` characters (masking a 4-character value garbles every
log line that happens to contain it; leaving it unmasked leaks it). Values are never
quoted in an error.

The values go only into the environment of the stage children that list them, never
argv. :class:`Redactor` masks every secret value in text that leaves the process: the
journal, state.json, status.json, the ledger, notifications and the logs all pass through
the one built from the loaded .env (:attr:`Secrets.redactor`) where the process configures
itself, and handed to each writer (see README, "Secrets"). There is no process-wide one.
"""

from __future__ import annotations

import io
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from shoprld.daemon.foundation.system.errors import ConfigError

MASK = "***"
# Keys whose values are secret whatever the config says.
KNOWN_SECRET_KEYS = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "BAILIAN_API_KEY")
# Any key whose name says it holds a credential is a secret too.
SECRETISH = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASS|CREDENTIAL)", re.IGNORECASE)
# No real API key or token is shorter. A shorter secret is refused at load (issue 15): masking
# "info" turned every log line's "level" into "***", and not masking a 1-character secret
# leaked it. With this floor, masking never has to choose.
MIN_SECRET_LEN = 8
# A .env file is a few lines; a bigger one is a mistake (a log or a dump pointed at by env_file).
MAX_ENV_BYTES = 1024 * 1024
# What a well-formed key looks like: only such a name is ever quoted in an error (never a value).
_KEY = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(['\"])?")


class Redactor:
    """Masks every secret value in text and in JSON-like objects, before they leave the process.

    One instance, built from the loaded .env where the process configures itself (``shoprld
    run``: the logs' :func:`~.logs.configure` and the engine), is handed to the writers (the
    store, the status file, the ledger, the notifier, the logs); they call it themselves, so a
    caller that builds text from a child's output cannot forget it.
    """

    __slots__ = ("_pattern", "_masked")

    def __init__(self, pattern: re.Pattern[str] | None = None, masked: Iterable[str] = ()) -> None:
        self._pattern = pattern
        self._masked = frozenset(masked)

    def extend(self, other: Redactor) -> None:
        """Mask ``other``'s values too, from now on, in every writer that holds this instance.

        A SIGHUP reload that makes a new key secret (``train.secrets``) calls this on the
        daemon's one redactor: the logs, the store, the alerts and the status all hold it, so
        none of them keeps the old pattern. The old values stay masked: a child started before
        the reload may still print them."""
        if other._pattern is None:
            return
        if other._masked and (self._pattern is None or self._masked):
            self._masked = self._masked | other._masked
            self._pattern = _compile(self._masked)
        else:  # one was built from a bare pattern: keep both as they are
            self._pattern = other._pattern if self._pattern is None else \
                re.compile(f"{other._pattern.pattern}|{self._pattern.pattern}")
            self._masked = frozenset()

    def __repr__(self) -> str:  # never show the pattern: it is made of the values
        return f"Redactor(active={self._pattern is not None})"

    def __call__(self, text: str) -> str:
        return self.text(text)

    def text(self, text: str) -> str:
        """``text`` with every secret value replaced by ``***``."""
        return text if self._pattern is None else self._pattern.sub(MASK, text)

    def obj(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string (keys included) redacted."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.obj(v) for v in value]
        return value


class RedactingStream:
    """A text stream that redacts each write: the last line of defence for the log file, and a
    one-shot command's report (``clean`` lists paths, which may hold anything)."""

    def __init__(self, stream: TextIO, redactor: Redactor) -> None:
        self._stream = stream
        self._redactor = redactor

    def write(self, text: str) -> int:
        return self._stream.write(self._redactor.text(text))

    def flush(self) -> None:
        self._stream.flush()


# What a writer built without a redactor uses: a one-shot command or a reader (no secret to
# mask), or a test. The daemon hands its own to every writer.
NO_REDACTION = Redactor()


@dataclass(frozen=True)
class Secrets:
    """The loaded .env values, and the file they came from."""

    values: Mapping[str, str] = field(default_factory=dict)
    source: Path | None = None
    _pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)
    # One instance per Secrets: whoever asks (the logs, the engine) gets the same, so a reload
    # that extends it reaches every writer.
    _redactor: Redactor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._redactor is None:
            object.__setattr__(self, "_redactor", Redactor(self._pattern))

    def __repr__(self) -> str:  # never show values, even in a debugger or a traceback
        return f"Secrets(keys={sorted(self.values)}, source={self.source})"

    @property
    def redactor(self) -> Redactor:
        """The redactor that masks these values (always the same instance)."""
        assert self._redactor is not None
        return self._redactor

    def for_child(self, names: Iterable[str]) -> dict[str, str]:
        """The env entries a child gets: only the names it needs, only the set ones."""
        return {k: self.values[k] for k in names if self.values.get(k)}

    def redact(self, text: str) -> str:
        """Replace every known secret value in ``text`` with ``***``."""
        return self.redactor.text(text)

    def require(self, needed: Mapping[str, str]) -> None:
        """Stop before authenticated work when a needed key is missing or empty."""
        if self.source is None or not self.source.exists():
            if needed:
                first = next(iter(needed))
                raise ConfigError(
                    f"{self.source}: missing .env file, but {first} is required by {needed[first]}; "
                    f"fix: create it with a line {first}=... (never commit it)"
                )
            return
        for key, why in needed.items():
            if not self.values.get(key):
                raise ConfigError(
                    f"{self.source}: {key} is not set (required by {why}); fix: add a line {key}=... to that file"
                )


def is_secret_key(key: str, extra_keys: Iterable[str] = ()) -> bool:
    """Whether ``key``'s value is a secret: a known key, one the config hands to a child as a
    secret, or a name that says so (``*KEY*``, ``*TOKEN*``, ...)."""
    return key in KNOWN_SECRET_KEYS or key in set(extra_keys) or SECRETISH.search(key) is not None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _read(env_file: Path) -> bytes | None:
    """The file's bytes; None when it does not exist. Never blocks on a FIFO or a device."""
    try:
        st = os.stat(env_file)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{env_file}: cannot read .env ({exc.strerror}); "
                          f"fix: make it a readable UTF-8 KEY=value file") from None
    fix = "fix: point storage.env_file at a regular KEY=value file"
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{env_file}: is a directory, not a .env file; {fix}")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{env_file}: is {_kind(st.st_mode)}, not a .env file; {fix}")
    try:
        # O_NONBLOCK: if a FIFO was swapped in after the stat, the open must not wait for a writer.
        fd = os.open(env_file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{env_file}: cannot read .env ({exc.strerror}); "
                          f"fix: make it a readable UTF-8 KEY=value file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{env_file}: is {_kind(st.st_mode)}, not a .env file; {fix}")
        if st.st_size > MAX_ENV_BYTES:
            raise ConfigError(f"{env_file}: {st.st_size} bytes, too big for a .env file (at most {MAX_ENV_BYTES}); "
                              f"{fix}")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(MAX_ENV_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{env_file}: cannot read .env ({exc.strerror}); "
                          f"fix: make it a readable UTF-8 KEY=value file") from None
    finally:
        os.close(fd)


def _name(key: str) -> str:
    """A key as an error may quote it: a well-formed name, else nothing of it (a garbled line's
    "key" can be a pasted value)."""
    return key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key) else "the key on that line"


def _parse_error(env_file: Path, line: int, original: str) -> ConfigError:
    """One line for a statement the dotenv parser rejects: the file, the line, the key if it
    has a well-formed name, and why; never the value."""
    m = _KEY.match(original)
    what = "a line that is not KEY=value"
    if m is not None:
        key, quote = m.group(1), m.group(2)
        what = f"the value of {key} is malformed"
        if quote:
            rest = original[m.end():]
            closed = re.search(r'(?<!\\)"' if quote == '"' else "'", rest)
            what = (f"the value of {key} has text after its closing quote" if closed
                    else f"the value of {key} has an unterminated {quote} quote")
    return ConfigError(f"{env_file}:{line}: {what}; fix: write it as KEY=value (quote a value that holds "
                       f"spaces or #, close the quote, put comments on their own line)")


def load_secrets(env_file: Path, *, extra_keys: Iterable[str] = ()) -> Secrets:
    """Parse ``env_file`` without touching os.environ. A missing file gives empty Secrets.

    Raises ConfigError (exit 3, one line: file, line number, key; never a value) for a file
    that is not a regular UTF-8 file, a line the parser rejects, a NUL character, or a secret
    shorter than :data:`MIN_SECRET_LEN`.
    """
    # The parser only, not dotenv_values(): that one logs python-dotenv's own warning (no
    # file name) on stderr for every bad line, a second line beside ours.
    from dotenv.parser import parse_stream  # lazy: `shoprld stop` imports this module (control)

    data = _read(env_file)
    if data is None:
        return Secrets({}, env_file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{env_file}:{line}: not UTF-8 text; fix: save the file as UTF-8") from None
    text = text.removeprefix("\ufeff")  # a BOM from an editor is not part of the first key
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    for binding in parse_stream(io.StringIO(text)):
        # A binding's text starts with the blank lines before it; its line is the statement's.
        raw = binding.original.string
        stmt = raw.lstrip()
        line = binding.original.line + len(re.findall(r"\r\n|\n|\r", raw[: len(raw) - len(stmt)]))
        if binding.error:
            raise _parse_error(env_file, line, stmt)
        if not binding.key:
            continue
        key = binding.key.strip()
        value = (binding.value or "").strip().rstrip("\r")
        if "\0" in key or "\0" in value:
            raise ConfigError(f"{env_file}:{line}: a NUL character; fix: remove it (no environment variable "
                              f"can hold one)")
        if key:
            values[key] = value
            lines[key] = line
    extra = set(extra_keys)
    for key, value in values.items():
        if value and len(value) < MIN_SECRET_LEN and is_secret_key(key, extra):
            raise ConfigError(
                f"{env_file}:{lines[key]}: {_name(key)} is shorter than {MIN_SECRET_LEN} characters, too short to be "
                f"a real secret or to be masked in logs; fix: set the real value, or remove the line")
    return with_pattern(values, env_file, extra)


def with_pattern(values: Mapping[str, str], source: Path | None, extra_keys: Iterable[str] = ()) -> Secrets:
    """Build Secrets whose redaction covers every value of a secret-looking key."""
    extra = set(extra_keys)
    masked = sorted(
        {v for k, v in values.items() if v and len(v) >= MIN_SECRET_LEN and is_secret_key(k, extra)},
        key=len,
        reverse=True,
    )
    pattern = _compile(masked) if masked else None
    return Secrets(dict(values), source, pattern, Redactor(pattern, masked))


def _compile(values: Iterable[str]) -> re.Pattern[str]:
    """One alternation of the values, longest first (a value inside another is masked whole)."""
    return re.compile("|".join(re.escape(v) for v in sorted(set(values), key=len, reverse=True)))
