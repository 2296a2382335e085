"""The repo hygiene guard: big untracked files and caches in the checkout are warned about, never touched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from shoprld.daemon.services.hygiene import HygieneWarning, lines, scan_repo

MiB = 1024**2
LIMIT = MiB  # storage.repo_hygiene_max in these tests (the default is 50 MiB): small files, fast git


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                   check=True, capture_output=True, timeout=30)


def _sparse(path: Path, size: int) -> Path:
    """A file of ``size`` apparent bytes that takes no disk space."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def _tree(top: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(top))] = os.lstat(p).st_size if not p.is_dir() else -1
    return out


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A git checkout with one tracked big file, .gitignore and a managed runs/ symlink."""
    r = tmp_path / "RL"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    (r / "README.md").write_text("code\n")
    (r / ".gitignore").write_text(".env\nruns\noutputs/\n")
    _sparse(r / "data" / "tracked_big.bin", 3 * MiB)
    _git(r, "add", "-A")
    _git(r, "commit", "-q", "-m", "init")
    (r / ".env").write_text("WANDB_API_KEY=x\n")
    (tmp_path / "volume-runs").mkdir()
    (r / "runs").symlink_to(tmp_path / "volume-runs", target_is_directory=True)
    return r


def _by_path(warnings: list[HygieneWarning], repo: Path) -> dict[str, HygieneWarning]:
    return {str(w.path.relative_to(repo)): w for w in warnings}


def test_clean_checkout_has_no_warnings(repo: Path) -> None:
    """Tracked files (however big), .env, and the managed runs/ symlink are not findings."""
    assert scan_repo(repo, LIMIT) == []


def test_big_untracked_and_ignored_paths_are_warned_with_path_and_size(repo: Path) -> None:
    """An untracked file and an ignored dir over the limit each give one line naming the path and size."""
    _sparse(repo / "dump.bin", 2 * MiB)
    _sparse(repo / "outputs" / "a" / "big.bin", MiB // 2 + 1)
    _sparse(repo / "outputs" / "b.bin", MiB // 2 + 1)
    _sparse(repo / "small.txt", 1000)
    got = _by_path(scan_repo(repo, LIMIT), repo)
    assert set(got) == {"dump.bin", "outputs"}
    assert got["dump.bin"].kind == "large" and got["dump.bin"].bytes == 2 * MiB
    assert got["outputs"].bytes == MiB + 2
    for line in lines(got.values()):
        assert "\n" not in line and "repo hygiene:" in line and "fix:" in line
    assert f"{repo / 'dump.bin'} (2.0 MiB)" in got["dump.bin"].line()


def test_allowed_records_are_skipped_even_inside_a_collapsed_untracked_dir(repo: Path) -> None:
    """reports/shoprld (the ledger and the records) is allowed; a big sibling under reports/ is not."""
    _sparse(repo / "reports" / "shoprld" / "demo" / "results" / "huge.json", 9 * MiB)
    assert scan_repo(repo, LIMIT) == []
    _sparse(repo / "reports" / "other.bin", 2 * MiB)
    got = _by_path(scan_repo(repo, LIMIT), repo)
    assert set(got) == {"reports"} and got["reports"].bytes == 2 * MiB


@pytest.mark.parametrize(("rel", "kind"), [
    (".cache/huggingface/hub/x", "cache"), ("wandb/offline-run-1/run.wandb", "cache"),
    ("model.safetensors", "weights"), ("ckpt/iter_0000020/__0_0.distcp", "weights"), ("opt.pt", "weights"),
])
def test_known_caches_and_weights_are_warned_at_any_size(repo: Path, rel: str, kind: str) -> None:
    """.cache, wandb/, *.safetensors, *.distcp and *.pt in the checkout are findings even when small."""
    _sparse(repo / rel, 4096)
    got = scan_repo(repo, LIMIT)
    assert len(got) == 1 and got[0].kind == kind, got
    assert rel.startswith(str(got[0].path.relative_to(repo)))


def test_a_real_runs_dir_is_warned(repo: Path) -> None:
    """runs/ as a real directory (tool output landing in the repo) is a finding, with the link fix."""
    (repo / "runs").unlink()
    _sparse(repo / "runs" / "round-000-bare-val" / "traces.jsonl", 100)
    got = scan_repo(repo, LIMIT)
    assert [w.kind for w in got] == ["runs-dir"] and "manage_runs_link" in got[0].line()


def test_pycache_only_when_big(repo: Path) -> None:
    """__pycache__ is normal; it is only a finding when over the limit."""
    _sparse(repo / "pkg" / "__pycache__" / "m.cpython-311.pyc", 10_000)
    assert scan_repo(repo, LIMIT) == []
    _sparse(repo / "pkg" / "__pycache__" / "big.pyc", 2 * MiB)
    got = scan_repo(repo, LIMIT)
    assert [(str(w.path.relative_to(repo)), w.kind) for w in got] == [("pkg", "large")]


def test_never_deletes_or_changes_anything(repo: Path) -> None:
    """Scanning leaves the checkout byte-for-byte as it was."""
    _sparse(repo / "model.safetensors", 4096)
    _sparse(repo / "dump.bin", 2 * MiB)
    before = _tree(repo)
    assert scan_repo(repo, LIMIT)
    assert _tree(repo) == before


def test_not_a_git_checkout_falls_back_to_a_size_walk(tmp_path: Path) -> None:
    """Without git metadata every top-level entry is looked at, .git-less, by size."""
    r = tmp_path / "plain"
    _sparse(r / "big" / "x.bin", 3 * MiB)
    _sparse(r / "ok.txt", 10)
    (r / ".env").write_text("K=v\n")
    got = _by_path(scan_repo(r, LIMIT), r)
    assert set(got) == {"big"} and got["big"].bytes == 3 * MiB


def test_time_budget_marks_sizes_as_lower_bounds_and_counts_what_was_not_sized(repo: Path) -> None:
    """A walk cut short by the budget warns with a lower bound ('>='); the entries never reached are
    summed up in one line; a missing repo is no finding."""
    for i in range(20):
        _sparse(repo / "outputs" / f"d{i}" / "f.bin", 1024)
    _sparse(repo / "zz-later.bin", 10)
    ticks = iter(range(10_000))

    def clock() -> float:  # one second per call: the budget of 8 s ends inside outputs/
        return float(next(ticks))

    got = scan_repo(repo, LIMIT, time_budget=8.0, clock=clock)
    by = {w.kind: w for w in got}
    assert by["large"].path == repo / "outputs" and by["large"].partial and ">= " in by["large"].line()
    assert 0 < by["large"].bytes < 20 * 1024
    assert by["budget"].count == 1 and "were not sized" in by["budget"].line()
    assert scan_repo(repo / "nope", 1) == []


def test_symlinks_are_not_followed(repo: Path, tmp_path: Path) -> None:
    """A symlink to a huge directory outside the checkout takes no room in it: no finding."""
    _sparse(tmp_path / "elsewhere" / "huge.bin", 500 * MiB)
    (repo / "link-out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (repo / "inner").mkdir()
    (repo / "inner" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert scan_repo(repo, LIMIT) == []
