"""rehearse_tool's sizing of the emitted files (outside input: the emitter's YAML or JSON) and the
analyst stand-in's schema-driven answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.ops.rehearse_tool import _set_int, _swap_urls, size_down

DEMO = Path(__file__).resolve().parents[2] / "run" / "demo"


def _analyst():
    spec = importlib.util.spec_from_file_location("analyst_llm", DEMO / "analyst_llm.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _spec(tmp: Path, **over: object) -> dict[str, object]:
    return {"scratch": str(tmp), "episode_concurrency": 2, "val_concurrency": 3, "val_tasks": 2,
            "analyst_url": "http://127.0.0.1:9/v1",
            "swaps": [["127.0.0.1:5700", "127.0.0.1:41000"], ["127.0.0.1:30000", "127.0.0.1:42000"]], **over}


def test_block_yaml_is_sized_and_repointed(tmp_path: Path) -> None:
    """The real emitter's block YAML: ports, concurrencies, the split and the analyst config."""
    loop = tmp_path / "loop"
    loop.mkdir()
    split = tmp_path / "splits.json"
    split.write_text(json.dumps({"version": 1, "splits": {"train": [1, 2, 3], "val": [10, 11, 12, 13]}}))
    t2s = tmp_path / "configs" / "t2s.yaml"
    t2s.parent.mkdir()
    t2s.write_text("environment:\n  base_url: http://127.0.0.1:5700\nexperiment:\n  dotenv: ../.env\n"
                   "analyst_model:\n  base_url: https://dashscope.aliyuncs.com/compatible-mode/v1\n")
    (loop / "slime.yaml").write_text("shopsim_environment_base_url: http://127.0.0.1:5700\n"
                                     "shopsim_episode_concurrency: 32\nshopsim_max_steps: 30\n")
    (loop / "val.yaml").write_text(f"experiment:\n  concurrency: 32\n  seed: 20260830\ntasks:\n  split_file: {split}\n"
                                   "  split: val\n  sample_size: null\nmodel:\n  base_url: http://127.0.0.1:30000/v1\n")
    (loop / "analysis.yaml").write_text(f"online_analysis:\n  trace2skill_config: {t2s}\n")
    notes: list[str] = []
    size_down(loop, _spec(tmp_path), notes)
    slime = (loop / "slime.yaml").read_text()
    assert "127.0.0.1:41000" in slime and "shopsim_episode_concurrency: 2\n" in slime and "max_steps: 30" in slime
    val = (loop / "val.yaml").read_text()
    assert "  concurrency: 3\n" in val and "127.0.0.1:42000/v1" in val and "seed: 20260830" in val
    trimmed = json.loads((tmp_path / "split_file.json").read_text())
    assert trimmed["splits"] == {"train": [1, 2, 3], "val": [10, 11]}
    copy = tmp_path / "t2s.yaml"
    assert f"trace2skill_config: {copy}\n" in (loop / "analysis.yaml").read_text()
    body = copy.read_text()
    assert "127.0.0.1:41000" in body and "http://127.0.0.1:9/v1" in body and "dashscope" not in body
    assert f"dotenv: {(t2s.parent / '../.env').resolve()}" in body
    assert t2s.read_text().count("dashscope") == 1  # the original is never edited


