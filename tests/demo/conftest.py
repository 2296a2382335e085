"""Fixtures for the demo stand-ins: free ports, owned processes, HTTP helpers.

Every long-lived program is started in its own session (so its process group is ours to
signal) with its output in a log file, and is stopped in teardown: SIGTERM to the group,
a grace period, then SIGKILL to the group. Extra pids (an orphaned scheduler) are killed by
pid. Nothing is ever killed by name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

DEMO = Path(__file__).resolve().parents[2] / "run" / "demo"
PY = sys.executable
# The stand-ins use only the stdlib, so they run with -S: no site-packages, no editable-install
# hook, a ~50 ms start instead of ~250 ms in this venv. Their behaviour does not depend on it.
PY_ARGS = [PY, "-S"]
SECRET_VARS = ("WANDB_API_KEY", "BAILIAN_API_KEY")
sys.path.insert(0, str(DEMO))  # tests of the pure helpers import _common


def child_env(**overrides: str | None) -> dict[str, str]:
    """The test's environment without secrets or demo knobs, plus `overrides` (None removes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEMO_", "SHOPSIM_")) and k not in SECRET_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: Any = None, timeout: float = 5.0, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One request, no proxies; returns (status, decoded JSON or None)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, None


def shop(url: str, payload: Any, timeout: float = 5.0) -> tuple[int, Any]:
    return http("POST", url + "/api/shop_agent", payload, timeout=timeout)


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = pred()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class Proc:
    """A started demo program: its Popen, its log file, and helpers."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path):
        self.popen, self.log_path = popen, log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait(self, timeout: float = 20.0) -> int:
        return self.popen.wait(timeout=timeout)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        return wait_until(lambda: text in self.log() and self.log(), timeout, what=f"{text!r} in {self.log_path}")

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass


class Procs:
    """Owns every process a test starts; `stop_all` is the teardown."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[Proc] = []
        self.extra_pids: list[int] = []

    def start(self, program: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              name: str | None = None) -> Proc:
        log = self.logdir / f"{name or Path(program).stem}-{len(self.procs)}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen([*PY_ARGS, str(DEMO / program), *args], stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env or child_env(), cwd=cwd, start_new_session=True)
        proc = Proc(popen, log)
        self.procs.append(proc)
        return proc

    def adopt_pid(self, pid: int) -> None:
        self.extra_pids.append(pid)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + 3
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:
            proc.signal_group(signal.SIGKILL)  # also reaches an orphan left in the group
            try:
                proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for pid in self.extra_pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    owner = Procs(tmp_path)
    try:
        yield owner
    finally:
        owner.stop_all()


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    owner = Procs(tmp_path_factory.mktemp("procs"))
    try:
        yield owner
    finally:
        owner.stop_all()


def run_demo(program: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a short-lived demo program to completion, capturing its output."""
    return subprocess.run([*PY_ARGS, str(DEMO / program), *args], capture_output=True, text=True, env=env or child_env(),
                          cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)


def start_shopsim(procs: Procs, slots: int = 4, **knobs: str) -> tuple[Proc, str]:
    """Start the ShopSim stand-in on a free port and wait for `ready`."""
    port = free_port()
    proc = procs.start("shopsim.py", env=child_env(SHOPSIM_ENV_SLOTS=str(slots), SHOPSIM_PORT=str(port), **knobs))
    url = f"http://127.0.0.1:{port}"
    if not knobs:
        wait_until(lambda: http("GET", url + "/healthz")[1]["ready"], what="shopsim ready")
    return proc, url


def start_valserver(procs: Procs, model_path: Path | str, *extra: str, wait_healthy: bool = True, **knobs: str) -> tuple[Proc, str]:
    port = free_port()
    env = child_env(DEMO_VAL_LOAD_SECONDS=knobs.pop("DEMO_VAL_LOAD_SECONDS", "0.05"), **knobs)
    proc = procs.start("valserver.py", "--model-path", str(model_path), "--host", "127.0.0.1", "--port", str(port),
                       "--served-model-name", "Qwen/Qwen3.5-4B", *extra, env=env)
    url = f"http://127.0.0.1:{port}"
    if wait_healthy:
        wait_until(lambda: http("GET", url + "/health")[0] == 200, what="val server healthy")
    return proc, url


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two HF dirs made by the converter: the converted base (`release/`) of seed 1234 and of seed 99."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for name, seed in (("a", "1234"), ("b", "99")):
        base = root / f"base-{name}"
        assert run_demo("slime_train.py", "--init-base", str(base), "--seed", seed).returncode == 0
        (root / "orig").mkdir(exist_ok=True)
        res = run_demo("convert_torch_dist_to_hf.py", "--input-dir", str(base / "release"),
                       "--output-dir", str(root / f"hf-{name}"), "--origin-hf-dir", str(root / "orig"))
        assert res.returncode == 0, res.stderr
        out[name] = root / f"hf-{name}"
    return out
