"""Run a child inside a conda env the way ``conda activate`` would.

The seed's slime env prepends pip's cuDNN 9.17 to LD_LIBRARY_PATH from an
``etc/conda/activate.d/`` hook; running ``envs/slime/bin/python`` directly silently picks
the system's cuDNN 9.8. So a stage with ``conda_prefix`` is launched through a fixed bash
prologue that does what activation does (CONDA_PREFIX, PATH, then every activate.d
``*.sh`` hook in order) and then ``exec``s the stage's argv. The argv is passed as
positional parameters, never spliced into the script, so no value is ever parsed by a
shell.
"""

from __future__ import annotations

from pathlib import Path

_PROLOGUE = (
    'prefix="$1"; shift; '
    'export CONDA_PREFIX="$prefix" CONDA_DEFAULT_ENV="$(basename "$prefix")" CONDA_SHLVL=1; '
    'export PATH="$prefix/bin:$PATH"; '
    'if [ -d "$prefix/etc/conda/activate.d" ]; then '
    'for hook in "$prefix"/etc/conda/activate.d/*.sh; do [ -f "$hook" ] && . "$hook"; done; fi; '
    'exec "$@"'
)


def activation_argv(prefix: Path, argv: list[str]) -> list[str]:
    """``argv`` wrapped so that it runs with ``prefix`` activated."""
    return ["bash", "-c", _PROLOGUE, "shoprld-activate", str(prefix), *argv]
