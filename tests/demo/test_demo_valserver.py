"""The SGLang stand-in: health vs /v1/models, weights, generate, orphan scheduler, faults."""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import pytest

from conftest import Procs, http, pid_alive, start_valserver, wait_until

FIRED_UP = "The server is fired up and ready to roll!"


def scheduler_pid(log: str) -> int:
    return int(re.search(r"scheduler pid=(\d+)", log).group(1))


def test_v1_models_answers_before_health(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """While loading, /health and /health_generate are 503 but /v1/models is already 200; then health turns 200."""
    p, url = start_valserver(procs, hf_dirs["a"], wait_healthy=False, DEMO_VAL_LOAD_SECONDS="1.0")
    wait_until(lambda: http("GET", url + "/v1/models")[0] == 200, what="/v1/models")
    assert http("GET", url + "/health")[0] == 503
    assert http("GET", url + "/health_generate")[0] == 503
    assert FIRED_UP not in p.log()
    wait_until(lambda: http("GET", url + "/health")[0] == 200, timeout=10, what="healthy")
    assert http("GET", url + "/health_generate")[0] == 200
    assert FIRED_UP in p.log()
    assert http("GET", url + "/v1/models")[1]["data"][0]["id"] == "Qwen/Qwen3.5-4B"


def test_model_info_and_generate_are_deterministic(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """/get_model_info reports the weights; /generate answers the same text for the same weights and prompt."""
    _, url = start_valserver(procs, hf_dirs["a"], "--weight-version", "iter-0")
    info = http("GET", url + "/get_model_info")[1]
    assert info["weight_version"] == "iter-0" and info["model_path"] == str(hf_dirs["a"])
    assert re.fullmatch(r"[0-9a-f]{64}", info["weights_fingerprint"])
    a = http("POST", url + "/generate", {"text": "buy a mug", "sampling_params": {"temperature": 0.6}})[1]
    b = http("POST", url + "/generate", {"text": "buy a mug", "sampling_params": {}})[1]
    assert a["text"] == b["text"] and "click[" in a["text"] and a["meta_info"]["finish_reason"]["type"] == "stop"
    assert http("POST", url + "/generate", {"input_ids": [1, 2, 3]})[0] == 200
    assert http("POST", url + "/generate", {"nothing": 1})[0] == 400
    chat = http("POST", url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "buy a mug"}]})[1]
    assert chat["choices"][0]["message"]["content"] == a["text"]


