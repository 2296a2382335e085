"""Megatron's async save: the flags the trainer's command asks for, the disabling line in its
log, and the one interval of lag the save-interval model counts (issue 30, item 2)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.config.configsections import SavesSection
from shoprld.daemon.round import asyncsave, saves

BASE = ("python3", "train.py", "--save", "{save_dir}", "--save-interval", "{save_interval}")


@pytest.mark.parametrize(("extra", "enabled", "state"), [
    (("{async_save}", "{async_save_worker}"), True, "on"),
    (("{async_save}", "{async_save_worker}"), False, "off"),     # the placeholders are left out
    (("--async-save", "--use-persistent-ckpt-worker"), False, "on"),  # literal flags: what is written
    (("--async-save",), True, "no_worker"),
    (("{async_save}",), True, "no_worker"),
    (("--async-save", "--use-persistent-ckpt-workers"), True, "no_worker"),  # misspelt: slime ignores it
    ((), True, "off"),
])
def test_flags_state_reads_what_megatron_will_get(extra: tuple[str, ...], enabled: bool, state: str) -> None:
    assert asyncsave.flags_state((*BASE, *extra), enabled) == state


def test_check_lines_say_what_the_saves_will_be_and_the_fix() -> None:
    on = asyncsave.command_line((*BASE, "{async_save}", "{async_save_worker}"), True)
    assert on.startswith("async saves: on (--async-save --use-persistent-ckpt-worker)")
    lone = asyncsave.command_line((*BASE, "--async-save"), True)
    assert lone.startswith("warning:") and "Disabling --async-save" in lone and "fix:" in lone
    off = asyncsave.command_line(BASE, True)
    assert off.startswith("async saves: off") and "whole write" in off
    assert all("\n" not in line for line in (on, lone, off))


MEGATRON = (b"/opt/Megatron-LM/megatron/training/arguments.py:1742: UserWarning: --async-save is not "
            b"supported without --use-persistent-ckpt-worker. Disabling --async-save.\n")


@settings(max_examples=200)
@given(before=st.binary(max_size=4096), after=st.binary(max_size=4096), offset=st.integers(0, 64))
def test_the_disabling_line_is_found_in_the_launchs_log_only(tmp_path_factory: pytest.TempPathFactory,
                                                             before: bytes, after: bytes, offset: int) -> None:
    """Found after the launch's offset in any bytes around it; an earlier launch's line (before
    the offset) does not count; a log with no such line, or no log, says nothing."""
    d = tmp_path_factory.mktemp("log")
    log = d / "r000-train.log"
    head = b"x" * offset
    log.write_bytes(head + before + MEGATRON + after)
    assert asyncsave.log_says_disabled(log, offset)
    if asyncsave.DISABLED not in after:  # an earlier launch's line, before this one's header
        assert not asyncsave.log_says_disabled(log, offset + len(before) + len(MEGATRON))
    clean = before.replace(asyncsave.DISABLED, b"") + after.replace(asyncsave.DISABLED, b"")
    if asyncsave.DISABLED not in clean:
        log.write_bytes(clean)
        assert not asyncsave.log_says_disabled(log, 0)
    assert not asyncsave.log_says_disabled(d / "missing.log", 0)


seconds = st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(seconds, seconds, seconds, st.integers(0, 5))
def test_the_lag_shortens_the_optimum_by_the_square_root_of_one_plus_twice_the_lag(
        cost: float, mtbf: float, step: float, lag: int) -> None:
    """C/T + (1/2 + lag) T / MTBF is least at T = sqrt(2 C MTBF / (1 + 2 lag)); lag 0 is Young's."""
    t = saves.young_daly_steps(cost, mtbf, step, lag_intervals=lag) * step
    assert math.isclose(t * t * (1 + 2 * lag), 2 * cost * mtbf, rel_tol=1e-9)
    waste = lambda x: cost / x + (0.5 + lag) * x / mtbf  # noqa: E731
    assert waste(t) <= waste(t * 1.01) and waste(t) <= waste(t * 0.99)


def test_choose_counts_the_lag_only_while_megatron_keeps_async_saves() -> None:
    """The same inputs: async saves shorten the interval by sqrt(3); once a trainer's log said
    Megatron disabled them, the model is Young's again and says so."""
    seed = SavesSection(mode="adaptive", cost_guess=180, step_guess=850)
    room = saves.DiskRoom(need_bytes=1, room_bytes=2)
    common = dict(fixed_interval=10_000, steps_left=20, end_iteration=20, num_rollout=21, room=room)
    sync = saves.choose(seed, history=saves.History(), async_save=False, **common)
    lagged = saves.choose(seed, history=saves.History(), async_save=True, **common)
    disabled = saves.choose(seed, history=saves.History(async_disabled=True), async_save=True, **common)
    assert sync.optimum_steps and lagged.optimum_steps
    assert lagged.optimum_steps == pytest.approx(sync.optimum_steps / math.sqrt(3))
    assert lagged.async_save and "its lag counted" in saves.describe(lagged)
    assert disabled.optimum_steps == sync.optimum_steps and not disabled.async_save


def test_the_journaled_disabling_is_read_back_into_the_history() -> None:
    recs = [{"event": "transition", "src": None, "dst": "TRAIN", "state": "TRAIN", "t": 1.0},
            {"event": saves.ASYNC_DISABLED_EVENT, "state": "TRAIN", "t": 2.0, "message": "m"}]
    assert saves.read_history(recs, now=3.0).async_disabled
    assert not saves.read_history(recs[:1], now=3.0).async_disabled


def test_the_recipe_and_the_template_pass_both_flags_by_default() -> None:
    from shoprld.daemon.ops.initcmd import TEMPLATE

    root = Path(__file__).resolve().parents[2]
    recipe = (root / "run" / "slime-4xa800.toml").read_text()
    for text in (recipe, TEMPLATE):
        assert '"{async_save}", "{async_save_worker}"' in text
    assert SavesSection().async_save is True


def test_save_hf_is_left_out_only_for_mid_round_launches_with_a_converter() -> None:
    """slime writes --save-hf after every save: a launch whose interval can fire inside the round
    leaves it out when export.command converts once at EXPORT_HF; else it stays."""
    from shoprld.daemon.foundation.config.config import load_config
    from shoprld.daemon.foundation.config.placeholders import expand

    cfg = load_config(Path(__file__).resolve().parents[2] / "run" / "slime-4xa800.toml")
    assert cfg.export.command and cfg.campaign.steps_per_round == 20
    assert saves.hf_at_every_save(cfg, 10_000) and saves.hf_at_every_save(cfg, 20)
    assert not saves.hf_at_every_save(cfg, 5) and not saves.hf_at_every_save(cfg, 19)
    no_converter = cfg.model_copy(update={"export": cfg.export.model_copy(update={"command": ()})})
    assert saves.hf_at_every_save(no_converter, 5)
    assert saves.save_hf_left_out(cfg, 5) and not saves.save_hf_left_out(cfg, 10_000)
    literal = cfg.model_copy(update={"train": cfg.train.model_copy(update={"command": ("train.py", "--save-hf", "/hf")})})
    assert not saves.save_hf_left_out(literal, 5)  # a literal --save-hf is always passed: EXPORT_HF verifies it
    template = ["train.py", "--save-interval", "5", "{save_hf}", "{save_hf_dir}", "--num-rollout", "21"]
    assert expand(template, {"save_hf": "", "save_hf_dir": ""}) == ["train.py", "--save-interval", "5",
                                                                     "--num-rollout", "21"]
    assert "{save_hf}" in cfg.train.command and "{save_hf_dir}" in cfg.train.command
