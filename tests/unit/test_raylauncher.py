"""The Ray Jobs launcher against a real HTTP server: run/demo/rayjobs_standin.py on loopback.

The stand-in speaks Ray's Jobs REST API and runs each entrypoint as a real local process
(shell, own session), so these tests exercise the real client, the real re-attach and the
real log copy in seconds. The real head is exercised by tests/integration/test_real_ray.py.
"""

from __future__ import annotations

import json
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from shoprld.daemon.foundation.config.config import Config, config_from_dict
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.services.processes import ChildRecord, LocalLauncher
from shoprld.daemon.services.ray import (
    RayJobChild,
    RayLauncher,
    build_launcher,
    entrypoint_of,
    job_env,
    ray_tmpdir,
    ray_tmpdir_path,
    split_secrets,
)
from shoprld.daemon.foundation.system.proctable import session_pids
from shoprld.daemon.services.rayjobs import RayJobsClient, RayJobsError
from shoprld.daemon.round.plan import resolve

STANDIN = Path(__file__).resolve().parents[2] / "run" / "demo" / "rayjobs_standin.py"
SECRET = "wandb-secret-value-0123456789"
PY = sys.executable


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred, timeout: float = 15.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def api(address: str, method: str, path: str) -> object:
    with httpx.Client(base_url=address, trust_env=False, timeout=5) as c:
        return c.request(method, path).json()


