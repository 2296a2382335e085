"""TRAIN as a Ray job, through the Ray Jobs REST API (rayjobs.py), behind the Launcher seam.

Theory of operation
-------------------
slime launches itself as a Ray job (``ray job submit -- python3 train.py ...``). A Ray job
outlives the process that submitted it, which is what an unattended campaign wants: a
daemon crash does not kill an overnight run. So role ``trainer`` is not a local child here
but a job, and every other role is a local process (the inner :class:`LocalLauncher`)::

    start("trainer") -> ensure the head (when train.ray_start_head)
                     -> list this campaign's jobs (GET /api/jobs/)
                        - another round's job still live: stop it (one trainer per save dir)
                        - this round's job PENDING/RUNNING: re-attach to it, so a crash
                          between the submit and the persisted record cannot duplicate it
                        - else POST /api/jobs/ as shoprld-<campaign>-<experiment>-<round>-<n>
    wait()           -> poll GET /api/jobs/{id}; append each GET .../logs increment to the
                        stage log (TRAIN's ``rollout (\\d+)`` progress regex keeps working);
                        0 for SUCCEEDED, 1 for FAILED or STOPPED
    stop(grace)      -> POST /api/jobs/{id}/stop (Ray: SIGTERM to the entrypoint's group,
                        then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S), poll until terminal
    adopt(record)    -> record.job_id PENDING/RUNNING: re-attached; finished while the daemon
                        was down: None (TRAIN then judges by the checkpoints on disk)

The submission id is deterministic: ``n`` is one more than the highest ``n`` Ray already
knows for this campaign and round, so it is re-derived from Ray itself after a crash.

Records: a job's :class:`ChildRecord` has ``pid = pgid = 0`` (no local process stands for
it) and ``job_id`` = the submission id. :class:`RayJobChild` overrides every method that
would signal a process group, so pgid 0 (which ``os.killpg`` reads as "my own group") is
never signalled. The engine must keep a record whose ``job_id`` is set even though its pid
is not alive (``Children.find_left`` does); without it, :meth:`start`'s re-attach
still prevents a second job.

Secrets: Ray runs the entrypoint through a shell, so every argv element is ``shlex.quote``d.
Ray's Jobs API returns ``runtime_env`` (and the entrypoint) in clear to any client of the
dashboard, so the secrets go into neither: they are written to a 0600 file under the
experiment's tmp dir, and the entrypoint sources it (``. <file> && exec ...``): Ray is told
its path, never a value. A secret value found in the entrypoint is refused before anything is
submitted. The dashboard still stays on loopback (the recipe's head binds 127.0.0.1).

Logs: with a head of ours, the job's driver log (``<RAY_TMPDIR>/ray/session_latest/logs/
job-driver-<id>.log``) is followed by byte offset, as the trainer's own log is. Otherwise (a
cluster elsewhere) the job's whole log is fetched per poll (the REST API has no offset; its
tail is a websocket), so the log poll backs off with the log's size. The number of characters already
copied is kept beside the stage log (``.<log>.<job>.offset``), so a re-attach after a daemon
crash appends only what is new.

Ray's sessions: a head of ours writes ``<exp>/ray/ray/session_*`` (every component's log and
the driver logs) on the experiment's volume; the start and the stop of each head prune them to
:data:`~shoprld.daemon.foundation.storage.raysessions.SESSIONS_KEPT`, ``<exp>/logs/ray-session`` links
the live one's logs, and the disk forecast reserves room for them (foundation/storage/raysessions.py).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from shoprld.daemon.foundation.system.proctable import session_pids
from shoprld.daemon.foundation.config.condaenv import activation_argv
from shoprld.daemon.foundation.config.config import Config
from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.layout import Layout, short_link
from shoprld.daemon.foundation.config.roles import ChildRole
from shoprld.daemon.services.processes import Child, ChildRecord, Launcher, LocalLauncher, pid_alive
from shoprld.daemon.services.raychild import LIVE, TERMINAL, RayJobChild, _now
from shoprld.daemon.services.rayjobs import JobExists, NoAgent, RayJobsClient, RayJobsError
from shoprld.daemon.round.plan import RoundValues
from shoprld.daemon.foundation.config.placeholders import expand
from shoprld.daemon.foundation.storage import raysessions
from shoprld.daemon.foundation.config.secrets import KNOWN_SECRET_KEYS
from shoprld.daemon.foundation.records.store import atomic_write_json

RAY_ROLES = (ChildRole.TRAINER,)
# Environment entries that never go to a job: the engine's local-process tag (the job is
# Ray's, not a local stray), and CUDA_VISIBLE_DEVICES, which Ray assigns per GPU actor from
# the head's own view (restrict the GPUs on the head: the head command's environment).
_NOT_FOR_JOBS = ("SHOPRLD_CHILD", "CUDA_VISIBLE_DEVICES")
_HEAD_RECORD = "shoprld-head.json"
# Ray puts sockets at <RAY_TMPDIR>/ray/session_<date>_<pid>/sockets/plasma_store, and
# AF_UNIX paths stop at 107 bytes; that suffix takes about 66.
_RAY_SOCKET_SUFFIX = 70
_AF_UNIX_MAX = 107


# -- the launcher -----------------------------------------------------------------------------
def entrypoint_of(argv: Sequence[str], cwd: Path | None) -> str:
    """Ray's entrypoint (a shell string): every element quoted; ``cd`` first, as the seed does."""
    cmd = "exec " + shlex.join(list(argv))
    return f"cd {shlex.quote(str(cwd))} && {cmd}" if cwd else cmd


