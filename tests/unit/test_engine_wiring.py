"""How the engine's collaborators are wired (issue 29): typed events, one restart count, a
shutdown that carries out the machine's decision as it is, reactions that only say what an
event means."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from shoprld.daemon.core.diskwatch import DiskWatch
from shoprld.daemon.core.engine import Engine
from shoprld.daemon.core.events import CheckpointCommitted, DiskLevelChanged, Event
from shoprld.daemon.foundation.config.config import Config, load_config
from shoprld.daemon.foundation.config.configsections import DiskSection
from shoprld.daemon.foundation.storage.disk import Level
from shoprld.daemon.foundation.system.errors import EXIT_GATE, EXIT_OK
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import Secrets
from shoprld.daemon.foundation.records.store import JOURNAL_FILE, STATE_FILE
from shoprld.daemon.round.machine import Decision, Fail, Occurrence, Park, State, Stop
from tests.demotree import make_tree
from tests.fsfixtures import tmpfs_fixture  # noqa: F401  (the "tmpfs" fixture)

MiB = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A started-up engine (identity checked, state loaded) on a fresh demo campaign; no loop runs."""
    cfg: Config = load_config(make_tree(tmp_path / "tree", rounds=2))
    eng = Engine(cfg, Layout.from_config(cfg), Secrets())
    eng._check_identity()
    eng._load()
    yield eng
    eng.store.flush_status()
    eng.store.release_lock()


def _journal(eng: Engine) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (eng.layout.state_dir / JOURNAL_FILE).read_text().splitlines() if line]


def test_the_restart_count_is_the_machines_and_state_json_shows_that_one(tmp_path: Path) -> None:
    """A daemon that died mid-work counts one restart at load; every later count is the
    counters', and state.json (and the metrics) write what the counters hold, not a copy."""
    cfg: Config = load_config(make_tree(tmp_path / "tree", rounds=2))
    layout = Layout.from_config(cfg)
    first = Engine(cfg, layout, Secrets())
    first._check_identity()
    first._load()
    first._transition(None, State.PREFLIGHT_DISK, "start")  # a working state: then it "dies"
    first.counters = replace(first.counters, restarts=3)
    first.view.persist()
    first.store.flush_status()
    first.store.release_lock()

    again = Engine(cfg, layout, Secrets())
    again._check_identity()
    again._load()
    try:
        assert again.counters.restarts == 4
        assert again.view.state_doc()["counters"]["restarts"] == 4
        again.counters = replace(again.counters, restarts=9)  # what a retry decision does
        again.view.persist()
        assert json.loads((layout.state_dir / STATE_FILE).read_text())["counters"]["restarts"] == 9
        assert "restarts" not in again.view.state_data["counters"]  # no second copy to drift
    finally:
        again.store.flush_status()
        again.store.release_lock()


@pytest.mark.anyio
async def test_shutdown_enters_the_state_the_decision_names(engine: Engine) -> None:
    """Shutdown records the decision's own end state and trigger (a gate stop: FAILED by
    'fail', exit 5) and returns its code; it derives neither from the action's type."""
    engine._transition(None, State.GATE, "start")
    d = Decision(State.FAILED, "fail", Fail("gate says stop", EXIT_GATE, "gate"), engine.counters)
    code = await engine.ending.run(d, State.GATE)
    assert code == EXIT_GATE and engine.machine.state is State.FAILED and engine.ending.stopping
    last = [e for e in _journal(engine) if e["event"] == "transition"][-1]
    assert (last["src"], last["dst"], last["trigger"], last["exit_code"]) == ("GATE", "FAILED", "fail", EXIT_GATE)
    assert engine.view.snap["stop_reason"] == "gate" and engine.ending.final_message == "gate says stop"


@pytest.mark.anyio
async def test_a_stop_records_where_the_campaign_resumes(engine: Engine) -> None:
    """A stop's transition line says where the next run resumes (round and state)."""
    engine._transition(None, State.VAL, "start")
    code = await engine.ending.run(Decision(State.STOPPED, "stop", Stop("requested"), engine.counters), State.VAL)
    assert code == EXIT_OK and engine.machine.state is State.STOPPED
    last = [e for e in _journal(engine) if e["event"] == "transition"][-1]
    assert last["resume_from"] == {"round": engine.round, "state": "VAL"} and last["message"] == "requested"


