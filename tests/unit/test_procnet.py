"""Reading who listens on a TCP port from /proc/net/tcp{,6} and /proc/<pid>/fd."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

from hypothesis import given
from hypothesis import strategies as st

from shoprld.daemon.foundation.system.procnet import TCP_LISTEN, cmdline, listeners, parse_tcp_table, socket_owners

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _kernel_hex(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as the kernel prints it: each 32-bit word in little-endian order."""
    raw = addr.packed
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words)


def _row(i: int, addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, state: int, inode: int) -> str:
    remote = "0" * len(_kernel_hex(addr)) + ":0000"
    return (f"{i:4d}: {_kernel_hex(addr)}:{port:04X} {remote} {state:02X} 00000000:00000000 00:00000000 "
            f"00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


addresses = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))
rows = st.lists(st.tuples(addresses, st.integers(1, 65535), st.integers(1, 0x0C), st.integers(0, 2**40)),
                max_size=20)


@given(rows)
def test_parse_returns_exactly_the_listening_rows(table: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, int, int]]) -> None:
    """Every LISTEN row comes back with its address, port and inode; no other row does."""
    text = HEADER + "".join(_row(i, a, p, s, n) for i, (a, p, s, n) in enumerate(table))
    got = parse_tcp_table(text)
    want = [(str(a), p, n) for a, p, s, n in table if s == TCP_LISTEN]
    assert [(lst.address, lst.port, lst.inode) for lst in got] == want


@given(st.text(max_size=400))
def test_parse_never_raises_on_garbage(text: str) -> None:
    """A truncated or garbled table gives rows it can read and skips the rest, never an exception."""
    for lst in parse_tcp_table(text):
        assert 0 < lst.port < 65536


def test_a_real_listening_socket_is_found_with_its_owner() -> None:
    """A socket listening on 127.0.0.1 is in /proc/net/tcp, and its inode leads to this pid."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        found = [lst for lst in listeners() if lst.port == port]
        assert [lst.address for lst in found] == ["127.0.0.1"]
        owners = socket_owners([found[0].inode])
        assert owners[found[0].inode] == [os.getpid()]
    assert not [lst for lst in listeners() if lst.port == port]  # closed: gone from the table


def test_cmdline_is_one_printable_line() -> None:
    """The owner's command line is shown space-separated, and a pid that is gone is '?'."""
    assert "python" in cmdline(os.getpid()).lower() or "pytest" in cmdline(os.getpid())
    assert cmdline(2**22 + 12345) == "?"
