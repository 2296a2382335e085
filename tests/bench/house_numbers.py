"""The house's numbers for issue 29's closing note: import pairs (every shoprld import, as
tests/unit/test_architecture.py counts them), the longest functions, the engine's callbacks
and Shutdown's arguments.

    .venv/bin/python tests/bench/house_numbers.py [checkout]   # default: this checkout
"""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path


def main(root: Path) -> None:
    spec = importlib.util.spec_from_file_location("arch", root / "tests/unit/test_architecture.py")
    assert spec is not None and spec.loader is not None
    arch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arch)
    pairs = {(s, d) for s, edges in arch.GRAPH.items() for d, _, _ in edges}
    print(f"modules {len(arch.MODULES)}, import pairs {len(pairs)}, "
          f"from core/ {sum(s.startswith('shoprld.daemon.core') for s, _ in pairs)}")
    funcs = []
    for f in [*(root / "daemon").rglob("*.py"), *(root / "states").rglob("*.py")]:
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((n.end_lineno - n.lineno + 1, f"{f.relative_to(root)}:{n.name}"))  # type: ignore[operator]
    print("longest functions:", ", ".join(f"{where} {n}" for n, where in sorted(funcs, reverse=True)[:6]))
    engine = ast.parse((root / "daemon/core/engine.py").read_text())
    init = next(n for n in ast.walk(engine) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    handed = [a for c in ast.walk(init) if isinstance(c, ast.Call) for a in [*c.args, *(k.value for k in c.keywords)]]
    callbacks = [a for a in handed if isinstance(a, ast.Lambda) or isinstance(a, ast.Attribute)
                 and isinstance(a.value, ast.Name) and a.value.id == "self" and a.attr.startswith("_")
                 and a.attr != "_raw_launcher"]
    print(f"Engine.__init__: {init.end_lineno - init.lineno + 1} lines, {len(callbacks)} callbacks into the engine")
    shutdown = ast.parse((root / "daemon/core/shutdown.py").read_text())
    sinit = next(m for c in shutdown.body if isinstance(c, ast.ClassDef) and c.name == "Shutdown"
                 for m in c.body if isinstance(m, ast.FunctionDef) and m.name == "__init__")
    print(f"Shutdown.__init__ arguments: {len(sinit.args.args) - 1 + len(sinit.args.kwonlyargs)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
