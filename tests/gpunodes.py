"""GPU device nodes for tests, made in a temp dir: never the machine's own ``/dev/nvidia*``.

:func:`make_nodes` makes ``<dir>/nvidia0`` and ``<dir>/nvidia-uvm`` as character devices with
``/dev/null``'s numbers (a node of the NVIDIA major 195 would reach the real driver when opened,
and fails to open where there is none), so a test process can hold them open as a CUDA process
holds the real ones; the prefix ``<dir>/nvidia`` is what ``gpus.devices`` names.
:data:`HOLD` is a child program that opens the nodes named in ``$GPU_NODES`` and sleeps.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

HOLD = ("import os, time; held = [open(p, 'rb') for p in os.environ.get('GPU_NODES', '').split(':') if p]; "
        "time.sleep(600)")


def make_nodes(directory: Path) -> tuple[str, str]:
    """(device prefix, the ``GPU_NODES`` value that makes :data:`HOLD` open both nodes)."""
    directory.mkdir(parents=True, exist_ok=True)
    null = os.stat("/dev/null").st_rdev
    nodes = [directory / "nvidia0", directory / "nvidia-uvm"]
    for node in nodes:
        os.mknod(node, stat.S_IFCHR | 0o666, null)
    return str(directory / "nvidia"), ":".join(str(n) for n in nodes)
