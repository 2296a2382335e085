"""The ShopSimulator stand-in: health, the product flow, lease semantics, error codes, faults, shutdown.

The line-by-line comparison with the recorded real service is tests/demo/test_shopsim_contract.py.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from conftest import DEMO, Procs, child_env, free_port, http, run_demo, shop, start_shopsim, wait_until


def lease(url: str, task: int = 3) -> dict:
    status, body = shop(url, {"action": "reset", "idx": task})
    assert status == 200, body
    return body["result"]


def act(url: str, ids: dict, response: str) -> dict:
    status, body = shop(url, {"action": "interact", **ids, "response": response})
    assert status == 200, body
    return body["result"]


@pytest.fixture(scope="module")
def shared_shop(module_procs: Procs) -> str:
    """One server for the stateless tests."""
    return start_shopsim(module_procs, slots=1)[1]


def quiet_reset(url: str) -> None:
    try:
        shop(url, {"action": "reset", "idx": 0}, timeout=10)
    except OSError:
        pass  # the server stops under it: expected


def catalog_tasks() -> dict[int, dict]:
    """task id -> (product, instruction) of the catalog the stand-in ships."""
    out = {}
    for p in json.loads((DEMO / "shopsim_catalog.json").read_text(encoding="utf-8")):
        for ins in p["instructions"]:
            out[ins["task_id"]] = {"product": p, "instruction": ins}
    return out


def test_healthz_reports_exactly_the_real_fields(procs: Procs) -> None:
    """/healthz carries exactly the 9 fields of the real service, with the catalog's task count."""
    _, url = start_shopsim(procs, slots=3)
    status, body = http("GET", url + "/healthz")
    assert status == 200
    assert set(body) == {"ready", "environment_slots", "free_slots", "tasks", "environment_version", "primary_reward",
                         "observation_version", "debug_ui", "replay_ui"}
    assert body["ready"] is True and body["environment_slots"] == 3 and body["free_slots"] == 3
    assert body["tasks"] == len(catalog_tasks()) and body["primary_reward"] == "r_strict"


def test_a_full_episode_needs_options_then_buy_now(procs: Procs) -> None:
    """search -> click the asin -> every option -> buy now ends the episode with the real reward_detail types."""
    _, url = start_shopsim(procs, slots=2)
    task = catalog_tasks()[0]
    r = lease(url, 0)
    assert len(r["lease_id"]) == 32 and int(r["lease_id"], 16) >= 0 and r["env_idx"] in (0, 1)
    assert http("GET", url + "/healthz")[1]["free_slots"] == 1
    ids = {"env_idx": r["env_idx"], "lease_id": r["lease_id"]}
    res = act(url, ids, f"search[{task['product']['title']}]")
    assert res["done"] is False and task["product"]["asin"] in res["observation_state"]["actions"]
    res = act(url, ids, f"Thought: open it\nAction: click[{task['product']['asin']}]")
    assert res["observation_state"]["page_type"] == "product_detail" and "buy now" not in res["observation_state"]["actions"]
    res = act(url, ids, "click[buy now]")
    assert res["action_feedback"]["reason"] == "incomplete_options" and res["reward"] == 0 and type(res["reward"]) is int
    for axis, values in task["product"]["customization_options"].items():
        res = act(url, ids, f"click[{axis}={values[0]['value']}]")
    assert "buy now" in res["observation_state"]["actions"] and res["done"] is False
    res = act(url, ids, "click[buy now]")
    assert res["done"] is True and res["termination_reason"] == "purchase" and res["reward"] == res["reward_detail"]["r_strict"]
    detail = res["reward_detail"]
    assert len(detail) == 17 and type(detail["r_success"]) is int and isinstance(detail["price_resolution"], dict)
    assert isinstance(detail["category_match"], bool)
    assert shop(url, {"action": "interact", **ids, "response": "search[x]"})[0] == 500
    assert shop(url, {"action": "terminate", **ids})[0] == 500
    assert shop(url, {"action": "release_one", **ids}) == (200, {"result": {"message": f"Environment {r['env_idx']} has been released"}})
    assert http("GET", url + "/healthz")[1]["free_slots"] == 2


