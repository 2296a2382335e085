"""A ShopSim checkout for tests: the launch shape of ShopSimulator's ``shop_env/start.sh`` around
the demo stand-in, and a snapshot of a tree to prove a campaign left it as found.

The real ``start.sh`` sets ``SHOP_ENV_ROOT`` to its own directory, requires the search index
(``${SHOP_SEARCH_INDEX:-$SHOP_ENV_ROOT/search_engine/products.sqlite3}``, exit 1 when missing),
exports ``SHOP_ENV_CONFIG`` (default ``$SHOP_ENV_ROOT/configs/environment.json``), ``cd``s to
``SHOP_ENV_ROOT`` and execs ``python -m shop_env.pack_api``, whose ``logging.FileHandler
("shop_agent.log")`` appends every request to that cwd. The script written here does the same,
and its ``shop_env/pack_api.py`` runs the demo stand-in with ``--agent-log shop_agent.log``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DEMO_SHOPSIM = Path(__file__).resolve().parents[1] / "run" / "demo" / "shopsim.py"

START_SH = """#!/usr/bin/env bash
# The launch shape of ShopSimulator/shop_env/start.sh (see tests/shopsimcheckout.py).
set -euo pipefail

SHOP_ENV_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
INDEX_PATH="${SHOP_SEARCH_INDEX:-${SHOP_ENV_ROOT}/search_engine/products.sqlite3}"

if [[ ! -f "${INDEX_PATH}" ]]; then
  echo "ShopSimulator index is missing: ${INDEX_PATH}" >&2
  exit 1
fi

export SHOP_ENV_CONFIG="${SHOP_ENV_CONFIG:-${SHOP_ENV_ROOT}/configs/environment.json}"
export SHOP_SEARCH_INDEX="${INDEX_PATH}"
export SHOPSIM_ENV_SLOTS="${SHOPSIM_ENV_SLOTS:-8}"
export SHOPSIM_PORT="${SHOPSIM_PORT:-5700}"

cd "${SHOP_ENV_ROOT}"
exec python -m shop_env.pack_api
"""

PACK_API = f'''"""Stand-in for shop_env.pack_api: the demo ShopSim, logging to ./shop_agent.log."""
import os
import runpy
import sys

for key in ("SHOP_ENV_CONFIG", "SHOP_SEARCH_INDEX"):
    if not os.path.isfile(os.environ[key]):
        sys.exit(f"{{key}}: {{os.environ[key]}} does not exist")
demo = {str(DEMO_SHOPSIM)!r}
sys.path.insert(0, os.path.dirname(demo))
sys.argv = [demo, "--agent-log", "shop_agent.log"]
runpy.run_path(demo, run_name="__main__")
'''


def make_checkout(shop_env: Path, *, user_log: str | None = "an earlier session's requests\n") -> Path:
    """Write a ShopSim checkout's ``shop_env`` dir at ``shop_env`` (with the user's own
    ``shop_agent.log`` when ``user_log`` is given); returns ``shop_env``."""
    (shop_env / "shop_env").mkdir(parents=True)
    (shop_env / "search_engine").mkdir()
    (shop_env / "configs").mkdir()
    (shop_env / "search_engine" / "products.sqlite3").write_bytes(b"")
    (shop_env / "configs" / "environment.json").write_text('{"environment_version": "stand-in"}\n')
    (shop_env / "shop_env" / "__init__.py").write_text("")
    (shop_env / "shop_env" / "pack_api.py").write_text(PACK_API)
    script = shop_env / "start.sh"
    script.write_text(START_SH)
    script.chmod(0o755)
    if user_log is not None:
        (shop_env / "shop_agent.log").write_text(user_log)
    return shop_env


def snapshot(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` (``root`` itself too), not following links: (type and mode,
    size, mtime_ns, inode, link target). ``skip``: top-level names left out."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in skip]
            filenames = [f for f in filenames if f not in skip]
        for name in [".", *dirnames, *filenames] if rel_dir == "." else [*dirnames, *filenames]:
            path = Path(dirpath) / name if name != "." else Path(dirpath)
            st = path.lstat()
            target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            rel = os.path.normpath(os.path.join(rel_dir, name))
            out[rel] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, target)
        if rel_dir != ".":
            continue
    return out


def differences(before: dict[str, tuple[object, ...]], after: dict[str, tuple[object, ...]]) -> list[str]:
    """What changed between two snapshots, one line per path."""
    out = [f"gone: {p}" for p in sorted(before.keys() - after.keys())]
    out += [f"new: {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"changed: {p}: {before[p]} -> {after[p]}" for p in sorted(before.keys() & after.keys())
            if before[p] != after[p]]
    return out
