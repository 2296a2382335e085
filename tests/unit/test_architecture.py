"""The house's rules, checked on the source: no import cycle, and no import from a lower layer
to a higher one (README, "Architecture").

Every import counts, at module level, inside functions and under ``TYPE_CHECKING``: a cycle
that only a function-local import hides is still a cycle. The layers, lowest first, are the
subpackages of ``shoprld.daemon`` plus ``shoprld.states``; a module may import from its own
layer and from the layers below it. The function-local imports that remain are listed here
with their reason, so a new one is a decision, not an accident.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"daemon": "shoprld.daemon", "states": "shoprld.states"}

#: Lowest first. The order is the architecture: see the README.
LAYERS = (
    "shoprld.daemon.foundation",
    "shoprld.daemon.round",
    "shoprld.daemon.services",
    "shoprld.states",
    "shoprld.daemon.core",
    "shoprld.daemon.ops",
)


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, package in PACKAGES.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in f.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            if parts and parts[0] == "_root":
                continue
            mods[".".join([package, *parts])] = f
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported shoprld module, line, inside a function) for every import in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def targets(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        return [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, child.lineno, in_function) for t in targets(child)
                             if t in MODULES and t != name)
            else:
                walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(ast.parse(path.read_text()), False)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}

_CLI = "shoprld.daemon.ops.cli"
_CLI_WHY = "the CLI imports one command per import: `shoprld status` (and `stop`) stay on the standard library"
#: The function-local imports of shoprld modules that remain, each with its reason. Third-party
#: lazy imports (optional extras: prometheus-client, matplotlib, nvidia-ml-py, PyYAML; rich,
#: watchdog and structlog off the status path) are not listed: they hide no cycle.
LOCAL_IMPORTS = {
    (_CLI, "shoprld.daemon.ops.check"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.rehearse"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.notifytest"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.initcmd"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.run"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.demo"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.statuscmd"): _CLI_WHY,
    (_CLI, "shoprld.daemon.core.control"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.ledgercmd"): _CLI_WHY,
    (_CLI, "shoprld.daemon.foundation.system.logs"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.clean"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.campaignexport"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.campaignimport"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.report"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.unit"): _CLI_WHY,
    (_CLI, "shoprld.daemon.ops.supervise"): _CLI_WHY,
    ("shoprld.daemon.ops.demo", "shoprld.daemon.ops.report"): "the report needs the matplotlib extra; the demo "
                                                                "runs without it",
    ("shoprld.daemon.foundation.records.identity", "shoprld.daemon.foundation.records.store"): "status reads the identity; the "
                                                                                "store (anyio) only when writing",
    ("shoprld.daemon.foundation.records.store", "shoprld.daemon.foundation.records.statedoc"): "pydantic only when a state is "
                                                                                "loaded: `shoprld stop` imports "
                                                                                "the store",
}


def layer(module: str) -> int:
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return i
    raise AssertionError(f"{module} is in no layer: put it in one of {LAYERS}")


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        if module not in ("shoprld.daemon",):
            layer(module)


def test_no_import_goes_up_a_layer() -> None:
    upward = [f"{src} (layer {layer(src)}) imports {dst} (layer {layer(dst)}) at line {line}"
              for src, edges in GRAPH.items() if src != "shoprld.daemon"
              for dst, line, _ in edges if dst != "shoprld.daemon" and layer(dst) > layer(src)]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_import_cycle() -> None:
    """Tarjan's strongly connected components over every import; any component > 1 is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w, _, _ in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_every_function_local_import_has_its_reason() -> None:
    """A new function-local import of a shoprld module is a decision: list it with its reason."""
    local = {(src, dst) for src, edges in GRAPH.items() for dst, _, in_function in edges if in_function}
    assert local == set(LOCAL_IMPORTS), (f"unlisted: {sorted(local - set(LOCAL_IMPORTS))}; "
                                         f"listed but gone: {sorted(set(LOCAL_IMPORTS) - local)}")
    assert all(LOCAL_IMPORTS.values())
