"""``shoprld status``: the JSON contract, liveness, the human view, --watch, import hygiene."""

from __future__ import annotations

import io
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.records import status, statusview
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records import store
from shoprld.daemon.foundation.records.store import PID_FILE, STATUS_FILE
from tests.demotree import LOCK_HOLDER, ready_child, status_snapshot

SCHEMA = json.loads(status.SCHEMA_FILE.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
NOW = 1_800_000_000.0
HEAVY = ("pydantic", "structlog", "httpx", "anyio", "rich")


def snapshot(now: float = NOW, **over: Any) -> dict[str, Any]:
    """A realistic mid-campaign snapshot (``tests.demotree.status_snapshot``), at NOW by default."""
    return status_snapshot(now, **over)


@pytest.fixture
def campaign(tmp_path: Path) -> tuple[Path, Path]:
    """(campaign file, state dir) for a campaign named demo; the state dir does not exist yet."""
    state_dir = tmp_path / "state"
    cfg = tmp_path / "demo.toml"
    cfg.write_text(
        '[campaign]\nname = "demo"\nexperiment = "qwen35-4b"\nrounds = 5\nsteps_per_round = 20\n'
        f'[storage]\nstate_dir = "{state_dir}"\n[shopsim]\nurl = "http://127.0.0.1:5799"\nslots = 8\n'
        '[train]\ncommand = ["python", "train.py"]\n'
    )
    return cfg, state_dir


def write_snapshot(state_dir: Path, snap: dict[str, Any]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATUS_FILE).write_text(json.dumps(snap))


@pytest.fixture
def holder(campaign: tuple[Path, Path]) -> Iterator[subprocess.Popen[str]]:
    """A real process holding the campaign lock and pid file, like a running daemon."""
    _, state_dir = campaign
    with ready_child(LOCK_HOLDER, str(state_dir), stdin=subprocess.PIPE) as proc:
        yield proc


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoprld.daemon.ops.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


# -- the JSON contract ---------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12() -> None:
    """The shipped schema is itself a valid draft 2020-12 schema."""
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"].endswith("2020-12/schema")


@pytest.mark.parametrize("field", SCHEMA["required"])
def test_schema_rejects_a_missing_required_field(field: str) -> None:
    """Dropping any SPEC §6 field makes the output invalid (the schema can fail)."""
    out = dict(snapshot(), daemon={"alive": True, "pid": 1, "last_seen": NOW})
    VALIDATOR.validate(out)
    del out[field]
    assert not VALIDATOR.is_valid(out)


def test_schema_requires_nested_spec_fields() -> None:
    """Nested SPEC fields (daemon.alive, disk.inodes_free, rounds_done[].gate, ...) are required."""
    base = dict(snapshot(), daemon={"alive": True, "pid": 1, "last_seen": NOW})
    for path in (("daemon", "alive"), ("last_checkpoint", "committed_at"), ("disk", "inodes_free"),
                 ("shopsim", "healthy")):
        bad = json.loads(json.dumps(base))
        del bad[path[0]][path[1]]
        assert not VALIDATOR.is_valid(bad), path
    bad = json.loads(json.dumps(base))
    del bad["rounds_done"][0]["gate"]
    assert not VALIDATOR.is_valid(bad)


def test_never_started_gives_a_valid_object_from_the_toml(campaign: tuple[Path, Path]) -> None:
    """With no state dir at all, status names the campaign from the TOML and says NOT_STARTED."""
    cfg, state_dir = campaign
    out = status.collect(cfg)
    VALIDATOR.validate(out)
    assert out["campaign"] == "demo" and out["experiment"] == "qwen35-4b"
    assert out["state"] == "NOT_STARTED" and out["rounds"] == 5 and out["steps_per_round"] == 20
    assert out["daemon"] == {"alive": False, "pid": None, "last_seen": None, "started_at": None}
    assert out["shopsim"]["url"] == "http://127.0.0.1:5799" and out["shopsim"]["healthy"] is None
    assert not state_dir.exists()


def test_alive_daemon_is_reported_with_its_pid(campaign: tuple[Path, Path], holder: subprocess.Popen[str]) -> None:
    """A process holding the lock and named in daemon.pid is alive, whatever the snapshot says."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, snapshot(daemon={"pid": 1, "started_at": NOW}))
    out = status.collect(cfg)
    VALIDATOR.validate(out)
    assert out["daemon"]["alive"] is True
    assert out["daemon"]["pid"] == holder.pid
    assert out["daemon"]["last_seen"] == NOW - 1
    assert out["state"] == "TRAIN" and out["round"] == 2


def test_killed_daemon_is_not_alive_and_keeps_its_last_pid(campaign: tuple[Path, Path],
                                                           holder: subprocess.Popen[str]) -> None:
    """After SIGKILL the kernel drops the lock: not alive, last pid and last_seen kept."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, snapshot(daemon={"pid": holder.pid, "started_at": NOW}))
    holder.kill()
    holder.wait(timeout=10)
    assert (state_dir / PID_FILE).exists()  # SIGKILL leaves the pid file behind
    out = status.collect(cfg)
    VALIDATOR.validate(out)
    assert out["daemon"] == {"alive": False, "pid": holder.pid, "last_seen": NOW - 1, "started_at": NOW}


def test_existing_pid_without_the_lock_is_not_alive(campaign: tuple[Path, Path]) -> None:
    """A recorded pid reused by an unrelated process (this test) does not make the daemon alive."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, snapshot())
    (state_dir / PID_FILE).write_text(f"{os.getpid()}\n")
    (state_dir / "lock").write_text(f"{os.getpid()}\n")
    out = status.collect(cfg)
    assert out["daemon"]["alive"] is False and out["daemon"]["pid"] == os.getpid()


def test_daemon_starting_without_a_status_yet(campaign: tuple[Path, Path], holder: subprocess.Popen[str]) -> None:
    """A live lock holder with no status.json yet: alive, state null, and a warning says why."""
    cfg, _ = campaign
    out = status.collect(cfg)
    VALIDATOR.validate(out)
    assert out["daemon"]["alive"] is True and out["state"] is None
    assert any("starting" in w for w in out["warnings"])


def test_corrupt_status_file_still_gives_a_valid_object(campaign: tuple[Path, Path]) -> None:
    """A status.json that is not JSON is reported as a warning, never a crash."""
    cfg, state_dir = campaign
    state_dir.mkdir()
    (state_dir / STATUS_FILE).write_text('{"campaign": "demo", "sta')
    out = status.collect(cfg)
    VALIDATOR.validate(out)
    assert out["state"] is None and "not valid JSON" in out["warnings"][0]


def test_older_engine_snapshot_is_completed_from_the_skeleton(campaign: tuple[Path, Path]) -> None:
    """Fields missing from the snapshot are filled, so the output always meets the schema."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, {"campaign": "demo", "state": "VAL", "round": 1, "updated_at": NOW})
    out = status.collect(cfg)
    VALIDATOR.validate(out)
    assert out["state"] == "VAL" and out["rounds"] == 5


def test_missing_campaign_file_is_a_one_line_config_error(tmp_path: Path) -> None:
    """A wrong -c path raises ConfigError (exit 3) naming the file."""
    with pytest.raises(ConfigError, match="no such campaign file"):
        status.collect(tmp_path / "nope.toml")


def test_cli_json_output_meets_the_schema(campaign: tuple[Path, Path]) -> None:
    """`shoprld status --json` prints one object that validates against status.schema.json."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, snapshot(now=time.time()))
    res = cli("status", "--json", "-c", str(cfg))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    VALIDATOR.validate(out)
    assert out["daemon"]["alive"] is False and out["last_checkpoint"]["iteration"] == 59


@pytest.mark.parametrize("args", [("--json",), ()])
def test_status_path_imports_no_heavy_module(campaign: tuple[Path, Path], args: tuple[str, ...]) -> None:
    """--json and the piped human view import none of pydantic/structlog/httpx/anyio/rich."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, snapshot(now=time.time()))
    code = ("import sys, io; from shoprld.daemon.ops import cli; sys.stdout = io.StringIO(); "
            f"rc = cli.main(['status', *{list(args)!r}, '-c', {str(cfg)!r}]); "
            f"print(rc, [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert res.stderr.strip() == "0 []"


def test_file_names_match_the_store() -> None:
    """status.py's copies of the state dir's file names are store.py's names."""
    assert (status.LOCK_FILE, status.PID_FILE, status.STATUS_FILE) == (store.LOCK_FILE, store.PID_FILE,
                                                                        store.STATUS_FILE)


# -- the human view ------------------------------------------------------------------------


def human(out: dict[str, Any], now: float = NOW) -> str:
    return statusview.render_plain(statusview.view(out, now))


def test_human_view_mid_campaign() -> None:
    """The plain view shows round r/R, the bar with rate and ETA, checkpoint, disk, rounds, stop condition."""
    out = dict(snapshot(), daemon={"alive": True, "pid": 4242, "last_seen": NOW - 1, "started_at": NOW - 7380})
    text = human(out)
    assert "daemon     alive (pid 4242, up 2h03m)" in text
    assert "TRAIN  round-002 (3 of 5)" in text
    assert re.search(r"█+░+ 12/20  60%  41\.2 s/step  ETA 5m30s", text)
    assert "iteration 59, 2m05s ago, 52.9 GiB" in text
    assert "free 612.0 GiB of 2.0 TiB  (soft 64.0 GiB, hard 10.0 GiB)  12.3M inodes free  [ok]" in text
    assert "healthy, 16/48 slots free" in text
    assert re.search(r"trainer\s+5001\s+1h12m", text)
    assert re.search(r"round-001\s+0\.4375\s+success_rate\s+incomplete\s+kept\s+1h55m", text)
    assert "stop condition not yet met: 2/5 rounds, 6h12m left" in text
    assert "last error none" in text


def test_human_view_dead_daemon_says_when_it_was_last_seen() -> None:
    """A dead daemon reads "not running, last seen 3m ago" and the state is marked as stale."""
    out = dict(snapshot(updated_at=NOW - 180), daemon={"alive": False, "pid": 4242, "last_seen": NOW - 180})
    text = human(out)
    assert "not running, last seen 3m00s ago (last pid 4242)" in text
    assert "as last seen; the daemon is not running" in text


def test_human_view_parked_and_failed_states() -> None:
    """Parked for disk: the stop reason, the error and the hard level are all shown."""
    out = dict(snapshot(state="PAUSED_DISK", stop_reason="disk", last_error="free 1.2 GiB < soft 4.0 GiB",
                        warnings=["trainer stalled for 42m"]),
               daemon={"alive": False, "pid": 4242, "last_seen": NOW - 1})
    out["disk"] = dict(out["disk"], level="hard")
    text = human(out)
    assert "PAUSED_DISK" in text and "stopped: disk pressure" in text
    assert "last error free 1.2 GiB < soft 4.0 GiB" in text
    assert "[hard]" in text and "warnings   ! trainer stalled for 42m" in text


def test_human_view_shows_the_launchs_save_interval_and_a_fallback() -> None:
    """The last save.interval's summary (issue 17) is one line, in both its mid-round and its
    one-save-per-round forms; without one (fixed mode, or before a launch) there is no line."""
    mid = {"mode": "adaptive", "mid_round": True, "summary": "adaptive: a save every 6 steps (save 180s (guess), ...)"}
    text = human(dict(snapshot(saves=mid), daemon={"alive": True, "pid": 4242}))
    assert "saves      adaptive: a save every 6 steps" in text
    fallback = {"mode": "adaptive", "mid_round": False,
                "summary": "adaptive: one save per round (--save-interval 10000), as the seed: no disk room for a mid-round save"}
    assert "no disk room for a mid-round save" in human(dict(snapshot(saves=fallback), daemon={"alive": True}))
    assert "saves " not in human(dict(snapshot(), daemon={"alive": True}))


def test_human_view_never_started(campaign: tuple[Path, Path]) -> None:
    """Never started: the view names the campaign and says so, without a progress bar."""
    cfg, _ = campaign
    text = human(status.collect(cfg))
    assert "demo / qwen35-4b" in text and "never started" in text and "NOT_STARTED" in text
    assert "step " not in text


def test_human_view_plain_ascii_when_the_stream_is_not_utf8() -> None:
    """A non-UTF-8 stream gets an ASCII bar."""
    out = dict(snapshot(), daemon={"alive": True, "pid": 1})
    assert "##########" in statusview.render_plain(statusview.view(out, NOW, unicode=False))


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["pid", "started_at", "iteration", "bytes", "level", "round", "val", "gate", "log", "role", "url",
         "healthy", "free_slots", "deadline", "rounds_done", "rounds", "alive", "last_seen"]), inner, max_size=5),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(list(snapshot())), _values, max_size=12))
