"""identity.json: which campaign a state dir belongs to (issue 15, bug 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoprld.daemon.foundation.records import identity
from shoprld.daemon.foundation.system.errors import EXIT_CONFIG
from shoprld.daemon.foundation.records.identity import StateMismatch, ensure, expected
from shoprld.daemon.foundation.records.status import collect

A = expected("demo", "main", "/srv/a/repo", "/vol/a")
B = expected("demo", "main", "/srv/b/repo", "/vol/b")


def test_a_fresh_state_dir_gets_an_identity_with_a_creation_id(tmp_path: Path) -> None:
    """First use writes identity.json (the four fields and a random creation id); reuse is silent."""
    assert ensure(tmp_path, A) == "created"
    doc = json.loads((tmp_path / "identity.json").read_text())
    assert {k: doc[k] for k in identity.FIELDS} == A and len(doc["creation_id"]) == 32
    assert ensure(tmp_path, A) is None
    assert json.loads((tmp_path / "identity.json").read_text())["creation_id"] == doc["creation_id"]


@pytest.mark.parametrize("field,value", [("campaign", "other"), ("experiment", "exp2"), ("repo", "/srv/b/repo"),
                                         ("ephemeral_root", "/vol/b")])
def test_any_differing_field_is_refused_in_one_line_naming_the_dir_and_the_fix(tmp_path: Path, field: str,
                                                                              value: str) -> None:
    """A state dir recorded for another campaign: StateMismatch, exit 3, one line with both values."""
    ensure(tmp_path, A)
    with pytest.raises(StateMismatch) as info:
        ensure(tmp_path, {**A, field: value})
    msg = str(info.value)
    assert info.value.exit_code == EXIT_CONFIG and "\n" not in msg
    assert msg.startswith(f"{tmp_path}: this state dir belongs to another campaign")
    assert f"{field} {A[field]!r} there, {value!r} here" in msg and "--adopt-state" in msg


def test_adopt_state_takes_a_foreign_dir_over_and_records_where_it_came_from(tmp_path: Path) -> None:
    """`run --adopt-state` rewrites the identity (new creation id) and keeps the old one in adopted_from."""
    ensure(tmp_path, A)
    old = json.loads((tmp_path / "identity.json").read_text())
    assert ensure(tmp_path, B, adopt=True) == f"adopted {old['creation_id']}"
    new = json.loads((tmp_path / "identity.json").read_text())
    assert new["repo"] == B["repo"] and new["creation_id"] != old["creation_id"]
    assert new["adopted_from"]["creation_id"] == old["creation_id"]
    assert ensure(tmp_path, B) is None


def _legacy(tmp_path: Path, *, log: str, name: str = "demo") -> None:
    (tmp_path / "state.json").write_text(json.dumps({"campaign": name, "round": 1, "schema": 1, "children": {
        "trainer": {"log": log}}}))


def test_a_legacy_state_dir_is_adopted_when_what_it_recorded_agrees(tmp_path: Path) -> None:
    """State from before identities: adopted (identity written) when its name and paths fit."""
    _legacy(tmp_path, log="/vol/a/nemo-rl/u/x/logs/train.log")
    assert ensure(tmp_path, A) == "legacy"
    assert json.loads((tmp_path / "identity.json").read_text())["adopted_from"] == "legacy"


@pytest.mark.parametrize("log,name", [("/vol/b/logs/train.log", "demo"), ("/vol/a/logs/t.log", "other")])
def test_a_legacy_state_dir_of_another_campaign_is_refused(tmp_path: Path, log: str, name: str) -> None:
    """State from before identities whose name or recorded paths disagree: refused, nothing written."""
    _legacy(tmp_path, log=log, name=name)
    with pytest.raises(StateMismatch):
        ensure(tmp_path, A)
    assert not (tmp_path / "identity.json").exists()
    assert ensure(tmp_path, A, adopt=True) == "adopted legacy"


def test_status_refuses_to_show_another_campaigns_state(tmp_path: Path) -> None:
    """`status` of a campaign whose state dir records another campaign raises the same one line."""
    state = tmp_path / "state"
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'[campaign]\nname = "demo"\nexperiment = "main"\n[storage]\nrepo = "/srv/b/repo"\n'
                   f'ephemeral_root = "/vol/b"\nstate_dir = "{state}"\n')
    ensure(state, A)
    (state / "status.json").write_text(json.dumps({"campaign": "demo", "state": "DONE", "rounds_done": [{"round": 0}]}))
    with pytest.raises(StateMismatch, match="belongs to another campaign"):
        collect(cfg)
    ensure(state, B, adopt=True)
    assert collect(cfg)["state"] == "DONE"
