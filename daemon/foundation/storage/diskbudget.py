"""The disk budget: what a campaign's peak needs on its volume, and the free-space floors.

Theory of operation (issue 25: the user's box has a data disk little larger than a campaign)
---------------------------------------------------------------------------------------------
* **Forecast** (:func:`forecast`): the peak of a round is the finals retention keeps, the save
  being written and one HF export (upstream's loop: previous iter + new iter + the HF dir).
  What of it is already on the volume is not needed again; the margin covers logs and rollouts.
* **Limits** (:func:`limits`): soft and hard floors, small and scale-free (a fraction of a
  checkpoint, :func:`floor_unit`), both overridable. The forecast already reserves the save in
  flight; the floors only keep the volume from filling.
* **Budget** (:class:`Budget`): the forecast and the limits against one sample: whether the
  next save fits above the hard floor, and what an unattended campaign needs free
  (``need_bytes``). `check`, PREFLIGHT_DISK and the save planner all read this one object.

Every default here derives from the checkpoint size, so a campaign scaled down 1024x (MiB for
GiB) behaves the same on a tmpfs. Nothing here knows about config objects: plain values only.
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Forecast:
    """What the campaign's peak needs on the volume, and where the checkpoint size came from.

    The peak of a round is ``keep`` checkpoints (the finals retention keeps plus the save being
    written) and one HF export; ``present_bytes`` of that is already on the volume (kept
    checkpoints, the HF dir), so only the rest, plus the margin, must still be free."""

    checkpoint_bytes: int
    keep: int
    hf_bytes: int
    margin_bytes: int
    measured: bool  # True: the last checkpoint's measured size; False: the configured estimate
    present_bytes: int = 0
    # Ray's session logs still to come (a head of ours writes them on this volume): the kept
    # sessions' allowance less what of it is there (foundation/storage/raysessions.py); 0 otherwise.
    ray_logs_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        """``checkpoint_bytes * keep + hf_bytes``: the campaign's own bytes at a round's peak."""
        return self.checkpoint_bytes * self.keep + self.hf_bytes

    @property
    def total(self) -> int:
        """Free bytes the peak still needs: what of it is not on the volume yet (at least one
        checkpoint: the next save is always new), plus the margin and Ray's session logs."""
        new = max(self.checkpoint_bytes, self.peak_bytes - self.present_bytes)
        return new + self.margin_bytes + self.ray_logs_bytes


def forecast(
    *,
    last_checkpoint_bytes: int | None,
    estimate_bytes: int,
    keep: int = 2,
    hf_bytes: int,
    margin_bytes: int,
    present_bytes: int = 0,
) -> Forecast:
    """Forecast the peak's need: the measured checkpoint size when known, else the estimate.

    A measured size of 0 (an empty or unreadable checkpoint) is not a measurement and falls back
    to the estimate. Negative inputs raise ``ValueError``.
    """
    for name, value in (
        ("estimate_bytes", estimate_bytes),
        ("keep", keep),
        ("hf_bytes", hf_bytes),
        ("margin_bytes", margin_bytes),
        ("present_bytes", present_bytes),
    ):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    measured = last_checkpoint_bytes is not None and last_checkpoint_bytes > 0
    ckpt = last_checkpoint_bytes if measured and last_checkpoint_bytes is not None else estimate_bytes
    return Forecast(checkpoint_bytes=ckpt, keep=keep, hf_bytes=hf_bytes, margin_bytes=margin_bytes, measured=measured,
                    present_bytes=present_bytes)


@dataclass(frozen=True)
class Limits:
    """Free-space floors: below ``soft`` finish the in-flight save then stop; below ``hard`` stop now."""

    soft_bytes: int
    hard_bytes: int
    soft_inodes: int
    hard_inodes: int


FLOOR_FRACTION = 64  # the floor unit is 1/64 of a checkpoint: 0.83 GiB for the recipe's 53 GiB


