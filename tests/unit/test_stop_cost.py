"""A plain `shoprld stop` in TRAIN says what it throws away (the steps since the last
checkpoint) and names `--at-checkpoint`: in the daemon's reply and in `status`. When the next
save is near, a plain stop waits for it (it loses nothing), and a second plain stop stops now."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from shoprld.daemon.core import sources
from shoprld.daemon.core.control import request_stop
from shoprld.daemon.core.events import StopRequested
from shoprld.daemon.foundation.records.status import NEAR_SAVE_S, save_is_near, stop_cost_line, unsaved_progress
from shoprld.daemon.foundation.records.statusview import render_plain, view
from shoprld.daemon.foundation.records.store import SOCKET_FILE


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


pytestmark = pytest.mark.anyio


@pytest.fixture
def campaign() -> Iterator[tuple[Path, Path]]:
    d = Path(tempfile.mkdtemp(prefix="shoprld-stop-", dir="/tmp"))  # short: an AF_UNIX path
    try:
        (d / "state").mkdir()
        cfg = d / "demo.toml"
        cfg.write_text(f'[campaign]\nname = "demo"\nrounds = 3\nsteps_per_round = 20\n'
                       f'[storage]\nstate_dir = "{d / "state"}"\n')
        yield cfg, d / "state"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _train(**kw: Any) -> dict[str, Any] | None:
    args: dict[str, Any] = {"state": "TRAIN", "round_index": 2, "step": 12, "steps_per_round": 20, "end_offset": 0,
                            "last_iteration": 40, "step_seconds": 30.0, "save_interval": 10_000}
    return unsaved_progress(**{**args, **kw})


def _lost(u: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if u is None else {k: u[k] for k in ("steps", "since_iteration", "seconds")}


def test_unsaved_steps_count_from_the_newest_checkpoint_of_the_round() -> None:
    """Round 2 of 20-step rounds starts from iteration 40 (round 1's final): at step 12 with no
    save since, 12 steps (6 min at 30 s/step) are lost; after a save at 50, only 2."""
    assert _lost(_train()) == {"steps": 12, "since_iteration": 40, "seconds": 360.0}
    assert _lost(_train(last_iteration=50)) == {"steps": 2, "since_iteration": 50, "seconds": 60.0}
    assert _train(end_offset=-1, last_iteration=39)["steps"] == 12  # type: ignore[index]  # slime's numbering
    assert _lost(_train(last_iteration=None, step_seconds=None)) == {"steps": 12, "since_iteration": 40,
                                                                     "seconds": None}
    assert _train(state="VAL") is None
    assert stop_cost_line(_train(last_iteration=52)) is None  # nothing to lose
    assert stop_cost_line(_train(step_seconds=600.0)) == (
        "a plain stop in TRAIN loses the 12 steps since the last checkpoint (iteration 40) (about 2h00m of "
        "training); `shoprld stop --at-checkpoint` stops after the next checkpoint instead and loses nothing")


def test_the_next_save_is_the_next_multiple_of_the_interval_or_the_round_end() -> None:
    """At iteration 52 (round 2, step 12): every 5 -> 55 (3 steps); every 10000 or none -> the
    round's final, 60 (8 steps). Near means due within NEAR_SAVE_S, and something to lose."""
    assert _train(save_interval=5)["next_save"] == {"iteration": 55, "steps": 3, "seconds": 90.0}  # type: ignore[index]
    assert _train()["next_save"] == {"iteration": 60, "steps": 8, "seconds": 240.0}  # type: ignore[index]
    assert _train(save_interval=None)["next_save"]["iteration"] == 60  # type: ignore[index]
    assert save_is_near(_train()) and not save_is_near(_train(step_seconds=NEAR_SAVE_S / 7))
    assert not save_is_near(_train(step_seconds=None)) and not save_is_near(_train(last_iteration=52))
    assert stop_cost_line(_train()) == (
        "a plain stop now waits for the next checkpoint (iteration 60, due in about 4m) and loses nothing; a "
        "second plain stop stops at once, losing the 12 steps since iteration 40")


async def test_a_plain_stop_replies_with_its_cost(campaign: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Through the daemon's real control task and the real `shoprld stop`: a plain stop in TRAIN
    says what it loses and names --at-checkpoint; --at-checkpoint's reply does not."""
    cfg, state_dir = campaign
    send, receive = anyio.create_memory_object_stream[Any](10)
    doc = {"state": "TRAIN", "unsaved": _train(step_seconds=600.0)}
    with anyio.fail_after(20), capture_logs():
        async with anyio.create_task_group() as tg:
            tg.start_soon(sources.control, state_dir / SOCKET_FILE, send, lambda: doc)
            while not (state_dir / SOCKET_FILE).exists():
                await anyio.sleep(0.01)
            rc = await anyio.to_thread.run_sync(request_stop, cfg, "now")
            assert rc == 0 and await receive.receive() == StopRequested("now")
            plain = capsys.readouterr().out
            assert await anyio.to_thread.run_sync(request_stop, cfg, "checkpoint") == 0
            at_ckpt = capsys.readouterr().out
            tg.cancel_scope.cancel()
    assert plain == ("shoprld: stop requested (now: every stage stops gracefully); the daemon will exit when it is safe; a plain stop in TRAIN "
                     "loses the 12 steps since the last checkpoint (iteration 40) (about 2h00m of training); "
                     "`shoprld stop --at-checkpoint` stops after the next checkpoint instead and loses nothing\n")
    assert "loses" not in at_ckpt


async def test_a_plain_stop_near_a_save_waits_for_it_and_a_second_stops_now(
        campaign: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The next save due in 4 min: the first plain stop is sent on as "at the next checkpoint" and
    says so; a second plain stop is "now"."""
    cfg, state_dir = campaign
    send, receive = anyio.create_memory_object_stream[Any](10)
    doc = {"state": "TRAIN", "unsaved": _train()}
    with anyio.fail_after(20), capture_logs():
        async with anyio.create_task_group() as tg:
            tg.start_soon(sources.control, state_dir / SOCKET_FILE, send, lambda: doc)
            while not (state_dir / SOCKET_FILE).exists():
                await anyio.sleep(0.01)
            assert await anyio.to_thread.run_sync(request_stop, cfg, "now") == 0
            assert await receive.receive() == StopRequested("checkpoint")
            first = capsys.readouterr().out
            assert await anyio.to_thread.run_sync(request_stop, cfg, "now") == 0
            assert await receive.receive() == StopRequested("now")
            second = capsys.readouterr().out
            tg.cancel_scope.cancel()
    assert second == ("shoprld: stop requested (now: every stage stops gracefully); the daemon will exit when it is "
                      "safe; this stop loses the 12 steps since iteration 40\n")
    assert first == ("shoprld: stop requested (at the next committed checkpoint); the next checkpoint (iteration 60) "
                     "is due in about 4m, so this stop waits for it and loses nothing; `shoprld stop` again stops "
                     "now and loses the 12 steps since iteration 40\n")


def test_status_shows_the_cost_while_the_daemon_runs() -> None:
    """The human view's `unsaved` line, only for a live daemon in TRAIN."""
    st = {"campaign": "demo", "state": "TRAIN", "round": 2, "rounds": 3, "step": 12, "steps_per_round": 20,
          "daemon": {"alive": True, "pid": 1}, "unsaved": _train(step_seconds=600.0)}
    text = render_plain(view(st, 0.0, unicode=False))
    assert "unsaved" in text and "--at-checkpoint" in text and "12 steps" in text
    st["daemon"] = {"alive": False}
    assert "--at-checkpoint" not in render_plain(view(st, 0.0, unicode=False))


@pytest.mark.parametrize("state", ["STOPPED", "FAILED"])
def test_a_stopped_or_failed_campaign_shows_no_rate_or_eta_but_how_to_resume(state: str) -> None:
    """The last step stays, but no s/step or ETA for a campaign that is not running; the resume
    command names the campaign file (a FAILED one: after fixing the cause)."""
    st = {"campaign": "demo", "state": state, "round": 1, "rounds": 3, "step": 12, "steps_per_round": 20,
          "step_seconds": 30.0, "eta_seconds": 240.0, "daemon": {"alive": False},
          "plan": {"campaign_eta_seconds": 9000.0}}
    text = render_plain(view(st, 0.0, unicode=False, config=Path("/etc/shoprld/demo.toml")))
    assert "12/20" in text and "s/step" not in text and "ETA" not in text
    assert "shoprld run -c /etc/shoprld/demo.toml" in text and "systemctl start shoprld@demo" in text
    assert ("fix the cause above, then" in text) == (state == "FAILED")
    live = render_plain(view({**st, "state": "TRAIN", "daemon": {"alive": True, "pid": 1}}, 0.0, unicode=False))
    assert "30.0 s/step" in live and "ETA 4m" in live and "resume" not in live