def test_terminate_gives_the_no_purchase_detail(procs: Procs) -> None:
    """terminate ends a running episode with reward 0.0 and the 11-key reward_detail; the page stays."""
    _, url = start_shopsim(procs, slots=1)
    r = lease(url, 1)
    ids = {"env_idx": r["env_idx"], "lease_id": r["lease_id"]}
    status, body = shop(url, {"action": "terminate", **ids, "termination_reason": "timeout"})
    assert status == 500 and body["result"]["error"] == "unsupported termination reason: timeout"
    status, body = shop(url, {"action": "terminate", **ids, "termination_reason": "generation_length"})
    res = body["result"]
    assert status == 200 and res["done"] is True and res["reward"] == 0.0 and len(res["reward_detail"]) == 11
    assert res["message"] == "Episode terminated: generation_length" and "action_feedback" not in res
    assert res["observation_state"]["page_type"] == "search_home" and res["goal"]["task_id"] == 1


def test_reward_is_deterministic_in_task_and_actions(procs: Procs) -> None:
    """The same (task, actions) gives the same reward and detail on any slot and lease."""
    _, url = start_shopsim(procs, slots=2)
    task = catalog_tasks()[5]
    out = []
    for _ in range(2):
        r = lease(url, task=5)
        ids = {"env_idx": r["env_idx"], "lease_id": r["lease_id"]}
        act(url, ids, f"search[{task['product']['title']}]")
        act(url, ids, f"click[{task['product']['asin']}]")
        for axis, values in task["product"]["customization_options"].items():
            act(url, ids, f"click[{axis}={values[-1]['value']}]")
        out.append(act(url, ids, "Action: click[buy now]"))
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
    """release_all frees other clients' leases too (they turn stale), and a queued reset takes a freed slot at once."""
    _, url = start_shopsim(procs, slots=2)
    old = lease(url)
    lease(url)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(r=shop(url, {"action": "reset", "idx": 0}, timeout=10)), daemon=True)
    waiter.start()
    time.sleep(0.3)
    assert shop(url, {"action": "release_all"}) == (200, {"result": {"message": "All environments have been initialized"}})
    waiter.join(5)
    assert got["r"][0] == 200
    assert http("GET", url + "/healthz")[1]["free_slots"] == 1  # the waiter holds one
    status, _ = shop(url, {"action": "interact", "env_idx": old["env_idx"], "lease_id": old["lease_id"], "response": "search[x]"})
    assert status == 409


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
        assert status == 409 and body["result"]["error"] == f"stale or invalid lease for environment {old['env_idx']}"


def test_a_second_release_one_is_409(procs: Procs) -> None:
    """release_one is not idempotent: the same lease again gives 409, as in the real service."""
    _, url = start_shopsim(procs, slots=1)
    r = lease(url)
    ids = {"env_idx": r["env_idx"], "lease_id": r["lease_id"]}
    assert shop(url, {"action": "release_one", **ids})[0] == 200
    status, body = shop(url, {"action": "release_one", **ids})
    assert status == 409 and "stale" in body["result"]["error"]


@pytest.mark.parametrize("raw, ctype, status", [
    (b"{not json", "application/json", 200), (b"", "application/json", 200), (b"null", "application/json", 200),
    (b'{"action": "reset", "idx": 0}', "text/plain", 200),
    (b"[1, 2]", "application/json", 500), (b'"reset"', "application/json", 500),
    (b'{"action": "dance"}', "application/json", 400), (b'{"action": "interact", "lease_id": "x"}', "application/json", 400),
    (b'{"action": "release_one", "env_idx": 0}', "application/json", 400),
    (b'{"action": "reset", "env_idx": 0}', "application/json", 400),
    (b'{"action": "reset", "idx": -1}', "application/json", 500), (b'{"action": "reset", "task_id": 0}', "application/json", 500),
    (b'{"action": "interact", "env_idx": 99, "lease_id": "x", "response": "a"}', "application/json", 409),
])
def test_malformed_requests_get_the_real_status(shared_shop: str, raw: bytes, ctype: str, status: int) -> None:
    """Not JSON: 200 with an error; JSON not an object: 500 HTML; unknown action/malformed lease: 400;
    a bad task (or the `task_id` alias): 500; an out-of-range slot: 409. The slot is never kept."""
    got, body = http("POST", shared_shop + "/api/shop_agent", raw=raw, headers={"Content-Type": ctype})
    assert got == status
    if status == 500 and raw.startswith((b"[", b'"')):
        assert body is None  # an HTML page, not the JSON envelope
    else:
        assert isinstance(body["result"]["error"], str)
    assert http("GET", shared_shop + "/healthz")[1]["free_slots"] == 1


