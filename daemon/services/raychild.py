"""One Ray job as a :class:`~.processes.Child`: status, log, stop (split from :mod:`.ray`).

:class:`RayJobChild` has ``pid = pgid = 0`` (no local process stands for a job) and overrides
every method that would signal a process group. Its ``wait`` keeps a job it cannot see alive
while the head that runs it (ours) lives (issue 27); its log is followed by byte offset from the
driver log when the head is on this box, else through the Jobs API (see :mod:`.ray`'s docstring).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from shoprld.daemon.services.processes import Child, ChildRecord
from shoprld.daemon.services.rayjobs import RayJobsClient, RayJobsError

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
LIVE = frozenset({"PENDING", "RUNNING"})


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# -- one job, as a Child --------------------------------------------------------------------
class RayJobChild(Child):
    """A Ray job standing in for a local child: same surface, no process group."""

    def __init__(self, record: ChildRecord, client: RayJobsClient, *, status: str = "PENDING",
                 poll: float = 1.0, unreachable_timeout: float = 300.0,
                 head_alive: Callable[[], bool] = lambda: False, driver_log: Path | None = None) -> None:
        super().__init__(record, None)
        self.head_alive = head_alive  # whether the head that runs the job (ours) still runs
        self.driver_log = driver_log  # the job's log on this box: followed by byte offset
        self.client = client
        self.status = status
        self.message = ""
        self._poll = poll
        self._unreachable_timeout = unreachable_timeout
        self._lock = anyio.Lock()
        self._log = Path(record.log) if record.log else None
        self._offset_file = (self._log.with_name(f".{self._log.name}.{record.job_id}.offset")
                             if self._log else None)
        self._copied = _read_offset(self._offset_file)
        self._boffset_file = (self._log.with_name(f".{self._log.name}.{record.job_id}.driver-offset")
                              if self._log else None)
        self._bcopied = _read_offset(self._boffset_file)
        self._log_due = 0.0
        self._log_size = 0
        self.submitted_entrypoint = ""   # what Ray runs, for a re-attached job
        self.status_failures = 0         # failed status calls in a row (the job's fate)
        self.log_failures = 0            # failed log pulls (never the job's fate)

    @property
    def job_id(self) -> str:
        return self.record.job_id

    def alive(self) -> bool:
        return self.returncode is None and self.status not in TERMINAL

    def _finish(self, status: str) -> int:
        self.status = status
        self.returncode = 0 if status == "SUCCEEDED" else 1
        return self.returncode

    async def refresh(self) -> str:
        info = await self.client.info(self.job_id)
        if info is None:  # deleted behind our back: nothing runs any more
            self.message = "Ray no longer knows this job"
            self._finish("STOPPED")
            return self.status
        self.status = str(info.get("status", "PENDING"))
        self.message = str(info.get("message") or "")
        if self.status in TERMINAL:
            self._finish(self.status)
        return self.status

    async def pull_logs(self, *, force: bool = False) -> int:
        """Append what the job logged since the last pull to the stage log; bytes written.

        With the driver log on this box (a head of ours), it is followed by byte offset, a
        chunk at a time: memory stays flat however long the log grows, and the dashboard is
        never asked (issue 27: Ray's agent materialises the whole log per request, about 3x).
        Otherwise the Jobs API's whole log, with a poll that backs off with its size."""
        if self._log is None:
            return 0
        if self.driver_log is not None:
            if self._bcopied or self.driver_log.exists() or self.status not in ("RUNNING", "SUCCEEDED", "FAILED"):
                return self._follow_driver_log()
            # Running, yet no driver log where Ray writes it (a head command with its own
            # --temp-dir?): the Jobs API's log then, rather than a trainer that looks silent.
            self._note(f"no driver log at {self.driver_log}; following the job's log through the Jobs API")
            self.driver_log = None
        now = time.monotonic()
        if not force and now < self._log_due:
            return 0
        async with self._lock:
            text = await self.client.logs(self.job_id)
            # The whole log comes back each time: back off with its size (1 s per 4 MiB, at most 30 s).
            self._log_size = len(text)
            self._log_due = time.monotonic() + min(30.0, max(self._poll, len(text) / (4 << 20)))
            if len(text) < self._copied:  # a log that shrank is not ours to reconcile: restart the copy
                self._copied = 0
            new = text[self._copied:]
            if not new:
                return 0
            data = new.encode("utf-8", errors="replace")
            fd = os.open(self._log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            self._copied = len(text)
            _write_offset(self._offset_file, self._copied)
            return len(data)

    def _follow_driver_log(self, chunk: int = 1 << 20, most: int = 64 << 20) -> int:
        assert self.driver_log is not None and self._log is not None
        try:
            src = open(self.driver_log, "rb")
        except OSError:
            return 0  # not written yet (PENDING), or the session is gone
        total = 0
        with src:
            if os.fstat(src.fileno()).st_size < self._bcopied:
                self._bcopied = 0  # another file under the same name: copy it from its start
            src.seek(self._bcopied)
            fd = os.open(self._log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                while total < most:
                    data = src.read(chunk)
                    if not data:
                        break
                    os.write(fd, data)
                    total += len(data)
                    self._bcopied += len(data)
            finally:
                os.close(fd)
        if total:
            _write_offset(self._boffset_file, self._bcopied)
        return total

    async def wait(self, poll: float | None = None) -> int | None:
        """Poll until the job is terminal, copying its log; 0 SUCCEEDED, 1 FAILED/STOPPED.

        A status call that fails is retried with backoff; "the API does not answer" becomes
        "the job failed" only after ``unreachable_timeout`` AND with no head of ours running
        (issue 27: a dashboard stalled by log reads must not kill a healthy run). A failed log
        pull says nothing of the job: it is counted apart and never ends the wait."""
        interval = self._poll if poll is None else max(poll, 0.05)
        unreachable_since: float | None = None
        while self.alive():
            try:
                await self.refresh()
                self.status_failures, unreachable_since = 0, None
            except RayJobsError as exc:
                self.status_failures += 1
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > self._unreachable_timeout:
                    if self.head_alive():
                        self._note(f"the Ray Jobs API has not answered for {self._unreachable_timeout:.0f}s ({exc}), "
                                   "but the head runs: still watching the job")
                        unreachable_since = time.monotonic()
                    else:
                        self._note(f"lost the Ray Jobs API for {self._unreachable_timeout:.0f}s ({exc}) and no head "
                                   "of ours runs; treating the job as failed")
                        self.message = str(exc)
                        return self._finish("FAILED")
            if self.alive():
                try:
                    await self.pull_logs()
                    self.log_failures = 0
                except RayJobsError:
                    self.log_failures += 1
            if self.alive():
                # Back off while the API fails (a struggling dashboard needs air), up to 30 s.
                await anyio.sleep(min(30.0, interval * 2 ** min(self.status_failures, 5)))
        try:
            await self.pull_logs(force=True)
        except RayJobsError:
            pass
        return self.returncode

    async def stop(self, grace: float = 10.0) -> int | None:
        """POST stop, then wait for a terminal status; shielded, like a local child's stop."""
        with anyio.CancelScope(shield=True):
            if not self.alive():
                return self.returncode
            self._note(f"stopping ray job {self.job_id}")
            for budget in (max(grace, 1.0) + 5.0, 30.0):  # Ray escalates to SIGKILL itself after ~3 s
                try:
                    await self.client.stop(self.job_id)
                except RayJobsError:
                    pass
                with anyio.move_on_after(budget):
                    while self.alive():
                        try:
                            await self.refresh()
                        except RayJobsError:
                            pass
                        if self.alive():
                            await anyio.sleep(0.2)
                if not self.alive():
                    break
            try:
                await self.pull_logs(force=True)
            except RayJobsError:
                pass
        return self.returncode

    def signal_group(self, sig: int) -> None:
        """A signal means stop: the job's processes are Ray's to signal, not ours."""
        if sig and self.alive() and sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
            self.client.stop_sync(self.job_id)

    def _note(self, line: str) -> None:
        if self._log is None:
            return
        try:
            with open(self._log, "a", encoding="utf-8") as fh:
                fh.write(f"=== shoprld {_now()} {line}\n")
        except OSError:
            pass


def _read_offset(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return max(0, int(json.loads(path.read_text()).get("chars", 0)))
    except (OSError, ValueError, AttributeError):
        return 0


def _write_offset(path: Path | None, chars: int) -> None:
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"chars": chars}))
        os.replace(tmp, path)
    except OSError:
        pass
