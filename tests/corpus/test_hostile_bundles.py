"""Hostile campaign bundles (issue 15, bug 3): ``import-campaign`` writes nothing outside the roots
it is given (``--repo``, ``--ephemeral-root``, ``--state-dir``), never changes an existing file
outside them, and answers every bundle with a documented exit code and at most one stderr line.

The base bundle is a real ``export-campaign`` of a demo tree; the cases and the hypothesis test
add hostile members and hostile bundled configs to it. The CLI's ``main`` runs in-process (each
example would otherwise pay ~1 s of imports); the repro cases also run it as a real child.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shoprld.daemon.ops.campaignexport import BUNDLE_TOP, export_campaign
from shoprld.daemon.ops.cli import main
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.tomlwrite import dump_toml
from tests.demotree import make_tree

CLI = [sys.executable, "-m", "shoprld.daemon.ops.cli"]
IMPORT_CODES = {0, 3}  # done, or refused in one line (README: exit codes)
CANARY = "canary-7f3a9c1e-do-not-copy"
CORPUS = Path(__file__).with_name("bundles")


@pytest.fixture(scope="module")
def base_members(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The members of a real export of a (never run) demo tree, keyed by name."""
    root = tmp_path_factory.mktemp("exported")
    campaign = make_tree(root / "old", rounds=2)
    state = root / "old" / "state"
    state.mkdir(exist_ok=True)
    (state / "state.json").write_text(json.dumps({"schema": 1, "state": "TRAIN", "round": 1, "children": {}}))
    (state / "journal.jsonl").write_text(json.dumps({"event": "transition", "to": "TRAIN"}) + "\n")
    layout = Layout.from_config(load_config(campaign))
    (layout.artifacts / "gate").mkdir(parents=True, exist_ok=True)
    (layout.artifacts / "gate" / "round-000.json").write_text('{"decision": "continue"}')
    bundle = root / "b.tar"
    assert export_campaign(campaign, bundle, out=io.StringIO()) == 0
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


@dataclass
class Extra:
    """One extra tar member: a file, a symlink, a hardlink, a device or a FIFO."""

    name: str
    kind: str = "file"  # file | symlink | hardlink | chr | blk | fifo | dir
    data: bytes = b"{}"
    link: str = ""


@dataclass
class World:
    """The roots an import gets, and a sentinel tree outside them that must not change."""

    top: Path
    trap: bool = False  # <repo>/reports is a symlink out of the roots, already in the new checkout
    repo: Path = field(init=False)
    eph: Path = field(init=False)
    state: Path = field(init=False)
    outside: Path = field(init=False)

    def __post_init__(self) -> None:
        self.repo, self.eph, self.state = self.top / "new" / "repo", self.top / "new" / "eph", self.top / "new" / "st"
        self.outside = self.top / "outside"
        self.repo.mkdir(parents=True)
        self.eph.mkdir()
        (self.outside / "sub").mkdir(parents=True)
        for rel in ("ledger.tsv", "skillbank.json", "sub/curriculum.json", "passwd"):
            (self.outside / rel).write_text(f"index\tsecret\n0\t{CANARY}\n")
        if self.trap:
            os.symlink(self.outside, self.repo / "reports")

    def argv(self, bundle: Path) -> list[str]:
        return ["import-campaign", str(bundle), "--repo", str(self.repo), "--ephemeral-root", str(self.eph),
                "--state-dir", str(self.state)]

    def snapshot(self) -> dict[str, tuple[int, str]]:
        """Every path of the world outside the roots, with its mtime and content hash."""
        out: dict[str, tuple[int, str]] = {}
        for dirpath, dirnames, filenames in os.walk(self.top, followlinks=False):
            here = Path(dirpath)
            if here == self.top / "new":
                dirnames[:] = []  # the roots (and the campaign file beside the repo) may change
                continue
            for name in dirnames + filenames:
                p = here / name
                if p == self.top / "new":
                    continue  # holds the roots: its own mtime changes when the state dir is made
                st = os.lstat(p)
                digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
                out[str(p)] = (st.st_mtime_ns, digest)
        return out


def write_bundle(path: Path, members: dict[str, bytes], extras: list[Extra] = ()) -> Path:  # type: ignore[assignment]
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for e in extras:
            info = tarfile.TarInfo(e.name)
            if e.kind == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "chr": tarfile.CHRTYPE,
                         "blk": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE, "dir": tarfile.DIRTYPE}[e.kind]
            info.linkname = e.link
            if e.kind in ("chr", "blk"):
                info.devmajor, info.devminor = 1, 3
            tar.addfile(info)
    return path


