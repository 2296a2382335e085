"""The storage etiquette, the secrets path and the redaction in logs."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config import secrets as secrets_mod
from shoprld.daemon.foundation.config.secrets import Secrets, load_secrets
from shoprld.daemon.foundation.records.store import Store, replace_json

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
    from shoprld.daemon.foundation.system import logs

    (tmp_path / ".env").write_text(f"WANDB_API_KEY={CANARY}\nBAILIAN_API_KEY={CANARY2}\n")
    buf = io.StringIO()
    logs.configure(log_file=tmp_path / "shoprld.log", json_stdout=True, stream=buf,
                   redactor=load_secrets(tmp_path / ".env").redactor)
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
    proc = subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(c)], env=env,
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


# -- the redaction boundary and the state dir's modes (issue 15, serious bug 2) -------------------------
def _secrets_with(tmp_path: Path, *values: str) -> Secrets:
    keys = ("WANDB_API_KEY", "BAILIAN_API_KEY", "HF_TOKEN")
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in zip(keys, values)))
    return load_secrets(tmp_path / ".env")


def test_redactor_masks_every_string_of_a_json_like_value_keys_included(tmp_path: Path) -> None:
    """Strings at any depth (dict keys, lists, tuples) are masked; numbers, None and bools stay."""
    red = _secrets_with(tmp_path, CANARY, CANARY2).redactor
    doc = {"last_error": f"401 invalid key {CANARY}", CANARY2: [1, None, True, ("x", {"y": CANARY})], "n": 2.5}
    out = red.obj(doc)
    assert CANARY not in json.dumps(out) and CANARY2 not in json.dumps(out)
    assert out["last_error"] == "401 invalid key ***" and out["n"] == 2.5 and out["***"][:3] == [1, None, True]
    assert CANARY not in repr(red)


def test_store_redacts_journal_state_and_status_whoever_built_the_text(tmp_path: Path) -> None:
    """A record holding a secret (as a failure message quoting a child's output does) reaches
    journal.jsonl, state.json and status.json masked by the redactor given to the store, with
    the status written synchronously or in the background."""
    secrets = _secrets_with(tmp_path, CANARY, CANARY2)
    for name, store in (("given", Store(tmp_path / "a", redactor=secrets.redactor)),
                        ("background", Store(tmp_path / "b", redactor=secrets.redactor, status_in_background=True))):
        store.acquire_lock()
        try:
            msg = f"train.check_command did not report ready: 401 invalid key {CANARY} ({CANARY2})"
            store.append({"event": "transition", "message": msg, "snapshot": {"last_error": msg}})
            store.save({"last_error": msg, "children": {CANARY2: {"argv": [CANARY]}}})
            store.write_status({"last_error": msg, "warnings": [msg]})
        finally:
            store.release_lock()
        for f in ("journal.jsonl", "state.json", "status.json"):
            text = (store.dir / f).read_text()
            assert CANARY not in text and CANARY2 not in text, (name, f)
            assert "401 invalid key ***" in text, (name, f)


def test_state_dir_is_0700_and_its_files_0600_even_if_it_was_more_open(tmp_path: Path) -> None:
    """A state dir left 0755 with a 0644 status.json (as older versions and `shoprld demo` did) is
    tightened when the daemon takes the lock, and every file the store writes is 0600."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    (state / "status.json").write_text("{}\n")
    os.chmod(state / "status.json", 0o644)
    (state / ".status.json.1.tmp").write_text("")  # a stale temp file keeps its mode through O_CREAT
    os.chmod(state / ".status.json.1.tmp", 0o644)
    store = Store(state)
    store.acquire_lock()
    try:
        store.append({"event": "x"})
        store.save({"round": 0})
        store.write_status({"state": "TRAIN"})
        replace_json(state / "shopsim.witness", {"iteration": 1})
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in state.iterdir() if p.is_file()}
    finally:
        store.release_lock()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert {"lock", "daemon.pid", "journal.jsonl", "state.json", "status.json", "shopsim.witness"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_the_ledger_masks_with_the_given_redactor_and_stays_readable(tmp_path: Path) -> None:
    """A ledger masks with the redact callable it was given (the round's secrets), and the repo
    file keeps its ordinary, readable mode: it is the one record meant for others."""
    from shoprld.daemon.foundation.records.ledger import Ledger

    led = Ledger(tmp_path / "repo" / "demo.tsv", overflow_dir=tmp_path / "vol",
                 redact=_secrets_with(tmp_path, CANARY).redact)
    old = os.umask(0o022)
    try:
        led.append({"index": 0, "status": "crash", "description": f"401 invalid key {CANARY}"})
    finally:
        os.umask(old)
    text = led.path.read_text()
    assert CANARY not in text and "401 invalid key ***" in text
    assert stat.S_IMODE(led.path.stat().st_mode) == 0o644


def test_notifications_are_redacted_before_the_status_line_is_cut(tmp_path: Path) -> None:
    """STATUS= never carries a secret, not even its head when the 200-character cut falls inside it."""
    from shoprld.daemon.core.notify import MAX_STATUS_LEN, Notifier

    secrets = _secrets_with(tmp_path, CANARY)
    path = Path(tempfile.mkdtemp(prefix="ntf", dir="/tmp")) / "n.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": str(path)}, redactor=secrets.redactor)
        head = "FAILED in round-000 (1 of 1): "
        err = "x" * (MAX_STATUS_LEN - len(head) - len("STATUS=") - 4) + CANARY
        n.status_of({"state": "FAILED", "rounds": 1, "round": 0, "last_error": err})
        got = sock.recv(4096).decode()
        n.send(f"STATUS=bad key {CANARY}")
        got += sock.recv(4096).decode()
        n.close()
    finally:
        sock.close()
        path.unlink()
        path.parent.rmdir()
    assert CANARY[:6] not in got and "bad key ***" in got