def test_human_view_never_raises_on_a_malformed_snapshot(garbage: dict[str, Any]) -> None:
    """Whatever a buggy engine writes, both renderers produce a view instead of a traceback."""
    from rich.console import Console

    merged = {**snapshot(), **garbage}
    items = statusview.view(merged, NOW)
    assert statusview.render_plain(items)
    console = Console(file=io.StringIO(), width=100)
    console.print(statusview.render_rich(items, console))


# -- terminals and --watch --------------------------------------------------------------------


def _run_in_pty(args: list[str], env: dict[str, str]) -> str:
    import pty

    leader, follower = pty.openpty()
    os.set_blocking(leader, False)
    proc = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks: list[bytes] = []
    sel = selectors.DefaultSelector()
    sel.register(leader, selectors.EVENT_READ)
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the pty
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def _color_codes(text: str) -> list[str]:
    params = [p for seq in re.findall(r"\x1b\[([0-9;]*)m", text) for p in seq.split(";")]
    return [p for p in params if p.isdigit() and (30 <= int(p) <= 38 or 90 <= int(p) <= 97)]


@pytest.mark.parametrize("no_color", [True, False])
def test_terminal_view_uses_rich_and_honours_no_color(campaign: tuple[Path, Path], no_color: bool) -> None:
    """On a terminal the view is rich; with NO_COLOR set it carries no colour codes at all."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, snapshot(now=time.time()))
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS="120", LINES="40")
    if no_color:
        env["NO_COLOR"] = "1"
    text = _run_in_pty([sys.executable, "-m", "shoprld.daemon.ops.cli", "status", "-c", str(cfg)], env)
    assert "round-002 (3 of 5)" in text and "stop condition not yet met" in text
    assert bool(_color_codes(text)) is not no_color


@pytest.mark.parametrize("as_json", [False, True])
def test_watch_refreshes_until_ctrl_c(campaign: tuple[Path, Path], as_json: bool) -> None:
    """--watch keeps printing fresh frames and exits 0 on SIGINT (Ctrl-C)."""
    cfg, state_dir = campaign
    write_snapshot(state_dir, snapshot(now=time.time(), step=3))
    args = [sys.executable, "-m", "shoprld.daemon.ops.cli", "status", "--watch", "--interval", "0.05", "-c", str(cfg)]
    # A terminal's Ctrl-C meets Python's own SIGINT handler; the child gets it even when this test
    # runs under a runner that started it with SIGINT ignored (a background job inherits SIG_IGN).
    proc = subprocess.Popen(args + (["--json"] if as_json else []), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    deadline = time.monotonic() + 20
    try:
        wrote = False
        while time.monotonic() < deadline:
            time.sleep(0.02)
            buf += proc.stdout.read() or b""
            if not wrote and buf.count(b"\n") > 2:
                write_snapshot(state_dir, snapshot(now=time.time(), step=17))  # progress while watching
                wrote = True
            if wrote and (b"17/20" in buf or b'"step": 17' in buf or b'"step":17' in buf):
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = buf.decode()
    if as_json:
        frames = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert {f["step"] for f in frames} >= {3, 17}
    else:
        assert text.count("campaign   demo") >= 2 and "3/20" in text and "17/20" in text


def test_shopsim_is_not_shown_healthy_once_the_campaign_ended() -> None:
    """After DONE (or a park, stop or failure) the last health check is history, not "healthy"."""
    for state in ("DONE", "FAILED", "PAUSED_DISK"):
        out = dict(snapshot(), state=state, daemon={"alive": False, "pid": 4242, "last_seen": NOW - 5})
        text = human(out)
        line = next(ln for ln in text.splitlines() if ln.startswith("shopsim"))
        assert "healthy" not in line and f"not running (stopped with the campaign, {state})" in line
    dead = dict(snapshot(), daemon={"alive": False, "pid": 4242, "last_seen": NOW - 5})
    assert "unknown (the daemon is not running)" in human(dead)


def test_plan_line_shows_the_campaign_eta_and_whether_the_next_round_fits() -> None:
    """status shows the campaign ETA and a NO when the next round does not fit the deadline or the disk."""
    plan = {"median_round_seconds": 3600.0, "campaign_eta_seconds": 9000.0, "next_round": 3,
            "fits_deadline": False, "fits_disk": True}
    out = dict(snapshot(), plan=plan, daemon={"alive": True, "pid": 4242, "last_seen": NOW - 1, "started_at": NOW - 9})
    assert "plan       campaign ETA 2h30m  (~1h00m a round)  next round-003 (4 of 5) fits: deadline NO, disk yes" \
        in human(out)