def test_update_weights_swaps_a_good_dir_and_keeps_the_old_on_a_bad_one(procs: Procs, hf_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A valid HF dir is swapped in (new fingerprint, weight_version); a bad dir gives success=false and no change."""
    _, url = start_valserver(procs, hf_dirs["a"])
    before = http("GET", url + "/get_model_info")[1]
    text_a = http("POST", url + "/generate", {"text": "p"})[1]["text"]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 1}, "weight_map": {"w": "missing.safetensors"}}')
    (bad / "config.json").write_text("{}")
    status, body = http("POST", url + "/update_weights_from_disk", {"model_path": str(bad), "weight_version": "bad"})
    assert status == 400 and body["success"] is False and "missing" in body["message"]
    assert http("GET", url + "/get_model_info")[1] == before
    status, body = http("POST", url + "/update_weights_from_disk", {"model_path": str(hf_dirs["b"]), "weight_version": "iter-b"})
    assert status == 200 and body["success"] is True
    after = http("GET", url + "/get_model_info")[1]
    assert after["weight_version"] == "iter-b" and after["weights_fingerprint"] != before["weights_fingerprint"]
    assert http("POST", url + "/generate", {"text": "p"})[1]["text"] != text_a


def test_memory_occupation_endpoints_answer_success(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """/release_memory_occupation and /resume_memory_occupation answer {success: true}."""
    _, url = start_valserver(procs, hf_dirs["a"], "--enable-memory-saver")
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        assert http("POST", url + path, {})[1]["success"] is True


def test_api_key_guards_all_but_health(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """With --api-key, requests need the bearer token; /health does not."""
    _, url = start_valserver(procs, hf_dirs["a"], "--api-key", "k3y")
    assert http("GET", url + "/get_model_info")[0] == 401
    assert http("GET", url + "/get_model_info", headers={"Authorization": "Bearer k3y"})[0] == 200


def test_sigterm_stops_the_scheduler_and_exits_0(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """SIGTERM to the server is graceful: its scheduler exits too and the server exits 0."""
    p, _ = start_valserver(procs, hf_dirs["a"])
    child = scheduler_pid(p.log())
    assert pid_alive(child) and os.getpgid(child) == p.pid
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    wait_until(lambda: not pid_alive(child), timeout=5, what="scheduler exit")


def test_sigterm_to_the_group_exits_0(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """SIGTERM to the whole process group (the daemon's way) also ends in exit 0."""
    p, _ = start_valserver(procs, hf_dirs["a"])
    child = scheduler_pid(p.log())
    p.signal_group(signal.SIGTERM)
    assert p.wait(10) == 0
    wait_until(lambda: not pid_alive(child), timeout=5, what="scheduler exit")


def test_sigkill_of_the_server_leaves_an_orphan_scheduler(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """After SIGKILL of the server its scheduler lives on, reparented, holding a port: orphan handling is real."""
    p, url = start_valserver(procs, hf_dirs["a"])
    child = scheduler_pid(p.log())
    procs.adopt_pid(child)  # killed by pid in teardown
    p.popen.send_signal(signal.SIGKILL)
    p.wait(5)
    wait_until(lambda: "orphaned" in p.log(), timeout=5, what="orphan notice")
    assert pid_alive(child) and os.getpgid(child) == p.pid
    ports = re.findall(r":([0-9A-F]{4}) 00000000:0000 0A", Path(f"/proc/{child}/net/tcp").read_text())
    assert ports, "the orphan still listens on a socket"
    with pytest.raises(OSError):  # the HTTP port itself was the parent's and is closed
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=1).close()


def test_never_healthy_knob(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """DEMO_VAL_NEVER_HEALTHY=1: /v1/models answers, /health stays 503, no fired-up line."""
    p, url = start_valserver(procs, hf_dirs["a"], wait_healthy=False, DEMO_VAL_NEVER_HEALTHY="1")
    p.wait_log("never becoming healthy")
    assert http("GET", url + "/v1/models")[0] == 200 and http("GET", url + "/health")[0] == 503
    assert FIRED_UP not in p.log()


def test_crash_after_n_generate_calls(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """DEMO_VAL_CRASH_AFTER=2: two generates succeed, then the scheduler dies and the server exits 1."""
    p, url = start_valserver(procs, hf_dirs["a"], DEMO_VAL_CRASH_AFTER="2")
    child = scheduler_pid(p.log())
    assert http("POST", url + "/generate", {"text": "a"})[0] == 200
    assert http("POST", url + "/generate", {"text": "b"})[0] == 200
    assert p.wait(10) == 1
    assert not pid_alive(child)
    assert "scheduler process" in p.log()


def test_invalid_model_dir_is_a_one_line_exit_1(procs: Procs, tmp_path: Path) -> None:
    """A model path that is not a valid HF dir makes the server exit 1 with one error line."""
    p, _ = start_valserver(procs, tmp_path / "nope", wait_healthy=False)
    assert p.wait(10) == 1
    errors = [ln for ln in p.log().splitlines() if "cannot load model" in ln]
    assert len(errors) == 1 and "Traceback" not in p.log()


def test_busy_port_is_exit_1(procs: Procs, hf_dirs: dict[str, Path]) -> None:
    """A port in use is one line and exit 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        p = procs.start("valserver.py", "--model-path", str(hf_dirs["a"]), "--port", str(s.getsockname()[1]))
        assert p.wait(10) == 1
    assert "cannot bind" in p.log()