def test_unrouted_paths_are_html_404_and_405(shared_shop: str) -> None:
    """Unknown paths give 404 and a wrong method 405, both as HTML pages."""
    for method, path, want in (("GET", "/", 404), ("GET", "/healthz/", 404), ("POST", "/api/shop_agent/", 404),
                               ("GET", "/api/shop_agent", 405), ("POST", "/healthz", 405)):
        status, body = http(method, shared_shop + path, {} if method == "POST" else None)
        assert (status, body) == (want, None)


def test_start_delay_binds_the_port_late_and_never_reports_not_ready(procs: Procs) -> None:
    """DEMO_SHOPSIM_START_DELAY: connections are refused while slots are built; the first answer is ready."""
    port = free_port()
    procs.start("shopsim.py", env=child_env(SHOPSIM_ENV_SLOTS="1", SHOPSIM_PORT=str(port), DEMO_SHOPSIM_START_DELAY="0.6"))
    time.sleep(0.3)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    body = wait_until(lambda: http("GET", f"http://127.0.0.1:{port}/healthz")[1], what="healthz")
    assert body["ready"] is True and body["free_slots"] == 1


def test_never_ready_stays_not_ready(procs: Procs) -> None:
    """DEMO_SHOPSIM_NEVER_READY=1 serves /healthz with ready=false forever and the API answers 503."""
    _, url = start_shopsim(procs, slots=1, DEMO_SHOPSIM_NEVER_READY="1")
    wait_until(lambda: http("GET", url + "/healthz")[0] == 200, what="healthz")
    time.sleep(0.3)
    assert http("GET", url + "/healthz")[1]["ready"] is False
    assert shop(url, {"action": "reset", "idx": 0})[0] == 503


def test_hang_on_start_never_binds_the_port(procs: Procs) -> None:
    """DEMO_SHOPSIM_HANG_ON_START=1: the process lives but nothing listens on its port."""
    p, url = start_shopsim(procs, slots=1, DEMO_SHOPSIM_HANG_ON_START="1")
    p.wait_log("hanging on start")
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert p.alive()
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait(5) == -signal.SIGTERM


def test_sigterm_exits_at_once_even_with_a_blocked_reset(procs: Procs) -> None:
    """SIGTERM kills the service at once (status -15, no drain) although a reset is queued, as the real one."""
    p, url = start_shopsim(procs, slots=1)
    lease(url)
    threading.Thread(target=quiet_reset, args=(url,), daemon=True).start()
    time.sleep(0.2)
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait(5) == -signal.SIGTERM


