"""shoprld.daemon.foundation.storage.disk on REAL small filesystems: tmpfs and loop-mounted ext4 (root only)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from shoprld.daemon.foundation.storage import disk, diskcheck, reclaim
from shoprld.daemon.foundation.storage.ballast import Ballast
from shoprld.daemon.foundation.storage.disk import Guard, Limits, is_enospc
from shoprld.daemon.foundation.storage.diskcheck import check_volume
from structlog.testing import capture_logs

from tests.fsfixtures import (  # noqa: F401  (fixtures "loop_ext4", "tmpfs")
    MOUNT_SOURCE,
    DiskEvents,
    FsUnavailable,
    Mounts,
    loop_ext4_fixture,
    mount_loop_ext4,
    mount_tmpfs,
    read_only,
    tmpfs_fixture,
)

pytestmark = pytest.mark.root

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
Mount = Callable[..., Path]


def fill(path: Path, leave_bytes: int = 0, chunk: int = MiB) -> None:
    """Write zeros to `path` until the volume has `leave_bytes` free, or until ENOSPC."""
    buf = b"\0" * chunk
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            room = disk.sample(path.parent).free_bytes - leave_bytes
            if room <= 0:
                return
            os.write(fd, buf[: min(chunk, room)])
    except OSError as exc:
        if not is_enospc(exc):
            raise
    finally:
        os.close(fd)


def no_problems_but(problems: list[diskcheck.PreflightProblem], what: str) -> str:
    """Assert exactly one problem, starting with `what`; return its line."""
    lines = [p.line() for p in problems]
    assert len(lines) == 1, lines
    assert lines[0].startswith(what + ": "), lines[0]
    assert "\n" not in lines[0]
    return lines[0]


def check(root: Path, **kw: Any) -> list[diskcheck.PreflightProblem]:
    """check_volume() with test defaults: the real repo, no heavy paths, no needs."""
    args: dict[str, Any] = {"ephemeral_root": root, "repo": REPO, "heavy_paths": {}, "need_bytes": 0, "need_inodes": 0}
    return check_volume(**(args | kw))


def mounted_here(mnt: Path) -> bool:
    """Whether /proc/self/mountinfo lists `mnt` as a mount point."""
    return any(line.split()[4] == str(mnt) for line in Path("/proc/self/mountinfo").read_text().splitlines())


# ---------------------------------------------------------------------------- fixtures themselves


def test_tmpfs_is_unmounted_when_the_body_raises() -> None:
    """mount_tmpfs unmounts and removes its mount point even when the block raises."""
    try:
        with pytest.raises(RuntimeError, match="boom"), mount_tmpfs("1m") as mnt:
            assert os.path.ismount(mnt)
            raise RuntimeError("boom")
    except FsUnavailable as exc:
        pytest.skip(str(exc))
    assert not mounted_here(mnt) and not mnt.exists()


def test_loop_ext4_is_unmounted_and_detached_when_the_body_raises() -> None:
    """mount_loop_ext4 unmounts, detaches the loop device and deletes the image on an exception."""
    try:
        with pytest.raises(RuntimeError, match="boom"), mount_loop_ext4(16) as mnt:
            src = next(
                ln.split(" - ")[1].split()[1]
                for ln in Path("/proc/self/mountinfo").read_text().splitlines()
                if ln.split()[4] == str(mnt)
            )
            backing = Path(f"/sys/block/{Path(src).name}/loop/backing_file")
            image = Path(backing.read_text().strip())
            assert image.exists()
            raise RuntimeError("boom")
    except FsUnavailable as exc:
        pytest.skip(str(exc))
    assert not mounted_here(mnt) and not mnt.exists()
    assert not backing.exists(), "loop device still attached"
    assert not image.exists()


def test_mounts_unmounts_everything_even_when_one_is_busy() -> None:
    """Mounts.close() tears down all mounts, lazily unmounting one that still has an open file."""
    try:
        with pytest.raises(RuntimeError), Mounts() as m:
            a, b = m.tmpfs("1m"), m.tmpfs("1m")
            held = open(a / "busy", "w")  # noqa: SIM115  (kept open on purpose: EBUSY)
            raise RuntimeError("boom")
    except FsUnavailable as exc:
        pytest.skip(str(exc))
    held.close()
    assert not mounted_here(a) and not mounted_here(b)


# ---------------------------------------------------------------------------- sample


def test_sample_sees_bytes_and_inodes_change(tmpfs: Mount) -> None:
    """Writing a file lowers free bytes by its size; creating files lowers free inodes by their count."""
    root = tmpfs("20m")
    before = disk.sample(root)
    assert before.total_bytes == 20 * MiB and not before.read_only
    (root / "blob").write_bytes(b"\1" * (4 * MiB))
    after = disk.sample(root)
    assert after.free_bytes == before.free_bytes - 4 * MiB
    assert after.avail_bytes == after.free_bytes
    for i in range(100):
        (root / f"f{i}").touch()
    assert disk.sample(root).inodes_free == after.inodes_free - 100


def test_sample_reports_a_read_only_remount(tmpfs: Mount) -> None:
    """A tmpfs remounted read-only samples as read_only."""
    root = tmpfs("4m")
    with read_only(root):
        assert disk.sample(root).read_only
    assert not disk.sample(root).read_only


# ---------------------------------------------------------------------------- monitor, for real


LIM = Limits(soft_bytes=8 * MiB, hard_bytes=4 * MiB, soft_inodes=20, hard_inodes=10)


@pytest.mark.anyio
async def test_monitor_sees_a_sudden_fill_as_hard_then_ok_after_delete(tmpfs: Mount) -> None:
    """Another thread filling a 20 MiB tmpfs brings disk.hard_limit; deleting the file brings disk.ok."""
    root, ev = tmpfs("20m"), DiskEvents()
    async with anyio.create_task_group() as tg:
        await tg.start(partial(disk.monitor, interval=0.05), root, Guard(LIM, hysteresis_bytes=MiB), ev.emit)
        await anyio.to_thread.run_sync(fill, root / "filler")
        hard = await ev.wait_for("disk.hard_limit")
        assert hard["free_bytes"] < LIM.hard_bytes and hard["hard_limit_bytes"] == LIM.hard_bytes
        (root / "filler").unlink()
        ok = await ev.wait_for("disk.ok")
        assert ok["free_bytes"] > LIM.soft_bytes + MiB
        await ev.wait_for("disk.sample")
        tg.cancel_scope.cancel()
    assert ev.levels()[-1] == "disk.ok" and ev.levels().count("disk.hard_limit") == 1


@pytest.mark.anyio
async def test_monitor_sees_a_partial_fill_as_soft(tmpfs: Mount) -> None:
    """Filling to between hard and soft brings disk.soft_limit and no hard limit."""
    root, ev = tmpfs("20m"), DiskEvents()
    async with anyio.create_task_group() as tg:
        await tg.start(partial(disk.monitor, interval=0.05), root, Guard(LIM, hysteresis_bytes=MiB), ev.emit)
        await anyio.to_thread.run_sync(fill, root / "filler", 6 * MiB)
        soft = await ev.wait_for("disk.soft_limit")
        assert LIM.hard_bytes <= soft["free_bytes"] < LIM.soft_bytes
        for _ in range(3):  # a few more ticks: still no change
            await ev.wait_for("disk.sample")
        tg.cancel_scope.cancel()
    assert ev.levels() == ["disk.soft_limit"]


# ---------------------------------------------------------------------------- ballast


def test_ballast_takes_real_blocks_and_gives_them_back(tmpfs: Mount) -> None:
    """ensure() lowers statvfs free by the ballast size; release() restores it and reports the bytes."""
    root = tmpfs("20m")
    before = disk.sample(root).free_bytes
    b = Ballast(root / "ballast", 8 * MiB)
    with capture_logs() as logs:
        assert b.ensure() and b.present
        assert disk.sample(root).free_bytes == before - 8 * MiB
        ino = (root / "ballast").stat().st_ino
        assert b.ensure() and (root / "ballast").stat().st_ino == ino  # already right: no-op
        assert b.release() == 8 * MiB
    assert not b.present and b.release() == 0
    assert disk.sample(root).free_bytes == before
    assert [e["event"] for e in logs] == ["disk.ballast_created", "disk.ballast_released"]


def test_ballast_takes_real_blocks_on_ext4(loop_ext4: Mount) -> None:
    """On ext4, fallocate'd ballast blocks are really taken and really returned."""
    root = loop_ext4(64)
    before = disk.sample(root).free_bytes
    b = Ballast(root / "ballast", 16 * MiB)
    assert b.ensure()
    taken = before - disk.sample(root).free_bytes
    assert 16 * MiB <= taken <= 16 * MiB + MiB  # plus extent metadata
    b.release()
    os.sync()
    assert disk.sample(root).free_bytes >= before - 64 * 1024