# -- .env files that masking or the parser cannot handle (issue 15) ---------------------------------------
@pytest.mark.parametrize("line,key", [
    ("WANDB_API_KEY=info", "WANDB_API_KEY"),
    ("HF_TOKEN=x", "HF_TOKEN"),
    ("export MY_PASSWORD='1234567'", "MY_PASSWORD"),
    ("CUSTOM=abc", "CUSTOM"),  # a key the config hands to a child as a secret
])
def test_a_secret_shorter_than_8_characters_is_refused_naming_file_line_and_key(tmp_path: Path, line: str,
                                                                                key: str) -> None:
    """No real key is that short, and masking it would garble the logs: one line with the file, the
    line number and the key, never the value."""
    (tmp_path / ".env").write_text(f"# secrets\nDEBUG=1\n{line}\n")
    with pytest.raises(ConfigError) as err:
        load_secrets(tmp_path / ".env", extra_keys=["CUSTOM"])
    assert str(err.value) == (f"{tmp_path / '.env'}:3: {key} is shorter than 8 characters, too short to be a real "
                              "secret or to be masked in logs; fix: set the real value, or remove the line")


def test_short_values_of_non_secret_keys_and_8_character_secrets_load(tmp_path: Path) -> None:
    """DEBUG=1 is not a secret; an 8-character secret is masked."""
    (tmp_path / ".env").write_text("DEBUG=1\nLEVEL=info\nWANDB_API_KEY=abcd1234\n")
    s = load_secrets(tmp_path / ".env")
    assert s.values == {"DEBUG": "1", "LEVEL": "info", "WANDB_API_KEY": "abcd1234"}
    assert s.redact('{"level": "info", "key": "abcd1234"}') == '{"level": "info", "key": "***"}'


