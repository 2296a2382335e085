"""The rest of the box, one ``check`` line each: ``/dev/shm``, the ports the campaign needs, and
where the children's caches land against the system disk's free space.

A Docker container (the user's AutoDL box) differs from the bare metal the daemon was first
built on in three quiet ways that each end a night hours in:

- ``/dev/shm`` is Docker's 64 MB by default. Ray sizes its object store at 30 % of memory
  (``DEFAULT_OBJECT_STORE_MEMORY_PROPORTION`` in ray/_private/ray_constants.py, at most 200 GB)
  and moves it to /tmp with a warning when /dev/shm is smaller (ray/_private/services.py,
  "The object store is using /tmp instead of /dev/shm ... --shm-size"); NCCL's intra-node
  transport puts its segments there too and fails with "No space left on device".
- A port the campaign needs is taken. ``RayLauncher.ensure_head`` reuses any head that answers
  at ``train.ray_address``; a head that is not ours (no ``shoprld-head.json`` record) would then
  run our trainer in someone else's cluster, with their RAY_TMPDIR and their lifetime. So that
  one is refused (exit 3); the others are named, with their pid and command when visible.
- The tools' caches default to $HOME and /tmp, the ~30 GB system disk. The layout
  (daemon/foundation/records/layout.py, :meth:`Layout.cache_places`) decides where each goes; this
  module only reports it with the free space there.

Every function takes its paths as parameters so tests use a small real tmpfs and ephemeral
ports; :func:`box_lines` is what ``check`` prints, :func:`box_refusals` what ``run`` refuses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.config.configvalues import parse_size
from shoprld.daemon.foundation.system.units import human_bytes
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.system.procnet import cmdline, listeners, socket_owners
from shoprld.daemon.services.gpus import Owners, ray_head_sid

Level = Literal["ok", "warning", "refused"]

# Ray's defaults (ray/_private/ray_constants.py): the object store takes this share of the
# node's memory, at most this many bytes, unless `ray start --object-store-memory` says otherwise.
RAY_OBJECT_STORE_PROPORTION = 0.3
RAY_OBJECT_STORE_MAX_BYTES = 200 * 10**9
RAY_GCS_PORT = 6379
RAY_DASHBOARD_PORT = 8265
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""}


@dataclass(frozen=True)
class BoxLine:
    """One verdict of ``check``: ok, a warning, or a refusal (``run`` refuses it too, exit 3)."""

    level: Level
    text: str

    def shown(self) -> str:
        return self.text if self.level == "ok" else f"{self.level.upper()}: {self.text}"


# -- /dev/shm -----------------------------------------------------------------------------------
def memory_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory this container may use: MemTotal, lowered to the cgroup's limit (a container's
    /proc/meminfo shows the host's). None when unreadable."""
    total: int | None = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file in (cgroup / "memory.max", cgroup / "memory" / "memory.limit_in_bytes"):
        try:
            raw = limit_file.read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and (total is None or int(raw) < total):
            total = int(raw)
        break
    return total


def _object_store_flag(argv: Sequence[str]) -> int | None:
    for i, arg in enumerate(argv):
        value = None
        if arg == "--object-store-memory" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--object-store-memory="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return parse_size(value)
            except (ValueError, TypeError):
                return None
    return None


