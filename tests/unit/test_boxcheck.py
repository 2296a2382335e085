"""``check``'s lines about the box: /dev/shm on a real tmpfs, the campaign's ports held by real
listening sockets on 127.0.0.1, and where the children's caches land."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.ops.cli import main
from shoprld.daemon.services.processes import proc_start_ticks
from shoprld.daemon.services.boxcheck import box_refusals, cache_lines, port_lines, shm_line
from tests.fsfixtures import loop_ext4_fixture, tmpfs_fixture  # noqa: F401  (fixtures)

GIB = 1024**3
# Holds a listening socket on 127.0.0.1:<argv[1]> (0: any free port), prints its port, then
# waits for stdin to close.
LISTENER = ("import socket, sys\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\n"
            "print(s.getsockname()[1], flush=True)\nsys.stdin.read()\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Holder:
    """A real process (not a thread of the test) listening on a port."""

    def __init__(self, env: dict[str, str] | None = None, port: int = 0, session: bool = False,
                 extra: tuple[str, ...] = (), script: Path | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if k != "SHOPRLD_CHILD"}
        self.proc = subprocess.Popen([sys.executable, *(["-c", LISTENER] if script is None else [str(script)]), str(port), *extra], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**base, **(env or {})},
                                     start_new_session=session)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        h.close()


def write_config(tmp_path: Path, *, ray: int | None = None, gcs: int | None = None, start_head: bool = True,
                 shopsim: int | None = None, train_extra: str = "", storage_extra: str = "") -> Path:
    (tmp_path / "repo").mkdir(exist_ok=True)
    (tmp_path / "eph").mkdir(exist_ok=True)
    train = ""
    if ray is not None:
        # A stand-in argv: only its --port is read here (Ray's GCS port).
        head = [sys.executable, "-c", "pass", "--dashboard-port", str(ray), "--port", str(gcs or free_port())]
        train = (f'launcher = "ray"\nray_address = "http://127.0.0.1:{ray}"\n'
                 f"ray_start_head = {'true' if start_head else 'false'}\nray_head_command = {json.dumps(head)}\n")
    text = f"""
[campaign]
name = "box"
experiment = "exp1"
rounds = 1
steps_per_round = 2
[storage]
repo = "repo"
ephemeral_root = "eph"
{storage_extra}
state_dir = "{tmp_path / 'st'}"
[disk]
require_mount = false
forbid_same_fs = false
[wandb]
enabled = false
[gpus]
probe = "none"
[shopsim]
command = ["true"]
url = "http://127.0.0.1:{shopsim or free_port()}"
[val]
server_command = ["true"]
url = "http://127.0.0.1:{free_port()}"
command = ["true"]
[gate]
command = ["true"]
[train]
command = ["true"]
{train}
{train_extra}
"""
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def load(path: Path) -> tuple[Config, Layout]:
    cfg = load_config(path)
    return cfg, Layout.from_config(cfg, environ={})


# -- /dev/shm -----------------------------------------------------------------------------------
def test_shm_of_dockers_64m_default_warns_with_the_fix(tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    """A 64 MiB tmpfs against Ray's 30 % of 8 GiB is a warning that names the need and --shm-size."""
    shm = tmpfs("64m")
    cfg, _ = load(write_config(tmp_path))
    line = shm_line(cfg, shm, memory=8 * GIB)
    assert line.level == "warning"
    assert "64.0 MiB" in line.text and "2.4 GiB" in line.text  # 30 % of 8 GiB
    assert "--shm-size=3g" in line.text and "mount -o remount,size=3G" in line.text