@pytest.mark.parametrize("text,line,says", [
    (f'A=1\nWANDB_API_KEY="{CANARY}\nB=2\n', 2, 'the value of WANDB_API_KEY has an unterminated " quote'),
    (f"A=1\n\nHF_TOKEN='{CANARY}\n", 3, "the value of HF_TOKEN has an unterminated ' quote"),
    (f'WANDB_API_KEY="{CANARY}" trailing\n', 1, "the value of WANDB_API_KEY has text after its closing quote"),
    (f"A=1\nnot a {CANARY} line\n", 2, "a line that is not KEY=value"),
])
def test_a_malformed_line_names_the_file_and_the_line_never_the_value(tmp_path: Path, text: str, line: int,
                                                                        says: str) -> None:
    """An unterminated quote is reported as such (not as "not set"), with the file and line number."""
    (tmp_path / ".env").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_secrets(tmp_path / ".env")
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / '.env'}:{line}: {says}; fix: ")
    assert CANARY not in msg


def _check(campaign_file: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", "check", "-c", str(campaign_file)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HOME": str(campaign_file.parent / "home")})


@pytest.mark.parametrize("kind", ["malformed", "unterminated", "short", "fifo", "not-utf8"])
def test_check_reports_a_bad_env_file_in_exactly_one_stderr_line(tmp_path: Path, kind: str) -> None:
    """`shoprld check` on a bad .env: exit 3 and one stderr line naming the file (and the line),
    without python-dotenv's own warning; a FIFO is refused without waiting for a writer."""
    c = campaign(tmp_path)
    env = tmp_path / "repo" / ".env"
    if kind == "fifo":
        os.mkfifo(env)
    else:
        env.write_bytes({
            "malformed": f"WANDB_API_KEY={CANARY}\nBAILIAN_API_KEY={CANARY2}\n=oops {CANARY2}\n".encode(),
            "unterminated": f'WANDB_API_KEY="{CANARY}\nBAILIAN_API_KEY={CANARY2}\n'.encode(),
            "short": f"WANDB_API_KEY={CANARY}\nBAILIAN_API_KEY=info\n".encode(),
            "not-utf8": f"WANDB_API_KEY={CANARY}\nBAILIAN_API_KEY=\xff{CANARY2}\n".encode("latin-1"),
        }[kind])
    proc = _check(c)
    assert proc.returncode == 3, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    where = f"{env}:" if kind == "fifo" else f"{env}:{ {'malformed': 3, 'unterminated': 1}.get(kind, 2)}: "
    assert proc.stderr.startswith(f"shoprld: {where}"), proc.stderr
    assert CANARY not in proc.stdout + proc.stderr and CANARY2 not in proc.stdout + proc.stderr


# -- fuzzing .env files (issue 15): a clean load, or one line naming the file; never a canary ------------
_HEX = "0123456789abcdef"
# Canaries hold characters no well-formed key has ('@', '%'), so an error that quotes a key never quotes one.
_canaries = st.text(_HEX, min_size=10, max_size=10).map(lambda h: f"cn@{h}%")
_keys = st.one_of(
    st.sampled_from(["WANDB_API_KEY", "BAILIAN_API_KEY", "HF_TOKEN", "MY_SECRET", "DB_PASSWORD", "DEBUG", "LEVEL"]),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True))
_chars = st.characters(blacklist_categories=("Cs",))
_values = st.one_of(_canaries, st.text(_chars, max_size=12), st.text("ab #'\"\\=$ \t", max_size=10),
                    st.tuples(st.text(_chars, max_size=4), _canaries).map("".join))


@st.composite
def _assignment(draw: st.DrawFn) -> str:
    key, value = draw(_keys), draw(_values)
    quote = draw(st.sampled_from(["", "", "'", '"', "'open", '"open']))
    if quote in ("'", '"'):
        value = f"{quote}{value}{quote}"
    elif quote:
        value = quote[0] + value
    export = draw(st.sampled_from(["", "export "]))
    eq = draw(st.sampled_from(["=", " = ", "= "]))
    tail = draw(st.sampled_from(["", " # a comment", " junk"]))
    return f"{export}{key}{eq}{value}{tail}"


_lines = st.one_of(
    _assignment(), _assignment(), st.just(""),
    _canaries.map(lambda c: f"# old key: {c}"),
    st.tuples(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="=\r\n"), min_size=1,
                      max_size=15), st.sampled_from(["", " "]), _canaries | st.just("")).map("".join),
)
_env_files = st.tuples(st.lists(_lines, max_size=8), st.sampled_from(["\n", "\r\n"]), st.booleans()).map(
    lambda t: (t[1].join(t[0]) + (t[1] if t[2] else "")).encode())


