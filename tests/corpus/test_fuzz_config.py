"""TOML config fuzzer (issue 15): valid campaign files, mutated at a random key (a random type or
value, the key deleted, or an unknown key added), through `shoprld check -c FILE` (the CLI's main,
in-process: the same argv parsing, handlers and error mapping as the console script).

Invariants: the exit code is 0 or 3 (check's documented set); on 3, stderr is exactly one line,
with no traceback, and on 0 it is empty; no canary secret from `.env` appears in stdout or stderr.
The default suite runs a bounded number of examples; the slow suite many more, with a fixed seed.
Every failing example hypothesis found is kept in REGRESSIONS (after its fix).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from shoprld.daemon.ops import cli
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.ops.demo import create_tree

ROOT = Path(__file__).resolve().parents[2]
CANARY_WANDB = "wandb-canary-15-fuzz-0a1b2c3d4e5f"
CANARY_BAILIAN = "bailian-canary-15-fuzz-6a7b8c9d"
CHECK_CODES = {0, 3}


# -- a TOML writer for the mapping tomllib reads (str, int, float, bool, datetime, list, table) -------
def _key(k: str) -> str:
    return json.dumps(k)  # a quoted key is always valid


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON escapes are TOML basic-string escapes (\uXXXX, \", \\, \n)
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def dump_toml(data: dict[str, Any]) -> str:
    """Top-level scalars first, then one [table] per top-level table (nested tables inline)."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"\n[{_key(k)}]")
            lines += [f"{_key(kk)} = {_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


# -- the valid bases ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The demo tree's campaign.toml and the seed's recipe (its repo pointed at a temp checkout
    with a canary .env), each as (file to overwrite, parsed mapping)."""
    root = tmp_path_factory.mktemp("fuzz")
    demo = create_tree(root / "demo", fast=True, rounds=2)
    (root / "demo" / "repo" / ".env").write_text(f"WANDB_API_KEY={CANARY_WANDB}\nBAILIAN_API_KEY={CANARY_BAILIAN}\n")
    slime_repo = root / "slime" / "repo"
    slime_repo.mkdir(parents=True)
    (slime_repo / ".env").write_text(f"WANDB_API_KEY={CANARY_WANDB}\nBAILIAN_API_KEY={CANARY_BAILIAN}\n")
    slime = tomllib.loads((ROOT / "run" / "slime-4xa800.toml").read_text())
    slime["storage"].update(repo=str(slime_repo), project_root=str(slime_repo),
                            state_dir=str(root / "slime" / "state"))
    slime_file = root / "slime" / "campaign.toml"
    slime_file.write_text(dump_toml(slime))
    assert tomllib.loads(slime_file.read_text()) == slime  # the writer round-trips the recipe
    return {"demo": (demo, tomllib.loads(demo.read_text())), "slime": (slime_file, slime)}


def run_check(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["check", "-c", str(path)])
    return code, out.getvalue(), err.getvalue()


def assert_invariants(code: int, out: str, err: str) -> None:
    assert code in CHECK_CODES, (code, err)
    assert "Traceback" not in out + err, err
    lines = err.strip().splitlines()
    assert len(lines) == (1 if code else 0), err
    if code:
        assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    for canary in (CANARY_WANDB, CANARY_BAILIAN):
        assert canary not in out and canary not in err


# -- mutations ----------------------------------------------------------------------------------
def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path (tables and list items) in a parsed config."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_TEMPLATES = st.sampled_from([
    "{save_dir}", "{save_dir:{seed}}", "{round:03d}", "{save_dir!r}", "{repo.upper}", "{save_dir[0]}", "{", "}",
    "{}", "{0}", "{{literal}}", "{no_such}", "{python}", "", " ", "\x00", "/etc", "-1", "1e9", "nan", "true",
    "../../..", "a/b", "{campaign}", "http://[::1", "http://127.0.0.1:99999", "a" * 300, "53GiB", "9" * 40 + "GiB", "9" * 400 + "d", "30m", "2026-12-01T08:00:00Z", "no-such-program-15",
])
_SCALARS = st.one_of(
    st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, -1, 1, 10**9, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e9, 1e-9, 0.5]),
    _TEXT, _TEMPLATES, st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "PATH", "save_dir", "x y", "="]), inner,
                                                 max_size=2)), max_leaves=4)


@st.composite
def mutated(draw: st.DrawFn, bases: dict[str, tuple[Path, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(bases)))
    data = json.loads(json.dumps(bases[name][1], default=str))  # a deep copy (no datetimes in the bases)
    paths = list(_paths(data))
    path = draw(st.sampled_from(paths))
    parent: Any = data
    for part in path[:-1]:
        parent = parent[part]
    action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
    if action == "set":
        parent[path[-1]] = draw(_VALUES)
        note(f"{name}: set {path} = {parent[path[-1]]!r}")
    elif action == "delete":
        del parent[path[-1]]
        note(f"{name}: delete {path}")
    else:
        # A key the schema knows but the base leaves at its default (storage.ledger,
        # storage.user, ...), or one it does not know.
        section = path[0] if isinstance(data.get(path[0]), dict) else None
        target = data[section] if section else data
        known = sorted(_schema_keys(section))
        key = draw(st.sampled_from([*known, "unknown_key_15", "roundz", "save_dir"]))
        target[key] = draw(_VALUES)
        note(f"{name}: add {section}.{key} = {target[key]!r}")
    return name, data


def _schema_keys(section: str | None) -> set[str]:
    fields = Config.model_fields
    if section is None:
        return {k for k in fields if k != "source"}
    model: Any = fields[section].annotation if section in fields else None
    return set(getattr(model, "model_fields", {}) or {"a_var"})


def check_one(bases: dict[str, tuple[Path, dict[str, Any]]], name: str, data: dict[str, Any]) -> None:
    path = bases[name][0]
    original = path.read_text()
    try:
        path.write_text(dump_toml(data))
        assert_invariants(*run_check(path))
    finally:
        path.write_text(original)


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                       HealthCheck.too_slow], database=None)


def test_the_bases_are_ready_or_not_ready_in_one_line(bases: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """Unmutated: the demo tree is ready (exit 0); the seed's recipe is NOT READY here, in one line."""
    for name, want in (("demo", 0), ("slime", 3)):
        code, out, err = run_check(bases[name][0])
        assert_invariants(code, out, err)
        assert code == want, (name, err)


