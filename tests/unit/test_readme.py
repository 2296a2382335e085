"""The README cites only files that are in the repo, and its exit codes are the code's.

A reader on the GPU box has the checkout and nothing else: a path the README names that is not
in it (a module moved, a doc kept beside the repo) sends them looking for nothing. Paths are
found the way a reader sees them: markdown link targets, and words that start with one of the
repo's own top-level entries (``daemon/``, ``run/``, ``tests/``, ``pyproject.toml``, ...). A
bare ``*.md`` name must be some file of the repo. The project's shared docs beside the repo are
cited as ``../shared/...``, which says they are not in it; ``shared/...`` would not."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from shoprld.daemon.foundation.system import errors
from shoprld.daemon.ops import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def cited_paths(text: str, dirs: set[str], root_files: set[str] = frozenset({"pyproject.toml"})) -> set[str]:
    """Every repo path ``text`` cites: link targets, words that start with a top-level dir and a
    ``/`` (or with ``shared/``, the shared docs misnamed as a repo path), and the root files."""
    found = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)}
    starts = "|".join(re.escape(t) for t in sorted(dirs | {"shared"}, key=len, reverse=True))
    for m in re.finditer(rf"(?<![\w./~<>$-])((?:{starts})/[^\s`'\"(),;:|\]]*)", text):
        word = m.group(1).rstrip(".")
        if not any(ch in word for ch in "{}*<>%[$"):  # a pattern, not a path: daemon/{core,ops}, states/*.py
            found.add(word)
    for name in root_files:
        if re.search(rf"(?<![\w./-]){re.escape(name)}\b", text):
            found.add(name)
    return {f for f in found if f}


def test_every_file_the_readme_cites_is_in_the_repo() -> None:
    """Each cited path exists in this checkout (a tracked file, or a dir holding some)."""
    files = _tracked()
    tops = {f.split("/")[0] for f in files if "/" in f}
    dirs = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    cited = cited_paths(README.read_text(), tops, {f for f in files if "/" not in f})
    assert len(cited) > 40, cited  # the scan finds the README's paths at all
    missing = sorted(c for c in cited if c.rstrip("/") not in set(files) | dirs)
    assert missing == [], f"the README cites {missing}, which are not in the repo"


def test_every_md_name_the_readme_gives_is_a_file_of_the_repo() -> None:
    """`ARCHITECTURE.md`-style names in backticks: some tracked file has that name (or the word is
    a ../ path, outside the repo on purpose)."""
    names = {Path(f).name for f in _tracked()}
    text = README.read_text()
    bare = {m for m in re.findall(r"`([A-Za-z0-9_.-]+\.md)`", text)}
    assert sorted(bare - names) == []


def test_the_scan_finds_a_missing_file_and_ignores_patterns() -> None:
    """The scanner itself: a moved module, a link and a shared/ path are found; globs, braces,
    ../ paths, URLs and run-time paths are not."""
    text = ("see `daemon/status.schema.json`, [x](systemd/gone.service), shared/contracts/a.md, "
            "daemon/{core,ops}, `states/*.py`, ../shared/SPEC.md, https://x.org/daemon/y, "
            "runs/loop/round-000/val.yaml and `run/demo/`.")
    got = cited_paths(text, {"daemon", "systemd", "states", "run"})
    assert got == {"daemon/status.schema.json", "systemd/gone.service", "shared/contracts/a.md", "run/demo/"}


def test_the_readme_exit_codes_are_the_codes_of_the_code() -> None:
    """The README's exit-code table lists exactly the codes errors.py and the CLI define, each
    once, with the same meaning word."""
    text = README.read_text()
    table = text[text.index("| exit | meaning |"):]
    table = table[:table.index("\n\n")]
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| \*\*(\d+)\*\* \| (.+?) \|$", table, re.M)}
    code = {getattr(errors, n): n for n in dir(errors) if n.startswith("EXIT_")}
    code[cli.EXIT_INTERRUPTED] = "EXIT_INTERRUPTED"
    assert sorted(rows) == sorted(code), (sorted(rows), sorted(code))
    words = {"EXIT_OK": "done", "EXIT_BUG": "bug", "EXIT_USAGE": "usage", "EXIT_CONFIG": "config",
             "EXIT_DISK": "disk", "EXIT_GATE": "gate", "EXIT_STAGE": "stage", "EXIT_INTERRUPTED": "interrupted",
             "EXIT_PIPE": "stdout"}
    for value, name in code.items():
        assert words[name] in rows[value].lower(), (value, rows[value])
