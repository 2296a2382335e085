"""The child roles: the name each child process the daemon starts goes by (issue 16).

A role names a child in the state (``children``), in status.json, in the journal
(``stage.spawn``, ``child.adopted``), in its stage log's ``=== shoprld <time> start <role>:``
header and in ``SHOPRLD_CHILD=<state_dir>|<role>``, the tag every descendant inherits. The
enum is a :class:`enum.StrEnum`: a member is its value wherever it is written (json.dumps,
f-strings, ``str()``), so what is on disk and on the screen is the plain word. Roles read
back (from state.json or from ``/proc/<pid>/environ``) are plain strings and compare equal to
the members. Nothing here touches the disk.
"""

from __future__ import annotations

import enum


class ChildRole(enum.StrEnum):
    """Who a child is, as the daemon names it."""

    SHOPSIM = "shopsim"        # the ShopSim server (START_SHOPSIM, kept across rounds)
    TRAINER = "trainer"        # the training run (TRAIN); a Ray job under the Ray launcher
    SIDECAR = "sidecar"        # the optional process beside the trainer (TRAIN)
    EMIT = "emit"              # train.emit_command: writes the round's tool configs (TRAIN)
    CHECK = "check"            # train.check_command: checks the trainer can start (TRAIN)
    EXPORTER = "exporter"      # the HF export (EXPORT_HF)
    VAL_SERVER = "val_server"  # the served model VAL evaluates (VAL, GATE)
    VAL = "val"                # the validation run (VAL)
    ANALYZE = "analyze"        # gate.analyze_command: started by VAL to overlap, awaited by GATE
    GATE = "gate"              # the gate policy (GATE)
    CURRICULUM = "curriculum"  # inject.command run to build a curriculum (a stage's helper)
    RAY_HEAD = "ray_head"      # the Ray head the Ray launcher starts (train.ray_start_head)
    # Not a child the daemon starts: the processes in the Ray head's session, as the GPU
    # holder check names them (they carry no SHOPRLD_CHILD tag).
    RAY = "ray"
