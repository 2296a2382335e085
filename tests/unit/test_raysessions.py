"""Ray's session dirs of a head of ours: on the experiment's volume, pruned, counted by the disk
forecast; and the short /tmp links a campaign removes when it ends or is cleaned (issue 27).

The head is the Jobs API stand-in wrapped in a shell that makes a session dir under
``$RAY_TMPDIR/ray`` the way Ray does (``session_<date>_<pid>``, ``session_latest``), so the
real launcher's start/stop path runs against real dirs in seconds.
"""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import anyio
import pytest

from shoprld.daemon.foundation.storage import raysessions
from shoprld.daemon.foundation.storage.diskbudget import floor_unit
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout, short_link
from shoprld.daemon.ops.clean import clean
from shoprld.daemon.ops.demo import create_tree
from shoprld.daemon.foundation.storage.preflight import budget_for, need_line
from shoprld.daemon.services.ray import SESSION_LOGS_LINK, ray_tmpdir, session_pids
from tests.conftest import remove_links_into
from tests.unit.test_raylauncher import PRINT_ROLLOUTS, PY, STANDIN, free_port, setup, start_trainer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_session(ray_tmp: Path, stamp: str, pid: int = 0, *, latest: bool = False, size: int = 10) -> Path:
    s = raysessions.sessions_root(ray_tmp) / f"session_2026-12-05_{stamp}_123456_{pid}"
    (s / "logs").mkdir(parents=True)
    (s / "logs" / "raylet.out").write_bytes(b"x" * size)
    if latest:
        link = raysessions.sessions_root(ray_tmp) / "session_latest"
        link.unlink(missing_ok=True)
        link.symlink_to(s.name)
    return s


def test_prune_keeps_the_newest_and_never_the_live_session(tmp_path: Path) -> None:
    """Oldest go first; session_latest's target and a session whose head pid runs stay."""
    old = [make_session(tmp_path, f"10-00-0{i}") for i in range(4)]
    running = make_session(tmp_path, "09-00-00", pid=os.getpid())  # oldest, but its head runs
    live = make_session(tmp_path, "08-00-00", latest=True)  # older still, but session_latest
    (raysessions.sessions_root(tmp_path) / "not-a-session").mkdir()
    assert raysessions.live_session(tmp_path) == live
    removed = raysessions.prune(tmp_path, keep=2)
    assert sorted(removed) == sorted(old[:2])
    assert [p.name for p in raysessions.sessions(tmp_path)] == [live.name, running.name, old[2].name, old[3].name]
    assert (raysessions.sessions_root(tmp_path) / "not-a-session").is_dir()
    assert raysessions.prune(tmp_path, keep=2) == []  # nothing else of ours to take


def test_the_allowance_scales_with_the_checkpoint_and_grows_to_what_is_measured(tmp_path: Path) -> None:
    """1/64 of a checkpoint for the kept sessions (a MiB checkpoint on the tests' tmpfs, 53 GiB on
    the recipe), or 2x the largest session on the volume; what is there is not needed again."""
    gib, mib = 2**30, 2**20
    assert raysessions.allowance(tmp_path, 53 * gib).need_bytes == 53 * gib // 64  # 848 MiB
    assert raysessions.allowance(tmp_path, 8 * mib).need_bytes == 128 * 1024
    make_session(tmp_path, "10-00-00", size=3 * mib)
    make_session(tmp_path, "10-00-01", size=mib, latest=True)
    a = raysessions.allowance(tmp_path, 8 * mib)
    assert a.per_session_bytes == 3 * mib and a.present_bytes == 4 * mib and a.need_bytes == 2 * mib


def test_the_disk_forecast_and_checks_line_count_the_ray_session_logs(tmp_path: Path) -> None:
    """A head of ours writes its sessions on the volume: the need and `check`'s line count them;
    a local trainer or a cluster elsewhere adds nothing."""
    cfg, layout, _ = setup(tmp_path, "http://127.0.0.1:9", ray_start_head=True, ray_head_command=["true"])
    layout.ensure(cfg)
    with_ray = budget_for(cfg, layout)
    elsewhere = cfg.model_copy(update={"train": cfg.train.model_copy(update={"ray_start_head": False})})
    without = budget_for(elsewhere, layout)
    allowance = floor_unit(with_ray.forecast.checkpoint_bytes)
    assert with_ray.forecast.ray_logs_bytes == allowance and without.forecast.ray_logs_bytes == 0
    assert with_ray.need_bytes == without.need_bytes + allowance
    assert " Ray session logs " in need_line(cfg, with_ray)
    assert "Ray session logs" not in need_line(elsewhere, without)


def _session_making_head(tmp_path: Path, port: int) -> list[str]:
    """The stand-in head, after making a session dir under $RAY_TMPDIR/ray as Ray does."""
    script = ('set -e; root="$RAY_TMPDIR/ray"; s="session_$(date -u +%Y-%m-%d_%H-%M-%S_%6N)_$$"; '
              'mkdir -p "$root/$s/logs"; echo head > "$root/$s/logs/raylet.out"; '
              'ln -sfn "$root/$s" "$root/session_latest"; exec "$0" "$@"')  # absolute, as Ray's
    return ["/bin/sh", "-c", script, PY, str(STANDIN), "--port", str(port), "--logs-dir", str(tmp_path / "hl")]


