"""What the one-shot campaign commands share: clean, export-campaign and import-campaign (issue 9).

They run outside the daemon, on a campaign the daemon is not running: :func:`open_campaign`
loads its config, layout and secrets once; :func:`refuse_if_running` refuses while a daemon
holds the campaign's lock, and :class:`OneShotLock` then holds that lock for the whole
operation, so no daemon starts in the middle. The path helpers compare realpaths; the
commands' own rules (clean's refusals, import's fence) are built from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, LockError, ShoprldError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import NO_REDACTION, Redactor, Secrets, load_secrets
from shoprld.daemon.foundation.records.status import probe_lock
from shoprld.daemon.foundation.records.store import LOCK_FILE, Store

# slime's rollout samples under runs/: heavy; clean deletes them and a bundle leaves them out.
ROLLOUT_SAMPLES = "slime-training"


class LifecycleError(ShoprldError):
    """clean / export / import cannot go ahead (one line: what, where, the fix)."""

    exit_code = EXIT_CONFIG


@dataclass(frozen=True)
class Campaign:
    """A campaign as the one-shot commands see it: its config, layout and secrets, loaded once."""

    cfg: Config
    layout: Layout
    secrets: Secrets


def open_campaign(config_path: Path) -> Campaign:
    """Load the campaign file, its layout and its ``.env`` (the keys the config requires)."""
    cfg = load_config(config_path)
    layout = Layout.from_config(cfg)
    secrets = load_secrets(layout.env_file, extra_keys=cfg.required_secrets())
    return Campaign(cfg, layout, secrets)


def daemon_holds(state_dir: Path) -> int | None | bool:
    """False when no daemon holds the campaign's lock; else its pid (or True when unknown)."""
    held, pid = probe_lock(state_dir / LOCK_FILE)
    if held:
        return pid if pid is not None else True
    return False


class OneShotLock:
    """Hold the campaign's lock for the whole operation, so no daemon starts in the middle."""

    def __init__(self, state_dir: Path, action: str, *, redactor: Redactor = NO_REDACTION) -> None:
        """``redactor``: what the journal lines the command appends pass through (the campaign's
        ``.env`` values, as in the daemon; import has no ``.env`` to read yet)."""
        self.store = Store(state_dir, redactor=redactor)
        self.action = action

    def __enter__(self) -> Store:
        try:
            self.store.acquire_lock(role="oneshot")  # never daemon.pid: `stop` must not see us
        except LockError as exc:
            raise LockError(f"{self.action} refused: {exc}") from None
        return self.store

    def __exit__(self, *_: object) -> None:
        self.store.release_lock()


def refuse_if_running(state_dir: Path, action: str) -> None:
    """Raise a one-line LockError naming the daemon's pid while one runs this campaign."""
    holder = daemon_holds(state_dir)
    if holder is not False:
        pid = "" if holder is True else f" (pid {holder})"
        raise LockError(f"{action} refused: a shoprld daemon{pid} runs this campaign ({state_dir}); "
                        "fix: `shoprld stop` it first, then rerun")


def read_json(path: Path) -> Any:
    """The parsed file, or None when it is missing or not JSON (the commands report what they lack)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def strictly_inside(child: str, parent: str) -> bool:
    """Strictly inside (both already realpaths)."""
    return child != parent and child.startswith(parent.rstrip("/") + "/")


def inside_or_equal(child: str, parent: str) -> bool:
    """``child`` is ``parent`` or strictly inside it (both already realpaths)."""
    return child == parent or strictly_inside(child, parent)
