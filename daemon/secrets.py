"""Secrets from ``<repo>/.env``: a mapping for the children that need it, never os.environ.

The values are loaded with python-dotenv (which handles ``export`` prefixes, quotes and
CRLF line endings). They are handed only to the environment of the stage children that
list them, never to argv, and :meth:`Secrets.redact` masks every value anywhere in text
that shoprld writes (logs, state, ledger, status).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

MASK = "***"
# Keys whose values are secret whatever the config says.
KNOWN_SECRET_KEYS = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "BAILIAN_API_KEY")
# Values shorter than this are not masked: masking "1" everywhere would garble the logs
# and a 3-character secret is not a secret.
_MIN_SECRET_LEN = 4


@dataclass(frozen=True)
class Secrets:
    """The loaded .env values, and the file they came from."""

    values: Mapping[str, str] = field(default_factory=dict)
    source: Path | None = None
    _pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:  # never show values, even in a debugger or a traceback
        return f"Secrets(keys={sorted(self.values)}, source={self.source})"

    def for_child(self, names: Iterable[str]) -> dict[str, str]:
        """The env entries a child gets: only the names it needs, only the set ones."""
        return {k: self.values[k] for k in names if self.values.get(k)}

    def redact(self, text: str) -> str:
        """Replace every known secret value in ``text`` with ``***``."""
        pat = self._pattern
        if pat is None:
            return text
        return pat.sub(MASK, text)

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


def load_secrets(env_file: Path, *, extra_keys: Iterable[str] = ()) -> Secrets:
    """Parse ``env_file`` without touching os.environ. A missing file gives empty Secrets."""
    from dotenv import dotenv_values

    if not env_file.exists():
        return Secrets({}, env_file)
    if env_file.is_dir():
        raise ConfigError(f"{env_file}: is a directory, not a .env file; fix: point storage.env_file at a file")
    try:
        raw = dotenv_values(env_file, interpolate=False)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{env_file}: cannot read .env ({exc}); fix: make it a readable UTF-8 KEY=value file") from None
    values = {k.strip(): (v or "").strip().rstrip("\r") for k, v in raw.items() if k}
    return with_pattern(values, env_file, extra_keys)


def with_pattern(values: Mapping[str, str], source: Path | None, extra_keys: Iterable[str] = ()) -> Secrets:
    """Build Secrets whose redaction covers every value of a secret-looking key."""
    secret_keys = set(KNOWN_SECRET_KEYS) | set(extra_keys)
    secretish = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASS|CREDENTIAL)", re.IGNORECASE)
    masked = sorted(
        {v for k, v in values.items() if v and len(v) >= _MIN_SECRET_LEN and (k in secret_keys or secretish.search(k))},
        key=len,
        reverse=True,
    )
    pattern = re.compile("|".join(re.escape(v) for v in masked)) if masked else None
    return Secrets(dict(values), source, pattern)
