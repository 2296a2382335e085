"""The README's architecture section names only what the code has: every module file, every
type (CamelCase), every constant and every ``Type.method`` it cites exists in daemon/ or
states/. A rename that forgets the README fails here."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Words of the section that look like code but name no code of ours (products, the stdlib).
NOT_OURS = {"NNN", "ShopSim", "ShopSimRL", "StrEnum", "TOML", "README", "ARCHITECTURE", "MTBF", "JSON", "TSV", "HF",
            "GPU", "NVML", "ENOSPC", "SIGHUP", "PREFLIGHT_DISK", "TERM", "KILL", "Young", "Daly", "Megatron"}


def _section() -> str:
    text = README.read_text()
    start = text.index("\n## Architecture\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _definitions() -> tuple[set[str], dict[str, set[str]], set[str]]:
    """(names defined at module level, members by class: methods and fields, in daemon/ and
    states/; file names there and in tests/)."""
    names: set[str] = set()
    methods: dict[str, set[str]] = {}
    files: set[str] = set()
    for folder in ("daemon", "states"):
        for f in (ROOT / folder).rglob("*.py"):
            files.add(f.name)
            for node in ast.parse(f.read_text()).body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    methods.setdefault(node.name, set()).update(
                        n.name if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) else n.target.id  # type: ignore[union-attr]
                        for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        or isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
                    methods[node.name].update(t.id for n in node.body if isinstance(n, ast.Assign)  # enum members
                                              for t in n.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
    files.update(f.name for f in (ROOT / "tests").rglob("*.py"))
    return names, methods, files


def cited(section: str) -> tuple[set[str], set[str], set[str]]:
    """(module file names, type and constant names, ``Type.method`` pairs) the section cites."""
    files = set(re.findall(r"\b([a-z_][a-z0-9_]*\.py)\b", section))
    spans = re.findall(r"`([^`\n]+)`", section)
    types = set(re.findall(r"\b([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+)\b", section))  # CamelCase anywhere
    for span in spans:  # a single capitalized word or a CONSTANT counts when it is code-quoted
        types.update(re.findall(r"(?<![.\w])([A-Z][A-Za-z0-9_]+)\b", span))
    pairs = {m for span in spans for m in re.findall(r"\b([A-Z][a-z]\w*\.[a-z_]\w*)\b", span)}
    return files, types - NOT_OURS, pairs


def test_the_architecture_section_cites_only_what_exists() -> None:
    """Each module file, type, constant and Type.method named in the section is defined in the code."""
    names, methods, files = _definitions()
    want_files, want_types, want_pairs = cited(_section())
    assert want_files and want_types and want_pairs  # the parsing found something to check
    missing = sorted(f for f in want_files if f not in files)
    missing += sorted(t for t in want_types if t not in names)
    missing += sorted(p for p in want_pairs if p.split(".")[1] not in methods.get(p.split(".")[0], set()))
    assert not missing, f"the README's architecture section names what the code does not have: {missing}"


def test_the_check_would_catch_a_name_the_code_lost() -> None:
    """The check is not vacuous: a type and a module the code never had are reported."""
    names, _, files = _definitions()
    got_files, got_types, got_pairs = cited("`EndAction` in `planning.py`, `Shutdown.nothing()`")
    assert "EndAction" in got_types and "EndAction" not in names
    assert "planning.py" in got_files and "planning.py" not in files
    assert got_pairs == {"Shutdown.nothing"}