def with_config(members: dict[str, bytes], **sections: dict[str, object]) -> dict[str, bytes]:
    """``members`` with the bundled config's sections updated."""
    key = f"{BUNDLE_TOP}/config/campaign.toml"
    data = tomllib.loads(members[key].decode())
    for sec, vals in sections.items():
        data.setdefault(sec, {}).update(vals)
    return {**members, key: dump_toml(data).encode()}


def run_inprocess(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def assert_contained(world: World, before: dict[str, tuple[int, str]], rc: int, out: str, err: str) -> None:
    """The invariants: a documented code, one stderr line at most (exactly one on failure), no
    traceback, nothing outside the roots changed, and the canary never copied or printed."""
    assert rc in IMPORT_CODES, (rc, err)
    lines = err.strip().splitlines()
    assert "Traceback" not in out + err
    assert len(lines) == (1 if rc else 0) or (rc == 0 and len(lines) <= 1), err
    assert world.snapshot() == before
    assert CANARY not in out + err
    for dirpath, _, filenames in os.walk(world.top / "new", followlinks=False):
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                assert CANARY.encode() not in p.read_bytes(), p


# -- the repro cases (each failed before the fix) ---------------------------------------------------------


def test_absolute_ledger_over_an_existing_file_outside_the_roots_is_refused(base_members: dict[str, bytes],
                                                                          tmp_path: Path) -> None:
    """A bundled storage.ledger naming an existing file outside the roots: exit 3 in one line naming
    storage.ledger, and the file is byte-for-byte and mtime unchanged (it was merged over before)."""
    world = World(tmp_path)
    target = world.outside / "ledger.tsv"
    members = with_config(base_members, storage={"ledger": str(target)})
    members[f"{BUNDLE_TOP}/ledger/repo.tsv"] = b"index\tsuccess_rate\n0\t0.5\n"
    bundle = write_bundle(tmp_path / "b.tar", members)
    before = world.snapshot()
    proc = subprocess.run([*CLI, *world.argv(bundle)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "storage.ledger" in proc.stderr, proc.stderr
    assert "outside the roots given" in proc.stderr
    assert world.snapshot() == before
    assert not (world.state / "state.json").exists()


def test_relative_ledger_through_a_symlink_out_of_the_repo_is_refused(base_members: dict[str, bytes],
                                                                    tmp_path: Path) -> None:
    """The default ledger path (reports/shoprld/...) through a symlink the new repo already has, which
    leads outside: refused by the ledger's realpath, nothing written there."""
    world = World(tmp_path, trap=True)
    (world.outside / "shoprld").mkdir()
    members = {**base_members, f"{BUNDLE_TOP}/ledger/repo.tsv": b"index\tsuccess_rate\n0\t0.5\n"}
    bundle = write_bundle(tmp_path / "b.tar", members)
    before = world.snapshot()
    rc, out, err = run_inprocess(world.argv(bundle))
    assert rc == 3 and "storage.ledger" in err, err
    assert_contained(world, before, rc, out, err)


@pytest.mark.parametrize("attr", ["cwd", "conda_prefix", "command", "env", "secrets", "__class__", "nope"])
def test_inputs_member_for_an_arbitrary_config_attribute_is_refused(base_members: dict[str, bytes],
                                                                   tmp_path: Path, attr: str) -> None:
    """inputs/<attr>/ maps only to the allow-listed cold-start inputs: any other attribute is refused in
    one line (it used to be written to whatever path that attribute of [inject] held)."""
    world = World(tmp_path)
    members = with_config(base_members, inject={"cwd": str(world.outside / "passwd")})
    members[f"{BUNDLE_TOP}/inputs/{attr}/x.json"] = b'{"evil": true}'
    bundle = write_bundle(tmp_path / "b.tar", members)
    before = world.snapshot()
    rc, out, err = run_inprocess(world.argv(bundle))
    assert rc == 3 and f"inputs/{attr}/ is not one of the inputs" in err, err
    assert_contained(world, before, rc, out, err)


def test_cold_start_paths_outside_the_roots_are_never_written(base_members: dict[str, bytes],
                                                            tmp_path: Path) -> None:
    """inject.cold_start_* pointing outside the roots: an existing file there is left as is, a missing
    one is not created; the import says so on stdout and exits 0."""
    world = World(tmp_path)
    new_file = world.outside / "sub" / "created-by-import.json"
    members = with_config(base_members, inject={"cold_start_skillbank": str(world.outside / "skillbank.json"),
                                                "cold_start_curriculum": str(new_file)})
    members[f"{BUNDLE_TOP}/inputs/cold_start_skillbank/skillbank.json"] = b'{"skills": []}'
    members[f"{BUNDLE_TOP}/inputs/cold_start_curriculum/curriculum.json"] = b'{"tasks": []}'
    bundle = write_bundle(tmp_path / "b.tar", members)
    before = world.snapshot()
    rc, out, err = run_inprocess(world.argv(bundle))
    assert rc == 0, err
    assert not new_file.exists()
    assert "not restored    inject.cold_start_curriculum" in out, out
    assert_contained(world, before, rc, out, err)


@pytest.mark.parametrize("key,value", [("hf_dir", "ABS/sub"), ("user", "../../../outside")])
def test_bundled_paths_that_lead_the_campaign_outside_the_roots_are_refused(
        base_members: dict[str, bytes], tmp_path: Path, key: str, value: str) -> None:
    """export.hf_dir outside the roots, or a manifest user that climbs out of the ephemeral root: one line."""
    world = World(tmp_path)
    if key == "hf_dir":
        members = with_config(base_members, export={"hf_dir": value.replace("ABS", str(world.outside))})
    else:
        mkey = f"{BUNDLE_TOP}/manifest.json"
        man = json.loads(base_members[mkey])
        man["user"] = value
        members = {**base_members, mkey: json.dumps(man).encode()}
    bundle = write_bundle(tmp_path / "b.tar", members)
    before = world.snapshot()
    rc, out, err = run_inprocess(world.argv(bundle))
    assert rc == 3, err
    assert_contained(world, before, rc, out, err)


def test_a_plain_bundle_still_imports(base_members: dict[str, bytes], tmp_path: Path) -> None:
    """The fence lets the ordinary case through: exit 0, state and records restored under the roots."""
    world = World(tmp_path)
    bundle = write_bundle(tmp_path / "b.tar", base_members)
    before = world.snapshot()
    rc, out, err = run_inprocess(world.argv(bundle))
    assert rc == 0, err
    assert (world.state / "state.json").exists()
    assert list(world.eph.rglob("round-000.json"))
    assert_contained(world, before, rc, out, err)


# -- the fuzzer ---------------------------------------------------------------------------------------------

_SEG = st.one_of(st.sampled_from(["..", ".", "", "exp", "runs", "artifacts", "inputs", "state", "ledger",
                                  "cold_start_skillbank", "cwd", "conda_prefix", "x.json", "é🙂.json",
                                  "a" * 300, "manifest.json", "campaign.toml"]),
                 st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=12))
_NAME = st.one_of(
    st.lists(_SEG, min_size=1, max_size=5).map(lambda s: f"{BUNDLE_TOP}/" + "/".join(s)),
    st.lists(_SEG, min_size=1, max_size=4).map(lambda s: "/".join(s)),
    st.lists(_SEG, min_size=1, max_size=4).map(lambda s: "/" + "/".join(s)),
    st.sampled_from([f"{BUNDLE_TOP}/exp/runs/../../../../outside/passwd", f"{BUNDLE_TOP}/../outside/passwd",
                     f"{BUNDLE_TOP}/inputs/cwd/x", f"{BUNDLE_TOP}/exp/runs/" + "b" * 5000,
                     f"{BUNDLE_TOP}/state/state.json", f"{BUNDLE_TOP}/ledger/repo.tsv",
                     f"{BUNDLE_TOP}/manifest.json", f"{BUNDLE_TOP}/config/campaign.toml"]),
)
_LINK = st.sampled_from(["OUT/passwd", "OUT", "../../outside/passwd", "/etc/passwd", "/dev/zero", "", "x"])


@st.composite
def _extras(draw: st.DrawFn) -> list[Extra]:
    out = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["file", "file", "symlink", "hardlink", "chr", "blk", "fifo", "dir"]))
        out.append(Extra(draw(_NAME), kind, draw(st.binary(max_size=64) | st.just(CANARY.encode())),
                         draw(_LINK)))
    return out