def secret_names(cfg: Config) -> set[str]:
    """Every env name that holds a secret for the trainer job."""
    return set(KNOWN_SECRET_KEYS) | set(cfg.train.secrets) | set(cfg.secrets.required)


def job_env(cfg: Config, layout: Layout, env: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: the etiquette's variables, ``train.env``, the trainer's secrets
    (from ``env``), then ``train.runtime_env`` expanded for the round, and W&B's run of the
    round. :func:`split_secrets` takes the secrets out of what Ray is told.

    Not the daemon's whole environment: PATH or HOME of the daemon mean nothing on the
    node that runs the job.
    """
    keys = set(layout.child_env(cfg, base={})) | set(cfg.train.env) | secret_names(cfg)
    if cfg.wandb.enabled:
        keys |= set(cfg.wandb.pass_env)  # when set (upstream: WANDB_* "when set")
    out = {k: env[k] for k in sorted(keys) if k in env and k not in _NOT_FOR_JOBS}
    if cfg.wandb.enabled:
        # One W&B run per round: a relaunch (crash, stall, restart) continues it instead of
        # opening a second run of the same name whose steps repeat the first's.
        out["WANDB_RUN_ID"] = f"{cfg.campaign.experiment}-{values.get('round_id', '')}".strip("-")
        out["WANDB_RESUME"] = "allow"
    out.update({k: v.format_map(dict(values)) for k, v in cfg.train.runtime_env.items()})
    return out


def split_secrets(cfg: Config, env_vars: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(what Ray may be told, the secrets). The Jobs API serves ``runtime_env`` in clear to any
    client of the dashboard, so secrets travel in a 0600 file instead (:func:`write_secrets`)."""
    names = secret_names(cfg)
    return ({k: v for k, v in env_vars.items() if k not in names},
            {k: v for k, v in env_vars.items() if k in names and v})


def write_secrets(layout: Layout, round_id: str, secrets: Mapping[str, str]) -> Path:
    """The round's secrets as ``export K='v'`` lines in a 0600 file (in a 0700 dir) under the
    experiment's tmp dir, for the entrypoint to source before the trainer starts. Rewritten at
    each submission; ``clean`` removes it with the tmp dir."""
    d = layout.tmp / "ray-secrets"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    path = d / f"{round_id}.env"
    tmp = d / f".{round_id}.env.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(secrets.items())))
    os.replace(tmp, path)
    return path


def with_secrets(entrypoint: str, path: Path | None) -> str:
    """The entrypoint that sources the secrets file first (Ray runs it through ``/bin/sh``)."""
    return f". {shlex.quote(str(path))} && {entrypoint}" if path is not None else entrypoint


def ray_tmpdir_path(layout: Layout) -> Path:
    """RAY_TMPDIR for a head we start: the experiment's ray dir, or a short symlink to it in
    /tmp when the real path would push Ray's socket paths past AF_UNIX's 107 bytes."""
    target = layout.ray_tmp
    if len(str(target)) + _RAY_SOCKET_SUFFIX <= _AF_UNIX_MAX:
        return target
    return short_link(target, "ray")


def ray_tmpdir(layout: Layout) -> Path:
    """:func:`ray_tmpdir_path`, created (the dir, and the symlink when one is needed)."""
    target = layout.ray_tmp
    target.mkdir(parents=True, exist_ok=True)
    link = ray_tmpdir_path(layout)
    if link == target:
        return target
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return link
    if link.is_symlink() or link.exists():
        raise ConfigError(f"{link}: exists and does not point to {target}; fix: remove it (it is shoprld's "
                          "short RAY_TMPDIR link) and rerun")
    link.symlink_to(target, target_is_directory=True)
    return link


async def stop_session(sid: int, grace: float = 10.0) -> None:
    """SIGTERM every pid of session ``sid``, wait ``grace``, SIGKILL the rest; never by name.

    Ray's workers get process groups of their own but keep the head's session, so the
    session is the one handle on all of them (Ray's own stop command would kill EVERY Ray on the box).
    """
    if sid <= 1 or sid == os.getsid(0):
        raise ValueError(f"refusing to signal session {sid} (init's, or shoprld's own)")
    with anyio.CancelScope(shield=True):
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            pids = session_pids(sid)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            with anyio.move_on_after(wait):
                while session_pids(sid):
                    await anyio.sleep(0.1)


class RayLauncher:
    """The trainer as a Ray job; every other role through ``inner`` (local processes)."""

    def __init__(self, cfg: Config, layout: Layout, *, inner: Launcher | None = None,
                 client: RayJobsClient | None = None, poll: float = 1.0, head_timeout: float = 180.0,
                 unreachable_timeout: float = 300.0, roles: Sequence[ChildRole] = RAY_ROLES,
                 driver_logs: Path | None = None) -> None:
        self.cfg, self.layout = cfg, layout
        self.inner: Launcher = inner or LocalLauncher()
        self.client = client or RayJobsClient(cfg.train.ray_address)
        self.poll, self.head_timeout, self.unreachable_timeout = poll, head_timeout, unreachable_timeout
        self.roles = tuple(roles)
        self.head: Child | None = None
        # Where the jobs' driver logs are, when the head is ours (its session is on this box):
        # Ray writes <temp dir>/session_latest/logs/job-driver-<submission id>.log, and
        # RAY_TMPDIR/ray is the temp dir of a head started with it.
        if driver_logs is None and cfg.train.ray_start_head:
            driver_logs = ray_tmpdir_path(layout) / "ray" / "session_latest" / "logs"
        self.driver_logs = driver_logs

    # -- naming -------------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return f"shoprld-{self.cfg.campaign.name}-{self.cfg.campaign.experiment}-"

    def submission_id(self, round_id: str, n: int) -> str:
        return f"{self.prefix}{round_id}-{n}"

    def _parse(self, sid: str | None) -> tuple[str, int] | None:
        if not sid or not sid.startswith(self.prefix):
            return None
        rid, _, n = sid[len(self.prefix):].rpartition("-")
        return (rid, int(n)) if rid and n.isdigit() else None

    # -- Launcher protocol ----------------------------------------------------------------------
    async def start(self, role: ChildRole, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None,
                    log: Path, redacted_argv: Sequence[str], round: RoundValues | None = None) -> Child:
        """A Ray role becomes this round's job (``round``: the round and its values, resolved
        once by the caller); every other role goes to ``inner``."""
        if role not in self.roles:
            return await self.inner.start(role, argv, env=env, cwd=cwd, log=log, redacted_argv=redacted_argv,
                                          round=round)
        if round is None:
            raise ValueError(f"RayLauncher.start({str(role)!r}) needs the round (round=RoundValues): a job is named "
                             "after its round and its runtime env is expanded with the round's values")
        values, round_id = round.values, round.round_id
        entrypoint = entrypoint_of(argv, cwd)
        env_vars, secrets = split_secrets(self.cfg, job_env(self.cfg, self.layout, env, values))
        for name in sorted(secret_names(self.cfg)):
            value = env.get(name) or secrets.get(name)
            if value and len(value) >= 4 and value in entrypoint:
                raise ConfigError(f"train.command: the value of {name} would appear in the Ray entrypoint; "
                                  "fix: pass it through the environment (train.secrets), never argv")
        secrets_file = write_secrets(self.layout, round_id, secrets) if secrets else None
        entrypoint = with_secrets(entrypoint, secrets_file)
        shown = with_secrets(entrypoint_of(redacted_argv, cwd), secrets_file)
        if self.cfg.train.ray_start_head:
            await self.ensure_head(values)
        log.parent.mkdir(parents=True, exist_ok=True)

        ours = await self._ours()
        child = await self._attach(role, round, ours, log, list(redacted_argv))
        if child is not None:
            if str(child.submitted_entrypoint) != entrypoint:
                child._note("note: the live job's entrypoint differs from the recipe's; it keeps running as "
                            "submitted (stop the campaign to pick up the change)")
            return child
        n = 1 + max((n for rid, n, _ in ours if rid == round_id), default=0)
        sid = self.submission_id(round_id, n)
        _append(log, f"=== shoprld {_now()} start {role}: ray job {sid} at {self.client.address}: {shown}\n"
                     f"=== shoprld runtime_env.env_vars: {', '.join(sorted(env_vars))}; secrets from a 0600 file: "
                     f"{', '.join(sorted(secrets)) or 'none'}\n")
        metadata = {"shoprld_campaign": self.cfg.campaign.name, "shoprld_experiment": self.cfg.campaign.experiment,
                    "shoprld_round": round_id, "shoprld_role": role}
        deadline = time.monotonic() + self.head_timeout
        while True:
            try:
                sid = await self.client.submit(entrypoint, submission_id=sid, env_vars=env_vars, metadata=metadata,
                                               entrypoint_resources=self.cfg.train.ray_entrypoint_resources)
                break
            except JobExists:
                break  # submitted by us an instant ago (a retried request): attach to it
            except NoAgent:
                if time.monotonic() > deadline:
                    raise
                await anyio.sleep(1.0)
        info = await self.client.info(sid)
        child = self._child(sid, role, log, list(redacted_argv), str((info or {}).get("status", "PENDING")))
        self._note_job(round.plan.round_record, sid)
        return child

    async def _ours(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(round id, n, job) of every job of this campaign Ray knows."""
        ours: list[tuple[str, int, dict[str, Any]]] = []
        for j in await self.client.list():
            parsed = self._parse(j.get("submission_id"))
            if parsed is not None:
                ours.append((parsed[0], parsed[1], j))
        return ours

    async def _attach(self, role: str, round: RoundValues, ours: list[tuple[str, int, dict[str, Any]]], log: Path,
                      argv: list[str]) -> RayJobChild | None:
        """Re-attach to the round's newest live job (stopping any other live job of ours first:
        one trainer per save dir); None when the round has none."""
        live = sorted(((n, j) for rid, n, j in ours if rid == round.round_id and j.get("status") in LIVE),
                      key=lambda t: t[0])
        keep = live[-1][1] if live else None
        for _rid, _, j in ours:
            if j.get("status") in LIVE and j is not keep:
                other = self._child(str(j["submission_id"]), role, log, [], str(j.get("status")))
                await other.stop(self.cfg.train.grace)
        if keep is None:
            return None
        sid = str(keep["submission_id"])
        child = self._child(sid, role, log, argv, str(keep.get("status")))
        child.reattached, child.submitted_entrypoint = True, str(keep.get("entrypoint", ""))
        child._note(f"re-attach {role}: ray job {sid} ({keep.get('status')}) at {self.client.address}")
        self._note_job(round.plan.round_record, sid)
        return child

    async def live(self, role: ChildRole, *, log: Path, round: RoundValues) -> Child | None:
        """This round's live job, asked of Ray before anything else in TRAIN (issue 27): a job
        that outlived its daemon, or that the daemon lost sight of while the Jobs API did not
        answer, is re-attached: no emit, no resume check, no leak or GPU recovery under it.
        None when no head answers and none of ours runs (it is ours to start). Raises
        :class:`RayJobsError` when the API does not answer while our head runs, or on a cluster
        shoprld does not start: a live job may be there, so nothing is launched blind."""
        if role not in self.roles:
            return await self.inner.live(role, log=log, round=round)
        if not await self.client.reachable():
            if self.head_running() or not self.cfg.train.ray_start_head:
                # Our head runs, or the cluster is not ours to start: a job may be live there.
                raise RayJobsError(f"the Ray Jobs API at {self.cfg.train.ray_address} does not answer"
                                   + (" (the head shoprld started runs)" if self.head_running() else ""))
            return None
        log.parent.mkdir(parents=True, exist_ok=True)
        return await self._attach(role, round, await self._ours(), log, [])

    async def idle(self) -> None:
        """TRAIN's job is done: stop the head this campaign started, unless ``train.ray_keep_head``
        (the next TRAIN starts it again). A cluster shoprld did not start is never touched."""
        await self.inner.idle()
        if self.cfg.train.ray_start_head and not self.cfg.train.ray_keep_head:
            await self.stop_head(self.cfg.train.grace)

    def head_running(self) -> bool:
        """Whether the head this campaign started (its record) still runs: this boot, its pid
        with its start time."""
        try:
            rec = json.loads((self.layout.ray_tmp / _HEAD_RECORD).read_text())
            return rec.get("boot_id") == boot_id() and pid_alive(int(rec.get("pid", 0)), rec.get("start_ticks"))
        except (OSError, ValueError, TypeError):
            return False

    def adopt(self, record: ChildRecord) -> Child | None:
        if not record.job_id:
            return self.inner.adopt(record)
        try:
            info = self.client.info_sync(record.job_id)
        except RayJobsError:
            return None
        if info is None or info.get("status") not in LIVE:
            return None
        return RayJobChild(record, self.client, status=str(info["status"]), poll=self.poll,
                           unreachable_timeout=self.unreachable_timeout, head_alive=self.head_running,
                           driver_log=self.driver_log(record.job_id))

    def _child(self, sid: str, role: str, log: Path, argv: list[str], status: str) -> RayJobChild:
        record = ChildRecord(role=role, pid=0, pgid=0, start_ticks=None, started_at=time.time(), log=str(log),
                             argv=argv, job_id=sid)
        return RayJobChild(record, self.client, status=status, poll=self.poll,
                           unreachable_timeout=self.unreachable_timeout, head_alive=self.head_running,
                           driver_log=self.driver_log(sid))

    def driver_log(self, sid: str) -> Path | None:
        """The job's driver log on this box (a head of ours), followed by offset; else None."""
        return self.driver_logs / f"job-driver-{sid}.log" if self.driver_logs is not None else None

    def _note_job(self, path: Path, sid: str) -> None:
        """The ledger reads ``job_id`` from the round record (``RoundPlan.round_record``)."""
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict) or data.get("job_id") == sid:
            return
        data["job_id"] = sid
        data["ray_jobs"] = sorted(set(data.get("ray_jobs", [])) | {sid})
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, data)

    # -- the head -------------------------------------------------------------------------------
    async def ensure_head(self, values: Mapping[str, str]) -> None:
        """Make sure a head answers at ``train.ray_address``; start ``train.ray_head_command``
        (in its own session, RAY_TMPDIR in the experiment dir) when none does."""
        if await self.client.reachable():
            if self.head_running():
                return  # ours, from before a daemon restart: its jobs are ours to re-attach
            raise ConfigError(f"{self.cfg.source}: train.ray_address: a Ray head already answers at "
                              f"{self.cfg.train.ray_address}, and it is not one this campaign started (no record in "
                              f"{self.layout.ray_tmp / _HEAD_RECORD}); fix: stop that head, or use it on purpose "
                              "with train.ray_start_head = false")
        if not self.cfg.train.ray_head_command:
            raise ConfigError(f"{self.cfg.source}: train.ray_head_command: empty, and no Ray head answers at "
                              f"{self.cfg.train.ray_address}; fix: give the `ray start --head --block ...` argv")
        argv = expand(list(self.cfg.train.ray_head_command), dict(values))
        if self.cfg.train.conda_prefix is not None:
            argv = activation_argv(self.cfg.train.conda_prefix, argv)
        env = self.layout.child_env(self.cfg)
        env["RAY_TMPDIR"] = str(ray_tmpdir(self.layout))
        # The new head adds a session: keep the previous round's for a post-mortem, no more.
        raysessions.prune(self.layout.ray_tmp, keep=raysessions.SESSIONS_KEPT - 1)
        log = self.layout.logs / "ray-head.log"
        head = await self.inner.start(ChildRole.RAY_HEAD, argv, env=env, cwd=self.layout.project_root, log=log,
                                      redacted_argv=argv)
        self.head = head
        rec = {"pid": head.pid, "sid": head.pid, "start_ticks": head.record.start_ticks,
               "address": self.cfg.train.ray_address, "started_at": time.time(), "boot_id": boot_id()}
        atomic_write_json(self.layout.ray_tmp / _HEAD_RECORD, rec)
        deadline = time.monotonic() + self.head_timeout
        while time.monotonic() < deadline:
            if await self.client.reachable():
                link_session_logs(self.layout)
                return
            if not head.alive():
                raise RayJobsError(f"the Ray head exited during start-up; see {log}")
            await anyio.sleep(0.5)
        await self.stop_head()
        raise RayJobsError(f"the Ray head did not answer at {self.cfg.train.ray_address} within "
                           f"{self.head_timeout:.0f}s; see {log}")

    async def stop_head(self, grace: float = 10.0) -> bool:
        """Stop the head this campaign started (by its recorded session); False if none."""
        path = self.layout.ray_tmp / _HEAD_RECORD
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        pid, sid = int(rec.get("pid", 0)), int(rec.get("sid", 0))
        # The leader alive with its recorded start time, or gone (then what keeps its
        # session id are its own orphans); a live pid with another start time was reused.
        # A record from another boot (an instance restart: PIDs start low again) names
        # nothing of ours: its session id may be anyone's now.
        same_boot = rec.get("boot_id") == boot_id()
        ours = same_boot and (pid_alive(pid, rec.get("start_ticks")) or not pid_alive(pid))
        if pid > 1 and sid == pid and ours:
            await stop_session(sid, grace)
        if self.head is not None:
            await self.head.wait()  # reap it (it was our child)
            self.head = None
        path.unlink(missing_ok=True)
        raysessions.prune(self.layout.ray_tmp)
        return True

    async def aclose(self) -> None:
        """At daemon exit: stop the head we started, and close the HTTP client."""
        try:
            await self.stop_head()
        finally:
            await self.client.aclose()


