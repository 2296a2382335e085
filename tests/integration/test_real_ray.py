"""TRAIN as real Ray jobs: a real local head on loopback, the trainer stand-in as the job,
the daemon SIGKILLed mid-job and restarted.

Slow suite (``tests/integration/run_real_ray.sh`` makes a venv with ``ray[default]``); it
skips where ``ray`` is not importable. Safety: the head runs in a session of its own and is
stopped by that session id (SIGTERM, then SIGKILL, to every pid in it), never with
``ray stop`` (which kills every Ray on the machine) and never by name. Loopback only;
every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="ray[default] is not installed (tests/integration/run_real_ray.sh)")

import httpx

from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.ops.demo import create_tree
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.system.proctable import session_pids

RUNNER = Path(__file__).resolve().parent / "ray_campaign_runner.py"
RAY_BIN = Path(sys.executable).parent / "ray"
PREFIX = "shoprld-demo-qwen35-4b-train-100-"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(pred, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
        except (httpx.HTTPError, OSError, ValueError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def stop_session_sync(sid: int, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, every pid in session ``sid``; bounded waits."""
    assert sid > 1 and sid != os.getsid(0)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in session_pids(sid):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not session_pids(sid):
            return


class Head:
    """A real Ray head in its own session, on loopback ports picked free."""

    def __init__(self) -> None:
        if not RAY_BIN.exists():
            pytest.skip(f"no ray CLI next to {sys.executable}")
        self.temp = Path(tempfile.mkdtemp(prefix="shoprld-test-rayhead-", dir="/tmp"))  # short: AF_UNIX paths
        self.dashboard = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard}"
        self.gcs_port = free_port()
        argv = [str(RAY_BIN), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard}", f"--port={self.gcs_port}",
                f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                "--num-cpus=2", f"--temp-dir={self.temp}", "--disable-usage-stats"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.log = open(self.temp / "head.out", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        self.sid = self.proc.pid
        try:
            wait_for(self.ready, 180, "the Ray dashboard's Jobs API")
        except BaseException:
            self.close()
            raise

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ray start exited {self.proc.returncode}: {(self.temp / 'head.out').read_text()[-2000:]}")
        with httpx.Client(base_url=self.address, trust_env=False, timeout=3) as c:
            return c.get("/api/version").status_code == 200 and c.get("/api/jobs/").status_code == 200

    def jobs(self) -> list[dict]:  # type: ignore[type-arg]
        with httpx.Client(base_url=self.address, trust_env=False, timeout=10) as c:
            return [j for j in c.get("/api/jobs/").json() if str(j.get("submission_id") or "").startswith(PREFIX)]

    def close(self) -> None:
        stop_session_sync(self.sid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()
        for _ in range(5):  # a dying raylet can still write a file or two
            shutil.rmtree(self.temp, ignore_errors=True)
            if not self.temp.exists():
                break
            time.sleep(1.0)


@pytest.fixture
def head() -> Iterator[Head]:
    h = Head()
    try:
        yield h
    finally:
        h.close()


def tagged_sessions(state_dir: Path) -> set[int]:
    """Sessions of the local children a daemon of this tree started (its SHOPRLD_CHILD tag)."""
    want = f"SHOPRLD_CHILD={state_dir}|".encode()
    out: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if want in Path(f"/proc/{entry.name}/environ").read_bytes():
                    out.add(os.getsid(int(entry.name)))
            except OSError:
                continue
    return out


def start_daemon(campaign: Path, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "ab") as fh:
        return subprocess.Popen([sys.executable, str(RUNNER), str(campaign)], stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def test_trainer_jobs_survive_a_daemon_sigkill_and_are_reattached_not_resubmitted(head: Head, tmp_path: Path) -> None:
    """Two rounds run TRAIN as Ray jobs; the daemon is SIGKILLed while round 0's job runs and
    restarted; the Jobs API then shows exactly one job per round, all SUCCEEDED, and the
    campaign completes: the persisted job record is adopted by TRAIN (nothing stops it before
    the round state that owns it decides)."""
    campaign = create_tree(tmp_path, fast=True, rounds=2)
    text = campaign.read_text()
    text, n1 = re.subn(r'^launcher = "local"$', f'launcher = "ray"\nray_address = "{head.address}"', text, flags=re.MULTILINE)
    # 1 s a step: the job must outlive the daemon's restart (imports, preflight, ShopSim's adoption)
    # even on a loaded CI box, or there is nothing left to adopt (it would be re-attached instead).
    text, n2 = re.subn(r'^step_seconds = ".*"$', 'step_seconds = "1.0"', text, flags=re.MULTILINE)
    assert n1 == 1 and n2 == 1
    campaign.write_text(text)
    cfg = load_config(campaign)
    layout = Layout.from_config(cfg)
    state_dir = layout.state_dir
    log0 = layout.stage_log(0, "TRAIN")
    out = tmp_path / "daemon.out"
    started = time.monotonic()
    daemon = start_daemon(campaign, out)
    try:
        # Mid-job: the job is RUNNING and has logged a few rollouts into the stage log.
        wait_for(lambda: [j for j in head.jobs() if j["status"] == "RUNNING"], 120, "round 0's job RUNNING")
        wait_for(lambda: log0.exists() and re.search(r" - rollout [3-9]: \{", log0.read_text()), 120,
                 "rollout 3 in the stage log")
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        [job] = head.jobs()
        assert job["status"] in ("PENDING", "RUNNING"), job["status"]  # the job outlived the daemon
        daemon = start_daemon(campaign, out)
        rc = daemon.wait(timeout=300)
        elapsed = time.monotonic() - started
        assert rc == 0, out.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=10)
        for sid in tagged_sessions(state_dir):
            stop_session_sync(sid, grace=5)
    jobs = head.jobs()
    by_round: dict[str, list[str]] = {}
    for j in jobs:
        rid = j["submission_id"][len(PREFIX):].rsplit("-", 1)[0]
        by_round.setdefault(rid, []).append(j["submission_id"])
    assert by_round == {"round-000": [f"{PREFIX}round-000-1"], "round-001": [f"{PREFIX}round-001-1"]}, jobs
    assert {j["status"] for j in jobs} == {"SUCCEEDED"}
    for j in jobs:
        # Issue 27: GET /api/jobs/ (what any dashboard client reads) holds no secret value.
        assert "WANDB_API_KEY" not in j["runtime_env"]["env_vars"]
        assert "demo-fake-wandb-key" not in json.dumps(j)
        assert j["runtime_env"]["env_vars"]["WANDB_RESUME"] == "allow"
    text0 = log0.read_text()
    assert re.search(r" - rollout 19: \{", text0)
    adopted = [r for r in map(json.loads, (state_dir / "journal.jsonl").read_text().splitlines())
               if r.get("event") == "child.adopted" and r.get("role") == "trainer"]
    assert len(adopted) == 1 and "re-attach trainer" not in text0
    status = json.loads((state_dir / "status.json").read_text())
    assert status["state"] == "DONE"
    ledger = layout.ledger.read_text().splitlines()
    assert any(f"{PREFIX}round-000-1" in line for line in ledger)
    print(f"\nreal-ray campaign with a SIGKILL mid-job: {elapsed:.1f}s, "
          f"jobs: {sorted(j['submission_id'] for j in jobs)}")


def _dashboard_pid(head: Head) -> int:
    """The head's dashboard process (its session's `dashboard/dashboard.py`)."""
    for pid in session_pids(head.sid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"dashboard/dashboard.py" in cmd:
            return pid
    raise AssertionError("no dashboard process in the head's session")


def _ray_tree(root: Path, head: Head, step_seconds: str, rounds: int = 2) -> Path:
    """A fast demo tree whose trainer runs as a job on ``head``, ``step_seconds`` a rollout."""
    campaign = create_tree(root, fast=True, rounds=rounds)
    text, n1 = re.subn(r'^launcher = "local"$', f'launcher = "ray"\nray_address = "{head.address}"',
                       campaign.read_text(), flags=re.MULTILINE)
    text, n2 = re.subn(r'^step_seconds = ".*"$', f'step_seconds = "{step_seconds}"', text, flags=re.MULTILINE)
    assert n1 == 1 and n2 == 1
    campaign.write_text(text)
    return campaign


def _outcome(root: Path) -> dict[str, object]:
    """What a campaign of the demo tree at ``root`` produced, the same for any run of it that
    is right: the round results (val summaries, gate manifests, SkillBanks, curricula), the
    ledger's verdicts and the checkpoints kept (their iterations and the tracker)."""
    from shoprld.daemon.foundation.records.ledger import COLUMNS
    from tests.demotree import results

    cfg = load_config(root / "campaign.toml")
    layout = Layout.from_config(cfg)
    rows = [dict(zip(COLUMNS, line.split("\t"))) for line in layout.ledger.read_text().splitlines()
            if line and not line.startswith("#")][1:]
    save = layout.save_dir
    return {
        "results": results(root),
        "ledger": [(r["index"], r["metric_name"], r["metric_value"], r["status"]) for r in rows],
        "checkpoints": sorted(p.name for p in save.iterdir() if p.name.startswith("iter_")),
        "tracker": (save / "latest_checkpointed_iteration.txt").read_text(),
    }


def test_a_restart_while_the_dashboard_is_stopped_reattaches_and_never_launches_twice(head: Head, tmp_path: Path) -> None:
    """Issue 27: the daemon is SIGKILLed in TRAIN and restarted while the head's dashboard is
    SIGSTOPped for 20 s: nothing is launched blind, the live job is re-attached once the API
    answers, the campaign ends DONE with one job per round, one trainer at a time, no
    wrong-resume verdict, and the same results as an unfaulted run of the same campaign."""
    # 2 s a step: round 0's job (21 steps) outlives the 20 s the dashboard is stopped, so the
    # restarted daemon must re-attach to it (with 1 s it may end during the restart; TRAIN then
    # takes the finished checkpoint and launches nothing: seen once, now guarded).
    root = tmp_path / "faulted"
    campaign = _ray_tree(root, head, "2.0")
    cfg = load_config(campaign)
    layout = Layout.from_config(cfg)
    log0 = layout.stage_log(0, "TRAIN")
    out = tmp_path / "daemon.out"
    daemon = start_daemon(campaign, out)
    second = None
    dash = _dashboard_pid(head)
    try:
        wait_for(lambda: [j for j in head.jobs() if j["status"] == "RUNNING"], 120, "round 0's job RUNNING")
        wait_for(lambda: log0.exists() and re.search(r" - rollout [3-9]: \{", log0.read_text()), 120, "rollout 3")
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)
        os.kill(dash, signal.SIGSTOP)
        try:
            second = start_daemon(campaign, out)
            time.sleep(20)
        finally:
            os.kill(dash, signal.SIGCONT)
        rc = second.wait(timeout=300)
        assert rc == 0, out.read_text()[-3000:]
    finally:
        for p in (daemon, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for sid in tagged_sessions(layout.state_dir):
            stop_session_sync(sid, grace=5)
    jobs = head.jobs()
    print("\n" + "\n".join(f"{j['submission_id']}: {j['status']} {str(j.get('message'))[:300]}" for j in jobs))
    assert sorted(j["submission_id"] for j in jobs) == [f"{PREFIX}round-000-1", f"{PREFIX}round-001-1"], jobs
    assert {j["status"] for j in jobs} == {"SUCCEEDED"}
    # One trainer at a time: each job ended (Ray's own clock, ms) before the next one started.
    spans = sorted((int(j["start_time"]), int(j["end_time"])) for j in jobs)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), spans
    records = [json.loads(line) for line in (layout.state_dir / "journal.jsonl").read_text().splitlines()]
    assert not [r for r in records if "wrong resume" in json.dumps(r).lower()]
    assert json.loads((layout.state_dir / "status.json").read_text())["state"] == "DONE"
    faulted = _outcome(root)

    # The same campaign unfaulted (its own tree, the same head; steps' pace changes no result).
    ref_root = tmp_path / "reference"
    ref_out = tmp_path / "reference.out"
    ref = start_daemon(_ray_tree(ref_root, head, "0.05"), ref_out)
    try:
        assert ref.wait(timeout=300) == 0, ref_out.read_text()[-3000:]
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait(timeout=10)
        for sid in tagged_sessions(ref_root / "state"):
            stop_session_sync(sid, grace=5)
    reference = _outcome(ref_root)
    assert faulted["results"] and faulted["checkpoints"], faulted
    assert faulted == reference
    print(f"\nreal-ray: daemon SIGKILLed, dashboard SIGSTOPped 20 s during the restart: DONE, jobs "
          f"{sorted(j['submission_id'] for j in jobs)} (spans {spans}); results equal to an unfaulted run: "
          f"{len(faulted['results'])} result files, ledger {faulted['ledger']}, checkpoints {faulted['checkpoints']}")


def test_ensure_head_starts_a_real_head_in_a_deep_experiment_dir_and_stops_it_by_session(tmp_path: Path) -> None:
    """With train.ray_start_head the launcher starts `ray start --head --block` in its own
    session with RAY_TMPDIR in a deep experiment dir (through the short /tmp link, since
    Ray's socket paths would pass 107 bytes), runs a job on it, and stops it by session."""
    import anyio
    from shoprld.daemon.foundation.config.config import config_from_dict
    from shoprld.daemon.foundation.storage import raysessions
    from shoprld.daemon.foundation.storage.diskbudget import floor_unit
    from shoprld.daemon.foundation.storage.preflight import budget_for
    from shoprld.daemon.services.ray import RayLauncher, ray_tmpdir_path
    from shoprld.daemon.round.plan import resolve

    if not RAY_BIN.exists():
        pytest.skip(f"no ray CLI next to {sys.executable}")
    dash = free_port()
    deep = tmp_path / ("volume-" + "x" * 40)
    head_cmd = [str(RAY_BIN), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--port={free_port()}",
                f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                "--num-cpus=2", "--disable-usage-stats"]
    cfg = config_from_dict({
        "campaign": {"name": "deep", "experiment": "exp", "rounds": 1, "steps_per_round": 1},
        "storage": {"repo": str(tmp_path / "repo"), "ephemeral_root": str(deep), "state_dir": str(tmp_path / "st")},
        "wandb": {"enabled": False},
        "train": {"launcher": "ray", "ray_address": f"http://127.0.0.1:{dash}", "ray_start_head": True,
                  "ray_head_command": head_cmd, "command": ["true"]},
    }, tmp_path / "c.toml")
    layout = Layout.from_config(cfg, environ={})
    (tmp_path / "repo").mkdir()
    link = ray_tmpdir_path(layout)
    assert link != layout.ray_tmp  # the real path is too long for Ray's sockets
    launcher = RayLauncher(cfg, layout, poll=0.2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    sid = 0

    async def run() -> None:
        nonlocal sid
        with anyio.fail_after(240):
            # About 60 MiB of SGLang-like request lines (issue 27): followed by offset from the
            # driver log on this box, the copy's memory stays flat however long the log grows.
            code = ("import sys\nprint('rollout 0', flush=True)\nline = '[DP0 TP0] INFO: 127.0.0.1 - \"POST "
                    "/generate HTTP/1.1\" 200 OK #running-req: 61, #token: 412345 ' + 'x' * 120\n"
                    "for i in range(400000):\n    sys.stdout.write(line + '\\n')\n")
            argv = [sys.executable, "-c", code]
            child = await launcher.start("trainer", argv, env=env, cwd=tmp_path / "repo",
                                         log=layout.stage_log(0, "TRAIN"), redacted_argv=["python", "-c", "..."],
                                         round=resolve(cfg, layout, 0))
            assert launcher.head is not None
            sid = launcher.head.pid
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            assert await child.wait() == 0
            grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
            size = layout.stage_log(0, "TRAIN").stat().st_size / 2**20
            assert child.driver_log is not None and size > 55, (child.driver_log, size)
            assert grew < 40, f"peak RSS grew {grew:.0f} MiB following a {size:.0f} MiB log"
            print(f"\nreal head of ours: a {size:.1f} MiB job log followed by offset; peak RSS grew {grew:.1f} MiB")
            # Ray's session logs: in the experiment's ray dir on the volume (the /tmp link only
            # shortens the path), shown beside the stage logs, and counted by the disk forecast.
            driver = layout.logs / "ray-session" / f"job-driver-{child.record.job_id}.log"
            assert driver.is_file() and driver.stat().st_size > 55 * 2**20
            assert layout.exp_dir.resolve() in driver.resolve().parents, driver.resolve()
            [session] = raysessions.sessions(layout.ray_tmp)
            assert await launcher.stop_head(grace=15.0)
            size = raysessions.tree_bytes(session)
            fc = budget_for(cfg, layout).forecast
            assert fc.ray_logs_bytes == max(0, 2 * max(size, floor_unit(fc.checkpoint_bytes) // 2) - size)
            print(f"real head's session {session.name}: {size / 2**20:.1f} MiB on the volume "
                  f"({raysessions.tree_bytes(session / 'logs') / 2**20:.1f} MiB of logs); forecast "
                  f"reserves {fc.ray_logs_bytes / 2**20:.1f} MiB more")
        await launcher.client.aclose()

    try:
        anyio.run(run)
        assert sid and session_pids(sid) == []
        assert "rollout 0" in layout.stage_log(0, "TRAIN").read_text()
    finally:
        if sid:
            stop_session_sync(sid, grace=5)
        layout.remove_short_links()


def test_an_existing_two_node_cluster_runs_the_trainer_on_the_node_it_asks_for(head: Head, tmp_path: Path) -> None:
    """Issue 27, item 6: a cluster shoprld did not start (a head and a worker node, both by
    `ray start`, on this machine): the job goes to the worker through its custom resource
    (train.ray_entrypoint_resources), and shoprld never stops or signals either node."""
    import anyio

    from shoprld.daemon.foundation.config.config import config_from_dict
    from shoprld.daemon.round.plan import resolve
    from shoprld.daemon.services.ray import RayLauncher

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["SHOPRLD_TEST_NODE"] = "worker"  # what the worker node's processes inherit
    argv = [str(RAY_BIN), "start", "--block", f"--address=127.0.0.1:{head.gcs_port}", "--node-ip-address=127.0.0.1",
            "--num-cpus=1", '--resources={"shoprld_trainer": 1}', "--disable-usage-stats"]
    with open(tmp_path / "worker.out", "wb") as out:
        worker = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                  start_new_session=True)
    try:
        cfg = config_from_dict({
            "campaign": {"name": "two", "experiment": "nodes", "rounds": 1, "steps_per_round": 2},
            "storage": {"repo": str(tmp_path / "repo"), "ephemeral_root": str(tmp_path / "eph"),
                        "state_dir": str(tmp_path / "state"), "user": "u"},
            "wandb": {"enabled": False},
            "train": {"launcher": "ray", "ray_address": head.address, "command": ["true"],
                      "ray_entrypoint_resources": {"shoprld_trainer": 1}},
        }, tmp_path / "c.toml")
        layout = Layout.from_config(cfg, environ={})
        layout.logs.mkdir(parents=True)
        (tmp_path / "repo").mkdir()
        code = "import os\nprint('node=' + os.environ.get('SHOPRLD_TEST_NODE', 'head'), flush=True)"
        launcher = RayLauncher(cfg, layout, poll=0.5)

        async def run() -> int | None:
            child = await launcher.start("trainer", [sys.executable, "-c", code], env={}, cwd=None,
                                         log=layout.stage_log(0, "TRAIN"), redacted_argv=["python"],
                                         round=resolve(cfg, layout, 0))
            rc = await child.wait()
            await launcher.idle()  # a cluster shoprld did not start: idle() leaves it alone
            await launcher.aclose()
            return rc

        assert anyio.run(run) == 0
        text = layout.stage_log(0, "TRAIN").read_text()
        assert "node=worker" in text, text[-2000:]
        assert worker.poll() is None and head.proc.poll() is None, "shoprld touched a cluster it did not start"
        print(f"\ntwo-node cluster: the job ran on the worker node ({text.strip().splitlines()[-1]})")
    finally:
        stop_session_sync(worker.pid)


def _vm_hwm_kib(pid: int) -> int | None:
    """The process's peak RSS so far (``VmHWM``, KiB); None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def test_a_two_round_campaign_on_heads_of_its_own_with_60_mib_of_engine_lines_a_round(tmp_path: Path) -> None:
    """Issue 27's Show: a 2-round campaign whose TRAIN starts a real head of its own
    (train.ray_start_head) and whose trainer prints about 60 MiB of SGLang-like request lines a
    round. The daemon's peak RSS stays under 80 MiB while the job logs reach the stage logs (by
    offset from the driver log); each head goes when its job is done, so each round leaves one
    Ray session, on the experiment's volume, two kept; the short /tmp links are gone at DONE."""
    from shoprld.daemon.foundation.storage import raysessions
    from shoprld.daemon.foundation.records.layout import short_link

    if not RAY_BIN.exists():
        pytest.skip(f"no ray CLI next to {sys.executable}")
    dash = free_port()
    head_cmd = [str(RAY_BIN), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--port={free_port()}",
                f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                "--num-cpus=2", "--disable-usage-stats"]
    campaign = create_tree(tmp_path, fast=True, rounds=2)
    text, n1 = re.subn(r'^launcher = "local"$',
                       f'launcher = "ray"\nray_address = "http://127.0.0.1:{dash}"\nray_start_head = true\n'
                       f'ray_head_command = {json.dumps(head_cmd)}', campaign.read_text(), flags=re.MULTILINE)
    text, n2 = re.subn(r'DEMO_CKPT_BYTES = "1048576" \}', 'DEMO_CKPT_BYTES = "1048576", DEMO_LOG_MIB = "60" }', text)
    assert n1 == 1 and n2 == 1
    campaign.write_text(text)
    cfg = load_config(campaign)
    layout = Layout.from_config(cfg)
    out = tmp_path / "daemon.out"
    env_ray = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    started = time.monotonic()
    with open(out, "ab") as fh:
        daemon = subprocess.Popen([sys.executable, str(RUNNER), str(campaign)], stdout=fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True, env=env_ray)
    peak = 0
    try:
        deadline = time.monotonic() + 420
        while daemon.poll() is None and time.monotonic() < deadline:
            peak = max(peak, _vm_hwm_kib(daemon.pid) or 0)
            time.sleep(0.1)
        rc = daemon.wait(timeout=5)
        elapsed = time.monotonic() - started
        assert rc == 0, out.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=10)
        for sid in tagged_sessions(layout.state_dir):
            stop_session_sync(sid, grace=5)
        try:  # a head left by a failure: its recorded session, ours
            rec = json.loads((layout.ray_tmp / "shoprld-head.json").read_text())
            if int(rec.get("sid", 0)) > 1:
                stop_session_sync(int(rec["sid"]), grace=5)
        except (OSError, ValueError):
            pass
        links = layout.remove_short_links()
    assert json.loads((layout.state_dir / "status.json").read_text())["state"] == "DONE"
    sizes = [layout.stage_log(r, "TRAIN").stat().st_size / 2**20 for r in range(2)]
    print(f"\ndaemon peak RSS {peak / 1024:.1f} MiB, stage logs {sizes} MiB")
    assert all(s > 55 for s in sizes), sizes
    assert peak / 1024 <= 80, f"daemon peak RSS {peak / 1024:.1f} MiB with {sizes} MiB job logs"
    jobs = [json.loads((layout.artifacts / "round" / f"round-00{r}.json").read_text())["job_id"] for r in range(2)]
    assert jobs == [f"{PREFIX}round-000-1", f"{PREFIX}round-001-1"], jobs
    # One head per TRAIN, stopped after its job: a session per round, both kept, none running.
    kept = raysessions.sessions(layout.ray_tmp)
    assert len(kept) == 2 and not (layout.ray_tmp / "shoprld-head.json").exists()
    assert all(session_pids(int(s.name.rsplit("_", 1)[1])) == [] for s in kept)
    driver = layout.logs / "ray-session" / f"job-driver-{jobs[1]}.log"
    assert driver.stat().st_size > 55 * 2**20 and layout.exp_dir.resolve() in driver.resolve().parents
    session_mib = [raysessions.tree_bytes(s) / 2**20 for s in kept]
    # The campaign removed its short links when it ended (before the teardown above).
    assert links == [] and not short_link(layout.tmp, "tmp").is_symlink()
    assert not short_link(layout.ray_tmp, "ray").is_symlink()
    print(f"\nreal heads of ours, 2 rounds in {elapsed:.0f}s: job logs {sizes[0]:.1f} + {sizes[1]:.1f} MiB, daemon "
          f"peak RSS {peak / 1024:.1f} MiB, Ray sessions kept {[f'{m:.1f} MiB' for m in session_mib]}")