_PATHVAL = st.sampled_from(["OUT/passwd", "OUT/ledger.tsv", "OUT/sub", "OUT/new.json", "../../../outside/passwd",
                            "/proc/self/mem", "/dev/full", "relative/x.json", "{repo}/x", "~/x", "$HOME/x",
                            "NEWREPO/../../outside/passwd"])
_KEYS = st.sampled_from([("storage", "ledger"), ("export", "hf_dir"), ("inject", "cold_start_skillbank"),
                         ("inject", "cold_start_curriculum"), ("inject", "cwd"), ("storage", "env_file"),
                         ("train", "base_load"), ("storage", "project_root"), ("campaign", "name"),
                         ("storage", "user")])
_MANIFEST_EDITS = st.sampled_from([("user", "../.."), ("user", ""), ("campaign", "../x"), ("config_file", "/"),
                                   ("config_file", "OUT/passwd"), ("roots", {"repo": "/"}), ("copy", [{}]),
                                   ("state", {"round": "abc"}), ("checkpoint", {"iteration": -1}),
                                   ("format", "nope"), ("roots", "x")])


@dataclass
class HostileBundle:
    extras: list[Extra]
    config: list[tuple[tuple[str, str], str]]
    manifest: list[tuple[str, object]]
    drop: list[str]


