"""Stages run inside a conda env the way `conda activate` runs them: activate.d hooks included.

The seed's slime env prepends pip's cuDNN 9.17 to LD_LIBRARY_PATH from
etc/conda/activate.d/; a fake prefix whose hook exports a variable proves that what the
hook sets reaches the child, through every launch path shoprld has: the plain argv, the
LocalLauncher via a stage spec, and a Ray entrypoint (a shell string, as Ray runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from shoprld.daemon.foundation.config.condaenv import activation_argv
from shoprld.daemon.foundation.config.config import config_from_dict
from shoprld.daemon.foundation.config.configsections import ProcessSpec
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.services.processes import LocalLauncher
from shoprld.daemon.services.ray import entrypoint_of
from shoprld.daemon.round.plan import RoundPlan, resolve
from tests.roundctx import standalone_context

DUMP = "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    """A fake conda env: bin/ with a tool, and an activate.d hook like the seed's cudnn_ldpath.sh."""
    p = tmp_path / "envs" / "slime env"  # a space in the path, on purpose
    (p / "bin").mkdir(parents=True)
    (p / "etc" / "conda" / "activate.d").mkdir(parents=True)
    (p / "etc" / "conda" / "activate.d" / "cudnn_ldpath.sh").write_text(
        'export SHOPRLD_HOOK_RAN="yes from $CONDA_PREFIX"\n'
        'export LD_LIBRARY_PATH="$CONDA_PREFIX/lib/nvidia/cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n')
    (p / "etc" / "conda" / "activate.d" / "not-a-hook.txt").write_text("export SHOULD_NOT=1\n")
    tool = p / "bin" / "envtool"
    tool.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"{DUMP}\" \"$@\"\n")
    tool.chmod(0o755)
    return p


def run(argv: list[str], env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONDA", "SHOPRLD_HOOK", "SHOULD_NOT"))}
    env["LD_LIBRARY_PATH"] = "/usr/lib/system-cudnn-9.8"
    return env


def test_activation_runs_the_hooks_and_puts_the_env_first(prefix: Path) -> None:
    """The hook's variable reaches the child, LD_LIBRARY_PATH gets the env's lib first, the
    env's bin/ is first on PATH, and only *.sh hooks run."""
    got = run(activation_argv(prefix, ["envtool", "a b", "$X", "'q'"]), base_env())
    env = got["env"]
    assert env["SHOPRLD_HOOK_RAN"] == f"yes from {prefix}"
    assert env["LD_LIBRARY_PATH"] == f"{prefix}/lib/nvidia/cudnn/lib:/usr/lib/system-cudnn-9.8"
    assert env["PATH"].split(":")[0] == f"{prefix}/bin"
    assert env["CONDA_PREFIX"] == str(prefix) and env["CONDA_DEFAULT_ENV"] == "slime env"
    assert "SHOULD_NOT" not in env
    assert got["argv"] == ["a b", "$X", "'q'"]


@pytest.mark.anyio
async def test_a_stage_with_conda_prefix_gets_the_hooks_env_through_the_local_launcher(
        prefix: Path, tmp_path: Path) -> None:
    """RoundContext.start wraps a spec with conda_prefix; the LocalLauncher child sees the hook's env."""
    cfg = config_from_dict({"campaign": {"name": "c", "rounds": 1, "steps_per_round": 1},
                            "storage": {"repo": str(tmp_path), "ephemeral_root": str(tmp_path / "eph")},
                            "train": {"command": ["true"]}, "wandb": {"enabled": False}}, tmp_path / "c.toml")
    layout = Layout.from_config(cfg, environ={})
    ctx = standalone_context(RoundPlan(cfg, layout, 0, base_env=base_env()), launcher=LocalLauncher())
    for spec, name in ((ProcessSpec(conda_prefix=prefix), "conda"), (ProcessSpec(), "plain")):
        dump = tmp_path / "dump.py"  # a file: DUMP's braces would read as {placeholders} in a template
        dump.write_text(DUMP)
        cmd = ["envtool"] if name == "conda" else [sys.executable, str(dump)]
        with anyio.fail_after(30):
            child = await ctx.start(name, cmd + ["x y"], spec, state=name.upper())
            assert await child.wait() == 0
        got = json.loads(ctx.log_path(name.upper()).read_text().strip().splitlines()[-1])
        if name == "conda":
            assert got["env"]["SHOPRLD_HOOK_RAN"] == f"yes from {prefix}"
            assert got["env"]["LD_LIBRARY_PATH"].startswith(f"{prefix}/lib/nvidia/cudnn/lib:")
        else:  # a plain venv or bare interpreter: launched as is, nothing activated
            assert "SHOPRLD_HOOK_RAN" not in got["env"] and "CONDA_PREFIX" not in got["env"]
            assert got["env"]["LD_LIBRARY_PATH"] == "/usr/lib/system-cudnn-9.8"
        assert got["argv"] == ["x y"]


def test_plain_specs_are_not_wrapped(tmp_path: Path) -> None:
    """Without conda_prefix the argv is launched unchanged (plain venvs stay supported)."""
    cfg = config_from_dict({"campaign": {"name": "c", "rounds": 1, "steps_per_round": 1},
                            "storage": {"repo": str(tmp_path)}, "train": {"command": ["true"]}}, tmp_path / "c.toml")
    rv = resolve(cfg, Layout.from_config(cfg, environ={}), 0)
    argv = ["/venv/bin/python", "-m", "tool", "a b"]
    assert rv.wrap(argv, ProcessSpec()) == argv
    assert rv.wrap(argv, ProcessSpec(conda_prefix=Path("/env")))[-4:] == argv


def test_the_ray_entrypoint_activates_the_env_too(prefix: Path, tmp_path: Path) -> None:
    """A Ray entrypoint (a shell string, run with sh -c as Ray does) built from a wrapped argv
    still runs the hooks and keeps every argument intact."""
    entry = entrypoint_of(activation_argv(prefix, ["envtool", "a b", "$HOME", "x;y"]), tmp_path)
    got = run(["/bin/sh", "-c", entry], base_env())
    assert got["env"]["SHOPRLD_HOOK_RAN"] == f"yes from {prefix}"
    assert got["env"]["LD_LIBRARY_PATH"].startswith(f"{prefix}/lib/nvidia/cudnn/lib:")
    assert got["argv"] == ["a b", "$HOME", "x;y"]
    assert got["env"]["PWD"] == str(tmp_path)