def test_a_busy_port_is_a_one_line_exit_1(procs: Procs) -> None:
    """Binding a port that is in use fails with one line and exit 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = procs.start("shopsim.py", env=child_env(SHOPSIM_PORT=str(port), SHOPSIM_ENV_SLOTS="1"))
        assert p.wait(10) == 1
    assert p.log().count("\n") == 1 and "cannot bind" in p.log()


def test_a_bad_catalog_is_a_one_line_exit_2(tmp_path: Path) -> None:
    """A catalog that is not the real format names the file and the entry, and exits 2 before binding."""
    bad = tmp_path / "catalog.json"
    bad.write_text(json.dumps([{"asin": "1", "title": "t", "category": "c", "pricing": [1.0], "instructions": [{"task_id": "x"}]}]))
    res = run_demo("shopsim.py", "--catalog", str(bad), env=child_env(SHOPSIM_PORT=str(free_port())))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert f"{bad}[0].instructions[0]" in res.stderr and "'task_id' must be an integer" in res.stderr
    res = run_demo("shopsim.py", "--catalog", str(tmp_path / "missing.json"), env=child_env(SHOPSIM_PORT=str(free_port())))
    assert res.returncode == 2 and "catalog not found" in res.stderr


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
        shop(url, {"action": "reset", "idx": 0}, timeout=0.3)
    assert shop(url, {"action": "release_all"})[0] == 200
    wait_until(lambda: http("GET", url + "/healthz")[1]["free_slots"] == 0, timeout=5, what="ghost takes the slot")
    time.sleep(0.2)
    assert http("GET", url + "/healthz")[1]["free_slots"] == 0


# ---------------------------------------------------------------- the client side (_common.ShopClient)

import _common as c  # noqa: E402 - conftest puts run/demo on sys.path
import shopsim as standin  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=10)


def test_the_client_plays_real_episodes_and_releases_each_lease_once(procs: Procs) -> None:
    """ShopClient draws task ids from /healthz, plays search -> asin -> options -> buy now, and frees every slot."""
    _, url = start_shopsim(procs, slots=2)
    client = c.ShopClient(url, 10)
    ids = client.task_ids()
    assert ids == list(range(len(catalog_tasks())))
    results = [client.play(t, f"k{t}", 1.0) for t in ids[:8]]
    assert all(r["done"] for r in results)
    assert any(r["termination_reason"] == "purchase" and r["actions"][-1] == "click[buy now]" for r in results)
    assert any(r["reward"] > 0 for r in results)
    assert all(isinstance(r["reward"], float) for r in results)
    assert http("GET", url + "/healthz")[1]["free_slots"] == 2


def test_a_release_all_mid_episode_loses_the_episode_with_409_not_a_crash(procs: Procs) -> None:
    """A stale lease (release_all by a recovery) raises ShopError 409 from play; the final release_one 409 is swallowed."""
    _, url = start_shopsim(procs, slots=1)
    client = c.ShopClient(url, 10)

    def recover(lease: dict) -> tuple[str, float]:
        shop(url, {"action": "release_all"})
        return "k", 1.0

    with pytest.raises(c.ShopError) as err:
        client.play(0, "k", 1.0, on_reset=recover)
    assert err.value.status == 409
    assert http("GET", url + "/healthz")[1]["free_slots"] == 1


def test_an_unknown_task_is_a_500_shop_error_and_the_slot_stays_free(procs: Procs) -> None:
    """A task id the catalog lacks: ShopError with the real 500 message; no slot is held."""
    _, url = start_shopsim(procs, slots=1)
    with pytest.raises(c.ShopError) as err:
        c.ShopClient(url, 10).play(10_000, "k", 1.0)
    assert err.value.status == 500 and err.value.error == "'unknown or inactive task_id 10000'"
    assert http("GET", url + "/healthz")[1]["free_slots"] == 1


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(max_size=8), JSON, max_size=6))
def test_numeric_components_never_float_a_non_number(detail: dict) -> None:
    """Any reward_detail value type is accepted; only ints and floats (not bools) come out, as floats."""
    out = c.numeric_components(detail)
    assert set(out) <= set(detail)
    for key, value in out.items():
        assert isinstance(value, float) and not isinstance(detail[key], bool)


def test_numeric_components_of_the_real_purchase_detail() -> None:
    """The real 17-key detail: str, bool, None and dict entries are skipped; r_success (int) is kept."""
    detail = {"reward_version": "v2", "termination_reason": "purchase", "category_match": True, "title_score": 1.0,
              "num_attr_matches": 2, "r_strict": 0.0, "r_success": 1, "price_upper": None,
              "price_resolution": {"status": "pass"}, "target_asin_match": True}
    assert c.numeric_components(detail) == {"title_score": 1.0, "num_attr_matches": 2.0, "r_strict": 0.0, "r_success": 1.0}


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40))
def test_parse_action_classifies_any_response(text: str) -> None:
    """Any model response is either one search/click with an argument, or refused with a real reason."""
    shown, verb, arg, fb = standin.parse_action(text)
    if fb is None:
        assert verb in ("search", "click") and arg
    else:
        assert fb["valid"] is False and fb["reason"] in {"invalid_format", "empty_argument", "multiple_actions_not_allowed"}