_BUNDLES = st.builds(
    HostileBundle, _extras(), st.lists(st.tuples(_KEYS, _PATHVAL), max_size=3),
    st.lists(_MANIFEST_EDITS, max_size=2),
    st.lists(st.sampled_from(["manifest.json", "config/campaign.toml", "state/state.json"]), max_size=1))


def _materialise(h: HostileBundle, base: dict[str, bytes], world: World, path: Path) -> Path:
    def sub(v: object) -> object:
        if isinstance(v, str):
            return v.replace("OUT", str(world.outside)).replace("NEWREPO", str(world.repo))
        return v

    members = dict(base)
    for (sec, key), val in h.config:
        members = with_config(members, **{sec: {key: sub(val)}})
    if h.manifest:
        mkey = f"{BUNDLE_TOP}/manifest.json"
        man = json.loads(members[mkey])
        for k, v in h.manifest:
            man[k] = sub(v) if not isinstance(v, dict) else {**(man.get(k) if isinstance(man.get(k), dict) else {}),
                                                            **v}
        members[mkey] = json.dumps(man).encode()
    for d in h.drop:
        members.pop(f"{BUNDLE_TOP}/{d}", None)
    extras = [Extra(e.name, e.kind, e.data, str(sub(e.link))) for e in h.extras]
    return write_bundle(path, members, extras)


def _check_one(h: HostileBundle, base: dict[str, bytes], top: Path) -> None:
    with _fresh(top) as world:
        bundle = _materialise(h, base, world, top / "bundle.tar")
        before = world.snapshot()
        rc, out, err = run_inprocess(world.argv(bundle))
        assert_contained(world, before, rc, out, err)


@contextlib.contextmanager
def _fresh(top: Path) -> Iterator[World]:
    import shutil

    if top.exists():
        shutil.rmtree(top)
    top.mkdir(parents=True)
    yield World(top)


_FOUND = sorted(CORPUS.glob("*.json")) if CORPUS.is_dir() else []


@pytest.mark.parametrize("case", _FOUND, ids=[p.stem for p in _FOUND])
def test_bundle_regressions_found_by_the_fuzzer(case: Path, base_members: dict[str, bytes], tmp_path: Path) -> None:
    """Every example the fuzzer once failed on (tests/corpus/bundles/) now holds the invariants."""
    doc = json.loads(case.read_text())
    extras = [Extra(e["name"], e["kind"], e["data"].encode(), e["link"]) for e in doc["extras"]]
    h = HostileBundle(extras, [((a, b), v) for (a, b), v in doc["config"]],
                      [tuple(x) for x in doc["manifest"]], doc["drop"])  # type: ignore[misc]
    _check_one(h, base_members, tmp_path / "w")


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=30, **_SETTINGS)  # type: ignore[arg-type]
@example(h=HostileBundle([Extra(f"{BUNDLE_TOP}/exp/runs/x.json", "symlink", link="OUT/passwd")],
                         [(("storage", "ledger"), "OUT/ledger.tsv")], [], []))
@given(h=_BUNDLES)
def test_hostile_bundles_keep_the_invariants(h: HostileBundle, base_members: dict[str, bytes],
                                             tmp_path: Path) -> None:
    """Generated bundles (hostile member names, links, devices, duplicates, hostile configs and
    manifests): a documented code, one stderr line, nothing outside the roots changed, no canary."""
    _check_one(h, base_members, tmp_path / "w")


@pytest.mark.slow
@settings(max_examples=500, derandomize=True, **_SETTINGS)  # type: ignore[arg-type]
@given(h=_BUNDLES)
def test_hostile_bundles_keep_the_invariants_many(h: HostileBundle, base_members: dict[str, bytes],
                                                  tmp_path: Path) -> None:
    """The same, 500 examples from a fixed seed (slow suite)."""
    _check_one(h, base_members, tmp_path / "w")