def shm_line(cfg: Config, shm: Path = Path("/dev/shm"), memory: int | None = None) -> BoxLine:
    """``/dev/shm``'s size against what Ray's object store will want (the recipe's
    ``--object-store-memory`` when it sets one, else 30 % of memory, at most 200 GB)."""
    try:
        st = os.statvfs(shm)
    except OSError as exc:
        return BoxLine("warning", f"/dev/shm: {shm} cannot be read ({exc.strerror or exc}); Ray's object store and "
                                  "NCCL need it (fix: run the container with --shm-size, e.g. docker run --shm-size=64g)")
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    flag = _object_store_flag(cfg.train.ray_head_command)
    if flag is not None:
        want, why = flag, "--object-store-memory in train.ray_head_command"
    else:
        mem = memory if memory is not None else memory_bytes()
        if mem is None:
            return BoxLine("ok", f"/dev/shm: {human_bytes(size)} ({human_bytes(free)} free); memory unknown, "
                                 "Ray's object store need not judged")
        want = min(int(mem * RAY_OBJECT_STORE_PROPORTION), RAY_OBJECT_STORE_MAX_BYTES)
        why = f"Ray's default object store, 30 % of {human_bytes(mem)} memory"
    head = f"/dev/shm ({shm}): {human_bytes(size)}, {human_bytes(free)} free; needs >= {human_bytes(want)} ({why})"
    if free >= want:
        return BoxLine("ok", f"{head}: ok")
    gib = max(1, -(-want // 1024**3))
    return BoxLine("warning", (
        f"{head}: too small, Ray moves its object store to /tmp (slow) and NCCL's shared-memory segments "
        f"can fail with 'No space left on device' (fix: docker run --shm-size={gib}g; in a running container "
        f"as root: mount -o remount,size={gib}G {shm}; or cap Ray below it with "
        f"--object-store-memory in train.ray_head_command)"))


# -- ports --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PortNeed:
    """A port the campaign uses: what it is for, and whether shoprld starts what listens there."""

    port: int
    what: str             # "Ray dashboard (train.ray_address)"
    key: str              # the config key that names the port: "train.ray_address"
    ours_to_start: bool   # False: the user runs it, an occupant is expected
    ray: bool = False     # a Ray head's port: a foreign occupant is refused


def _local_port(url: str) -> int | None:
    parts = urlsplit(url)
    if (parts.hostname or "") not in _LOCAL_HOSTS:
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


def _gcs_port(argv: Sequence[str]) -> int:
    for i, arg in enumerate(argv):
        m = re.fullmatch(r"--port=(\d+)", arg)
        if m:
            return int(m.group(1))
        if arg == "--port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
    return RAY_GCS_PORT


def port_needs(cfg: Config) -> list[PortNeed]:
    """The local ports this config uses, from the config itself (a test config's ephemeral
    ports are checked as the recipe's 8265/6379/30000/5700 are)."""
    needs: list[PortNeed] = []
    if cfg.train.launcher == "ray":
        port = _local_port(cfg.train.ray_address)
        if port is not None:
            needs.append(PortNeed(port, "Ray dashboard (train.ray_address)", "train.ray_address", cfg.train.ray_start_head,
                                  ray=cfg.train.ray_start_head))
        if cfg.train.ray_start_head:
            needs.append(PortNeed(_gcs_port(cfg.train.ray_head_command), "Ray GCS (train.ray_head_command --port)",
                                  "train.ray_head_command", True, ray=True))
    port = _local_port(cfg.val.url)
    if port is not None and (cfg.val.server_command or cfg.val.reuse_server):
        needs.append(PortNeed(port, "val server (val.url)", "val.url", bool(cfg.val.server_command)))
    port = _local_port(cfg.shopsim.url)
    if port is not None:
        needs.append(PortNeed(port, "ShopSim (shopsim.url)", "shopsim.url", cfg.shopsim.manage))
    unique: dict[int, PortNeed] = {}
    for need in needs:
        unique.setdefault(need.port, need)
    return list(unique.values())


def port_line(need: PortNeed, owners: Owners, *, ray_record: Path, proc: Path = Path("/proc")) -> BoxLine:
    """Who holds ``need.port``: free, ours, expected (the user's server), or not ours."""
    held = [lst for lst in listeners(proc) if lst.port == need.port]
    head = f"port {need.port} {need.what}"
    if not held:
        return BoxLine("ok", f"{head}: free")
    holders = socket_owners((lst.inode for lst in held), proc)
    pids = sorted({pid for lst in held for pid in holders.get(lst.inode, [])})
    roles = {pid: owners.role_of(pid) for pid in pids}
    ours = [pid for pid, role in roles.items() if role]
    if ours:
        return BoxLine("ok", f"{head}: in use by ours ({', '.join(f'pid {p} {roles[p]}' for p in ours)})")
    if not pids and need.ray and owners.ray_sid is not None:
        # The socket's holder is not visible here, but our recorded head is alive.
        return BoxLine("ok", f"{head}: in use, our Ray head (session {owners.ray_sid}) is alive")
    who = "; ".join(f"pid {p} ({cmdline(p, proc)})" for p in pids[:3]) or "a process not visible here"
    if not need.ours_to_start:
        return BoxLine("ok", f"{head}: in use by {who}: the server you run")
    if need.ray:
        return BoxLine("refused", (
            f"{head} is taken by {who}, with no record of a Ray head of ours ({ray_record}): "
            f"shoprld would submit the trainer to that cluster (fix: stop that Ray if it is a leftover, "
            f"shoprld stops only its own; or set train.ray_start_head = false to use it; or give ours free "
            f"ports in train.ray_head_command and train.ray_address)"))
    return BoxLine("warning", (f"{head} is taken by {who}, not ours: ours cannot bind it, and a health "
                               f"check may answer from the wrong server (fix: stop it, or move {need.key} "
                               f"to a free port)"))


def port_lines(cfg: Config, layout: Layout, proc: Path = Path("/proc")) -> list[BoxLine]:
    owners = Owners.of(layout.state_dir, ray_head_sid(layout.ray_tmp))
    record = layout.ray_tmp / "shoprld-head.json"
    return [port_line(need, owners, ray_record=record, proc=proc) for need in port_needs(cfg)]


# -- caches against the system disk -------------------------------------------------------------
def _existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path("/")


def cache_lines(cfg: Config, layout: Layout, base: Mapping[str, str] | None = None,
                system_root: Path = Path("/")) -> list[BoxLine]:
    """One line per cache the children get (where it goes, why, the free space there), then the
    verdict: every cache on the data disk, or which ones land on the system disk."""
    env = os.environ if base is None else base
    try:
        data_dev = layout.ephemeral_root.stat().st_dev
    except OSError:  # preflight refuses a missing root; where the caches land is moot until then
        return [BoxLine("ok", f"caches: not judged, the data disk {layout.ephemeral_root} is missing")]
    try:
        sys_dev = system_root.stat().st_dev
        sys_st = os.statvfs(system_root)
        sys_free = human_bytes(sys_st.f_bavail * sys_st.f_frsize)
    except OSError:
        sys_dev, sys_free = None, "?"
    out: list[BoxLine] = []
    off: list[str] = []
    for place in layout.cache_places(cfg, env):
        where = _existing(place.path)
        try:
            dev = where.stat().st_dev
            st = os.statvfs(where)
            free = human_bytes(st.f_bavail * st.f_frsize)
        except OSError:
            dev, free = None, "?"
        disk = ("data disk" if dev is not None and dev == data_dev else
                "system disk" if dev is not None and dev == sys_dev else "another filesystem")
        out.append(BoxLine("ok", f"cache {place.key} -> {place.path} ({place.source}): {disk}, {free} free"))
        if disk != "data disk":
            off.append(f"{place.key} ({disk})")
    head = f"caches: system disk {system_root} has {sys_free} free"
    if not off:
        out.append(BoxLine("ok", f"{head}; every cache is on the data disk ({layout.ephemeral_root})"))
    else:
        out.append(BoxLine("warning", (
            f"{head}; {len(off)} cache(s) off the data disk: {', '.join(off)}; models and JIT kernels "
            f"(Triton, inductor, FlashInfer) grow by GBs there (fix: unset them, and shoprld puts them under {layout.cache_root}; or "
            f"point them at {layout.ephemeral_root})")))
    return out


# -- what check prints, what run refuses --------------------------------------------------------
def box_lines(cfg: Config, layout: Layout) -> list[BoxLine]:
    """Everything ``check`` prints about the box, in order: /dev/shm, ports, caches."""
    return [shm_line(cfg), *port_lines(cfg, layout), *cache_lines(cfg, layout)]


def box_refusals(cfg: Config, layout: Layout) -> list[str]:
    """The box's reasons not to start, one line each (today: a foreign Ray head on our ports)."""
    return [line.text for line in port_lines(cfg, layout) if line.level == "refused"]