def test_real_analyst_keeps_the_api_url(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.mkdir()
    t2s = tmp_path / "t2s" / "c.yaml"
    t2s.parent.mkdir()
    t2s.write_text("analyst_model:\n  base_url: https://dashscope.aliyuncs.com/v1\n")
    (loop / "analysis.yaml").write_text(f"online_analysis:\n  trace2skill_config: {t2s}\n")
    size_down(loop, _spec(tmp_path, analyst_url=None), [])
    assert "dashscope" in (tmp_path / "c.yaml").read_text()


@settings(max_examples=50, deadline=None)
@given(key_pad=st.sampled_from(["", "  ", "    "]), value=st.integers(-10**6, 10**6), json_style=st.booleans(),
       other=st.text(alphabet="abcdefghij_:0123456789 ", max_size=20))
def test_set_int_changes_only_that_key(key_pad: str, value: int, json_style: bool, other: str) -> None:
    line = f'{key_pad}"concurrency": {value},' if json_style else f"{key_pad}concurrency: {value}"
    text = f"{other.replace(chr(10), '')}x\n{line}\nnot_concurrency: 5\n"
    new = _set_int(text, "concurrency", 7)
    assert new.splitlines()[1] == line.replace(str(value), "7", 1)
    assert new.splitlines()[0] == text.splitlines()[0] and new.endswith("not_concurrency: 5\n")


@settings(max_examples=50, deadline=None)
@given(port=st.integers(1, 65535))
def test_swap_urls_never_rewrites_a_longer_port(port: int) -> None:
    """127.0.0.1:5700 -> scratch, but 127.0.0.1:57001 is another endpoint and stays."""
    text = f"a: http://127.0.0.1:5700/x\nb: http://127.0.0.1:5700{port}\n"
    assert _swap_urls(text, [["127.0.0.1:5700", "127.0.0.1:1"]]) == f"a: http://127.0.0.1:1/x\nb: http://127.0.0.1:5700{port}\n"


SCHEMAS = [
    {"type": "object", "properties": {"summary": {"type": "string", "minLength": 20},
                                      "severity": {"enum": ["low", "high"]},
                                      "steps": {"type": "array", "items": {"type": "integer", "minimum": 3},
                                                "minItems": 2},
                                      "ok": {"type": "boolean"}, "score": {"type": "number", "minimum": 0}},
     "required": ["summary", "severity", "steps", "ok", "score"]},
    {"type": "object", "properties": {"candidates": {"type": "array", "items": {
        "type": "object", "properties": {"operation": {"type": "string", "enum": ["ADD", "REWRITE"]},
                                         "target_chunk_id": {"type": ["string", "null"]},
                                         "content": {"type": "string"}},
        "required": ["operation", "target_chunk_id", "content"]}}}, "required": ["candidates"]},
]


def test_analyst_answers_validate_against_the_tool_schema() -> None:
    analyst = _analyst()
    for schema in SCHEMAS:
        body = {"model": "m", "tools": [{"type": "function", "function": {"name": "submit", "parameters": schema}}]}
        msg = analyst.answer(body)["choices"][0]["message"]
        call = msg["tool_calls"][0]["function"]
        assert call["name"] == "submit"
        jsonschema.validate(json.loads(call["arguments"]), schema)


def test_analyst_answers_the_forced_tool() -> None:
    analyst = _analyst()
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b")]
    got = analyst.answer({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "b"}}})
    assert got["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "b"
    assert analyst.answer({})["choices"][0]["message"]["content"] == "rehearsal"


def _real_loop(tmp: Path, splits: dict[str, object], skills: int, max_candidates: int | None = 6) -> Path:
    """An emitted round as the real emitter writes it: the split file in shopsimrl/tasks.py's format
    ({"splits": {"val": {"task_ids": [...]}}}) and analysis.yaml naming the round's SkillBank."""
    loop = tmp / "loop"
    loop.mkdir()
    split = tmp / "persona_splits.v1.json"
    split.write_text(json.dumps({"version": "v1", "splits": splits}))
    bank = tmp / "selected_skillbank.json"
    bank.write_text(json.dumps({"schema_version": "shopsimrl-skillbank-v1", "skills": [
        {"skill_id": f"c{i}", "content": "x", "enabled": True} for i in range(skills)]
        + [{"skill_id": "off", "content": "x", "enabled": False}]}))
    (loop / "val.yaml").write_text(f"experiment:\n  concurrency: 32\ntasks:\n  split_file: {split}\n  split: val\n")
    extra = f"  max_candidates: {max_candidates}\n" if max_candidates is not None else ""
    (loop / "analysis.yaml").write_text(f"online_analysis:\n  name: round-000\n  current_skillbank_path: {bank}\n{extra}")
    return loop


def test_real_split_format_is_sized_past_the_gates_regression(tmp_path: Path) -> None:
    """tasks.py's split records are cut (a bare-list-only trim left 400 val tasks in place), to
    more tasks than the gate's factors (2 enabled chunks + 3 candidates), never to fewer."""
    loop = _real_loop(tmp_path, {"train": {"task_ids": list(range(100)), "persona": True},
                                 "val": {"task_ids": list(range(100, 500)), "persona": True},
                                 "test": {"start": 500, "end": 900}}, skills=2, max_candidates=3)
    notes: list[str] = []
    size_down(loop, _spec(tmp_path, val_tasks=2), notes)
    trimmed = json.loads((tmp_path / "split_file.json").read_text())["splits"]
    assert trimmed["val"] == {"task_ids": [100, 101, 102, 103, 104, 105], "persona": True}
    assert trimmed["train"]["task_ids"] == list(range(100)) and trimmed["test"] == {"start": 500, "end": 900}
    assert not any("too small" in n for n in notes), notes


def test_start_end_split_and_default_candidates(tmp_path: Path) -> None:
    loop = _real_loop(tmp_path, {"val": {"start": 40, "end": 80, "persona": True}}, skills=10, max_candidates=None)
    size_down(loop, _spec(tmp_path, val_tasks=4), [])
    assert json.loads((tmp_path / "split_file.json").read_text())["splits"]["val"] == {
        "start": 40, "end": 57, "persona": True}  # 10 chunks + the real default 6 candidates + 1


def test_a_split_smaller_than_the_gates_regression_is_named(tmp_path: Path) -> None:
    """The 7-task synthetic catalog: 4 val tasks, a 10-chunk SkillBank: the real gate must refuse."""
    loop = _real_loop(tmp_path, {"train": {"task_ids": [0, 1, 2]}, "val": {"task_ids": [3, 4, 5, 6]}}, skills=10)
    notes: list[str] = []
    size_down(loop, _spec(tmp_path, val_tasks=4), notes)
    assert json.loads((tmp_path / "split_file.json").read_text())["splits"]["val"] == {"task_ids": [3, 4, 5, 6]}
    assert any(n.startswith("val split too small for the gate: 4 val tasks") and "up to 16 factors" in n
               for n in notes), notes


def test_an_emit_that_exits_1_after_writing_still_gets_its_yamls_sized(tmp_path: Path) -> None:
    """The daemon goes on with the YAMLs an emitter wrote (it judges emit by slime.yaml, not its
    exit), so the rehearsal must re-point them even when the emitter exits 1: a real process
    writes them, the wrapper records exit 1 and the scratch port."""
    import sys

    from shoprld.daemon.ops.rehearse_tool import main

    loop = tmp_path / "loop"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec(tmp_path)))
    write = ("import pathlib, sys; d = pathlib.Path(sys.argv[1]); d.mkdir(); "
             "(d / 'slime.yaml').write_text('shopsim_environment_base_url: http://127.0.0.1:5700\\n'); sys.exit(1)")
    rc = main(["--record", str(tmp_path / "rec"), "--stage", "train.emit_command", "--emit-spec", str(spec),
               "--loop-dir", str(loop), "--", sys.executable, "-c", write, str(loop)])
    assert rc == 1
    assert (loop / "slime.yaml").read_text() == "shopsim_environment_base_url: http://127.0.0.1:41000\n"
    (rec,) = (tmp_path / "rec").glob("*.json")
    assert json.loads(rec.read_text())["returncode"] == 1
