"""The campaign's outlook: its ETA, and whether the next round fits (issue 18).

Pure: the engine hands in numbers it already has (the finished rounds' durations, the
current round's start, the deadline, the last disk sample, the forecast from
``preflight.forecast_for``) and puts the :class:`Outlook` into ``status.json`` (under the
key ``plan``, which the status contract names).

- ETA: the rounds after this one at the median round time, plus what is left of this one
  (the median minus the time spent in it; before any round has finished, TRAIN's own ETA).
- Fits the deadline: the next round starts when this one ends and needs a median round;
  the machine's deadline rule (``machine.Deadline.says_stop``) will stop the campaign at that
  round boundary, so the warning comes a round early.
- Fits the disk: free bytes minus the hard limit cover the next round's forecast (below the
  hard limit the guard parks the campaign).

``None`` everywhere means "cannot tell yet" (no round finished, no disk sample, no deadline).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shoprld.daemon.foundation.system.units import human_bytes, human_duration, round_label

EVENT = "plan.next_round_wont_fit"


@dataclass(frozen=True)
class Outlook:
    """What ``status`` shows under ``plan`` (every field may be None: not known yet)."""

    rounds: int
    median_round_seconds: float | None
    round_left_seconds: float | None      # the rest of the current round
    campaign_eta_seconds: float | None    # the rest of the campaign
    next_round: int | None                # the next round's 0-based index (None: this is the last)
    fits_deadline: bool | None
    fits_disk: bool | None
    disk_need_bytes: int | None
    disk_room_bytes: int | None           # free bytes above the hard limit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self) -> list[tuple[str, str]]:
        """(reason, one line) for each "no": reason is ``deadline`` or ``disk``."""
        out: list[tuple[str, str]] = []
        if self.next_round is None:
            return out
        nxt = round_label(self.next_round, self.rounds)
        if self.fits_deadline is False:
            out.append(("deadline", f"{nxt} will not fit before the deadline (a round takes "
                                    f"~{human_duration(self.median_round_seconds)}); the campaign will stop "
                                    "after this round; fix: extend campaign.deadline to let it run"))
        if self.fits_disk is False:
            out.append(("disk", f"{nxt} will not fit on the disk: it needs {human_bytes(self.disk_need_bytes)} "
                                f"above the hard limit, {human_bytes(self.disk_room_bytes)} is left; fix: free "
                                "space on the volume before this round ends"))
        return out


def make_outlook(*, rounds: int, current: int, durations: Sequence[float], round_started_at: float | None,
              now: float, train_eta: float | None, in_train: bool, deadline: float | None,
              free_bytes: int | None, hard_limit_bytes: int | None, need_bytes: int | None) -> Outlook:
    """The rest of the campaign from plain numbers (see the module docstring)."""
    median = statistics.median(durations) if durations else None
    if median is not None:
        spent = max(0.0, now - round_started_at) if round_started_at is not None else 0.0
        left = max(0.0, median - spent)
        if in_train and train_eta is not None:
            left = max(left, train_eta)  # never promise less than TRAIN's own remainder
    else:
        left = train_eta if in_train else None
    after = max(0, rounds - current - 1)
    eta = left + after * median if left is not None and median is not None else (left if after == 0 else None)
    nxt = current + 1 if current + 1 < rounds else None
    fits_deadline: bool | None = None
    if nxt is not None and deadline is not None and median is not None and left is not None:
        fits_deadline = now + left + median <= deadline
    room = free_bytes - hard_limit_bytes if free_bytes is not None and hard_limit_bytes is not None else None
    fits_disk = (room >= need_bytes) if nxt is not None and room is not None and need_bytes is not None else None
    return Outlook(rounds=rounds, median_round_seconds=median, round_left_seconds=left, campaign_eta_seconds=eta, next_round=nxt,
                fits_deadline=fits_deadline, fits_disk=fits_disk, disk_need_bytes=need_bytes,
                disk_room_bytes=room)