def _canaries_in(data: bytes) -> set[str]:
    import re

    return set(re.findall(r"cn@[0-9a-f]{10}%", data.decode("utf-8", errors="replace")))


def _judge_load(env: Path, data: bytes, extra_keys: Iterable[str] = ()) -> str | None:
    """Load ``data`` as ``env``: None for a clean load (every secret value masked), else the one-line error."""
    env.write_bytes(data)
    try:
        loaded = load_secrets(env, extra_keys=extra_keys)
    except ConfigError as exc:
        msg = str(exc)
        assert msg.startswith(f"{env}") and "\n" not in msg, msg
        assert not any(c in msg for c in _canaries_in(data)), msg
        return msg
    for k, v in loaded.values.items():
        if v and secrets_mod.is_secret_key(k, extra_keys):
            assert len(v) >= secrets_mod.MIN_SECRET_LEN and v not in loaded.redact(f"x{v}x"), k
    return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_env_files)
def test_any_env_file_loads_cleanly_or_fails_in_one_line_naming_the_file(tmp_path: Path, data: bytes) -> None:
    """Generated .env files (keys, values, quotes, comments, garbage, canaries): a clean load with every
    secret masked, or one ConfigError line that starts with the file and quotes no canary."""
    _judge_load(tmp_path / ".env", data, ["CUSTOM"])


def _fuzz_check(tmp_path: Path, data: bytes) -> None:
    c = tmp_path / "c.toml"
    if not c.exists():
        campaign(tmp_path)
    env = tmp_path / "repo" / ".env"
    expected = _judge_load(env, data, ["WANDB_API_KEY", "BAILIAN_API_KEY"])
    proc = _check(c)
    out = proc.stdout + proc.stderr
    assert not any(cn in out for cn in _canaries_in(data)), out
    if expected is None:  # the .env loaded: ready, or NOT READY for the minimal config's other gaps (one line)
        assert (proc.returncode, proc.stderr) == (0, "") or (
            proc.returncode == 3 and proc.stderr.startswith("shoprld: NOT READY: ") and proc.stderr.count("\n") == 1), proc.stderr
    else:
        assert proc.returncode == 3 and proc.stderr == f"shoprld: {expected}\n", proc.stderr


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_env_files)
def test_check_on_generated_env_files_says_ready_or_one_line_with_exit_3(tmp_path: Path, data: bytes) -> None:
    """`shoprld check` on generated .env files: ready (exit 0, stderr empty) or NOT READY (exit 3, one
    stderr line), or exactly the loader's one line with exit 3; no canary in stdout or stderr, no
    dotenv warning."""
    _fuzz_check(tmp_path, data)


@pytest.mark.slow
@seed(15)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_env_files)
def test_check_on_generated_env_files_many(tmp_path: Path, data: bytes) -> None:
    """The same, many more examples, with a fixed seed (slow suite)."""
    _fuzz_check(tmp_path, data)


def test_status_by_hand_finds_the_units_state_dir_under_its_instance_name(tmp_path: Path) -> None:
    """Issue 25: the unit's state dir is /var/lib/shoprld/<instance> (the campaign file's name);
    by hand, a campaign named otherwise still finds it there, and its own name wins when both exist."""
    from shoprld.daemon.foundation.records.paths import default_state_dir

    env = {"HOME": str(tmp_path / "home")}
    root = tmp_path / "var-lib-shoprld"
    assert default_state_dir("demo", env, instance="night1", system_root=root) == tmp_path / "home/.local/state/shoprld/demo"
    (root / "night1").mkdir(parents=True)
    assert default_state_dir("demo", env, instance="night1", system_root=root) == root / "night1"
    (root / "demo").mkdir()
    assert default_state_dir("demo", env, instance="night1", system_root=root) == root / "demo"
    assert default_state_dir("demo", {**env, "STATE_DIRECTORY": "/s"}, instance="night1", system_root=root) == Path("/s")
