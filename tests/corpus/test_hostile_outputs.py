"""Hostile output paths (issue 26, "never replace what is not ours"): every file the CLI writes to a
path the user chose (``report -o``, the metrics textfile, ``export-campaign OUT``, ``init``) refuses
a device node, a FIFO, a socket, a directory, a symlink to one of those, and the campaign's own
files (campaign file, ``.env``, state dir contents, ledger, a hard link to the journal), in one
line, exit 3, and leaves the thing it refused exactly as it was (a device keeps its rdev, a FIFO
stays a FIFO, a file keeps its bytes) with no temp file beside it.

As root, the device node is made by mknod in the test's temp dir (char 1,3, like /dev/null); the
machine's real device nodes are never touched.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shoprld.daemon.core.metrics import TextfileMetrics, textfile_problem
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.records.outputs import OutputPathError, Protected, campaign_files, write_output
from shoprld.daemon.ops.cli import main
from shoprld.daemon.ops.demo import create_tree

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo campaign with a state dir, a journal and a ledger, as after a run."""
    root = tmp_path_factory.mktemp("camp")
    campaign = create_tree(root, fast=True, rounds=2)
    layout = Layout.from_config(load_config(campaign))
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    (layout.state_dir / "state.json").write_text(json.dumps({"schema": 1, "state": "TRAIN", "round": 1,
                                                             "children": {}}))
    (layout.state_dir / "journal.jsonl").write_text(json.dumps({"event": "transition", "t": 1.8e9, "dst": "TRAIN"})
                                                    + "\n")
    layout.ledger.parent.mkdir(parents=True, exist_ok=True)
    if not layout.ledger.exists():
        layout.ledger.write_text("index\tstatus\n")
    if not layout.env_file.exists():
        layout.env_file.write_text("WANDB_API_KEY=x\n")
    return campaign


def _node(kind: str, where: Path) -> tuple[Path, Callable[[], None]]:
    """A hostile thing at ``where``; returns it and a check that it is still exactly that."""
    if kind == "device":
        if not ROOT:
            pytest.skip("mknod needs root")
        os.mknod(where, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return where, lambda: _same(where, stat.S_ISCHR, os.makedev(1, 3))
    if kind == "fifo":
        os.mkfifo(where)
        return where, lambda: _same(where, stat.S_ISFIFO)
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(where))
        s.close()
        return where, lambda: _same(where, stat.S_ISSOCK)
    if kind == "dir":
        where.mkdir()
        (where / "keep").write_text("keep")
        return where, lambda: _same(where, stat.S_ISDIR) or None
    if kind in ("link-to-fifo", "link-to-device"):
        target = where.with_name(where.name + ".real")
        _, check = _node(kind.removeprefix("link-to-"), target)
        os.symlink(target, where)
        return where, lambda: (check(), _same(where, stat.S_ISLNK))  # type: ignore[func-returns-value]
    raise AssertionError(kind)


def _same(p: Path, is_kind: Callable[[int], bool], rdev: int | None = None) -> None:
    st = os.lstat(p)
    assert is_kind(st.st_mode), f"{p} was replaced: mode {oct(st.st_mode)}"
    if rdev is not None:
        assert st.st_rdev == rdev


KINDS = ["device", "fifo", "socket", "dir", "link-to-fifo", "link-to-device"]


def _no_temp(d: Path) -> None:
    left = [p.name for p in d.iterdir() if p.name.endswith(".tmp")]
    assert not left, f"temp files left in {d}: {left}"


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("shoprld: "), err
    assert "Traceback" not in err
    return err


def _cmd(tool: str, campaign: Path, out: Path) -> list[str]:
    return {"report": ["report", "-c", str(campaign), "-o", str(out)],
            "export": ["export-campaign", "-c", str(campaign), str(out)],
            "init": ["init", str(out), "--force"]}[tool]


