"""`shoprld check` refuses a command whose arguments name files that are not there (issue 28):
scripts, config files and YAMLs, not only the program; and a config with no `train.emit_command`
whose val and gate commands read the YAMLs only the emitter writes (`run` refuses that too)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.config.config import Config, config_from_dict
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.services.argpaths import arg_paths, argument_problems, path_like
from tests.unit.test_validate import check, refused_by_check, refused_by_run, tree

RECIPE = Path(__file__).resolve().parents[2] / "run" / "slime-4xa800.toml"


def _moved(value: Any, root: Path) -> Any:
    """The seed recipe's value with every /root/... path moved under ``root``."""
    if isinstance(value, str):
        return value.replace("/root/", f"{root}/")
    if isinstance(value, list):
        return [_moved(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _moved(v, root) for k, v in value.items()}
    return value


def _seed(root: Path) -> tuple[Config, Layout]:
    data = _moved(tomllib.loads(RECIPE.read_text()), root)
    data["storage"]["state_dir"] = str(root / "state")
    cfg = config_from_dict(data, root / "seed.toml")
    return cfg, Layout.from_config(cfg)


# What the seed's commands read, beyond their program (python3, ray, bash): under ShopSimRL/ unless absolute.
SEED_INPUTS = {
    "scripts/emit_training_loop_round.py": "train.emit_command[1]",
    "scripts/run_shopsimrl.py": "train.check_command[1]",
    "data/shopsim_train.jsonl": "train.check_command[6]",
    "slime/train.py": "train.command[1]",
    "slime/tools/convert_torch_dist_to_hf.py": "export.command[1]",
    "artifacts/cold-start/selected_skillbank.json": "train.emit_command[7]",
    "artifacts/cold-start/curriculum.json": "train.emit_command[9]",
    "/models/Qwen3.5-4B/": "train.command[44]",
    "/models/Qwen3.5-4B_torch_dist/": "train.command[46]",
}


def _make_seed_box(root: Path, skip: str = "") -> None:
    project = root / "autodl-tmp" / "ShopSimRL"
    project.mkdir(parents=True, exist_ok=True)
    for rel in SEED_INPUTS:
        if rel == skip:
            continue
        path = root / "autodl-tmp" / rel.strip("/") if rel.startswith("/") else project / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x\n")


def test_the_seeds_recipe_on_a_box_with_its_files_names_nothing(tmp_path: Path) -> None:
    """Every script, data file, model dir and cold-start file the seed's commands read is there:
    no problem. What the campaign writes (save dir, HF dir, loop YAMLs, W&B dir) and the served
    model's Hub id `Qwen/Qwen3.5-4B` are never asked for."""
    cfg, layout = _seed(tmp_path)
    _make_seed_box(tmp_path)
    assert [p.line() for p in argument_problems(cfg, layout)] == []


def test_the_seeds_recipe_without_its_tool_script_names_every_command_that_runs_it(tmp_path: Path) -> None:
    """scripts/run_shopsimrl.py missing: one line for each command that runs it (check, sidecar,
    val, analyze, gate, inject), each naming the key, the file, the configured element and the fix."""
    cfg, layout = _seed(tmp_path)
    _make_seed_box(tmp_path, skip="scripts/run_shopsimrl.py")
    found = argument_problems(cfg, layout)
    assert [p.key for p in found] == ["train.check_command[1]", "sidecar.command[1]", "val.command[1]",
                                      "gate.analyze_command[1]", "gate.command[1]", "inject.command[1]"]
    script = tmp_path / "autodl-tmp" / "ShopSimRL" / "scripts" / "run_shopsimrl.py"
    assert found[2].line() == (
        f"{tmp_path}/seed.toml: val.command[1]: {script} does not exist (as round-000 runs it) "
        "(got '{project_root}/scripts/run_shopsimrl.py'); fix: create it, or fix the path in the command "
        "(or the [vars] it is built from)")


def test_every_input_of_the_seed_is_asked_for(tmp_path: Path) -> None:
    """With nothing on the box, each input of SEED_INPUTS is named at its key (the first command
    that reads it), so none of them is skipped by the rules for what the campaign creates."""
    cfg, layout = _seed(tmp_path)
    keys = {p.key for p in argument_problems(cfg, layout)}
    assert set(SEED_INPUTS.values()) <= keys, set(SEED_INPUTS.values()) - keys


def test_check_refuses_a_missing_config_file_argument_and_accepts_it_once_there(tmp_path: Path) -> None:
    """A demo tree whose gate command takes `--config {recipe_dir}/gate-extra.yaml`: NOT READY
    (exit 3, one line on stderr naming gate.command[6]) until the file exists, then ready."""
    gate = r'"training", "online-gate", "\{loop_dir\}/gate.yaml"\]$'
    campaign = tree(tmp_path, **{gate: '"training", "online-gate", "{loop_dir}/gate.yaml", "--config", '
                                       '"{recipe_dir}/gate-extra.yaml"]'})
    extra = campaign.parent / "gate-extra.yaml"
    line = refused_by_check(campaign, f"gate.command[6]: {extra} does not exist")
    assert "(got '{recipe_dir}/gate-extra.yaml')" in line
    extra.write_text("k: v\n")
    code, _, err = check(campaign)
    assert (code, err) == (0, ""), err


def test_a_relative_script_is_taken_against_the_stages_cwd(tmp_path: Path) -> None:
    """`python3 tools/gate_extra.py` with gate.cwd set: judged in that dir, and the line says so."""
    tools = tmp_path / "tools-cwd"
    tools.mkdir()
    gate = r'^command = \["\{python\}", "\{demo_dir\}/shopsimrl.py", "training", "online-gate", "\{loop_dir\}/gate.yaml"\]$'
    campaign = tree(tmp_path / "t", **{gate: f'command = ["{{python}}", "sub/gate_extra.py"]\ncwd = "{tools}"'})
    refused_by_check(campaign, f"gate.command[1]: {tools}/sub/gate_extra.py does not exist (as round-000 runs it, "
                               f"taken against the stage's cwd {tools})")
    (tools / "sub").mkdir()
    (tools / "sub" / "gate_extra.py").write_text("")
    code, _, err = check(campaign)
    assert (code, err) == (0, ""), err




def _without_emit(root: Path) -> Path:
    campaign = tree(root)
    text = re.sub(r'^emit_command = \[[^\]]*\]\n', "", campaign.read_text(), flags=re.M | re.S)
    assert "emit_command" not in text
    campaign.write_text(text)
    return campaign


def test_no_emitter_but_commands_that_read_its_yamls_is_refused_by_check_and_run(tmp_path: Path) -> None:
    """No train.emit_command: the val, gate and tool commands read YAMLs nothing writes. check and
    run both refuse it (exit 3, one line naming train.emit_command and the readers); run writes nothing."""
    campaign = _without_emit(tmp_path)
    line = refused_by_check(campaign, "train.emit_command: is not set, but train.check_command[4]")
    for reader in ("val.command[3]", "gate.command[4]", "gate.analyze_command[4]", "sidecar.command[4]"):
        assert reader in line, line
    assert "slime.yaml, analysis.yaml, val.yaml, gate.yaml in the round's loop dir" in line, line
    assert "fix: set train.emit_command" in line
    refused_by_run(tmp_path, campaign, "train.emit_command: is not set")


# -- which elements are paths -----------------------------------------------------------------------
def test_path_like_elements() -> None:
    """Absolute and ./ paths and files with an input suffix are paths; Hub ids, modules, URLs,
    numbers, flags, shell text and search paths are not."""
    yes = ["/a/b", "./x", "../y.py", "scripts/run.py", "gate.yaml", "--config=/etc/x.toml", "data/t.jsonl"]
    no = ["Qwen/Qwen3.5-4B", "shop_env.pack_api", "http://127.0.0.1:8265", "0.6", "1e-6", "--colocate",
          "a:b:/c", "${LD_LIBRARY_PATH}", "cd /x && run.sh", "/", ".", "*.yaml", "--flag", "~/x.py", ""]
    assert [a for a in yes if path_like(a) is None] == []
    assert [a for a in no if path_like(a) is not None] == []


def test_interpreter_code_and_output_options_are_not_inputs(tmp_path: Path) -> None:
    """`python3 -c CODE` is code; `--output-dir /x` and `--log-file=/y.txt` are outputs; the rest,
    `--rollout-data` too (a word of the name, not a substring: "rollout" holds "out"), are inputs."""
    argv = ("python3", "-c", "/not/a/file.py", "--output-dir", "/out/x", "--log-file=/y.txt", "--config", "/in.yaml",
            "--rollout-data", "/d.jsonl")
    got = [(a.key, str(a.path), a.output) for a in arg_paths(argv, {}, "k", tmp_path)]
    assert got == [("k[4]", "/out/x", True), ("k[5]", "/y.txt", True), ("k[7]", "/in.yaml", False),
                   ("k[9]", "/d.jsonl", False)]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_path_like_never_crashes_and_returns_a_part_of_its_input(arg: str) -> None:
    """Whatever an argv element holds, path_like returns None or a suffix of it without whitespace."""
    got = path_like(arg)
    assert got is None or (arg.endswith(got) and got and not any(c.isspace() for c in got))
