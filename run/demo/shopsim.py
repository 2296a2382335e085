"""STAND-IN for the ShopSimulator service (real: `ShopSimulator/shop_env/start.sh`, which
execs the Flask app `shop_env.pack_api`). Not a simulator: rewards are hashes.

It speaks the real HTTP surface and keeps the real lease semantics:
- `GET /healthz` -> {ready, environment_slots, free_slots, tasks, environment_version,
  primary_reward, observation_version}; `ready` is false during the start-up delay.
- `POST /api/shop_agent {action, ...}`; every reply is `{"result": {...}}`:
  `reset` leases a slot (uuid4 hex `lease_id`) and BLOCKS while none is free (a client that
  gives up leaves a "ghost waiter" that still takes the next freed slot, as the real one does);
  `interact` (`response`, or the demo alias `action_text`), `terminate`, `release_one`
  (idempotent on a free slot), `release_all` (frees every slot, other clients' too).
  Leases never expire. Stale lease -> 409, malformed request -> 400, exception -> 500,
  not ready yet -> 503.

Env: SHOPSIM_ENV_SLOTS (48), SHOPSIM_PORT (5700), SHOPSIM_HOST (127.0.0.1; the real one
hard-codes 0.0.0.0), SHOPSIM_TASKS (1000). Fault knobs: DEMO_SHOPSIM_START_DELAY=s,
DEMO_SHOPSIM_NEVER_READY=1, DEMO_SHOPSIM_HANG_ON_START=1 (never binds the port).
Exit codes: 0 on SIGTERM/SIGINT, 1 when the port cannot be bound, 2 for a bad setting.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import _common as c

PROG = "shopsim"
ENVIRONMENT_VERSION = "shopsim-demo-v1"
PRIMARY_REWARD = "reward"
OBSERVATION_VERSION = "structured-text-demo-v1"


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", flush=True)


class BadRequest(Exception):
    """A malformed request: HTTP 400."""


class StaleLease(Exception):
    """The slot's current lease differs from the caller's: HTTP 409."""


class SlotPool:
    """Explicit leases, as in the real `slot_lease_pool.SlotLeasePool`: never expire."""

    def __init__(self, size: int):
        self._cond = threading.Condition()
        self.size = size
        self._free = set(range(size))
        self._leases: dict[int, str] = {}

    def acquire(self) -> tuple[int, str]:
        with self._cond:
            if not self._free:
                log("no free slot; reset is queued (blocks until a release)")
            while not self._free:
                self._cond.wait()
            slot = min(self._free)
            self._free.remove(slot)
            lease = uuid.uuid4().hex
            self._leases[slot] = lease
            return slot, lease

    def check(self, slot: int, lease: str) -> None:
        with self._cond:
            if self._leases.get(slot) != lease:
                raise StaleLease(f"stale or invalid lease for environment {slot}")

    def release(self, slot: int, lease: str) -> bool:
        with self._cond:
            if slot in self._free:
                return False  # already free: idempotent
            if self._leases.get(slot) != lease:
                raise StaleLease(f"stale or invalid lease for environment {slot}")
            self._free.add(slot)
            del self._leases[slot]
            self._cond.notify()
            return True

    def release_all(self) -> int:
        with self._cond:
            count = len(self._leases)
            self._free = set(range(self.size))
            self._leases.clear()
            self._cond.notify_all()
            return count

    def free_count(self) -> int:
        with self._cond:
            return len(self._free)


def reward_detail(task_id: int, action: str) -> tuple[float, dict[str, float]]:
    """Deterministic reward of a purchase `action` on `task_id`."""
    success = c.unit("success", task_id, action) < 0.8
    parts = {k: 1.0 if success else round(c.unit(k, task_id, action), 6)
             for k in ("r_type", "r_att", "r_option", "r_price")}
    detail = {"r_success": 1.0 if success else 0.0, **parts}
    reward = 1.0 if success else round(0.5 * sum(parts.values()) / len(parts), 6)
    return reward, detail


class Shop:
    """Episode state per slot, behind the lease pool."""

    def __init__(self, slots: int, tasks: int):
        self.pool = SlotPool(slots)
        self.tasks = tasks
        self.episodes: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        action = req.get("action")
        if action == "release_all":
            count = self.pool.release_all()
            with self.lock:
                self.episodes.clear()
            log(f"release_all freed {count} leased slot(s)")
            return {"message": "All environments have been initialized", "released": count}
        if action == "reset":
            return self._reset(req)
        if action not in {"interact", "terminate", "release_one"}:
            raise BadRequest(f"unsupported action: {action!r}")
        slot, lease = self._slot_and_lease(req, action)
        if action == "release_one":
            released = self.pool.release(slot, lease)
            if released:
                with self.lock:
                    self.episodes.pop(slot, None)
            msg = f"Environment {slot} has been released" if released else f"Environment {slot} is already free"
            return {"message": msg, "released": released, "env_idx": slot}
        self.pool.check(slot, lease)
        with self.lock:
            episode = self.episodes.setdefault(slot, {"task_id": 0, "done": False})
        if action == "interact":
            return self._interact(slot, lease, episode, req)
        return self._terminate(slot, lease, episode, req)

    def _slot_and_lease(self, req: dict[str, Any], action: str) -> tuple[int, str]:
        slot, lease = req.get("env_idx"), req.get("lease_id")
        if isinstance(slot, bool) or not isinstance(slot, int) or not isinstance(lease, str) or not lease:
            raise BadRequest(f"{action} requires a valid env_idx and lease_id")
        if not 0 <= slot < self.pool.size:
            raise BadRequest(f"invalid environment index: {slot}")
        return slot, lease

    def _reset(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("env_idx") is not None:
            raise BadRequest("reset must not include env_idx; the server assigns a slot")
        task = req.get("idx", req.get("task_id", 0))
        if isinstance(task, bool) or not isinstance(task, int) or not 0 <= task < self.tasks:
            raise BadRequest(f"reset idx/task_id must be an integer in [0, {self.tasks})")
        slot, lease = self.pool.acquire()
        with self.lock:
            self.episodes[slot] = {"task_id": task, "done": False}
        instruction = f"Buy item matching demo task {task} (budget {50 + task % 7 * 10} dollars)"
        return {
            "lease_id": lease, "env_idx": slot, "idx": task,
            "task_instruction": instruction,
            "observation": f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search",
            "message": f"Task {task} started", "task_mode": "persona",
            "interaction_mode": req.get("interaction_mode", "single_turn"),
            "environment_version": ENVIRONMENT_VERSION,
        }

    def _interact(self, slot: int, lease: str, episode: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
        text = req.get("response", req.get("action_text"))
        if not isinstance(text, str):
            raise BadRequest("interact requires response (or action_text)")
        action = text.strip().splitlines()[-1].strip() if text.strip() else ""
        if action.lower().startswith("action:"):
            action = action[len("action:"):].strip()
        task = episode["task_id"]
        if episode["done"]:
            reward, detail = episode["reward"], episode["reward_detail"]
            valid = True
        elif action.startswith("click["):
            reward, detail = reward_detail(task, action)
            valid = True
            episode.update(done=True, reward=reward, reward_detail=detail)
        else:
            reward, detail = 0.0, {}
            valid = action.startswith("search[")
        return {
            "done": episode["done"], "over": episode["done"], "reward": reward, "reward_detail": detail,
            "observation": f"WebShop [SEP] results for {action[:40]!r} on task {task}",
            "message": "Continue interaction" if valid else "Invalid action",
            "env_idx": slot, "lease_id": lease, "action_feedback": {"valid": valid},
            **({"termination_reason": "environment_done"} if episode["done"] else {}),
        }

    def _terminate(self, slot: int, lease: str, episode: dict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
        if not episode["done"]:
            detail = {"r_success": 0.0, "r_type": 0.0, "r_att": 0.0, "r_option": 0.0, "r_price": 0.0}
            episode.update(done=True, reward=0.0, reward_detail=detail)
        reason = str(req.get("termination_reason", "action_limit"))
        return {
            "done": True, "over": True, "reward": episode["reward"], "reward_detail": episode["reward_detail"],
            "observation": "WebShop [SEP] episode over", "message": f"Episode terminated: {reason}",
            "env_idx": slot, "lease_id": lease, "termination_reason": reason,
        }


class Handler(BaseHTTPRequestHandler):
    server: "ShopServer"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # request lines are noise; lease events are logged by the Shop

    def _send(self, status: int, body: Any) -> None:
        c.send_reply(self, status, body)

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/healthz":
            self._send(404, {"error": f"no route {self.path}"})
            return
        srv = self.server
        self._send(200, {
            "ready": srv.is_ready(),
            "environment_slots": srv.shop.pool.size,
            "free_slots": srv.shop.pool.free_count(),
            "tasks": srv.shop.tasks,
            "environment_version": ENVIRONMENT_VERSION,
            "primary_reward": PRIMARY_REWARD,
            "observation_version": OBSERVATION_VERSION,
        })

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/api/shop_agent":
            self._send(404, {"result": {"error": f"no route {self.path}"}})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(req, dict):
                raise BadRequest("request body must be a JSON object")
            if not self.server.is_ready():
                self._send(503, {"result": {"error": "environments are still being built"}})
                return
            result = self.server.shop.handle(req)
        except (BadRequest, json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            self._send(400, {"result": {"error": str(exc)}})
        except StaleLease as exc:
            self._send(409, {"result": {"error": str(exc)}})
        except Exception as exc:  # the real app maps any other exception to 500
            self._send(500, {"result": {"error": f"{type(exc).__name__}: {exc}"}})
        else:
            self._send(200, {"result": result})


class ShopServer(ThreadingHTTPServer):
    daemon_threads = True  # blocked resets must not hold up shutdown

    def __init__(self, addr: tuple[str, int], shop: Shop, ready_at: float | None):
        super().__init__(addr, Handler)
        self.shop = shop
        self.ready_at = ready_at

    def is_ready(self) -> bool:
        return self.ready_at is not None and time.monotonic() >= self.ready_at


def main() -> int:
    slots = c.env_int("SHOPSIM_ENV_SLOTS", 48) or 0
    port = c.env_int("SHOPSIM_PORT", 5700) or 0
    tasks = c.env_int("SHOPSIM_TASKS", 1000) or 1
    host = os.environ.get("SHOPSIM_HOST", "127.0.0.1")
    if slots < 1:
        raise c.DemoError("SHOPSIM_ENV_SLOTS must be >= 1", 2)
    stop = threading.Event()
    holder: dict[str, ShopServer] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()
        if "srv" in holder:  # shutdown() blocks until serve_forever returns: not in the handler
            threading.Thread(target=holder["srv"].shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if c.env_flag("DEMO_SHOPSIM_HANG_ON_START"):
        log("hanging on start (DEMO_SHOPSIM_HANG_ON_START=1); the port is never bound")
        while not stop.wait(3600):
            pass
        return 0
    delay = c.env_float("DEMO_SHOPSIM_START_DELAY", 0.0)
    ready_at = None if c.env_flag("DEMO_SHOPSIM_NEVER_READY") else time.monotonic() + delay
    try:
        srv = ShopServer((host, port), Shop(slots, tasks), ready_at)
    except OSError as exc:
        raise c.DemoError(f"cannot bind {host}:{port}: {exc.strerror or exc}", 1) from None
    holder["srv"] = srv
    log(f"serving on http://{host}:{srv.server_address[1]} slots={slots} tasks={tasks} pid={os.getpid()}")
    if stop.is_set():
        return 0
    try:
        srv.serve_forever(poll_interval=0.1)
    finally:
        srv.server_close()
    log("stopped")
    return 0


if __name__ == "__main__":
    c.run_main(PROG, main)
