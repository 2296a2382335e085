"""The Ray Jobs REST API, as shoprld uses it: an httpx client and its errors.

The endpoints: ``GET /api/version`` (is a head there), ``GET/POST /api/jobs/`` (list, submit),
``GET /api/jobs/{id}`` (status), ``GET /api/jobs/{id}/logs`` (the whole log: the REST API has
no offset) and ``POST /api/jobs/{id}/stop``. Every failure to reach the API is a
:class:`RayJobsError`, which the engine retries; ray.py builds the launcher on top of this.
Touches nothing on disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx


class RayJobsError(ConnectionError):
    """The Ray Jobs API refused a request or cannot be reached.

    A ConnectionError (an OSError) on purpose: the engine retries a stage that raises one,
    with backoff, where a ShoprldError would end the daemon; a dashboard that restarts
    must not end a campaign whose job runs on.
    """


class RayJobsClient:
    """The four Jobs endpoints shoprld uses, plus the list. ``address`` is the dashboard URL."""

    def __init__(self, address: str, *, transport: httpx.AsyncBaseTransport | None = None,
                 sync_transport: httpx.BaseTransport | None = None, timeout: float = 30.0) -> None:
        # 30 s: a dashboard busy starting a head (or a job's runtime env) answers slowly.
        self.address = address.rstrip("/")
        self._transport, self._sync_transport, self._timeout = transport, sync_transport, timeout
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None or self._http.is_closed:
            # trust_env=False: a proxy from the environment must never see loopback traffic.
            self._http = httpx.AsyncClient(base_url=self.address, transport=self._transport, trust_env=False,
                                           timeout=self._timeout)
        return self._http

    def _sync(self) -> httpx.Client:
        # The daemon's start-up (adopt) waits up to the client's timeout (30 s): a dashboard slowed
        # by log reads answers late, and a job wrongly taken for gone is one launched twice.
        return httpx.Client(base_url=self.address, transport=self._sync_transport, trust_env=False,
                            timeout=self._timeout)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._client().request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise RayJobsError(f"Ray Jobs API at {self.address} unreachable ({type(exc).__name__}: {exc}); "
                               "fix: start the head (train.ray_start_head = true) or check train.ray_address") from None

    async def reachable(self) -> bool:
        try:
            r = await self._client().get("/api/version", timeout=2.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def submit(self, entrypoint: str, *, submission_id: str, env_vars: Mapping[str, str],
                     metadata: Mapping[str, str] | None = None,
                     entrypoint_resources: Mapping[str, float] | None = None) -> str:
        body: dict[str, Any] = {"entrypoint": entrypoint, "submission_id": submission_id,
                                "runtime_env": {"env_vars": dict(env_vars)}, "metadata": dict(metadata or {})}
        if entrypoint_resources:
            # Ray schedules the job's driver on a node with these custom resources (a cluster
            # of several nodes: the trainer's node, not the head's).
            body["entrypoint_resources"] = dict(entrypoint_resources)
        r = await self._request("POST", "/api/jobs/", json=body)
        if r.status_code == 200:
            return str(r.json().get("submission_id") or submission_id)
        text = r.text
        if "already exists" in text:
            raise JobExists(submission_id)
        if r.status_code == 500 and "No available agent" in text:
            raise NoAgent(f"Ray's job agent is not up yet at {self.address}")
        raise RayJobsError(f"Ray refused job {submission_id} (HTTP {r.status_code}): {_last_line(text)}")

    async def info(self, job_id: str) -> dict[str, Any] | None:
        """The job's details, or None when Ray does not know it."""
        r = await self._request("GET", f"/api/jobs/{job_id}")
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RayJobsError(f"GET /api/jobs/{job_id}: HTTP {r.status_code}: {_last_line(r.text)}")
        data = r.json()
        return data if isinstance(data, dict) else None

    async def list(self) -> list[dict[str, Any]]:
        r = await self._request("GET", "/api/jobs/")
        if r.status_code != 200:
            raise RayJobsError(f"GET /api/jobs/: HTTP {r.status_code}: {_last_line(r.text)}")
        data = r.json()
        return [j for j in data if isinstance(j, dict)] if isinstance(data, list) else []

    async def logs(self, job_id: str) -> str:
        r = await self._request("GET", f"/api/jobs/{job_id}/logs")
        if r.status_code != 200:
            raise RayJobsError(f"GET /api/jobs/{job_id}/logs: HTTP {r.status_code}")
        return str(r.json().get("logs", ""))

    async def stop(self, job_id: str) -> bool:
        r = await self._request("POST", f"/api/jobs/{job_id}/stop")
        return r.status_code == 200 and bool(r.json().get("stopped"))

    def info_sync(self, job_id: str) -> dict[str, Any] | None:
        """Blocking GET (for the synchronous ``adopt`` of the Launcher protocol)."""
        try:
            with self._sync() as c:
                r = c.get(f"/api/jobs/{job_id}")
        except httpx.HTTPError as exc:
            raise RayJobsError(f"Ray Jobs API at {self.address} unreachable ({exc})") from None
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RayJobsError(f"GET /api/jobs/{job_id}: HTTP {r.status_code}")
        data = r.json()
        return data if isinstance(data, dict) else None

    def stop_sync(self, job_id: str) -> None:
        """Blocking stop request (for ``signal_group``, which must not await)."""
        try:
            with self._sync() as c:
                c.post(f"/api/jobs/{job_id}/stop", timeout=min(self._timeout, 5.0))  # it blocks the loop
        except httpx.HTTPError:
            pass


class JobExists(RayJobsError):
    """POST /api/jobs/ with a submission id Ray already holds."""

    def __init__(self, submission_id: str) -> None:
        super().__init__(f"Ray already holds job {submission_id}")
        self.submission_id = submission_id


class NoAgent(RayJobsError):
    """A head that has just started answers before its job agent can take a submission."""


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(empty)"


__all__ = ["JobExists", "NoAgent", "RayJobsClient", "RayJobsError"]