def floor_unit(checkpoint_bytes: int) -> int:
    """The unit every default size of the disk guard derives from (floors, margin, hysteresis,
    ballast): a fraction of one checkpoint, so a campaign scaled down 1024x behaves the same."""
    return max(1, checkpoint_bytes // FLOOR_FRACTION)


def limits(
    total_bytes: int,
    checkpoint_bytes: int,
    *,
    soft_override: int | None = None,
    hard_override: int | None = None,
    hard_inodes: int = 1000,
    soft_inodes: int | None = None,
) -> Limits:
    """Derive the soft and hard limits for a checkpoint of ``checkpoint_bytes``.

    Defaults (issue 25): hard = one :func:`floor_unit`, soft = hard + one unit (1/64 and 1/32 of
    a checkpoint); soft_inodes = 2 x hard_inodes. They are floors below the forecast, which
    already reserves the save in flight: the old defaults (10 % of the volume, a checkpoint + 1
    GiB, soft one checkpoint above) counted that save twice and parked a 5-round campaign on a
    disk upstream's loop fits. Overrides win. ``total_bytes`` is the volume's size (overrides
    at or above it are refused before the campaign starts: services/validate.py). Raises
    ``ValueError`` when soft <= hard (bytes or inodes) or a value is negative.
    """
    if total_bytes < 0 or checkpoint_bytes < 0 or hard_inodes < 0:
        raise ValueError("total_bytes, checkpoint_bytes and hard_inodes must be >= 0")
    unit = floor_unit(checkpoint_bytes)
    hard = hard_override if hard_override is not None else unit
    soft = soft_override if soft_override is not None else hard + unit
    if hard < 0:
        raise ValueError(f"hard limit must be >= 0, got {hard}")
    if soft <= hard:
        raise ValueError(f"soft limit ({soft} bytes) must be above the hard limit ({hard} bytes)")
    s_inodes = soft_inodes if soft_inodes is not None else 2 * hard_inodes
    if s_inodes <= hard_inodes:
        raise ValueError(f"soft inode limit ({s_inodes}) must be above the hard one ({hard_inodes})")
    return Limits(soft_bytes=soft, hard_bytes=hard, soft_inodes=s_inodes, hard_inodes=hard_inodes)


@dataclass(frozen=True)
class Budget:
    """The forecast and the floors against the volume now (one owner for `check`, PREFLIGHT_DISK
    and the save planner)."""

    forecast: Forecast
    limits: Limits
    free_bytes: int
    total_bytes: int
    hf_present_bytes: int = 0  # the HF export dir already on the volume (a save rewrites it)

    @property
    def need_bytes(self) -> int:
        """Free bytes an unattended campaign needs now: the forecast's, above the soft floor (a
        save that ends below soft parks the campaign), and never less than the next save needs."""
        fc = self.forecast
        return max(fc.total, self.next_save_bytes + fc.margin_bytes) + self.limits.soft_bytes

    @property
    def ok(self) -> bool:
        """Whether the campaign runs to its end without parking, as far as the disk goes."""
        return self.free_bytes >= self.need_bytes

    @property
    def round_fits(self) -> bool:
        """Whether this round's peak (what of it is not on the volume yet) lands above the soft
        floor, so the round ends without parking. Mid-round saves need no more than this: each
        supersedes the one before, so the peak is the final save's (``saves.disk_room``)."""
        fc = self.forecast
        return self.free_bytes - max(self.next_save_bytes, fc.peak_bytes - fc.present_bytes) >= self.limits.soft_bytes

    @property
    def next_save_bytes(self) -> int:
        """What the next save adds: one checkpoint and the part of the HF export not there yet."""
        return self.forecast.checkpoint_bytes + max(0, self.forecast.hf_bytes - self.hf_present_bytes)

    @property
    def next_save_fits(self) -> bool:
        """Whether the next save (the first round's final one, at the start) lands above the hard
        floor: PREFLIGHT_DISK and `check` refuse a volume where it would not."""
        return self.free_bytes - self.next_save_bytes >= self.limits.hard_bytes

