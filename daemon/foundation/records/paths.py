"""Stdlib-only path helpers for the fast paths (``status``, ``stop``).

``shoprld status --json`` has a 100 ms budget, so it must not import pydantic, structlog,
httpx or anyio. It reads the campaign file with tomllib and finds the state dir here; the
full, validated :class:`~shoprld.daemon.foundation.records.layout.Layout` uses the same function.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def round_id(index: int) -> str:
    """A round's name in files, records and messages: ``round-000`` for index 0."""
    return f"round-{index:03d}"


def record_file(artifacts: Path, kind: str, rid: str) -> Path:
    """Where shoprld keeps one round's small decision record of ``kind``: the one spelling of
    ``<artifacts>/<kind>/<round_id>.json``. ``RoundPlan`` names each record through it; the
    save planner (``round/saves.py``, which ``RoundPlan`` itself imports) uses it directly."""
    return artifacts / kind / f"{rid}.json"


def default_state_dir(campaign: str, environ: Mapping[str, str] = os.environ, *, instance: str | None = None,
                      system_root: Path = Path("/var/lib/shoprld")) -> Path:
    """$STATE_DIRECTORY under systemd (or supervisord: its config pins it), else the system
    unit's dir when it exists, under the campaign's name or under the unit's instance name (the
    campaign file's name, which may differ), so that `shoprld status`/`stop` run by hand find a
    campaign systemd runs; else $XDG_STATE_HOME/shoprld/<campaign>."""
    if environ.get("STATE_DIRECTORY"):
        # systemd may pass several colon-separated dirs; the first is ours.
        return Path(environ["STATE_DIRECTORY"].split(":")[0])
    for name in dict.fromkeys(n for n in (campaign, instance) if n):
        system = system_root / name
        if system.is_dir():
            return system
    xdg = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME", "/root")) / ".local" / "state")
    return Path(xdg) / "shoprld" / campaign


def special_file(path: Path) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a dir (a FIFO, a device,
    a socket), else None. Such a campaign file is refused before it is opened: opening a FIFO
    blocks until a writer comes, and a device can be read forever (issue 15)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # the open that follows reports it, with its own message
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


class QuickConfigError(Exception):
    """The campaign file cannot even be read for its name (one line)."""


def quick_read(config: Path) -> dict[str, Any]:
    """Parse the TOML without validating it (the daemon validated it when it started)."""
    kind = special_file(config)
    if kind is not None:
        raise QuickConfigError(f"{config}: is {kind}, not a campaign file; fix: pass -c FILE.toml")
    try:
        return tomllib.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise QuickConfigError(f"{config}: no such campaign file; fix: pass -c FILE") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise QuickConfigError(f"{config}: not valid TOML ({exc}); fix: `shoprld check -c {config}`") from None
    except OSError as exc:
        raise QuickConfigError(f"{config}: cannot read ({exc.strerror})") from None


def state_dir_from_toml(config: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """The campaign's state dir, exactly as Layout.from_config derives it."""
    data = quick_read(config)
    campaign = data.get("campaign", {}).get("name")
    if not isinstance(campaign, str) or not campaign:
        raise QuickConfigError(f"{config}: campaign.name: missing; fix: add it")
    raw = data.get("storage", {}).get("state_dir")
    if isinstance(raw, str) and raw:
        p = Path(os.path.expandvars(raw)).expanduser()
        return p if p.is_absolute() else config.resolve().parent / p
    return default_state_dir(campaign, environ, instance=config.name.removesuffix(".toml"))


def identity_fields(config: Path, data: Mapping[str, Any]) -> tuple[str, str, Path, Path]:
    """(name, experiment, repo, ephemeral_root) as config.py resolves them: relative paths
    against the campaign file's dir, ``$VARS`` and ``~`` expanded (for ``status``'s identity
    check, without pydantic)."""
    camp_raw, storage_raw = data.get("campaign"), data.get("storage")
    camp: Mapping[str, Any] = camp_raw if isinstance(camp_raw, dict) else {}
    storage: Mapping[str, Any] = storage_raw if isinstance(storage_raw, dict) else {}
    base = config.resolve().parent

    def path(key: str, default: str) -> Path:
        raw = storage.get(key)
        p = Path(os.path.expandvars(raw)).expanduser() if isinstance(raw, str) and raw else Path(default)
        return p if p.is_absolute() else base / p

    return (str(camp.get("name", "")), str(camp.get("experiment", "main")), path("repo", "."),
            path("ephemeral_root", "/ephemeral"))


def tree_bytes(path: Path) -> int:
    """Apparent size of a file or tree; symlinks are not followed (a link counts as itself)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
