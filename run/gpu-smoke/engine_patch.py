#!/usr/bin/env python3
"""The engine change the GPU smoke needs, applied to an INSTALLED copy of shoprld (never the repo).

megatron-core 0.19 (``dist_checkpointing.save``) no longer writes ``common.pt``: the common state
is a ShardedObject (``common_state``) inside the torch DCP files, and ``load_common_state_dict``
reads either layout. shoprld's completeness rule (SPEC §3) and its deep verification require
``common.pt``, so a real megatron-core 0.19 checkpoint is never "complete" and TRAIN never
finishes. The fix: require ``.metadata`` + ``metadata.json`` (written LAST by every megatron-core
version) + a ``*.distcp`` shard; ``common.pt`` stays accepted (older megatron-core writes it
before the shards, so it is present whenever ``metadata.json`` is).

    python run/gpu-smoke/engine_patch.py --diff          # print the diff against the repo's file
    python run/gpu-smoke/engine_patch.py --apply FILE    # patch FILE (an installed checkpoints.py)
    python run/gpu-smoke/engine_patch.py --check FILE    # exit 0 when FILE already has the change
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

REPLACEMENTS = [
    (
        '    if has_shard and {"common.pt", ".metadata", "metadata.json"} <= names:\n',
        '    # common.pt is optional: megatron-core >= 0.19 keeps the common state inside the DCP files.\n'
        '    if has_shard and {".metadata", "metadata.json"} <= names:\n',
    ),
    (
        '    for required in ("common.pt", ".metadata", "metadata.json"):\n',
        '    for required in (".metadata", "metadata.json"):  # common.pt: only in older megatron-core\n',
    ),
]


def patched(text: str) -> str:
    for old, new in REPLACEMENTS:
        if text.count(old) != 1:
            raise SystemExit(f"engine_patch: expected exactly one {old.strip()!r}, found {text.count(old)}")
        text = text.replace(old, new)
    return text


def is_patched(text: str) -> bool:
    return all(new in text for _, new in REPLACEMENTS)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--diff", action="store_true")
    g.add_argument("--apply", metavar="FILE")
    g.add_argument("--check", metavar="FILE")
    a = p.parse_args()
    if a.diff:
        src = Path(__file__).resolve().parents[2] / "daemon" / "checkpoints.py"
        old = src.read_text()
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), patched(old).splitlines(True),
                                                   "a/daemon/checkpoints.py", "b/daemon/checkpoints.py"))
        return 0
    path = Path(a.apply or a.check)
    text = path.read_text()
    if a.check:
        return 0 if is_patched(text) else 1
    if is_patched(text):
        print(f"engine_patch: {path} already patched")
        return 0
    path.write_text(patched(text))
    for cache in path.parent.glob("__pycache__/checkpoints.*.pyc"):
        cache.unlink()
    print(f"engine_patch: patched {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
