"""The storage etiquette, the secrets path and the redaction in logs."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoprld.daemon.config import load_config
from shoprld.daemon.errors import ConfigError
from shoprld.daemon.layout import Layout
from shoprld.daemon.secrets import load_secrets

ROOT = Path(__file__).resolve().parents[2]
CANARY = "canary-7f3e9a1b-wandb-SECRET"
CANARY2 = "canary-2-bailian-SECRET-value"


def campaign(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "repo").mkdir(exist_ok=True)
    text = f"""
[campaign]
name = "etq"
experiment = "exp1"
rounds = 1
steps_per_round = 2
[storage]
repo = "repo"
ephemeral_root = "eph"
[train]
command = ["{{python}}", "t.py", "--wandb-key-never-here"]
secrets = ["WANDB_API_KEY"]
[gate]
analyze_secrets = ["BAILIAN_API_KEY"]
{extra}
"""
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_layout_follows_the_etiquette(tmp_path: Path) -> None:
    """BREV_ROOT/CACHE_ROOT/CAMPAIGN_ROOT/EXP_DIR and every child env path are under the volume."""
    cfg = load_config(campaign(tmp_path))
    lay = Layout.from_config(cfg, environ={"HOME": "/nonexistent-home", "XDG_STATE_HOME": str(tmp_path / "st")})
    eph = tmp_path / "eph"
    assert lay.brev_root == eph / "nemo-rl" / "ubuntu"  # ${USER:-ubuntu}
    assert lay.cache_root == lay.brev_root / "cache"
    assert lay.campaign_root == lay.brev_root / "nemo-rl-auto-research" / "etq"
    assert lay.exp_dir == lay.campaign_root / "exp1"
    env = lay.child_env(cfg, base={})
    for key in ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME",
                "TRITON_CACHE_DIR", "UV_CACHE_DIR", "PIP_CACHE_DIR", "XDG_CACHE_HOME", "WANDB_CACHE_DIR"):
        assert Path(env[key]).is_relative_to(lay.cache_root), key
    assert Path(env["WANDB_DIR"]).is_relative_to(lay.exp_dir)
    # TMPDIR/RAY_TMPDIR: the exp dir, or (long paths: AF_UNIX sockets) a short link to it.
    assert env["TMPDIR"] == str(lay.child_tmp) and env["RAY_TMPDIR"] == str(lay.child_ray_tmp)
    lay.ensure(cfg)
    assert Path(env["TMPDIR"]).resolve() == lay.tmp.resolve()
    assert Path(env["RAY_TMPDIR"]).resolve() == lay.ray_tmp.resolve()
    assert len(env["TMPDIR"]) <= 48
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert lay.state_dir == tmp_path / "st" / "shoprld" / "etq"


def test_user_and_state_directory_from_environment(tmp_path: Path) -> None:
    """USER names the Brev root; systemd's STATE_DIRECTORY wins for the state dir."""
    cfg = load_config(campaign(tmp_path))
    lay = Layout.from_config(cfg, environ={"USER": "alice", "STATE_DIRECTORY": "/var/lib/shoprld/etq"})
    assert lay.brev_root.name == "alice" and lay.state_dir == Path("/var/lib/shoprld/etq")


def test_blank_cache_gives_a_private_cache(tmp_path: Path) -> None:
    """storage.blank_cache puts the cache under the experiment dir instead of the shared root."""
    path = campaign(tmp_path)
    path.write_text(path.read_text().replace("[storage]", "[storage]\nblank_cache = true"))
    cfg = load_config(path)
    lay = Layout.from_config(cfg, environ={})
    assert lay.cache_root.is_relative_to(lay.exp_dir)


def test_ensure_creates_tree_and_runs_link_but_never_replaces_a_real_dir(tmp_path: Path) -> None:
    """ensure() makes the exp and cache dirs and <repo>/runs -> $EXP_DIR/runs; a real runs/ dir is refused."""
    cfg = load_config(campaign(tmp_path))
    lay = Layout.from_config(cfg, environ={"HOME": str(tmp_path / "home")})
    lay.ensure(cfg)
    assert (lay.exp_dir / "logs").is_dir() and (lay.cache_root / "huggingface").is_dir()
    assert os.readlink(lay.repo / "runs") == str(lay.runs)
    (lay.repo / "runs").unlink()
    (lay.repo / "runs").mkdir()
    with pytest.raises(ConfigError, match="is a real directory"):
        lay.ensure(cfg)


