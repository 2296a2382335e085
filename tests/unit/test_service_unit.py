"""install-service: the rendered shoprld@.service for a real demo campaign tree.

The unit is checked directive by directive, with ``systemd-analyze verify`` when the machine
has it (it works without systemd as PID 1). The real-systemd behaviour (restart, watchdog,
stop, disk park) is in tests/systemd/ (slow).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoprld.daemon.ops import unit as service
from shoprld.daemon.ops.demo import create_tree
from shoprld.daemon.foundation.system.errors import ConfigError

CANARY = "shoprld-canary-7f3c9e1d2b"
TEMPLATE = Path(__file__).resolve().parents[2] / "systemd" / "shoprld@.service"
ANALYZE = shutil.which("systemd-analyze")


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections -> [(key, value)], in order; comments and blank lines dropped."""
    out: dict[str, list[tuple[str, str]]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, [])
            continue
        key, _, value = line.partition("=")
        out.setdefault(section, []).append((key.strip(), value.strip()))
    return out


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}=: expected once, got {found}"
    return found[0]


@pytest.fixture(scope="module")
def demo_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo tree whose campaign file is demo.toml (so the instance is shoprld@demo)."""
    root = tmp_path_factory.mktemp("svc") / "tree"
    root.mkdir()
    campaign = create_tree(root, fast=True)
    demo = root / "demo.toml"
    campaign.rename(demo)
    with (root / "repo" / ".env").open("a") as f:
        f.write(f"CANARY_SECRET={CANARY}\n")
    return demo


@pytest.fixture()
def shm_tree() -> Iterator[Path]:
    """A demo tree outside /tmp and outside any home dir (/dev/shm), as on a real box."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    root = Path(tempfile.mkdtemp(prefix="shoprld-svc-", dir="/dev/shm"))
    try:
        campaign = create_tree(root, fast=True)
        demo = root / "demo.toml"
        campaign.rename(demo)
        yield demo
    finally:
        shutil.rmtree(root, ignore_errors=True)


def verify(tmp_path: Path, text: str, *, user: bool = False, name: str = "shoprld@.service",
           beside: dict[str, str] | None = None) -> None:
    """systemd-analyze verify passes with no warning at all (unknown keys only warn); ``beside``:
    other units written in the same dir (what OnFailure= names)."""
    if ANALYZE is None:
        pytest.skip("systemd-analyze not installed on this machine (the slow suite verifies in nspawn)")
    d = tmp_path / ("user" if user else "system")
    d.mkdir(exist_ok=True)
    for other, other_text in (beside or {}).items():
        (d / other).write_text(other_text)
    unit = d / name
    unit.write_text(text)
    argv = [ANALYZE, *(["--user"] if user else []), "verify", str(unit)]
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "notice"}
    if user:  # a user manager wants a runtime dir, which a CI shell may not have
        rt = tmp_path / "runtime"
        rt.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(rt)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def test_system_unit_has_the_contract(demo_tree: Path) -> None:
    """The rendered system unit carries every directive SPEC §5 and issue 7 ask for."""
    from shoprld.daemon.foundation.config.config import load_config
    from shoprld.daemon.foundation.records.layout import Layout

    lay = Layout.from_config(load_config(demo_tree))
    u = parse_unit(service.render(demo_tree, user=False).text)
    s = "Service"
    assert one(u, s, "Type") == "notify"
    assert one(u, s, "NotifyAccess") == "main"
    assert one(u, s, "KillMode") == "mixed"
    assert one(u, s, "WatchdogSec") == "120s"
    assert one(u, s, "TimeoutStopSec") == "15min"
    assert one(u, s, "Restart") == "on-failure"
    assert one(u, s, "RestartPreventExitStatus").split() == ["3", "4", "5"]
    assert one(u, s, "RestartSec")
    assert one(u, s, "StateDirectory") == "shoprld/%i"
    assert one(u, s, "WorkingDirectory") == str(lay.repo)
    assert values(u, s, "Environment") == ["PYTHONUNBUFFERED=1"]
    assert one(u, s, "NoNewPrivileges") == "yes"
    assert one(u, s, "ProtectSystem") == "strict"
    rw = one(u, s, "ReadWritePaths").split()
    assert f"-{lay.repo}" in rw and f"-{lay.ephemeral_root}" in rw
    # the start limit lives in [Unit] since systemd 230; in [Service] it is ignored
    assert one(u, "Unit", "StartLimitIntervalSec") and one(u, "Unit", "StartLimitBurst")
    assert not values(u, s, "StartLimitIntervalSec")
    assert one(u, "Install", "WantedBy") == "multi-user.target"