@settings(max_examples=50, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_fuzzed_configs_hold_the_invariants(bases: dict[str, tuple[Path, dict[str, Any]]], data: st.DataObject) -> None:
    """A valid config mutated at a random key: check exits 0 or 3, one stderr line, no traceback, no canary."""
    name, mutated_cfg = data.draw(mutated(bases))
    check_one(bases, name, mutated_cfg)


@pytest.mark.slow
@seed(15)
@settings(max_examples=2000, **_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_fuzzed_configs_hold_the_invariants_many(bases: dict[str, tuple[Path, dict[str, Any]]],
                                                 data: st.DataObject) -> None:
    """The same, 2,000 examples from a fixed seed (slow suite)."""
    name, mutated_cfg = data.draw(mutated(bases))
    check_one(bases, name, mutated_cfg)


# -- what the fuzzing found, kept after the fix ---------------------------------------------------
# (base, key path, value | DELETE): each broke an invariant before its fix (exit 1, "unexpected
# error", or a config `check` called ready). Found by mutating keys the bases leave at their
# defaults, which is why the "add" mutation now draws from the schema's own keys.
DELETE = object()
REGRESSIONS: dict[str, tuple[str, tuple[Any, ...], Any]] = {
    "ledger-unknown-placeholder": ("demo", ("storage", "ledger"), "{x}"),  # KeyError: 'x'
    "ledger-lone-brace": ("demo", ("storage", "ledger"), "{"),  # ValueError: Single '{'
    "ledger-empty": ("demo", ("storage", "ledger"), ""),  # the ledger would be the repo dir
    "user-nul": ("demo", ("storage", "user"), "a\x00b"),  # ValueError: embedded null byte
    "repo-nul": ("slime", ("storage", "repo"), "/tmp/re\x00po"),  # ValueError: embedded null byte
    "user-traversal": ("demo", ("storage", "user"), "../../x"),  # BREV_ROOT moved off the volume: ready
    "shopsim-url-bad-ipv6": ("demo", ("shopsim", "url"), "http://[::1"),  # ValueError: Invalid IPv6 URL
    "val-url-bad-port": ("slime", ("val", "url"), "http://127.0.0.1:99999"),  # crashed in round values
    "name-too-long": ("demo", ("campaign", "name"), "a" * 300),  # ENAMETOOLONG at run: ready
    "rounds-bool": ("demo", ("campaign", "rounds"), True),  # one round: ready
    "interval-nan": ("demo", ("disk", "interval"), float("nan")),  # never wakes: ready
    "size-overflow": ("demo", ("disk", "ballast"), "9" * 400 + "GiB"),  # OverflowError: int(inf)
    "duration-overflow": ("slime", ("campaign", "deadline"), "9" * 400 + "d"),  # OverflowError
    "vars-forward": ("slime", ("vars", "slime_dir"), "{nvidia}/slime"),  # KeyError at check
    "project-root-missing": ("demo", ("storage", "project_root"), "/nonexistent/shoprld-15"),  # ready
}


def _apply(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(data, default=str))
    parent: Any = data
    for part in path[:-1]:
        parent = parent.setdefault(part, {}) if isinstance(parent, dict) else parent[part]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return data


@pytest.mark.parametrize("case", sorted(REGRESSIONS) or [pytest.param("none", marks=pytest.mark.skip("none yet"))])
def test_fuzzer_regressions(bases: dict[str, tuple[Path, dict[str, Any]]], case: str) -> None:
    """Every example the fuzzing found, replayed: refused (exit 3) in one line, no traceback, no canary."""
    name, path, value = REGRESSIONS[case]
    file = bases[name][0]
    original = file.read_text()
    try:
        file.write_text(dump_toml(_apply(bases[name][1], path, value)))
        code, out, err = run_check(file)
    finally:
        file.write_text(original)
    assert_invariants(code, out, err)
    assert code == 3 and ".".join(map(str, path)) in err, err