def test_shm_large_enough_is_ok(tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    """The same 64 MiB tmpfs is enough for 30 % of 100 MiB of memory."""
    shm = tmpfs("64m")
    cfg, _ = load(write_config(tmp_path))
    line = shm_line(cfg, shm, memory=100 * 1024**2)
    assert line.level == "ok" and line.text.endswith(": ok")


def test_shm_need_follows_the_recipes_object_store_memory(tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    """`ray start --object-store-memory` in the recipe is the need, whatever the memory."""
    shm = tmpfs("64m")
    extra = f'ray_head_command = ["{sys.executable}", "--head", "--object-store-memory", "32MiB"]\n'
    cfg, _ = load(write_config(tmp_path, train_extra=extra))
    line = shm_line(cfg, shm, memory=512 * GIB)
    assert line.level == "ok" and "32.0 MiB" in line.text and "--object-store-memory" in line.text


# -- ports --------------------------------------------------------------------------------------
def test_a_foreign_ray_head_on_our_port_is_refused_by_check_and_run(tmp_path: Path, holders: list[Holder],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Something not ours on the dashboard port, with no head record: a refusal naming its pid and
    command; `check` and `run` exit 3 with that line, and run writes no state."""
    h = Holder()
    holders.append(h)
    path = write_config(tmp_path, ray=h.port)
    cfg, layout = load(path)
    refusals = box_refusals(cfg, layout)
    assert len(refusals) == 1
    assert f"port {h.port} Ray dashboard" in refusals[0] and f"pid {h.proc.pid} (" in refusals[0]
    assert "no record of a Ray head of ours" in refusals[0] and "train.ray_start_head = false" in refusals[0]
    assert main(["check", "-c", str(path)]) == 3
    out = capsys.readouterr()
    assert "NOT READY" in out.err and f"REFUSED: port {h.port} Ray dashboard" in out.out
    assert main(["run", "-c", str(path)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no record of a Ray head of ours" in err and "Traceback" not in err
    assert not (tmp_path / "st").exists()


def test_a_key_in_a_foreign_command_line_is_masked(tmp_path: Path, holders: list[Holder],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A foreign listener whose argv quotes a .env key: check and run name it with the key masked."""
    canary = "canary-bx-SECRET"
    short = Path(tempfile.mkdtemp(prefix="bx", dir="/tmp"))  # the whole argv within the 120 characters shown
    try:
        (short / "l.py").write_text(LISTENER)
        h = Holder(extra=(f"--token={canary}",), script=short / "l.py")
        holders.append(h)
        path = write_config(tmp_path, ray=h.port)
        (tmp_path / "repo" / ".env").write_text(f"WANDB_API_KEY={canary}\n")
        assert main(["check", "-c", str(path)]) == 3
        assert main(["run", "-c", str(path)]) == 3
    finally:
        shutil.rmtree(short)
    out = capsys.readouterr()
    shown = re.findall(r"--token=(\S+)\)", out.out + out.err)
    assert len(shown) == 4  # check: the box line, NOT READY, its stderr line; run: its stderr line
    assert canary not in out.out + out.err


def test_the_gcs_port_from_the_head_command_is_checked_too(tmp_path: Path, holders: list[Holder]) -> None:
    """A foreign listener on `--port` of ray_head_command (Ray's GCS, 6379 by default) is refused."""
    h = Holder()
    holders.append(h)
    cfg, layout = load(write_config(tmp_path, ray=free_port(), gcs=h.port))
    lines = port_lines(cfg, layout)
    gcs = [ln for ln in lines if f"port {h.port} " in ln.text]
    assert [ln.level for ln in gcs] == ["refused"] and "Ray GCS" in gcs[0].text


def test_a_listener_of_ours_is_ok(tmp_path: Path, holders: list[Holder]) -> None:
    """A process carrying this campaign's SHOPRLD_CHILD tag on the dashboard port is ours: ok."""
    path = write_config(tmp_path, ray=free_port())
    cfg, layout = load(path)
    h = Holder(env={"SHOPRLD_CHILD": f"{layout.state_dir}|ray_head"})
    holders.append(h)
    cfg, layout = load(write_config(tmp_path, ray=h.port))
    lines = [ln for ln in port_lines(cfg, layout) if f"port {h.port} " in ln.text]
    assert [ln.level for ln in lines] == ["ok"] and "in use by ours" in lines[0].text
    assert box_refusals(cfg, layout) == []


@pytest.mark.parametrize("recorded", ["right", "reused pid"])
def test_a_head_in_our_recorded_session_is_ours(tmp_path: Path, holders: list[Holder], recorded: str) -> None:
    """A listener in the session shoprld-head.json records (leader alive, same start time) is our
    Ray head: ok. The same record with another start time (a reused pid) is not ours: refused."""
    h = Holder(session=True)
    holders.append(h)
    cfg, layout = load(write_config(tmp_path, ray=h.port))
    ticks = proc_start_ticks(h.proc.pid)
    assert ticks is not None
    layout.ray_tmp.mkdir(parents=True)
    (layout.ray_tmp / "shoprld-head.json").write_text(json.dumps(
        {"pid": h.proc.pid, "sid": h.proc.pid, "start_ticks": ticks + (0 if recorded == "right" else 1)}))
    (line,) = [ln for ln in port_lines(cfg, layout) if f"port {h.port} " in ln.text]
    if recorded == "right":
        assert line.level == "ok" and f"pid {h.proc.pid} ray" in line.text
    else:
        assert line.level == "refused"


def test_a_head_the_user_runs_is_expected(tmp_path: Path, holders: list[Holder]) -> None:
    """With train.ray_start_head = false the head on train.ray_address is the user's: ok, named."""
    h = Holder()
    holders.append(h)
    cfg, layout = load(write_config(tmp_path, ray=h.port, start_head=False))
    lines = [ln for ln in port_lines(cfg, layout) if f"port {h.port} " in ln.text]
    assert [ln.level for ln in lines] == ["ok"] and "the server you run" in lines[0].text
    assert box_refusals(cfg, layout) == []


def test_a_foreign_process_on_the_shopsim_port_is_a_warning_that_names_it(tmp_path: Path, holders: list[Holder]) -> None:
    """ShopSim's port taken by a process not ours: a warning with its pid and command; a free port is ok."""
    h = Holder()
    holders.append(h)
    cfg, layout = load(write_config(tmp_path, shopsim=h.port))
    (line,) = [ln for ln in port_lines(cfg, layout) if "ShopSim" in ln.text]
    assert line.level == "warning" and f"pid {h.proc.pid} (" in line.text and "shopsim.url" in line.text
    assert box_refusals(cfg, layout) == []
    h.close()
    holders.remove(h)
    (line,) = [ln for ln in port_lines(cfg, layout) if "ShopSim" in ln.text]
    assert line.level == "ok" and line.text.endswith(": free")


# -- caches -------------------------------------------------------------------------------------
def test_every_cache_goes_to_the_data_disk_by_default(tmp_path: Path) -> None:
    """FlashInfer, inductor, Triton, CUDA's JIT cache and the rest land under the cache root."""
    cfg, layout = load(write_config(tmp_path))
    env = layout.child_env(cfg, base={"HOME": str(tmp_path / "home")})
    for key in ("FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH",
                "HF_HOME", "TORCH_HOME", "XDG_CACHE_HOME"):
        assert Path(env[key]).is_relative_to(layout.cache_root), key


def test_a_cache_the_user_set_is_kept(tmp_path: Path) -> None:
    """$TRITON_CACHE_DIR in the daemon's environment reaches the children as set; HF_HOME's
    sub-caches follow a user's HF_HOME; storage.blank_cache reuses nothing."""
    cfg, layout = load(write_config(tmp_path))
    base = {"TRITON_CACHE_DIR": str(tmp_path / "mine" / "triton"), "HF_HOME": str(tmp_path / "hf")}
    env = layout.child_env(cfg, base=base)
    assert env["TRITON_CACHE_DIR"] == base["TRITON_CACHE_DIR"]
    assert env["HF_HUB_CACHE"] == str(tmp_path / "hf" / "hub") == env["TRANSFORMERS_CACHE"]
    blank, blank_layout = load(write_config(tmp_path, storage_extra="blank_cache = true"))
    env = blank_layout.child_env(blank, base=base)
    assert Path(env["TRITON_CACHE_DIR"]).is_relative_to(blank_layout.cache_root)


def test_an_existing_home_cache_is_reused_only_on_the_data_disk(tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    """~/.triton/cache on the data disk is reused; the same dir on another filesystem is not."""
    data = tmpfs("8m")
    cfg, layout = load(write_config(tmp_path))
    on_data = Layout.from_config(cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"ephemeral_root": data})}),
                                 environ={})
    for home in (data / "home", tmp_path / "home"):
        (home / ".triton" / "cache").mkdir(parents=True)
    reused = {p.key: p for p in on_data.cache_places(cfg, {"HOME": str(data / "home")})}
    assert reused["TRITON_CACHE_DIR"].path == data / "home" / ".triton" / "cache"
    assert reused["TRITON_CACHE_DIR"].source == "your existing ~/.triton/cache"
    other = {p.key: p for p in on_data.cache_places(cfg, {"HOME": str(tmp_path / "home")})}
    assert other["TRITON_CACHE_DIR"].path == on_data.cache_root / "triton"


def test_cache_lines_warn_about_a_cache_off_the_data_disk(tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    """With the data disk on a tmpfs, every shoprld cache is on it (ok, with the free space);
    a user's $TRITON_CACHE_DIR elsewhere is a warning that names it."""
    data = tmpfs("8m")
    cfg, _ = load(write_config(tmp_path))
    cfg = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"ephemeral_root": data})})
    layout = Layout.from_config(cfg, environ={})
    lines = cache_lines(cfg, layout, base={})
    assert all(ln.level == "ok" for ln in lines)
    assert "every cache is on the data disk" in lines[-1].text
    assert any("FLASHINFER_WORKSPACE_BASE" in ln.text and "data disk, 8.0 MiB free" in ln.text for ln in lines)
    lines = cache_lines(cfg, layout, base={"TRITON_CACHE_DIR": str(tmp_path / "triton")})
    assert lines[-1].level == "warning" and "TRITON_CACHE_DIR" in lines[-1].text
    assert "1 cache(s) off the data disk" in lines[-1].text
