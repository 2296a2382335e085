"""The ShopSimulator stand-in: health, lease semantics, error codes, faults, shutdown."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from conftest import Procs, child_env, free_port, http, shop, start_shopsim, wait_until


def lease(url: str, task: int = 3) -> dict:
    status, body = shop(url, {"action": "reset", "idx": task})
    assert status == 200, body
    return body["result"]


@pytest.fixture(scope="module")
def shared_shop(module_procs: Procs) -> str:
    """One server for the stateless tests."""
    return start_shopsim(module_procs, slots=1)[1]


def quiet_reset(url: str) -> None:
    try:
        shop(url, {"action": "reset"}, timeout=10)
    except OSError:
        pass  # the server stops under it: expected


def test_healthz_reports_the_real_fields(procs: Procs) -> None:
    """/healthz carries ready, environment_slots, free_slots, tasks and the version fields."""
    _, url = start_shopsim(procs, slots=3)
    status, body = http("GET", url + "/healthz")
    assert status == 200
    assert body["ready"] is True and body["environment_slots"] == 3 and body["free_slots"] == 3
    assert {"tasks", "environment_version", "primary_reward", "observation_version"} <= set(body)


def test_a_full_episode_leases_and_releases_a_slot(procs: Procs) -> None:
    """reset leases (uuid4 hex lease), interact scores a purchase, terminate ends it, release_one frees it."""
    _, url = start_shopsim(procs, slots=2)
    r = lease(url)
    assert len(r["lease_id"]) == 32 and int(r["lease_id"], 16) >= 0 and r["env_idx"] in (0, 1)
    assert http("GET", url + "/healthz")[1]["free_slots"] == 1
    ids = {"env_idx": r["env_idx"], "lease_id": r["lease_id"]}
    status, body = shop(url, {"action": "interact", **ids, "response": "search[red mug]"})
    assert status == 200 and body["result"]["done"] is False
    status, body = shop(url, {"action": "interact", **ids, "action_text": "click[item-1]"})
    res = body["result"]
    assert status == 200 and res["done"] is True and 0 <= res["reward"] <= 1
    assert set(res["reward_detail"]) >= {"r_success"} and all(k.startswith("r_") for k in res["reward_detail"])
    assert shop(url, {"action": "terminate", **ids})[1]["result"]["done"] is True
    assert shop(url, {"action": "release_one", **ids})[1]["result"]["released"] is True
    assert http("GET", url + "/healthz")[1]["free_slots"] == 2


def test_reward_is_deterministic_in_task_and_action(procs: Procs) -> None:
    """The same (task, action) gives the same reward and detail on any slot and lease."""
    _, url = start_shopsim(procs, slots=2)
    out = []
    for _ in range(2):
        r = lease(url, task=42)
        ids = {"env_idx": r["env_idx"], "lease_id": r["lease_id"]}
        out.append(shop(url, {"action": "interact", **ids, "response": "Action: click[item-abc]"})[1]["result"])
        shop(url, {"action": "release_one", **ids})
    assert (out[0]["reward"], out[0]["reward_detail"]) == (out[1]["reward"], out[1]["reward_detail"])


def test_reset_blocks_while_no_slot_is_free_and_wakes_on_release(procs: Procs) -> None:
    """With every slot leased, reset blocks; it returns the freed slot once another lease is released."""
    _, url = start_shopsim(procs, slots=1)
    first = lease(url)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(r=shop(url, {"action": "reset", "idx": 1}, timeout=10)), daemon=True)
    waiter.start()
    time.sleep(0.4)
    assert waiter.is_alive() and not got
    shop(url, {"action": "release_one", "env_idx": first["env_idx"], "lease_id": first["lease_id"]})
    waiter.join(5)
    status, body = got["r"]
    assert status == 200 and body["result"]["env_idx"] == 0 and body["result"]["lease_id"] != first["lease_id"]


def test_release_all_frees_every_slot_and_wakes_waiters(procs: Procs) -> None:
    """release_all frees other clients' leases too, and a queued reset takes a freed slot at once."""
    _, url = start_shopsim(procs, slots=2)
    lease(url), lease(url)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(r=shop(url, {"action": "reset"}, timeout=10)), daemon=True)
    waiter.start()
    time.sleep(0.3)
    assert shop(url, {"action": "release_all"})[1]["result"]["released"] == 2
    waiter.join(5)
    assert got["r"][0] == 200
    assert http("GET", url + "/healthz")[1]["free_slots"] == 1  # the waiter holds one


def test_leases_never_expire(procs: Procs) -> None:
    """A lease taken and abandoned still holds its slot later."""
    _, url = start_shopsim(procs, slots=2)
    r = lease(url)
    time.sleep(0.5)
    assert http("GET", url + "/healthz")[1]["free_slots"] == 1
    assert shop(url, {"action": "interact", "env_idx": r["env_idx"], "lease_id": r["lease_id"], "response": "search[x]"})[0] == 200


