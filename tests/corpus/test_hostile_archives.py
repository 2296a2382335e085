"""Bundles as untrusted sizes (issue 26, "bounded memory"): ``import-campaign`` reads only the members
it uses, each under a size cap and all under a total cap, streamed; a gzip bomb (a 1.5 GiB member of
zeros in a ~1.5 MB .tar.gz) is refused at its header with bounded RSS; a truncated or corrupt
archive (tar, tar.gz, tar.bz2, tar.xz; a zip is no bundle) is one line, exit 3, nothing written.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoprld.daemon.ops import campaignimport
from shoprld.daemon.ops.campaignexport import BUNDLE_TOP
from shoprld.daemon.ops.cli import main
from tests.corpus.test_hostile_bundles import World, base_members  # noqa: F401  (the fixture)

GiB = 1024**3


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gzip_bomb(path: Path, size: int, name: str = f"{BUNDLE_TOP}/state/journal.jsonl") -> Path:
    """A .tar.gz whose member ``name`` is ``size`` zero bytes, built as concatenated gzip members
    (valid gzip: a reader sees one stream) from one compressed 64 MiB block: fast to make, small."""
    info = tarfile.TarInfo(name)
    info.size = size
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    block = 64 * 1024**2
    zeros = gzip.compress(b"\0" * block, compresslevel=9)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(header))
        for _ in range(size // block):
            fh.write(zeros)
        fh.write(gzip.compress(b"\0" * (size % block)))
        fh.write(gzip.compress(b"\0" * (-size % 512 + 1024)))  # pad + the end-of-archive blocks
    return path


def _import(bundle: Path, world: World, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(world.argv(bundle))
    err = capsys.readouterr().err.strip()
    return rc, err


def _refused(rc: int, err: str, world: World) -> None:
    assert rc == 3, err
    assert err.startswith("shoprld: ") and "\n" not in err and "Traceback" not in err, err
    assert not world.state.exists(), "nothing is written on refusal"


def test_gzip_bomb_refused_at_its_header_with_bounded_rss(tmp_path: Path) -> None:
    """A 1.5 GiB member of zeros: refused before its data is read; the child's peak RSS stays
    small (measured by wait4 on the real CLI process)."""
    bomb = gzip_bomb(tmp_path / "bomb.tar.gz", 3 * GiB // 2)
    assert bomb.stat().st_size < 8 * 1024**2
    world = World(tmp_path / "w")
    # A wrapper process runs the CLI and reports its only child's peak RSS (getrusage of children).
    wrap = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    proc = subprocess.run([sys.executable, "-c", wrap, sys.executable, "-m", "shoprld.daemon.ops.cli",
                           *world.argv(bomb)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and "declares 1.5 GiB, over the 256" in line, line
    peak_kib = int(proc.stdout.split()[-1])
    print(f"import-campaign on a 1.5 GiB gzip bomb ({bomb.stat().st_size} B): peak RSS {peak_kib / 1024:.0f} MiB")
    assert peak_kib < 400 * 1024


def test_many_members_under_the_member_cap_hit_the_total_cap(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    parts = []
    for i in range(3):
        info = tarfile.TarInfo(f"{BUNDLE_TOP}/exp/runs/{i}")
        info.size = 200 * 1024**2
        parts.append(info.tobuf(format=tarfile.GNU_FORMAT))
    # Headers only, data left out: the reader must refuse on the declared sizes, not read them.
    bundle = tmp_path / "b.tar"
    with open(bundle, "wb") as fh:
        for p in parts:
            fh.write(p)
            fh.seek(200 * 1024**2, os.SEEK_CUR)  # a sparse file: no disk used
        fh.write(b"\0" * 1024)
    world = World(tmp_path / "w")
    rc, err = _import(bundle, world, capsys)
    _refused(rc, err, world)
    assert "more than 512" in err, err


def _compress(kind: str, data: bytes) -> bytes:
    return {"tar": lambda d: d, "tar.gz": gzip.compress, "tar.bz2": bz2.compress, "tar.xz": lzma.compress}[kind](data)


@pytest.fixture(scope="module")
def good_tar(base_members: dict[str, bytes]) -> bytes:  # noqa: F811
    return _tar(base_members)


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "tar.bz2", "tar.xz"])
@pytest.mark.parametrize("cut", [0.0, 0.05, 0.3, 0.5, 0.7, 0.9, 0.99])
def test_a_truncated_bundle_is_one_line_exit_3(kind: str, cut: float, good_tar: bytes, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Cut inside the content (a tar's trailing zero padding is no content: a copy cut there is
    whole): refused, also where tarfile alone would stop quietly at a header cut short."""
    content = len(good_tar.rstrip(b"\0"))  # the last member's data ends the content
    if kind == "tar":
        data = good_tar[: int(content * cut)]
    else:
        packed = _compress(kind, good_tar)
        data = packed[: int(len(packed) * cut * 0.9)]  # the zero padding packs into the last bytes
    bundle = tmp_path / f"b.{kind}"
    bundle.write_bytes(data)
    world = World(tmp_path / "w")
    rc, err = _import(bundle, world, capsys)
    _refused(rc, err, world)


def test_a_zip_is_not_a_bundle(base_members: dict[str, bytes], tmp_path: Path,  # noqa: F811
                               capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "b.zip"
    with zipfile.ZipFile(bundle, "w") as z:
        for name, data in base_members.items():
            z.writestr(name, data)
    world = World(tmp_path / "w")
    rc, err = _import(bundle, world, capsys)
    _refused(rc, err, world)


def test_a_member_cut_short_inside_is_refused(base_members: dict[str, bytes], tmp_path: Path,  # noqa: F811
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The last member's header says more bytes than the file holds (a copy that stopped)."""
    members = dict(base_members)
    members[f"{BUNDLE_TOP}/state/journal.jsonl"] = json.dumps({"event": "x"}).encode() * 2000
    data = _tar({k: members[k] for k in sorted(members, key=lambda k: k.endswith("journal.jsonl"))})
    end = data.rindex(b'{"event"') - 20000  # inside the journal's data, before its end
    bundle = tmp_path / "b.tar"
    bundle.write_bytes(data[:end])
    world = World(tmp_path / "w")
    rc, err = _import(bundle, world, capsys)
    _refused(rc, err, world)
    assert "cut short" in err or "truncated" in err, err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["tar", "tar.gz", "tar.bz2", "tar.xz"]), cut=st.integers(min_value=0),
       flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=1, max_value=255)), max_size=8))
def test_any_damaged_bundle_is_done_or_one_line(kind: str, cut: int, flips: list[tuple[int, int]],
                                                good_tar: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Cut anywhere and bytes flipped anywhere: the reader returns the members or refuses with
    one LifecycleError (exit 3); never another exception, never more than the caps."""
    data = bytearray(_compress(kind, good_tar))
    data = data[: cut % (len(data) + 1)]
    for pos, x in flips:
        if data:
            data[pos % len(data)] ^= x
    bundle = tmp_path_factory.mktemp("d") / f"b.{kind}"
    bundle.write_bytes(bytes(data))
    try:
        files = campaignimport._read_bundle(bundle)
    except campaignimport.LifecycleError as exc:
        assert "\n" not in str(exc) and "fix:" in str(exc)
        return
    assert "manifest.json" in files
    assert sum(map(len, files.values())) <= campaignimport.TOTAL_MAX