#: Beside the stage logs: the live (or last) Ray session's logs, Ray's own and the driver's.
SESSION_LOGS_LINK = "ray-session"


def link_session_logs(layout: Layout) -> Path | None:
    """``<exp>/logs/ray-session`` -> ``../ray/ray/<the live session>/logs``: Ray's session logs are
    written in the experiment's ray dir (Ray keeps them inside the session, beside its sockets),
    and this relative link shows them with the stage logs. It names the session itself, not
    ``session_latest`` (an absolute link through the short /tmp link, which goes at the
    campaign's end). Only a link of ours is replaced; None when no session is there yet."""
    live = raysessions.live_session(layout.ray_tmp)
    if live is None:
        return None
    link = layout.logs / SESSION_LOGS_LINK
    target = Path("..") / live.relative_to(layout.exp_dir) / "logs"
    layout.logs.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return link
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        return None  # something of the user's: left alone
    link.symlink_to(target, target_is_directory=True)
    return link


def boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """This boot's id (a new one after every reboot or container instance restart)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _append(log: Path, text: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def build_launcher(cfg: Config, layout: Layout) -> Launcher:
    """The launcher ``train.launcher`` names: local processes, or the trainer as a Ray job."""
    if cfg.train.launcher == "ray":
        return RayLauncher(cfg, layout)
    return LocalLauncher()


__all__ = [
    "LIVE", "TERMINAL", "RayJobChild", "RayLauncher", "build_launcher", "entrypoint_of", "job_env", "ray_tmpdir",
    "ray_tmpdir_path", "stop_session",
]