@pytest.mark.parametrize("content,expect", [
    (f"WANDB_API_KEY={CANARY}\n", CANARY),
    (f"export WANDB_API_KEY={CANARY}\n", CANARY),
    (f"WANDB_API_KEY={CANARY}\r\nOTHER=1\r\n", CANARY),
    (f'WANDB_API_KEY="{CANARY}"\n', CANARY),
])
def test_env_file_variants_load_without_touching_os_environ(tmp_path: Path, content: str, expect: str) -> None:
    """.env with export prefixes, CRLF and quotes loads into a mapping, never os.environ."""
    (tmp_path / ".env").write_text(content)
    s = load_secrets(tmp_path / ".env")
    assert s.values["WANDB_API_KEY"] == expect
    assert "WANDB_API_KEY" not in os.environ or os.environ["WANDB_API_KEY"] != expect
    assert CANARY not in repr(s)


def test_missing_env_file_and_empty_key_are_one_line_errors(tmp_path: Path) -> None:
    """A missing .env or a key without a value names the key and the file."""
    need = {"WANDB_API_KEY": "wandb.mode=online"}
    with pytest.raises(ConfigError, match=r"missing \.env file.*WANDB_API_KEY"):
        load_secrets(tmp_path / ".env").require(need)
    (tmp_path / ".env").write_text("WANDB_API_KEY=\n")
    with pytest.raises(ConfigError, match=r"\.env: WANDB_API_KEY is not set"):
        load_secrets(tmp_path / ".env").require(need)
    (tmp_path / ".env").write_text("")
    with pytest.raises(ConfigError, match="WANDB_API_KEY is not set"):
        load_secrets(tmp_path / ".env").require(need)


def test_redaction_masks_secrets_in_structlog_and_foreign_records(tmp_path: Path) -> None:
    """Every loaded secret value is masked in structlog events and stdlib records (e.g. httpx)."""
    from shoprld.daemon import logs

    (tmp_path / ".env").write_text(f"WANDB_API_KEY={CANARY}\nBAILIAN_API_KEY={CANARY2}\n")
    logs.set_secrets(load_secrets(tmp_path / ".env"))
    buf = io.StringIO()
    logs.configure(log_file=tmp_path / "shoprld.log", json_stdout=True, stream=buf)
    logs.get_logger().info("stage.spawn", argv=["x", f"--key={CANARY}"], nested={"k": [CANARY2]})
    logging.getLogger("httpx").warning("GET https://api.example/?token=%s", CANARY)
    text = buf.getvalue() + (tmp_path / "shoprld.log").read_text()
    assert CANARY not in text and CANARY2 not in text
    assert "***" in text
    assert any(json.loads(line)["event"] == "stage.spawn" for line in buf.getvalue().splitlines())


def test_check_prints_layout_and_masks_canary_everywhere(tmp_path: Path) -> None:
    """`shoprld check` with another HOME/USER shows every path under the ephemeral root, every cache
    var under the shared cache, and the canary appears nowhere in its output or in any file."""
    c = campaign(tmp_path)
    (tmp_path / "repo" / ".env").write_text(f"WANDB_API_KEY={CANARY}\nBAILIAN_API_KEY={CANARY2}\n")
    env = {**os.environ, "HOME": str(tmp_path / "otherhome"), "USER": "someone"}
    proc = subprocess.run([sys.executable, "-m", "shoprld.daemon.cli", "check", "-c", str(c)], env=env,
                          capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert CANARY not in out and CANARY2 not in out
    assert "WANDB_API_KEY" in out  # the name is shown, never the value
    eph = str(tmp_path / "eph" / "nemo-rl" / "someone")
    for line in out.splitlines():
        if line.strip().startswith(("HF_", "TORCH_HOME", "TRITON", "UV_", "PIP_", "XDG_", "WANDB_CACHE")):
            assert f"{eph}/cache" in line, line
        if line.strip().startswith(("RAY_TMPDIR", "TMPDIR", "WANDB_DIR")):
            assert f"{eph}/nemo-rl-auto-research/etq/exp1" in line, line  # itself, or what its link is
    assert not (tmp_path / "eph").exists(), "check must have no side effects"
    for p in tmp_path.rglob("*"):
        if p.is_file() and p.name != ".env":
            assert CANARY.encode() not in p.read_bytes(), p