def test_ballast_that_does_not_fit_returns_false(tmpfs: Mount) -> None:
    """On a volume too small for it, ensure() returns False, logs, raises nothing, leaves nothing."""
    root = tmpfs("4m")
    before = disk.sample(root).free_bytes
    with capture_logs() as logs:
        assert Ballast(root / "ballast", 8 * MiB).ensure() is False
    assert [e["event"] for e in logs] == ["disk.ballast_failed"]
    assert list(root.iterdir()) == [] and disk.sample(root).free_bytes == before


def test_ballast_with_the_wrong_size_is_remade(tmpfs: Mount) -> None:
    """A leftover ballast of another size is replaced by one of the configured size."""
    root = tmpfs("20m")
    (root / "ballast").write_bytes(b"\0" * MiB)
    assert Ballast(root / "ballast", 2 * MiB).ensure()
    assert (root / "ballast").stat().st_size == 2 * MiB


def test_write_that_hit_enospc_succeeds_after_release(tmpfs: Mount) -> None:
    """The point of the ballast: after ENOSPC, releasing it lets the final write land."""
    root = tmpfs("20m")
    b = Ballast(root / "ballast", 8 * MiB)
    assert b.ensure()
    with pytest.raises(OSError) as caught, open(root / "filler", "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * MiB)
    assert is_enospc(caught.value)
    assert b.release() == 8 * MiB
    (root / "state-final").write_bytes(b"\1" * (4 * MiB))
    assert (root / "state-final").stat().st_size == 4 * MiB


# ---------------------------------------------------------------------------- is_enospc, for real


def test_is_enospc_on_a_real_full_tmpfs(tmpfs: Mount) -> None:
    """Writing past the end of a real tmpfs raises an OSError that is_enospc recognises."""
    root = tmpfs("1m")
    with pytest.raises(OSError) as caught:
        (root / "x").write_bytes(b"\0" * (2 * MiB))
    assert caught.value.errno == errno.ENOSPC and is_enospc(caught.value)


def test_is_enospc_is_false_for_a_real_eacces(tmpfs: Mount) -> None:
    """A real EACCES (no execute permission on the dir, dropped privileges) is not a full disk."""
    root = tmpfs("1m")
    locked = root / "locked"
    locked.mkdir(mode=0o000)
    pid = os.fork()
    if pid == 0:  # child: drop root so that permissions apply, then report via exit status
        try:
            os.setgid(65534)
            os.setuid(65534)
            (locked / "f").write_text("x")
            os._exit(2)
        except OSError as exc:
            os._exit(0 if exc.errno == errno.EACCES and not is_enospc(exc) else 1)
        except BaseException:
            os._exit(3)
    assert os.waitpid(pid, 0)[1] == 0


# ---------------------------------------------------------------------------- preflight


def test_preflight_refuses_a_missing_root(tmpfs: Mount) -> None:
    """A missing ephemeral root is one problem naming the path."""
    missing = tmpfs("1m") / "ephemeral"
    line = no_problems_but(check(missing), "ephemeral root is missing")
    assert str(missing) in line


def test_preflight_refuses_a_plain_directory_when_a_mount_is_required(tmpfs: Mount) -> None:
    """A plain directory is refused with require_mount, and accepted without it."""
    plain = tmpfs("4m") / "ephemeral"
    plain.mkdir()
    line = no_problems_but(check(plain), "ephemeral root is not a mount point")
    assert str(plain) in line and "require_mount" in line
    assert check(plain, require_mount=False) == []


def test_preflight_refuses_a_repo_on_the_same_filesystem(tmpfs: Mount) -> None:
    """A repo on the volume's own filesystem is refused while forbid_same_fs is on."""
    root = tmpfs("4m")
    (root / "repo").mkdir()
    line = no_problems_but(check(root, repo=root / "repo"), "repo and ephemeral root are on the same filesystem")
    assert str(root / "repo") in line
    assert check(root, repo=root / "repo", forbid_same_fs=False) == []


def test_preflight_refuses_a_read_only_volume(tmpfs: Mount) -> None:
    """A volume remounted read-only is one problem."""
    root = tmpfs("4m")
    with read_only(root):
        line = no_problems_but(check(root), "ephemeral root is read-only")
    assert str(root) in line and "remount" in line


def test_preflight_refuses_too_few_bytes(tmpfs: Mount) -> None:
    """Less free space than the next round needs is one problem with both numbers."""
    root = tmpfs("20m")
    line = no_problems_but(check(root, need_bytes=21 * MiB), "not enough free space on the volume")
    assert "20.0 MiB free" in line and "needs 21.0 MiB" in line


def test_preflight_refuses_a_volume_out_of_inodes(tmpfs: Mount) -> None:
    """A tmpfs with nr_inodes=50, filled with empty files, is refused for inodes, not bytes."""
    root = tmpfs("4m", nr_inodes=50)
    with pytest.raises(OSError) as caught:
        for i in range(100):
            (root / f"f{i}").touch()
    assert caught.value.errno == errno.ENOSPC
    line = no_problems_but(check(root, need_bytes=MiB, need_inodes=10), "not enough free inodes on the volume")
    assert "0 inodes free" in line


def test_preflight_refuses_heavy_paths_that_escape_the_volume(tmpfs: Mount, loop_ext4: Mount) -> None:
    """Heavy paths symlinked onto another filesystem are refused, existing or not, with their realpath."""
    root, system_disk = tmpfs("8m"), loop_ext4(16)
    (system_disk / "envs" / "save").mkdir(parents=True)
    (root / "exp").mkdir()
    (root / "exp" / "checkpoints").symlink_to(system_disk / "envs" / "save")
    (root / "exp" / "logs").symlink_to(system_disk / "envs")
    heavy = {
        "save dir": root / "exp" / "checkpoints",
        "logs": root / "exp" / "logs" / "round-000",  # leaf not created yet: its ancestor decides
        "hf export": root / "exp" / "artifacts" / "hf",  # not created yet, really on the volume
        "ray tmp": root / "exp" / "ray",
    }
    problems = check(root, heavy_paths=heavy)
    lines = [p.line() for p in problems]
    assert len(lines) == 2, lines
    assert lines[0].startswith("save dir is not on the volume: ")
    assert f"-> {system_disk / 'envs' / 'save'} is on {system_disk}" in lines[0]
    assert lines[1].startswith("logs is not on the volume: ")
    assert f"-> {system_disk / 'envs' / 'round-000'}" in lines[1]


def test_preflight_reports_every_problem_in_order(tmpfs: Mount) -> None:
    """With several problems, all are returned, in the documented order."""
    vol = tmpfs("4m")
    plain = vol / "ephemeral"
    plain.mkdir()
    whats = [p.what for p in check(plain, repo=vol, need_bytes=5 * MiB, need_inodes=10**9)]
    assert whats == [
        "ephemeral root is not a mount point",
        "repo and ephemeral root are on the same filesystem",
        "not enough free space on the volume",
        "not enough free inodes on the volume",
    ]


def test_preflight_passes_a_good_tmpfs(tmpfs: Mount) -> None:
    """A mounted, writable tmpfs with room, off the repo's filesystem, passes and leaves no probe."""
    root = tmpfs("20m", nr_inodes=1000)
    heavy = {"save dir": root / "exp" / "checkpoints", "cache": root / "cache" / "huggingface"}
    assert check(root, heavy_paths=heavy, need_bytes=10 * MiB, need_inodes=100) == []
    assert list(root.iterdir()) == []


def test_preflight_passes_a_good_ext4_reached_through_a_symlink(loop_ext4: Mount, tmp_path: Path) -> None:
    """A root given as a symlink to a mounted ext4 is judged by its realpath and passes."""
    vol = loop_ext4(32)
    (tmp_path / "ephemeral").symlink_to(vol)
    assert check(tmp_path / "ephemeral", heavy_paths={"logs": tmp_path / "ephemeral" / "logs"}, need_bytes=MiB) == []


def test_df_summary_shows_the_volume_and_the_repo(tmpfs: Mount) -> None:
    """df_summary names the tmpfs source, its size and its mount point beside the repo."""
    root = tmpfs("20m", nr_inodes=1000)
    lines = diskcheck.df_summary({"repo": REPO, "volume": root}).splitlines()
    assert len(lines) == 3
    vol = lines[2].split()
    assert vol[:3] == ["volume", MOUNT_SOURCE, "(tmpfs)"]
    assert vol[3:7] == ["20M", "0", "20M", "0%"]
    assert vol[-1] == str(root)


# ---------------------------------------------------------------------------- reclaim


def test_clear_dir_contents_empties_tmp_but_not_link_targets_or_mounts(tmpfs: Mount) -> None:
    """Clearing exp/tmp frees its bytes, removes links (not targets) and skips a nested mount."""
    root = tmpfs("20m")
    tmp, keep = root / "camp" / "exp" / "tmp", root / "camp" / "exp" / "checkpoints"
    (tmp / "ray" / "session").mkdir(parents=True)
    keep.mkdir()
    (keep / "iter_0000020").write_bytes(b"\1" * MiB)
    (tmp / "a.bin").write_bytes(b"\1" * (2 * MiB))
    (tmp / "ray" / "session" / "b.bin").write_bytes(b"\1" * MiB)
    (tmp / "to-checkpoint").symlink_to(keep / "iter_0000020")
    (tmp / "to-dir").symlink_to(keep)
    free_before = disk.sample(root).free_bytes
    with mount_tmpfs("1m", base=tmp) as nested:
        (nested / "other-fs").write_text("x")
        assert reclaim.reclaimable_tmp(tmp) == 3 * MiB
        assert reclaim.clear_dir_contents(tmp, within=root / "camp") == 3 * MiB
        assert [p.name for p in tmp.iterdir()] == [nested.name]
        assert (nested / "other-fs").exists()
    assert tmp.is_dir() and (keep / "iter_0000020").stat().st_size == MiB
    assert disk.sample(root).free_bytes == free_before + 3 * MiB