def test_a_stop_request_is_news_for_the_machine_only_when_it_is_now(engine: Engine) -> None:
    """'now' is an Occurrence for decide(); 'checkpoint' and 'round' wait in the live stop mode."""
    engine._transition(None, State.TRAIN, "start")
    assert engine.reactions.stop_requested("now") == Occurrence("stop")
    assert engine.live.stop_mode is None
    assert engine.reactions.stop_requested("checkpoint") is None
    assert engine.live.stop_mode == "checkpoint"
    assert [e["mode"] for e in _journal(engine) if e["event"] == "stop.requested"] == ["now", "checkpoint"]


def test_a_checkpoint_is_journaled_from_its_typed_event(engine: Engine) -> None:
    """The watcher's commit arrives typed; the reaction records it and hands decide() a checkpoint."""
    engine._transition(None, State.VAL, "start")  # not TRAIN: nothing to prune
    got = engine.reactions.checkpoint(CheckpointCommitted(12, "/v/iter_0000012", 4096, 3.5))
    assert got == Occurrence("checkpoint")
    assert engine.view.snap["last_checkpoint"]["iteration"] == 12
    line = [e for e in _journal(engine) if e["event"] == "checkpoint.committed"][-1]
    assert (line["iteration"], line["bytes"], line["latency_ms"]) == (12, 4096, 3.5)


@pytest.mark.anyio
async def test_the_disk_monitor_sends_the_guards_level_typed(tmpfs: Any) -> None:  # noqa: F811
    """On a real 20 MiB tmpfs filled past its soft limit, the queue gets a DiskLevelChanged
    whose level is the guard's own (no event name turned back into a level), with the sample
    it was judged on."""
    root: Path = tmpfs("20m")
    watch = DiskWatch(root)
    section = DiskSection(soft_limit=10 * MiB, hard_limit=2 * MiB, hysteresis=MiB, interval=0.02)
    send, recv = anyio.create_memory_object_stream[Event](16)
    samples: list[dict[str, Any]] = []
    with anyio.fail_after(30):  # a bound on a hang, not a timing assert
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.monitor, section, None, samples.append, send)
            (root / "fill").write_bytes(b"\0" * (12 * MiB))
            event = await recv.receive()
            tg.cancel_scope.cancel()
    assert isinstance(event, DiskLevelChanged)
    assert event.level is Level.SOFT and watch.guard is not None and watch.guard.level is Level.SOFT
    assert event.event == "disk.soft_limit" and event.free_bytes < event.soft_limit_bytes == 10 * MiB
    fields = event.journal_fields()
    assert fields["level"] == "soft" and fields["path"] == str(root) and "event" not in fields


@pytest.mark.anyio
async def test_a_park_that_waits_for_space_goes_back_to_preflight(engine: Engine) -> None:
    """With --wait-for-space, a disk park records PAUSED_DISK, waits until the guard's rule
    says the volume is fine (it is, here), and returns None after the resume transition: the
    engine starts PREFLIGHT_DISK's stage, Shutdown does not."""
    disk = engine.cfg.disk.model_copy(update={"settle": 0.0, "interval": 0.01})
    engine.live.cfg = engine.cfg.model_copy(update={"disk": disk})
    engine.ending.wait_for_space = True
    engine._transition(None, State.EXPORT_HF, "start")
    d = Decision(State.PAUSED_DISK, "park_disk", Park("free 1 MiB < soft limit 2 MiB on /v"), engine.counters)
    with anyio.fail_after(30):  # a bound on a hang, not a timing assert
        code = await engine.ending.run(d, State.EXPORT_HF)
    assert code is None and engine.machine.state is State.PREFLIGHT_DISK and not engine.ending.stopping
    moves = [(e["src"], e["dst"], e["trigger"]) for e in _journal(engine) if e["event"] == "transition"][-2:]
    assert moves == [("EXPORT_HF", "PAUSED_DISK", "park_disk"), ("PAUSED_DISK", "PREFLIGHT_DISK", "resume")]