@pytest.mark.parametrize("tool", ["report", "export", "init"])
@pytest.mark.parametrize("kind", KINDS)
def test_cli_output_never_replaces_a_special_file(tool: str, kind: str, tree: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    if tool == "report":
        pytest.importorskip("matplotlib")
    target, still = _node(kind, tmp_path / "out.file")
    assert main(_cmd(tool, tree, target)) == 3
    err = _one_line(capsys)
    assert str(target) in err and "fix:" in err
    still()
    _no_temp(tmp_path)


def _own_files(campaign: Path) -> dict[str, Path]:
    layout = Layout.from_config(load_config(campaign))
    return {"campaign file": campaign, ".env": layout.env_file, "state.json": layout.state_dir / "state.json",
            "journal": layout.state_dir / "journal.jsonl", "ledger": layout.ledger,
            "new file in state dir": layout.state_dir / "x.html"}


@pytest.mark.parametrize("tool", ["report", "export"])
@pytest.mark.parametrize("which", ["campaign file", ".env", "state.json", "journal", "ledger",
                                   "new file in state dir", "hard link to journal", "symlink to .env"])
def test_cli_output_never_overwrites_the_campaigns_own_files(tool: str, which: str, tree: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    if tool == "report":
        pytest.importorskip("matplotlib")
    own = _own_files(tree)
    if which == "hard link to journal":
        target = tmp_path / "j.html"
        os.link(own["journal"], target)
    elif which == "symlink to .env":
        target = tmp_path / "e.html"
        os.symlink(own[".env"], target)
    else:
        target = own[which]
    before = {k: p.read_bytes() for k, p in own.items() if p.is_file()}
    assert main(_cmd(tool, tree, target)) == 3
    err = _one_line(capsys)
    assert "never overwritten" in err, err
    assert {k: p.read_bytes() for k, p in own.items() if p.is_file()} == before
    assert not own["new file in state dir"].exists()


def test_init_refuses_dotenv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / ".env"
    env.write_text("TOKEN=secret\n")
    link = tmp_path / "campaign.toml"
    os.symlink(env, link)
    for target in (env, link):
        assert main(["init", str(target), "--force"]) == 3
        assert "secrets" in _one_line(capsys)
    assert env.read_text() == "TOKEN=secret\n"


def test_outputs_still_write_regular_files_and_through_symlinks(tree: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The opener is not a wall: a new path, an existing regular file and a symlink to one are
    written (the symlink stays a symlink, its file gets the bytes)."""
    real = tmp_path / "real.toml"
    real.write_text("old")
    link = tmp_path / "link.toml"
    os.symlink(real, link)
    assert main(["init", str(link), "--force"]) == 0
    assert link.is_symlink() and "[campaign]" in real.read_text()
    assert main(["export-campaign", "-c", str(tree), str(tmp_path / "b.tar")]) == 0
    assert (tmp_path / "b.tar").stat().st_size > 0
    assert stat.S_IMODE((tmp_path / "b.tar").stat().st_mode) == 0o600
    capsys.readouterr()
    _no_temp(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
def test_textfile_refused_by_check_and_never_replaced_by_a_write(kind: str, tree: Path, tmp_path: Path) -> None:
    """``textfile = "/dev/null"`` (here: a 1,3 node of our own) is a config problem at check and
    start; and a node swapped in after the start survives every write (logged, never raised)."""
    pytest.importorskip("prometheus_client")
    target, still = _node(kind, tmp_path / "shoprld.prom")
    problem = textfile_problem(target, Protected())
    assert problem is not None and problem.startswith("metrics.textfile: ") and "fix:" in problem
    TextfileMetrics(target, "c").write({"state": "TRAIN", "round": 0}, {})
    still()
    _no_temp(tmp_path)


def test_a_textfile_in_a_dir_not_made_yet_is_fine(tmp_path: Path) -> None:
    """The writer makes the textfile's dir: check does not ask for it."""
    pytest.importorskip("prometheus_client")
    path = tmp_path / "not" / "yet" / "shoprld.prom"
    assert textfile_problem(path, Protected()) is None
    TextfileMetrics(path, "c").write({"state": "TRAIN", "round": 0}, {})
    assert "shoprld_state" in path.read_text()


def test_textfile_on_the_campaigns_own_files_is_a_check_problem(tree: Path) -> None:
    layout = Layout.from_config(load_config(tree))
    own = campaign_files(tree, layout)
    for p in _own_files(tree).values():
        assert textfile_problem(p, own) is not None, p
    journal = layout.state_dir / "journal.jsonl"
    before = journal.read_bytes()
    TextfileMetrics(journal, "c", own).write({"state": "TRAIN"}, {})
    assert journal.read_bytes() == before


def test_check_exits_3_on_a_device_textfile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("prometheus_client")
    campaign = create_tree(tmp_path, fast=True, rounds=1)
    fifo = tmp_path / "metrics.prom"
    os.mkfifo(fifo)
    campaign.write_text(campaign.read_text() + f'\n[metrics]\ntextfile = "{fifo}"\n')
    assert main(["check", "-c", str(campaign)]) == 3
    out = capsys.readouterr()
    assert f"metrics.textfile: {fifo}: is a FIFO" in out.out + out.err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.fixture
def swap(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "target"


@pytest.mark.parametrize("first", ["absent", "regular"])
@pytest.mark.parametrize("kind", ["fifo", "device", "dir"])
def test_a_node_swapped_in_during_the_write_is_not_replaced(first: str, kind: str, swap: Path) -> None:
    """Check after open: the target is re-checked through the dir's descriptor just before the
    rename, so a FIFO or device put there while the temp file was filled survives."""
    if first == "regular":
        swap.write_text("old")

    def fill(fh: object) -> None:
        swap.unlink(missing_ok=True)
        _node(kind, swap)
        fh.write(b"new")  # type: ignore[attr-defined]

    with pytest.raises(OutputPathError, match="nothing replaced"):
        write_output(swap, fill)
    assert not stat.S_ISREG(os.lstat(swap).st_mode)
    _no_temp(swap.parent)


def test_a_regular_file_swapped_for_another_is_not_replaced(swap: Path) -> None:
    swap.write_text("old")

    def fill(fh: object) -> None:
        swap.rename(swap.with_name("moved"))  # kept: its inode number is not reused
        swap.write_text("someone else's")
        fh.write(b"new")  # type: ignore[attr-defined]

    with pytest.raises(OutputPathError, match="replaced by another file"):
        write_output(swap, fill)
    assert swap.read_text() == "someone else's"
    _no_temp(swap.parent)


# -- install-service: the unit can write what the config writes ------------------------------


def _with_textfile(tmp_path: Path, textfile: str) -> Path:
    campaign = create_tree(tmp_path / "t", fast=True, rounds=1)
    campaign.write_text(campaign.read_text() + f'\n[metrics]\ntextfile = "{textfile}"\n')
    return campaign


def _rw(text: str) -> list[str]:
    return next(line for line in text.splitlines() if line.startswith("ReadWritePaths=")).split("=", 1)[1].split()


@pytest.mark.parametrize("where", ["/var/lib/node_exporter/textfile/shoprld.prom", "/srv/metrics/x/y.prom",
                                   "/opt/prom dir/shoprld.prom"])
def test_unit_makes_the_textfile_dir_writable(where: str, tmp_path: Path) -> None:
    """The README's node_exporter path (and odd ones): its dir is in ReadWritePaths= under
    ProtectSystem=strict, so the daemon's temp file + rename works under the unit."""
    from shoprld.daemon.ops import unit as service

    text = service.render(_with_textfile(tmp_path, where), user=False, command=["/usr/bin/true"]).text
    assert "ProtectSystem=strict" in text
    d = str(Path(where).parent)
    assert any(w.strip('"') == f"-{d}" for w in _rw(text)) or f'"-{d}"' in text, _rw(text)


@pytest.mark.parametrize("where", ["/shoprld.prom", "/etc/shoprld.prom", "/usr/shoprld.prom", "/var/x.prom"])
def test_unit_refuses_a_textfile_that_would_open_a_system_dir(where: str, tmp_path: Path) -> None:
    """A textfile directly in /, /etc, /usr, /var: the unit would have to undo ProtectSystem= for
    the whole tree; refused in one line naming the key (this host may run no systemd, so the
    renderer is called as install-service calls it)."""
    from shoprld.daemon.foundation.system.errors import ConfigError
    from shoprld.daemon.ops import unit as service

    with pytest.raises(ConfigError) as exc:
        service.render(_with_textfile(tmp_path, where), user=False, command=["/usr/bin/true"])
    line = str(exc.value)
    assert "\n" not in line and line.startswith("metrics.textfile = ") and "fix:" in line
