"""Who listens on a TCP port, from the kernel's tables: ``/proc/net/tcp``, ``/proc/net/tcp6``
and the ``socket:[inode]`` links under ``/proc/<pid>/fd``.

``shoprld check`` names the process on a port it needs (the Ray dashboard, Ray's GCS, the val
server, ShopSim) before a stage trips over it. The tables are read, never a program's output
(``ss``/``lsof`` may be missing in a container). A row of ``/proc/net/tcp`` looks like::

      sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
       0: 0100007F:2049 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 ...

addresses are hex in the kernel's byte order (IPv4: one little-endian 32-bit word; IPv6: four
of them), the port is big-endian hex, ``st`` 0A is LISTEN. A socket's owner is visible only
when its ``/proc/<pid>/fd`` can be read (same PID namespace, same user or root); otherwise the
port is just "in use".
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shoprld.daemon.foundation.system.proctable import pids

TCP_LISTEN = 0x0A
TABLES = ("tcp", "tcp6")


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its local address, port and socket inode."""

    address: str
    port: int
    inode: int


def _address(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    if len(raw) not in (4, 16):
        raise ValueError(f"address of {len(raw)} bytes")
    # Each 32-bit word is in host (little-endian on x86/arm64) order.
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(swapped))


def parse_tcp_table(text: str) -> list[Listener]:
    """The LISTEN rows of one ``/proc/net/tcp{,6}`` text. The header and any malformed row are
    skipped (a table read while it changes may end mid-row); never raises."""
    out: list[Listener] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            local, state, inode = fields[1], int(fields[3], 16), int(fields[9])
            host, _, port_hex = local.rpartition(":")
            port = int(port_hex, 16)
            if state != TCP_LISTEN or not 0 < port < 65536 or inode < 0:
                continue
            out.append(Listener(_address(host), port, inode))
        except ValueError:
            continue
    return out


def listeners(proc: Path = Path("/proc")) -> list[Listener]:
    """Every listening TCP socket of this network namespace (IPv4 and IPv6)."""
    out: list[Listener] = []
    for table in TABLES:
        try:
            out.extend(parse_tcp_table((proc / "net" / table).read_text()))
        except OSError:
            continue
    return out


def _socket_inodes(pid_dir: Path) -> Iterator[int]:
    try:
        fds = os.listdir(pid_dir / "fd")
    except OSError:
        return
    for fd in fds:
        try:
            target = os.readlink(pid_dir / "fd" / fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            try:
                yield int(target[8:-1])
            except ValueError:
                continue


def socket_owners(inodes: Iterable[int], proc: Path = Path("/proc")) -> dict[int, list[int]]:
    """inode -> the pids (ascending) that hold it open, for the inodes asked for. A socket a
    forked child inherited has several holders; one we cannot see has none."""
    want = set(inodes)
    found: dict[int, list[int]] = {}
    if not want:
        return found
    for pid in pids(proc):
        for inode in _socket_inodes(proc / str(pid)):
            if inode in want:
                found.setdefault(inode, [])
                if pid not in found[inode]:
                    found[inode].append(pid)
    return found


def cmdline(pid: int, proc: Path = Path("/proc"), limit: int = 120) -> str:
    """``/proc/<pid>/cmdline`` as one printable line (at most ``limit`` characters), else its
    ``comm``, else "?"."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
        text = " ".join(p.decode(errors="replace") for p in raw.split(b"\0") if p)
        if not text:
            text = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"
    text = "".join(c if c.isprintable() else "?" for c in text) or "?"
    return text if len(text) <= limit else text[:limit - 3] + "..."