@pytest.mark.anyio
async def test_each_head_of_ours_leaves_at_most_two_sessions_and_its_logs_sit_with_the_stage_logs(
        tmp_path: Path) -> None:
    """Three TRAINs, each with its own head: the sessions land in the experiment's ray dir (its
    logs linked from logs/ray-session), the older ones are pruned at the next start and at each
    stop, and the live session is never taken from under its head."""
    port = free_port()
    cfg, layout, launcher = setup(tmp_path, f"http://127.0.0.1:{port}", ray_start_head=True,
                                  ray_head_command=_session_making_head(tmp_path, port))
    stale = [make_session(layout.ray_tmp, f"00-00-0{i}") for i in range(3)]
    sids: list[int] = []
    try:
        with anyio.fail_after(90):
            for r in range(3):
                child = await start_trainer(launcher, layout, cfg, PRINT_ROLLOUTS, round_index=r)
                assert await child.wait() == 0
                assert launcher.head is not None
                sids.append(launcher.head.pid)
                live = raysessions.live_session(layout.ray_tmp)
                assert live is not None and live.name.endswith(f"_{launcher.head.pid}") and live.is_dir()
                names = [s.name for s in raysessions.sessions(layout.ray_tmp)]
                assert len(names) <= 2 and names[-1] == live.name
                logs = layout.logs / SESSION_LOGS_LINK
                assert logs.is_symlink() and (logs / "raylet.out").read_text() == "head\n"
                assert logs.resolve() == (live / "logs").resolve()
                assert layout.exp_dir.resolve() in logs.resolve().parents
                await launcher.idle()  # TRAIN's job is done: the head goes, its session stays
                assert [s.name for s in raysessions.sessions(layout.ray_tmp)][-1] == live.name
        assert not any(s.exists() for s in stale)
        assert len(raysessions.sessions(layout.ray_tmp)) == 2
        # session_latest is absolute through the short /tmp link; logs/ray-session survives it.
        assert layout.remove_short_links()
        assert not (raysessions.sessions_root(layout.ray_tmp) / "session_latest").exists()  # it dangles now
        assert (layout.logs / SESSION_LOGS_LINK / "raylet.out").read_text() == "head\n"
    finally:
        for sid in sids:
            for pid in session_pids(sid):
                os.kill(pid, signal.SIGKILL)
        await launcher.client.aclose()
        layout.remove_short_links()


def test_a_campaign_removes_only_its_own_short_links(tmp_path: Path) -> None:
    """remove_short_links takes the tmp and ray links that point at this experiment, and leaves
    one of the same name that points elsewhere (not ours)."""
    cfg, layout, _ = setup(tmp_path / ("deep-" + "d" * 60), "http://127.0.0.1:9", ray_start_head=True)
    layout.ensure(cfg)
    tmp_link, ray_link = short_link(layout.tmp, "tmp"), short_link(layout.ray_tmp, "ray")
    try:
        assert tmp_link.is_symlink() and ray_link.is_symlink() and ray_tmpdir(layout) == ray_link
        assert sorted(layout.remove_short_links()) == sorted([tmp_link, ray_link])
        assert not tmp_link.is_symlink() and not ray_link.is_symlink()
        ray_link.symlink_to(tmp_path, target_is_directory=True)  # same name, someone else's target
        assert layout.remove_short_links() == [] and ray_link.is_symlink()
    finally:
        for link in (tmp_link, ray_link):
            if link.is_symlink():
                link.unlink()


def test_the_suites_hook_removes_the_links_into_its_temp_dir_only(tmp_path: Path) -> None:
    """tests/conftest.py's session-end sweep: links into this session's temp dir go (dangling or
    not), a link elsewhere and a plain file of the same pattern stay."""
    fake_tmp = tmp_path / "tmp"
    fake_tmp.mkdir()
    base = tmp_path / "basetemp"
    (fake_tmp / "shoprld-tmp-aaaa").symlink_to(base / "t0" / "exp" / "tmp")  # dangling, ours
    (fake_tmp / "shoprld-ray-bbbb").symlink_to(base / "t1" / "exp" / "ray")
    (fake_tmp / "shoprld-ray-cccc").symlink_to(tmp_path / "other" / "ray")  # another session's
    (fake_tmp / "shoprld-tmp-dddd").write_text("not a link")
    removed = remove_links_into(base, fake_tmp)
    assert sorted(p.name for p in removed) == ["shoprld-ray-bbbb", "shoprld-tmp-aaaa"]
    assert sorted(p.name for p in fake_tmp.iterdir()) == ["shoprld-ray-cccc", "shoprld-tmp-dddd"]


def test_clean_removes_the_campaigns_short_links(tmp_path: Path) -> None:
    """`shoprld clean` (no daemon runs) removes the experiment's short links."""
    campaign = create_tree(tmp_path, fast=True, rounds=1)
    cfg = load_config(campaign)
    layout = Layout.from_config(cfg)
    layout.ensure(cfg)
    links = [short_link(layout.tmp, "tmp"), short_link(layout.ray_tmp, "ray")]
    try:
        assert all(p.is_symlink() for p in links)
        out = io.StringIO()
        assert clean(campaign, out=out) == 0
        assert not any(p.is_symlink() for p in links), out.getvalue()
        assert f"removed the short link {links[0]}" in out.getvalue()
    finally:
        for p in links:
            if p.is_symlink():
                p.unlink()