def test_a_stale_lease_is_409(procs: Procs) -> None:
    """Using a lease after its slot was released and leased again gives 409, wrapped in result.error."""
    _, url = start_shopsim(procs, slots=1)
    old = lease(url)
    ids = {"env_idx": old["env_idx"], "lease_id": old["lease_id"]}
    shop(url, {"action": "release_one", **ids})
    lease(url)
    for action in ("interact", "terminate", "release_one"):
        status, body = shop(url, {"action": action, **ids, "response": "click[x]"})
        assert status == 409 and "stale" in body["result"]["error"]


def test_release_one_is_idempotent_on_a_free_slot(procs: Procs) -> None:
    """Releasing an already free slot answers 200 with released=false."""
    _, url = start_shopsim(procs, slots=1)
    r = lease(url)
    ids = {"env_idx": r["env_idx"], "lease_id": r["lease_id"]}
    assert shop(url, {"action": "release_one", **ids})[1]["result"]["released"] is True
    status, body = shop(url, {"action": "release_one", **ids})
    assert status == 200 and body["result"]["released"] is False


@pytest.mark.parametrize("raw", [
    b"{not json", b"[1, 2]", b'{"action": "dance"}', b'{"action": "interact", "lease_id": "x"}',
    b'{"action": "release_one", "env_idx": 0}', b'{"action": "reset", "env_idx": 0}',
    b'{"action": "reset", "idx": -1}', b'{"action": "interact", "env_idx": 99, "lease_id": "x", "response": "a"}',
])
def test_malformed_requests_are_400(shared_shop: str, raw: bytes) -> None:
    """Bad JSON, a non-object, an unknown action or a missing/invalid field gives 400 {"result": {"error"}}."""
    url = shared_shop
    status, body = http("POST", url + "/api/shop_agent", raw=raw)
    assert status == 400 and isinstance(body["result"]["error"], str)


def test_start_delay_reports_not_ready_then_ready(procs: Procs) -> None:
    """During DEMO_SHOPSIM_START_DELAY /healthz answers 200 with ready=false and the API answers 503."""
    _, url = start_shopsim(procs, slots=1, DEMO_SHOPSIM_START_DELAY="0.8")
    body = wait_until(lambda: http("GET", url + "/healthz")[1], what="healthz")
    assert body["ready"] is False
    assert shop(url, {"action": "reset"})[0] == 503
    wait_until(lambda: http("GET", url + "/healthz")[1]["ready"], timeout=5, what="ready")
    assert shop(url, {"action": "reset"})[0] == 200


def test_never_ready_stays_not_ready(procs: Procs) -> None:
    """DEMO_SHOPSIM_NEVER_READY=1 serves /healthz with ready=false forever."""
    _, url = start_shopsim(procs, slots=1, DEMO_SHOPSIM_NEVER_READY="1")
    wait_until(lambda: http("GET", url + "/healthz")[0] == 200, what="healthz")
    time.sleep(0.3)
    assert http("GET", url + "/healthz")[1]["ready"] is False


def test_hang_on_start_never_binds_the_port(procs: Procs) -> None:
    """DEMO_SHOPSIM_HANG_ON_START=1: the process lives but nothing listens on its port."""
    p, url = start_shopsim(procs, slots=1, DEMO_SHOPSIM_HANG_ON_START="1")
    p.wait_log("hanging on start")
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert p.alive()
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait(5) == 0


def test_sigterm_stops_cleanly_even_with_a_blocked_reset(procs: Procs) -> None:
    """SIGTERM exits 0 promptly although a reset is queued on a full server."""
    p, url = start_shopsim(procs, slots=1)
    lease(url)
    threading.Thread(target=quiet_reset, args=(url,), daemon=True).start()
    time.sleep(0.2)
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait(5) == 0
    assert "stopped" in p.log()


def test_a_busy_port_is_a_one_line_exit_1(procs: Procs) -> None:
    """Binding a port that is in use fails with one line and exit 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = procs.start("shopsim.py", env=child_env(SHOPSIM_PORT=str(port), SHOPSIM_ENV_SLOTS="1"))
        assert p.wait(10) == 1
    assert p.log().count("\n") == 1 and "cannot bind" in p.log()


def test_port_and_slots_come_from_the_environment(procs: Procs) -> None:
    """SHOPSIM_PORT and SHOPSIM_ENV_SLOTS set the port and slot count, as in start.sh."""
    port = free_port()
    procs.start("shopsim.py", env=child_env(SHOPSIM_PORT=str(port), SHOPSIM_ENV_SLOTS="7"))
    body = wait_until(lambda: http("GET", f"http://127.0.0.1:{port}/healthz")[1], what="healthz")
    assert body["environment_slots"] == 7


def test_a_client_that_gives_up_leaves_a_ghost_waiter(procs: Procs) -> None:
    """A reset abandoned by its client still takes the next freed slot, even right after release_all."""
    _, url = start_shopsim(procs, slots=1)
    lease(url)
    with pytest.raises(OSError):  # the client times out and goes away
        shop(url, {"action": "reset"}, timeout=0.3)
    assert shop(url, {"action": "release_all"})[0] == 200
    wait_until(lambda: http("GET", url + "/healthz")[1]["free_slots"] == 0, timeout=5, what="ghost takes the slot")
    time.sleep(0.2)
    assert http("GET", url + "/healthz")[1]["free_slots"] == 0