def test_exec_start_is_absolute_and_runs_the_instance_config(demo_tree: Path) -> None:
    """ExecStart is `<absolute shoprld> run -c <config dir>/%i.toml`, and that command exists."""
    u = parse_unit(service.render(demo_tree, user=False).text)
    argv = one(u, "Service", "ExecStart").split()
    assert argv[1:] == ["run", "-c", f"{demo_tree.parent}/%i.toml"]
    exe = Path(argv[0])
    assert exe.is_absolute() and exe.name == "shoprld" and os.access(exe, os.X_OK)


def test_gpus_stay_visible(demo_tree: Path) -> None:
    """Nothing in the unit hides /dev/nvidia* or forbids the JIT that CUDA stacks need."""
    text = service.render(demo_tree, user=False).text
    u = parse_unit(text)
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "MemoryDenyWriteExecute", "PrivateUsers"):
        assert not values(u, "Service", key), key


def test_no_secret_reaches_the_unit(demo_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A canary in .env and in the caller's environment appears in neither rendering."""
    monkeypatch.setenv("WANDB_API_KEY", CANARY)
    monkeypatch.setenv("CANARY_SECRET", CANARY)
    assert CANARY in (demo_tree.parent / "repo" / ".env").read_text()  # the canary is really there
    for user in (False, True):
        text = service.render(demo_tree, user=user).text
        assert CANARY not in text
        assert "demo-fake-wandb-key" not in text
        u = parse_unit(text)
        assert not values(u, "Service", "EnvironmentFile")
        assert values(u, "Service", "Environment") == ["PYTHONUNBUFFERED=1"]


def test_user_unit_leaves_out_system_only_settings(demo_tree: Path) -> None:
    """--user: no User=, no mount-namespace sandboxing, WantedBy=default.target."""
    u = parse_unit(service.render(demo_tree, user=True).text)
    for key in ("User", "Group", "ProtectSystem", "ReadWritePaths", "PrivateTmp", "ProtectHome"):
        assert not values(u, "Service", key), key
    assert not values(u, "Unit", "RequiresMountsFor")
    assert one(u, "Install", "WantedBy") == "default.target"
    assert one(u, "Service", "Type") == "notify"


def test_tmp_tree_gets_no_private_tmp(demo_tree: Path) -> None:
    """A campaign under /tmp would vanish behind PrivateTmp=, so the unit leaves it out."""
    text = service.render(demo_tree, user=False).text
    assert not values(parse_unit(text), "Service", "PrivateTmp")
    assert "# No PrivateTmp=" in text


def test_tree_outside_tmp_and_home_is_fully_sandboxed(shm_tree: Path, tmp_path: Path) -> None:
    """Outside /tmp and any home: PrivateTmp=yes and ProtectHome=read-only, and it verifies."""
    # An executable outside /tmp, so the result does not depend on where this checkout's venv is
    # (a venv under /tmp would rightly turn PrivateTmp off).
    text = service.render(shm_tree, user=False, command=["/usr/bin/true"]).text
    u = parse_unit(text)
    assert one(u, "Service", "PrivateTmp") == "yes"
    assert one(u, "Service", "ProtectHome") == "read-only"
    verify(tmp_path, text)


def test_repo_under_home_drops_protect_home(demo_tree: Path, tmp_path: Path) -> None:
    """A repo under /home keeps ProtectHome= off (its stack writes around it) and says why."""
    text = demo_tree.read_text().replace('repo = "repo"', 'repo = "/home/shoprld-test-nobody/repo"')
    cfg = tmp_path / "homed.toml"
    cfg.write_text(text)
    r = service.render(cfg, user=False)
    assert not values(parse_unit(r.text), "Service", "ProtectHome")
    assert "# No ProtectHome=" in r.text
    assert any("home directory" in w for w in r.warnings)


@pytest.mark.parametrize("version,steps", [(252, False), (254, True), (None, False)])
def test_restart_backoff_matches_the_systemd_version(demo_tree: Path, version: int | None, steps: bool) -> None:
    """RestartSteps=/RestartMaxDelaySec= only where systemd knows them (>= 254)."""
    u = parse_unit(service.render(demo_tree, user=False, version=version).text)
    assert bool(values(u, "Service", "RestartSteps")) is steps
    assert bool(values(u, "Service", "RestartMaxDelaySec")) is steps
    assert len(values(u, "Service", "RestartSec")) == 1


def test_odd_paths_are_quoted_and_escaped(demo_tree: Path, tmp_path: Path) -> None:
    """A config dir with a space and a % is one quoted ExecStart word, % doubled."""
    odd = tmp_path / "my 100% campaigns"
    shutil.copytree(demo_tree.parent, odd, symlinks=True)
    cfg = odd / "demo.toml"
    r = service.render(cfg, user=False, command=["/opt/shoprld venv/bin/shoprld"])
    exec_line = one(parse_unit(r.text), "Service", "ExecStart")
    assert exec_line == f'"/opt/shoprld venv/bin/shoprld" run -c "{tmp_path}/my 100%% campaigns/%i.toml"'
    assert one(parse_unit(r.text), "Service", "WorkingDirectory") == f"{tmp_path}/my 100%% campaigns/repo"


@pytest.mark.parametrize("name", ["bad name.toml", "demo.yaml", "a\\b.toml"])
def test_instance_names_must_map_back_to_the_file(tmp_path: Path, name: str) -> None:
    """The file name must be a valid, unescaped systemd instance name, else a one-line error."""
    with pytest.raises(ConfigError, match="fix:"):
        service.instance_name(tmp_path / name)


def test_template_tags_and_tokens_are_all_known() -> None:
    """Every #@tag in the template is one the renderer knows (it raises on any other)."""
    import re

    tags = set(re.findall(r"^#@([a-z_]+) ", TEMPLATE.read_text(), flags=re.M))
    assert tags == {"template", "system", "user", "private_tmp", "tmp_note", "protect_home", "home_note",
                    "restart_steps", "restart_plain"}


def test_systemd_analyze_verify_system(demo_tree: Path, tmp_path: Path) -> None:
    """The rendered system unit passes systemd-analyze verify with no warning."""
    verify(tmp_path, service.render(demo_tree, user=False).text)


def test_systemd_analyze_verify_user(demo_tree: Path, tmp_path: Path) -> None:
    """The rendered --user unit passes systemd-analyze --user verify with no warning."""
    verify(tmp_path, service.render(demo_tree, user=True).text, user=True)


def test_install_service_writes_the_user_unit_and_never_runs_systemctl(
        demo_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--user --write: the unit lands in ~/.config/systemd/user, the commands are printed, not run."""
    trap = tmp_path / "bin"
    trap.mkdir()
    called = tmp_path / "systemctl-was-called"
    for name in ("systemctl", "loginctl"):
        fake = trap / name
        fake.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {called}\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{trap}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert service.install_service(demo_tree, user=True, write=True) == 0
    written = tmp_path / "cfg" / "systemd" / "user" / "shoprld@.service"
    assert written.read_text() == service.render(demo_tree, user=True).text
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    out = capsys.readouterr().out
    assert "systemctl --user daemon-reload" in out
    assert "systemctl --user enable --now shoprld@demo" in out
    assert not called.exists(), called.read_text()


def test_install_service_prints_the_unit_and_the_commands(
        demo_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --write: the unit on stdout (redirectable), the commands on stderr."""
    assert service.install_service(demo_tree, user=False, write=False) == 0
    cap = capsys.readouterr()
    assert cap.out == service.render(demo_tree, user=False).text
    assert "systemctl daemon-reload" in cap.err
    assert "systemctl enable --now shoprld@demo" in cap.err


def test_unset_state_dir_warns_about_status_by_hand(demo_tree: Path, tmp_path: Path) -> None:
    """Without storage.state_dir the unit uses /var/lib/shoprld/NAME; the operator is told how to reach it."""
    text = demo_tree.read_text().replace('state_dir = "state"\n', "")
    cfg = demo_tree.parent / "nostate.toml"
    cfg.write_text(text)
    try:
        r = service.render(cfg, user=False, environ={"HOME": str(tmp_path), "USER": "root"})
    finally:
        cfg.unlink()
    assert r.state_dir == Path("/var/lib/shoprld/nostate")
    assert any("STATE_DIRECTORY=/var/lib/shoprld/nostate" in w for w in r.warnings)
    assert any("instance is 'nostate'" in w for w in r.warnings)


def test_shoprld_command_prefers_the_running_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """argv[0] named shoprld wins; else the venv sibling; else PATH; else `python -m shoprld.daemon.ops.cli`."""
    script = tmp_path / "venv" / "bin" / "shoprld"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    py = tmp_path / "venv" / "bin" / "python"
    py.write_text("")
    assert service.shoprld_command(str(script), "/nonexistent/python") == [str(script)]
    assert service.shoprld_command("/usr/bin/pytest", str(py)) == [str(script)]
    nowhere = tmp_path / "none" / "python"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert service.shoprld_command("pytest", str(nowhere)) == [str(nowhere), "-m", "shoprld.daemon.ops.cli"]
    monkeypatch.setenv("PATH", str(script.parent))
    assert service.shoprld_command("pytest", str(nowhere)) == [str(script)]


# -- a dead daemon pages: ExecStopPost= after every stop, OnFailure= once nothing restarts it ------
def test_the_unit_pages_a_death_it_could_not_report_and_a_failure_for_good(demo_tree: Path) -> None:
    """The daemon unit runs `notify-crashed --systemd` after every stop (its failure ignored: `-`)
    and names shoprld-crashed@%i in OnFailure=; that oneshot runs `--systemd --gave-up` in the
    daemon's own state dir, as its user, sandboxed like it."""
    r = service.render(demo_tree, user=False, command=["/opt/venv/bin/shoprld"])
    u = parse_unit(r.text)
    assert one(u, "Unit", "OnFailure") == "shoprld-crashed@%i.service"
    assert one(u, "Service", "ExecStopPost") == \
        f"-/opt/venv/bin/shoprld notify-crashed -c {demo_tree.parent}/%i.toml --systemd"
    c = parse_unit(r.crashed)
    assert one(c, "Service", "Type") == "oneshot"
    assert one(c, "Service", "ExecStart") == \
        f"/opt/venv/bin/shoprld notify-crashed -c {demo_tree.parent}/%i.toml --systemd --gave-up"
    assert one(c, "Service", "StateDirectory") == one(u, "Service", "StateDirectory") == "shoprld/%i"
    assert one(c, "Service", "User") == one(u, "Service", "User")
    assert one(c, "Service", "ReadWritePaths") == one(u, "Service", "ReadWritePaths")
    assert one(c, "Service", "LimitCORE") == "0" and "OnFailure" not in dict(c["Unit"])  # no page loop


@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_systemd_analyze_verify_crashed_unit(demo_tree: Path, tmp_path: Path, user: bool) -> None:
    """Both rendered units pass systemd-analyze verify together with no warning."""
    r = service.render(demo_tree, user=user)
    verify(tmp_path, r.text, user=user, beside={"shoprld-crashed@.service": r.crashed})
    verify(tmp_path, r.crashed, user=user, name="shoprld-crashed@.service")


def test_install_service_write_installs_the_onfailure_unit_too(
        demo_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--write puts shoprld-crashed@.service beside shoprld@.service (the unit OnFailure= names)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert service.install_service(demo_tree, user=True, write=True) == 0
    d = tmp_path / "cfg" / "systemd" / "user"
    assert (d / "shoprld-crashed@.service").read_text() == service.render(demo_tree, user=True).crashed
    assert f"wrote {d / 'shoprld-crashed@.service'}" in capsys.readouterr().out