def kill_group(pid: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Standin:
    """One stand-in head, owned by the test: started in its own session, stopped in teardown."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.logs = root / "standin-logs"
        self.address = f"http://127.0.0.1:{self.port}"
        self.out = open(root / "standin.out", "wb")
        self.proc = subprocess.Popen([PY, str(STANDIN), "--port", str(self.port), "--logs-dir", str(self.logs)],
                                     stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self.up, what="the stand-in's /api/version")

    def up(self) -> bool:
        try:
            return bool(api(self.address, "GET", "/api/version"))
        except httpx.HTTPError:
            return False

    def jobs(self) -> list[dict]:  # type: ignore[type-arg]
        return api(self.address, "GET", "/api/jobs/")  # type: ignore[return-value]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(self.proc.pid)
                self.proc.wait(timeout=5)
        pids = self.logs / "pids.txt"
        if pids.exists():
            for line in pids.read_text().split():
                kill_group(int(line))
        self.out.close()


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Standin]:
    s = Standin(tmp_path)
    try:
        yield s
    finally:
        s.close()


def make_cfg(tmp_path: Path, address: str, **train: object) -> Config:
    data = {
        "campaign": {"name": "camp", "experiment": "exp", "rounds": 3, "steps_per_round": 2},
        "storage": {"repo": str(tmp_path / "repo"), "ephemeral_root": str(tmp_path / "eph"),
                    "state_dir": str(tmp_path / "state"), "user": "u"},
        "wandb": {"enabled": False},
        "train": {"launcher": "ray", "ray_address": address, "command": ["true"], "secrets": ["WANDB_API_KEY"],
                  "env": {"DEMO_KNOB": "7"}, "runtime_env": {"SHOPSIMRL_PROJECT_ROOT": "{project_root}",
                                                              "NCCL_NVLS_ENABLE": "0"}, **train},
    }
    return config_from_dict(data, tmp_path / "campaign.toml")


def setup(tmp_path: Path, address: str, **train: object) -> tuple[Config, Layout, RayLauncher]:
    cfg = make_cfg(tmp_path, address, **train)
    layout = Layout.from_config(cfg, environ={})
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.repo.mkdir(parents=True, exist_ok=True)
    return cfg, layout, RayLauncher(cfg, layout, poll=0.1)


def trainer_env(layout: Layout, cfg: Config) -> dict[str, str]:
    env = layout.child_env(cfg)
    env.update({"DEMO_KNOB": "7", "WANDB_API_KEY": SECRET, "SHOPRLD_CHILD": "tag|trainer"})
    return env


async def start_trainer(launcher: RayLauncher, layout: Layout, cfg: Config, code: str, round_index: int = 0):  # type: ignore[no-untyped-def]
    argv = [PY, "-c", code]
    return await launcher.start("trainer", argv, env=trainer_env(layout, cfg), cwd=layout.repo,
                                log=layout.stage_log(round_index, "TRAIN"), redacted_argv=argv,
                                round=resolve(cfg, layout, round_index))


PRINT_ROLLOUTS = "import time\nfor i in range(3):\n    print(f'rollout {i}', flush=True)\n    time.sleep(0.05)"
LOOP_FOREVER = "import time\nwhile True:\n    print('rollout 1', flush=True)\n    time.sleep(0.2)"


@pytest.mark.anyio
async def test_trainer_runs_as_a_job_and_its_log_reaches_the_stage_log(tmp_path: Path, standin: Standin) -> None:
    """A trainer start submits one job, copies its log into the stage log, and SUCCEEDED gives 0."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        child = await start_trainer(launcher, layout, cfg, PRINT_ROLLOUTS)
        assert isinstance(child, RayJobChild)
        assert (child.record.pid, child.record.pgid) == (0, 0)
        assert child.record.job_id == "shoprld-camp-exp-round-000-1"
        assert await child.wait() == 0
    log = layout.stage_log(0, "TRAIN").read_text()
    assert "rollout 2" in log and log.startswith("=== shoprld ")
    [job] = standin.jobs()
    assert job["status"] == "SUCCEEDED"
    assert SECRET not in job["entrypoint"] and SECRET not in log
    # Issue 27: the Jobs API serves runtime_env and the entrypoint to any client: no secret there.
    assert "WANDB_API_KEY" not in job["runtime_env"]["env_vars"]
    assert SECRET not in json.dumps(standin.jobs())
    secrets_file = layout.tmp / "ray-secrets" / "round-000.env"
    assert str(secrets_file) in job["entrypoint"] and os.stat(secrets_file).st_mode & 0o777 == 0o600
    assert json.loads((layout.artifacts / "round" / "round-000.json").read_text())["job_id"] == child.job_id


# The trainer compares a digest: the value itself in argv is refused (it would reach Ray).
SEES_SECRET = ("import hashlib, os\nkey = os.environ.get('WANDB_API_KEY', '').encode()\n"
               f"print('secret seen' if hashlib.sha256(key).hexdigest() == {hashlib.sha256(SECRET.encode()).hexdigest()!r} "
               "else 'no secret', flush=True)")


@pytest.mark.anyio
async def test_the_trainer_gets_its_secret_from_the_file_not_from_ray(tmp_path: Path, standin: Standin) -> None:
    """The job's process sees WANDB_API_KEY (sourced from the 0600 file), while GET /api/jobs/
    shows neither the value nor the name in runtime_env."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        child = await start_trainer(launcher, layout, cfg, SEES_SECRET)
        assert await child.wait() == 0
    assert "secret seen" in layout.stage_log(0, "TRAIN").read_text()
    assert SECRET not in json.dumps(standin.jobs())


@pytest.mark.anyio
async def test_failed_job_gives_1(tmp_path: Path, standin: Standin) -> None:
    """A job whose entrypoint exits non-zero is FAILED, and wait() returns 1."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        child = await start_trainer(launcher, layout, cfg, "raise SystemExit(3)")
        assert await child.wait() == 1
    assert child.status == "FAILED"


@pytest.mark.anyio
async def test_restart_reattaches_instead_of_submitting_again(tmp_path: Path, standin: Standin) -> None:
    """A second launcher (a restarted daemon) re-attaches to the round's live job: still one job."""
    cfg, layout, first = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        a = await start_trainer(first, layout, cfg, LOOP_FOREVER)
        await a.refresh()
        await a.pull_logs(force=True)
        second = RayLauncher(cfg, layout, poll=0.1)
        b = await start_trainer(second, layout, cfg, LOOP_FOREVER)
        assert b.record.job_id == a.record.job_id
        assert "re-attach trainer" in layout.stage_log(0, "TRAIN").read_text()
        assert len(standin.jobs()) == 1
        assert await b.stop(2.0) == 1
    assert standin.jobs()[0]["status"] == "STOPPED"


@pytest.mark.anyio
async def test_reattach_copies_only_new_log_lines(tmp_path: Path, standin: Standin) -> None:
    """After a re-attach the stage log gets what is new, not the job's whole log again."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    log = layout.stage_log(0, "TRAIN")
    with anyio.fail_after(30):
        a = await start_trainer(launcher, layout, cfg, "print('rollout 0', flush=True)\nimport time; time.sleep(30)")
        wait_for(lambda: "rollout 0" in api(standin.address, "GET", f"/api/jobs/{a.job_id}/logs")["logs"])  # type: ignore[index]
        await a.pull_logs(force=True)
        b = RayLauncher(cfg, layout, poll=0.1).adopt(a.record)
        assert isinstance(b, RayJobChild)
        await b.pull_logs(force=True)
        assert log.read_text().splitlines().count("rollout 0") == 1
        await b.stop(1.0)


@pytest.mark.anyio
async def test_adopt_only_a_live_job(tmp_path: Path, standin: Standin) -> None:
    """adopt() re-attaches to a RUNNING job, returns None once it finished, and leaves local
    records to the inner launcher."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        child = await start_trainer(launcher, layout, cfg, "import time; time.sleep(30)")
        wait_for(lambda: standin.jobs()[0]["status"] == "RUNNING", what="RUNNING")
        adopted = launcher.adopt(child.record)
        assert isinstance(adopted, RayJobChild) and adopted.alive()
        await adopted.stop(1.0)
    assert launcher.adopt(child.record) is None
    dead = ChildRecord("sidecar", 2**22 + 1, 2**22 + 1, 1, time.time(), "", [])
    assert launcher.adopt(dead) is None


@pytest.mark.anyio
async def test_another_rounds_live_job_is_stopped_first(tmp_path: Path, standin: Standin) -> None:
    """One trainer per save dir: round 1's start stops round 0's still-running job."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    with anyio.fail_after(40):
        old = await start_trainer(launcher, layout, cfg, LOOP_FOREVER, round_index=0)
        new = await start_trainer(launcher, layout, cfg, PRINT_ROLLOUTS, round_index=1)
        assert new.record.job_id == "shoprld-camp-exp-round-001-1"
        status = {j["submission_id"]: j["status"] for j in standin.jobs()}
        assert status[old.record.job_id] == "STOPPED"
        assert await new.wait() == 0


@pytest.mark.anyio
async def test_a_new_attempt_after_a_failure_gets_the_next_number(tmp_path: Path, standin: Standin) -> None:
    """The attempt number comes from Ray's own list: FAILED round-000-1 is followed by round-000-2."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        first = await start_trainer(launcher, layout, cfg, "raise SystemExit(1)")
        await first.wait()
        second = await start_trainer(RayLauncher(cfg, layout, poll=0.1), layout, cfg, PRINT_ROLLOUTS)
        assert second.record.job_id == "shoprld-camp-exp-round-000-2"
        assert await second.wait() == 0


@pytest.mark.anyio
async def test_argv_reaches_the_job_exactly(tmp_path: Path, standin: Standin) -> None:
    """Every argv element is shell-quoted: spaces, quotes, $ and ; arrive unchanged."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    odd = ["a b", "it's", '"q"', "$HOME", "x;rm -rf /nope", "", "{}", "*"]
    code = "import json,sys; print('ARGV=' + json.dumps(sys.argv[1:]))"
    argv = [PY, "-c", code, *odd]
    with anyio.fail_after(30):
        child = await launcher.start("trainer", argv, env=trainer_env(layout, cfg), cwd=None,
                                     log=layout.stage_log(0, "TRAIN"), redacted_argv=argv,
                                     round=resolve(cfg, layout, 0))
        assert await child.wait() == 0
    line = next(ln for ln in layout.stage_log(0, "TRAIN").read_text().splitlines() if ln.startswith("ARGV="))
    assert json.loads(line[5:]) == odd


@pytest.mark.anyio
async def test_a_secret_in_argv_is_refused_before_submitting(tmp_path: Path, standin: Standin) -> None:
    """A secret value in the trainer's argv is a config error, and nothing reaches Ray."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    argv = [PY, "-c", "pass", f"--key={SECRET}"]
    with pytest.raises(ConfigError, match="WANDB_API_KEY"):
        await launcher.start("trainer", argv, env=trainer_env(layout, cfg), cwd=None,
                             log=layout.stage_log(0, "TRAIN"), redacted_argv=["***"], round=resolve(cfg, layout, 0))
    assert standin.jobs() == []


@pytest.mark.anyio
async def test_signal_group_stops_the_job_through_ray(tmp_path: Path, standin: Standin) -> None:
    """A force stop (SIGKILL to the 'group') becomes a Ray stop; no local group is signalled."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        child = await start_trainer(launcher, layout, cfg, LOOP_FOREVER)
        wait_for(lambda: standin.jobs()[0]["status"] == "RUNNING", what="RUNNING")
        child.signal_group(signal.SIGKILL)
        assert await child.wait() == 1
    assert standin.jobs()[0]["status"] == "STOPPED"


@pytest.mark.anyio
async def test_other_roles_stay_local_processes(tmp_path: Path, standin: Standin) -> None:
    """A non-trainer role runs as a local process in its own session, not as a job."""
    cfg, layout, launcher = setup(tmp_path, standin.address)
    log = layout.stage_log(0, "TRAIN")
    with anyio.fail_after(20):
        child = await launcher.start("sidecar", ["true"], env=dict(os.environ), cwd=None, log=log,
                                     redacted_argv=["true"])
        assert child.record.pid > 0 and not child.record.job_id
        assert await child.wait() == 0
    assert standin.jobs() == []


@pytest.mark.anyio
async def test_lost_api_counts_as_a_failed_job(tmp_path: Path, standin: Standin) -> None:
    """When the Jobs API stays unreachable past the limit, wait() gives 1 and says why."""
    cfg, layout, _ = setup(tmp_path, standin.address)
    launcher = RayLauncher(cfg, layout, poll=0.05, unreachable_timeout=0.5)  # its own timeouts
    with anyio.fail_after(30):
        child = await start_trainer(launcher, layout, cfg, LOOP_FOREVER)
        standin.close()
        assert await child.wait() == 1
    assert "lost the Ray Jobs API" in layout.stage_log(0, "TRAIN").read_text()


@pytest.mark.anyio
async def test_a_stalled_api_while_our_head_runs_is_not_a_failed_job(tmp_path: Path, standin: Standin) -> None:
    """Issue 27: the dashboard stops answering (SIGSTOP) for longer than the limit while the head
    runs: wait() keeps watching, and the job's real end (SUCCEEDED) is what it returns."""
    cfg, layout, _ = setup(tmp_path, standin.address)
    client = RayJobsClient(standin.address, timeout=1.0)
    launcher = RayLauncher(cfg, layout, client=client, poll=0.05, unreachable_timeout=0.5)
    code = "import time\nfor i in range(80):\n    print(f'rollout {i}', flush=True)\n    time.sleep(0.1)"
    with anyio.fail_after(60):
        child = await start_trainer(launcher, layout, cfg, code)
        assert isinstance(child, RayJobChild)
        child.head_alive = lambda: True
        os.kill(standin.proc.pid, signal.SIGSTOP)
        try:
            async with anyio.create_task_group() as tg:
                async def resume_later() -> None:
                    await anyio.sleep(4.5)
                    os.kill(standin.proc.pid, signal.SIGCONT)
                tg.start_soon(resume_later)
                assert await child.wait() == 0
        finally:
            os.kill(standin.proc.pid, signal.SIGCONT)
    text = layout.stage_log(0, "TRAIN").read_text()
    assert "but the head runs: still watching" in text and "rollout 79" in text
    assert child.status_failures == 0
    await client.aclose()


@pytest.mark.anyio
async def test_live_finds_the_rounds_running_job_before_anything_is_launched(tmp_path: Path, standin: Standin) -> None:
    """A restarted daemon asks Ray first: the round's live job comes back re-attached (no
    resume check may judge it); another round's TRAIN finds none."""
    cfg, layout, first = setup(tmp_path, standin.address)
    with anyio.fail_after(30):
        a = await start_trainer(first, layout, cfg, LOOP_FOREVER)
        assert not a.reattached
        second = RayLauncher(cfg, layout, poll=0.1)
        b = await second.live("trainer", log=layout.stage_log(0, "TRAIN"), round=resolve(cfg, layout, 0))
        assert b is not None and b.record.job_id == a.record.job_id and b.reattached
        assert await second.live("trainer", log=layout.stage_log(1, "TRAIN"), round=resolve(cfg, layout, 1)) is None
        assert len(standin.jobs()) == 1
        assert await b.stop(2.0) == 1


@pytest.mark.anyio
async def test_live_with_no_head_answering_and_none_of_ours_is_none(tmp_path: Path) -> None:
    """No head answers and no head of ours runs: nothing can be live, TRAIN may start one; on a
    cluster shoprld does not start, a silent API is not "nothing runs": nothing is launched blind."""
    cfg, layout, launcher = setup(tmp_path, "http://127.0.0.1:9", ray_start_head=True, ray_head_command=["true"])
    assert not launcher.head_running()
    assert await launcher.live("trainer", log=layout.stage_log(0, "TRAIN"), round=resolve(cfg, layout, 0)) is None
    cfg, layout, external = setup(tmp_path / "ext", "http://127.0.0.1:9")
    with pytest.raises(RayJobsError, match="does not answer"):
        await external.live("trainer", log=layout.stage_log(0, "TRAIN"), round=resolve(cfg, layout, 0))


@pytest.mark.anyio
async def test_the_driver_log_is_followed_by_offset_once_even_across_a_restart(tmp_path: Path, standin: Standin) -> None:
    """Issue 27: with the driver log on this box, the stage log gets every line exactly once, read
    by byte offset (no whole-log GET), also when a restarted daemon re-attaches mid-job."""
    cfg, layout, _ = setup(tmp_path, standin.address)
    first = RayLauncher(cfg, layout, poll=0.05, driver_logs=standin.logs)
    code = ("import sys, time\nfor i in range(4000):\n    print(f'rollout {i:05d} ' + 'x' * 900, flush=True)\n"
            "    if i == 2000: time.sleep(1.5)\n")
    got: list[str] = []
    with anyio.fail_after(60):
        a = await start_trainer(first, layout, cfg, code)
        assert isinstance(a, RayJobChild) and a.driver_log == standin.logs / f"job-driver-{a.job_id}.log"
        while "rollout 01000" not in layout.stage_log(0, "TRAIN").read_text():
            await a.refresh()
            await a.pull_logs(force=True)
            await anyio.sleep(0.05)
        second = RayLauncher(cfg, layout, poll=0.05, driver_logs=standin.logs)  # a restarted daemon
        b = await second.live("trainer", log=layout.stage_log(0, "TRAIN"), round=resolve(cfg, layout, 0))
        assert isinstance(b, RayJobChild)
        assert await b.wait() == 0
    got = [line.split()[1] for line in layout.stage_log(0, "TRAIN").read_text().splitlines() if line.startswith("rollout ")]
    assert got == [f"{i:05d}" for i in range(4000)]


@pytest.mark.anyio
async def test_a_retried_submit_attaches_to_the_job_ray_already_holds(tmp_path: Path) -> None:
    """POST answered 'already exists' (our own earlier request landed) is an attach, not an error."""
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(f"{req.method} {req.url.path}")
        if req.method == "GET" and req.url.path == "/api/jobs/":
            return httpx.Response(200, json=[])
        if req.method == "POST" and req.url.path == "/api/jobs/":
            return httpx.Response(400, text="ValueError: Job with submission_id x already exists.")
        return httpx.Response(200, json={"status": "RUNNING", "submission_id": req.url.path.split("/")[-1]})

    cfg = make_cfg(tmp_path, "http://ray.invalid:8265")
    layout = Layout.from_config(cfg, environ={})
    client = RayJobsClient(cfg.train.ray_address, transport=httpx.MockTransport(handler))
    launcher = RayLauncher(cfg, layout, client=client)
    child = await launcher.start("trainer", ["true"], env={}, cwd=None, log=layout.stage_log(0, "TRAIN"),
                                 redacted_argv=["true"], round=resolve(cfg, layout, 0))
    assert isinstance(child, RayJobChild) and child.status == "RUNNING"
    assert calls == ["GET /api/jobs/", "POST /api/jobs/", "GET /api/jobs/shoprld-camp-exp-round-000-1"]
    await client.aclose()


def test_job_env_is_the_etiquette_train_env_runtime_env_and_secrets(tmp_path: Path) -> None:
    """The job gets the etiquette's variables, train.env, train.runtime_env and the trainer's
    secrets; never the daemon's PATH/HOME, the local child tag, or CUDA_VISIBLE_DEVICES."""
    cfg = make_cfg(tmp_path, "http://127.0.0.1:1")
    layout = Layout.from_config(cfg, environ={})
    env = trainer_env(layout, cfg)
    env.update({"PATH": "/usr/bin", "HOME": "/root"})
    out = job_env(cfg, layout, env, {"project_root": "/proj"})
    assert out["WANDB_API_KEY"] == SECRET and out["DEMO_KNOB"] == "7"
    public, secrets = split_secrets(cfg, out)
    assert secrets == {"WANDB_API_KEY": SECRET} and "WANDB_API_KEY" not in public
    assert out["SHOPSIMRL_PROJECT_ROOT"] == "/proj" and out["NCCL_NVLS_ENABLE"] == "0"
    assert out["HF_HOME"] == str(layout.cache_root / "huggingface")
    for key in ("PATH", "HOME", "SHOPRLD_CHILD", "CUDA_VISIBLE_DEVICES"):
        assert key not in out


def test_entrypoint_quotes_and_changes_dir() -> None:
    """The entrypoint is `cd <cwd> && exec <quoted argv>`."""
    assert entrypoint_of(["python3", "a b.py", "--x", "$Y"], Path("/p q")) == \
        "cd '/p q' && exec python3 'a b.py' --x '$Y'"
    assert entrypoint_of(["true"], None) == "exec true"


@pytest.mark.anyio
async def test_the_round_comes_from_the_caller_never_from_the_log_name(tmp_path: Path) -> None:
    """The job is named after the round the caller passes (whatever the log file is called), and
    a trainer start without its round is refused before anything reaches Ray."""
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(f"{req.method} {req.url.path}")
        if req.method == "GET" and req.url.path == "/api/jobs/":
            return httpx.Response(200, json=[])
        if req.method == "POST":
            return httpx.Response(200, json={"submission_id": json.loads(req.content)["submission_id"]})
        return httpx.Response(200, json={"status": "RUNNING", "submission_id": req.url.path.split("/")[-1]})

    cfg = make_cfg(tmp_path, "http://ray.invalid:8265")
    layout = Layout.from_config(cfg, environ={})
    client = RayJobsClient(cfg.train.ray_address, transport=httpx.MockTransport(handler))
    launcher = RayLauncher(cfg, layout, client=client)
    log = tmp_path / "r007-not-the-round.log"
    with pytest.raises(ValueError, match="needs the round"):
        await launcher.start("trainer", ["true"], env={}, cwd=None, log=log, redacted_argv=["true"])
    assert calls == []
    child = await launcher.start("trainer", ["true"], env={}, cwd=None, log=log, redacted_argv=["true"],
                                 round=resolve(cfg, layout, 2))
    assert child.record.job_id == "shoprld-camp-exp-round-002-1"
    assert json.loads((layout.artifacts / "round" / "round-002.json").read_text())["job_id"] == child.record.job_id
    await client.aclose()


def test_long_experiment_dirs_get_a_short_ray_tmpdir_link(tmp_path: Path) -> None:
    """A RAY_TMPDIR that would overflow AF_UNIX socket paths becomes a /tmp symlink to it."""
    short = make_cfg(tmp_path, "http://127.0.0.1:1")
    lay = Layout.from_config(short, environ={})
    deep = tmp_path / ("d" * 60)
    long_cfg = short.model_copy(update={"storage": short.storage.model_copy(update={"ephemeral_root": deep})})
    long_lay = Layout.from_config(long_cfg, environ={})
    link = ray_tmpdir(long_lay)
    try:
        assert link != long_lay.ray_tmp and link.is_symlink() and link.resolve() == long_lay.ray_tmp.resolve()
        assert len(str(link)) + 70 <= 107
        assert ray_tmpdir(long_lay) == link  # idempotent
    finally:
        link.unlink(missing_ok=True)
    if len(str(lay.ray_tmp)) + 70 <= 107:
        assert ray_tmpdir_path(lay) == lay.ray_tmp


def test_build_launcher_follows_train_launcher(tmp_path: Path) -> None:
    """train.launcher = "local" gives local processes, "ray" the Ray Jobs launcher."""
    cfg = make_cfg(tmp_path, "http://127.0.0.1:1")
    layout = Layout.from_config(cfg, environ={})
    assert isinstance(build_launcher(cfg, layout), RayLauncher)
    local = cfg.model_copy(update={"train": cfg.train.model_copy(update={"launcher": "local"})})
    assert isinstance(build_launcher(local, layout), LocalLauncher)


@pytest.mark.anyio
async def test_ensure_head_starts_the_head_in_its_own_session_and_stops_it_by_session(tmp_path: Path) -> None:
    """With ray_start_head, a missing head is started from ray_head_command in a new session,
    waited for, and stopped by that session (SIGTERM, then SIGKILL) leaving no process."""
    port = free_port()
    head_cmd = [PY, str(STANDIN), "--port", str(port), "--logs-dir", str(tmp_path / "head-logs")]
    cfg, layout, launcher = setup(tmp_path, f"http://127.0.0.1:{port}", ray_start_head=True,
                                  ray_head_command=head_cmd)
    sid = 0
    try:
        with anyio.fail_after(60):
            child = await start_trainer(launcher, layout, cfg, PRINT_ROLLOUTS)
            assert await child.wait() == 0
            assert launcher.head is not None
            sid = os.getsid(launcher.head.pid)
            assert sid == launcher.head.pid != os.getsid(0)
            rec = json.loads((layout.ray_tmp / "shoprld-head.json").read_text())
            assert rec["sid"] == sid
            head_env = Path(f"/proc/{sid}/environ").read_bytes().split(b"\0")
            assert f"RAY_TMPDIR={ray_tmpdir_path(layout)}".encode() in head_env
            assert await launcher.stop_head(grace=5.0)
        assert session_pids(sid) == []
    finally:
        if sid and session_pids(sid):
            for pid in session_pids(sid):
                os.kill(pid, signal.SIGKILL)
        await launcher.client.aclose()
        link = ray_tmpdir_path(layout)
        if link != layout.ray_tmp:
            link.unlink(missing_ok=True)


@pytest.mark.anyio
async def test_a_head_that_is_not_ours_is_refused_not_reused(tmp_path: Path, standin: Standin) -> None:
    """Issue 27: a head answers on the configured address with no record of ours: one line, no job."""
    cfg, layout, launcher = setup(tmp_path, standin.address, ray_start_head=True, ray_head_command=["true"])
    with anyio.fail_after(30), pytest.raises(ConfigError, match="not one this campaign started"):
        await launcher.ensure_head({})
    assert standin.jobs() == []


@pytest.mark.anyio
async def test_a_head_record_from_another_boot_signals_nothing(tmp_path: Path) -> None:
    """After an instance restart the recorded session id may be anyone's: stop_head leaves it be."""
    cfg, layout, launcher = setup(tmp_path, "http://127.0.0.1:9")
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        layout.ray_tmp.mkdir(parents=True, exist_ok=True)
        rec = {"pid": proc.pid, "sid": proc.pid, "start_ticks": None, "boot_id": "another-boot"}
        (layout.ray_tmp / "shoprld-head.json").write_text(json.dumps(rec))
        assert not launcher.head_running()
        assert await launcher.stop_head(grace=0.5)
        assert proc.poll() is None, "a session of another boot was signalled"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.anyio
@pytest.mark.parametrize("keep", [False, True])
async def test_the_head_goes_with_trains_job_unless_kept(tmp_path: Path, keep: bool) -> None:
    """Issue 27: idle() after TRAIN stops the head shoprld started (its session, its record), so
    its memory, logs and orphans do not live the whole campaign; ray_keep_head keeps it."""
    port = free_port()
    head_cmd = [PY, str(STANDIN), "--port", str(port), "--logs-dir", str(tmp_path / "head-logs")]
    cfg, layout, launcher = setup(tmp_path, f"http://127.0.0.1:{port}", ray_start_head=True,
                                  ray_head_command=head_cmd, ray_keep_head=keep)
    sid = 0
    try:
        with anyio.fail_after(60):
            child = await start_trainer(launcher, layout, cfg, PRINT_ROLLOUTS)
            assert await child.wait() == 0
            assert launcher.head is not None
            sid = launcher.head.pid
            await launcher.idle()
        assert bool(session_pids(sid)) is keep
        assert (layout.ray_tmp / "shoprld-head.json").exists() is keep
    finally:
        if sid and session_pids(sid):
            for pid in session_pids(sid):
                os.kill(pid, signal.SIGKILL)
        await launcher.client.aclose()
