"""The slime train.py stand-in: resume arithmetic, save schedule and order, W&B key, faults."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

import _common as c
from conftest import Procs, child_env, free_port, http, run_demo, start_shopsim

FAST = {"DEMO_STEP_SECONDS": "0", "DEMO_CKPT_BYTES": "4096", "DEMO_HF_BYTES": "8192"}


def train(*args: str, **knobs: str):  # noqa: ANN201 - CompletedProcess
    return run_demo("slime_train.py", *args, env=child_env(**{**FAST, **knobs}))


def rollouts_run(stdout: str) -> list[int]:
    """slime's own line: `[time] train_metric_utils.py:N - rollout <id>: {...}`."""
    return [int(m) for m in re.findall(r"^\[[\d: -]+\] \S+\.py:\d+ - rollout (\d+): \{.*\}$", stdout, re.M)]


def saves(stdout: str) -> list[int]:
    return [int(m) for m in re.findall(r" - successfully saved checkpoint from iteration +(\d+) to ", stdout)]


def test_init_base_writes_the_converted_release_layout(tmp_path: Path) -> None:
    """--init-base writes what convert_hf_to_torch_dist.py leaves: a complete `release/` dir and the tracker `release`."""
    res = train("--init-base", str(tmp_path / "base"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "base" / c.TRACKER).read_text() == "release"
    assert c.load_checkpoint(tmp_path / "base" / "release")["common"]["iteration"] == 1
    assert not list((tmp_path / "base").glob("iter_*"))


def test_the_converted_base_resumes_at_rollout_1(tmp_path: Path) -> None:
    """Round 0 from the converted base: tracker `release` is iteration 0, so slime starts at rollout 1."""
    assert train("--init-base", str(tmp_path / "base")).returncode == 0
    res = train("--load", str(tmp_path / "base"), "--save", str(tmp_path / "s"), "--save-interval", "100",
                "--num-rollout", "3")
    assert res.returncode == 0, res.stderr
    assert rollouts_run(res.stdout) == [1, 2] and (tmp_path / "s" / c.TRACKER).read_text() == "2"


def test_fresh_start_runs_from_zero_and_saves_like_slime(tmp_path: Path) -> None:
    """Without a tracker it starts at 0; saves at (id+1) % K == 0 and at the last rollout; iteration = rollout id."""
    res = train("--save", str(tmp_path / "s"), "--save-interval", "5", "--num-rollout", "12")
    assert res.returncode == 0, res.stderr
    assert rollouts_run(res.stdout) == list(range(12))
    assert saves(res.stdout) == [4, 9, 11]
    assert sorted(p.name for p in (tmp_path / "s").glob("iter_*")) == ["iter_0000004", "iter_0000009", "iter_0000011"]
    assert (tmp_path / "s" / c.TRACKER).read_text() == "11"
    assert (tmp_path / "s" / "rollout" / "global_dataset_state_dict_11.pt").is_file()
    assert re.search(r" - perf 11: \{", res.stdout)


def test_each_save_is_timed_as_slimes_timer_logs_it(tmp_path: Path) -> None:
    """Every save is wrapped in slime's `Timer save_model start` / `end (elapsed: X.Xs)` lines
    (daemon/round/saves.py reads the cost from them); DEMO_SAVE_SECONDS is a slow disk's extra time."""
    res = train("--save", str(tmp_path / "s"), "--save-interval", "3", "--num-rollout", "5", DEMO_SAVE_SECONDS="0.3")
    assert res.returncode == 0, res.stderr
    assert saves(res.stdout) == [2, 4]
    assert len(re.findall(r" timer\.py:\d+ - Timer save_model start$", res.stdout, re.M)) == 2
    elapsed = [float(x) for x in re.findall(r" timer\.py:\d+ - Timer save_model end \(elapsed: (\d+\.\d)s\)$",
                                            res.stdout, re.M)]
    assert len(elapsed) == 2 and all(e >= 0.3 for e in elapsed)


@pytest.mark.parametrize("tracker", ["5", " 5 \n", "5\n"])
def test_resume_starts_at_tracker_plus_one(tmp_path: Path, tracker: str) -> None:
    """A tracker holding an integer N (any whitespace) resumes at N+1."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / c.TRACKER).write_text(tracker)
    res = train("--load", str(tmp_path / "s"), "--save", str(tmp_path / "s"), "--save-interval", "100", "--num-rollout", "8")
    assert res.returncode == 0, res.stderr
    assert rollouts_run(res.stdout) == [6, 7]
    assert (tmp_path / "s" / c.TRACKER).read_text() == "7"


@pytest.mark.parametrize("num_rollout", ["21", "10"])
def test_num_rollout_at_or_below_start_runs_nothing(tmp_path: Path, num_rollout: str) -> None:
    """--num-rollout is an absolute end: with tracker 20 and an end <= 21 no rollout runs, no save, exit 0."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / c.TRACKER).write_text("20")
    res = train("--load", str(tmp_path / "s"), "--save", str(tmp_path / "s"), "--save-interval", "1", "--num-rollout", num_rollout)
    assert res.returncode == 0, res.stderr
    assert rollouts_run(res.stdout) == [] and saves(res.stdout) == []
    assert not list((tmp_path / "s").glob("iter_*"))


@pytest.mark.parametrize("tracker", ["garbage", "iter_5", "iter_0000005"])
def test_a_tracker_megatron_rejects_stops_the_trainer(tmp_path: Path, tracker: str) -> None:
    """Like Megatron's read_metadata, anything but an integer or `release` (iter_N included) is
    "Invalid metadata file": one stderr line, and the job fails (exit 1)."""
    (tmp_path / c.TRACKER).write_text(tracker)
    res = train("--load", str(tmp_path), "--save", str(tmp_path), "--num-rollout", "3")
    assert res.returncode == 1
    assert res.stderr.strip().count("\n") == 0 and "Invalid metadata file" in res.stderr


def test_checkpoint_files_are_written_in_megatron_order(tmp_path: Path) -> None:
    """common.pt, distcp, .metadata, metadata.json, then the tracker; sizes and contents as specified."""
    res = train("--save", str(tmp_path), "--save-interval", "1", "--num-rollout", "1",
                DEMO_CKPT_BYTES="300000", DEMO_CKPT_SHARDS="2")
    assert res.returncode == 0, res.stderr
    d = tmp_path / "iter_0000000"
    order = [d / "common.pt", d / "__0_0.distcp", d / "__1_0.distcp", d / ".metadata", d / "metadata.json", tmp_path / c.TRACKER]
    times = [p.stat().st_mtime_ns for p in order]
    assert times == sorted(times)
    assert (d / "__0_0.distcp").stat().st_size + (d / "__1_0.distcp").stat().st_size == 300000
    assert json.loads((d / "metadata.json").read_text()) == c.METADATA_JSON
    assert (tmp_path / c.TRACKER).read_text() == "0"
    assert res.stdout.index("saving checkpoint iter 0") < res.stdout.index("successfully saved checkpoint from iteration")


def test_save_seconds_pass_while_the_shards_grow(tmp_path: Path) -> None:
    """DEMO_SAVE_SECONDS (the benchmarks' save cost) passes while the shards are written (the
    saving phase's signal is the checkpoint growing, issue 30), and before the tracker, so a
    checkpoint is committed only once its save time has passed (a lower bound: a sleep never
    ends early)."""
    res = train("--save", str(tmp_path), "--save-interval", "1", "--num-rollout", "1", DEMO_SAVE_SECONDS="0.3")
    assert res.returncode == 0, res.stderr
    d = tmp_path / "iter_0000000"
    grew_ns = (d / "__0_0.distcp").stat().st_mtime_ns - (d / "common.pt").stat().st_mtime_ns
    assert grew_ns >= 0.25e9  # file times are kernel-tick coarse
    assert (tmp_path / c.TRACKER).stat().st_mtime_ns >= (d / "metadata.json").stat().st_mtime_ns


def test_save_hf_matches_the_converter_byte_for_byte(tmp_path: Path) -> None:
    """--save-hf and convert_torch_dist_to_hf.py produce identical HF dirs for the same iteration."""
    res = train("--save", str(tmp_path / "s"), "--save-interval", "3", "--num-rollout", "3", "--save-hf", str(tmp_path / "hf"))
    assert res.returncode == 0, res.stderr
    (tmp_path / "orig").mkdir()
    conv = run_demo("convert_torch_dist_to_hf.py", "--input-dir", str(tmp_path / "s" / "iter_0000002"),
                    "--output-dir", str(tmp_path / "conv"), "--origin-hf-dir", str(tmp_path / "orig"))
    assert conv.returncode == 0, conv.stderr
    names = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "conv").iterdir())
    assert all((tmp_path / "hf" / n).read_bytes() == (tmp_path / "conv" / n).read_bytes() for n in names)
    assert c.validate_hf_dir(tmp_path / "hf") == c.validate_hf_dir(tmp_path / "conv")


def test_converter_refuses_existing_output_without_force(tmp_path: Path) -> None:
    """An existing output dir is refused with one line and exit 1; -f overwrites it."""
    assert train("--init-base", str(tmp_path / "b")).returncode == 0
    (tmp_path / "out").mkdir()
    args = ["--input-dir", str(tmp_path / "b" / "release"), "--output-dir", str(tmp_path / "out"), "--origin-hf-dir", str(tmp_path)]
    res = run_demo("convert_torch_dist_to_hf.py", *args)
    assert res.returncode == 1 and "already exists" in res.stderr and res.stderr.count("\n") == 1
    assert run_demo("convert_torch_dist_to_hf.py", *args, "-f").returncode == 0
    assert c.validate_hf_dir(tmp_path / "out")


def test_weights_are_the_same_whatever_the_crash_path(tmp_path: Path) -> None:
    """iter_10 has the same bytes from a straight run and from a crash-and-resume run."""
    straight = train("--save", str(tmp_path / "a"), "--save-interval", "100", "--num-rollout", "11")
    assert straight.returncode == 0
    once = str(tmp_path / "once")
    args = ["--load", str(tmp_path / "b"), "--save", str(tmp_path / "b"), "--save-interval", "5", "--num-rollout", "11"]
    assert train(*args, DEMO_CRASH_AT="7", DEMO_FAULT_ONCE_DIR=once).returncode == 1
    assert train(*args, DEMO_CRASH_AT="7", DEMO_FAULT_ONCE_DIR=once).returncode == 0
    for name in ("__0_0.distcp", ".metadata", "common.pt"):
        assert (tmp_path / "a" / "iter_0000010" / name).read_bytes() == (tmp_path / "b" / "iter_0000010" / name).read_bytes()


def test_wandb_key_missing_is_one_line_exit_2(tmp_path: Path) -> None:
    """With W&B enabled and no WANDB_API_KEY, it prints exactly one line and exits 2."""
    res = train("--save", str(tmp_path), "--num-rollout", "1", "--use-wandb", "--wandb-mode", "online")
    assert res.returncode == 2
    assert res.stderr == "slime_train: WANDB_API_KEY is not set (W&B enabled)\n"


def test_wandb_key_is_never_printed_and_offline_marker_is_written(tmp_path: Path) -> None:
    """A present key is used silently; offline mode writes an offline-run-* marker under --wandb-dir."""
    res = train("--save", str(tmp_path / "s"), "--save-interval", "1", "--num-rollout", "2", "--use-wandb",
                "--wandb-mode", "offline", "--wandb-dir", str(tmp_path / "w"), "--wandb-group", "g",
                WANDB_API_KEY="s3cr3t-key-value")
    assert res.returncode == 0, res.stderr
    assert "s3cr3t-key-value" not in res.stdout + res.stderr
    assert list((tmp_path / "w").glob("wandb/offline-run-*"))


def test_wandb_disabled_needs_no_key(tmp_path: Path) -> None:
    """--wandb-mode disabled runs without a key."""
    assert train("--save", str(tmp_path), "--num-rollout", "1", "--use-wandb", "--wandb-mode", "disabled").returncode == 0


def test_unknown_slime_flags_are_accepted_and_recorded(tmp_path: Path) -> None:
    """Every other slime flag is accepted and recorded in the log."""
    res = train("--save", str(tmp_path), "--num-rollout", "1", "--rollout-batch-size", "16", "--global-batch-size", "64", "--colocate")
    assert res.returncode == 0, res.stderr
    assert "--rollout-batch-size 16 --global-batch-size 64 --colocate" in res.stdout


def test_sigterm_exits_at_once_without_saving(tmp_path: Path, procs: Procs) -> None:
    """Like slime, SIGTERM kills the trainer at once: no save, the tracker is untouched."""
    p = procs.start("slime_train.py", "--save", str(tmp_path / "s"), "--save-interval", "1000", "--num-rollout", "1000",
                    env=child_env(DEMO_STEP_SECONDS="0.1"))
    p.wait_log("- rollout 2: {")
    p.popen.send_signal(signal.SIGTERM)
    assert p.wait(timeout=5) == -signal.SIGTERM
    assert not (tmp_path / "s" / c.TRACKER).exists() and not list((tmp_path / "s").glob("iter_*"))


def test_crash_at_exits_1_and_keeps_the_last_save(tmp_path: Path) -> None:
    """DEMO_CRASH_AT=k exits 1 at the start of rollout k; the tracker shows the last save before it."""
    res = train("--save", str(tmp_path), "--save-interval", "5", "--num-rollout", "20", DEMO_CRASH_AT="7")
    assert res.returncode == 1
    assert rollouts_run(res.stdout) == list(range(7))
    assert (tmp_path / c.TRACKER).read_text() == "4"


def test_once_only_fault_lets_the_restart_proceed(tmp_path: Path) -> None:
    """With DEMO_FAULT_ONCE_DIR a fault fires once (marker file); the restarted trainer resumes and finishes."""
    args = ["--load", str(tmp_path / "s"), "--save", str(tmp_path / "s"), "--save-interval", "2", "--num-rollout", "6"]
    knobs = {"DEMO_CRASH_AT": "3", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "once")}
    first = train(*args, **knobs)
    assert first.returncode == 1 and (tmp_path / "once" / "crash_at").is_file()
    second = train(*args, **knobs)
    assert second.returncode == 0, second.stderr
    assert rollouts_run(second.stdout) == [2, 3, 4, 5]
    assert (tmp_path / "s" / c.TRACKER).read_text() == "5"


def test_resume_at_zero_restarts_the_count_after_a_numbered_load_only(tmp_path: Path) -> None:
    """DEMO_FAULT_RESUME_AT_ZERO (slime#1558): after --load of iteration 5 the rollouts restart at 0,
    not 6; from the converted base (`release`) the count is untouched; with DEMO_FAULT_ONCE_DIR the
    next launch resumes right."""
    assert train("--init-base", str(tmp_path / "base")).returncode == 0
    knobs = {"DEMO_FAULT_RESUME_AT_ZERO": "1", "DEMO_FAULT_ONCE_DIR": str(tmp_path / "once")}
    base = train("--load", str(tmp_path / "base"), "--save", str(tmp_path / "b"), "--save-interval", "100",
                 "--num-rollout", "3", **knobs)
    assert base.returncode == 0 and rollouts_run(base.stdout) == [1, 2]
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / c.TRACKER).write_text("5")
    args = ["--load", str(tmp_path / "s"), "--save", str(tmp_path / "s"), "--save-interval", "100", "--num-rollout", "8"]
    wrong = train(*args, **knobs)
    assert wrong.returncode == 0, wrong.stderr
    assert rollouts_run(wrong.stdout) == list(range(8)) and "start_rollout_id=0 " in wrong.stdout
    assert (tmp_path / "once" / "resume_at_zero").is_file()
    (tmp_path / "s" / c.TRACKER).write_text("5")
    assert rollouts_run(train(*args, **knobs).stdout) == [6, 7]


def test_stall_at_stays_alive_without_progress(tmp_path: Path, procs: Procs) -> None:
    """DEMO_STALL_AT=k: the trainer stays alive at rollout k and prints no further progress."""
    p = procs.start("slime_train.py", "--save", str(tmp_path), "--save-interval", "1", "--num-rollout", "10",
                    env=child_env(DEMO_STALL_AT="3", DEMO_STEP_SECONDS="0"))
    p.wait_log("stall at rollout 3")
    time.sleep(0.5)
    assert p.alive()
    assert rollouts_run(p.log()) == [0, 1, 2]


def test_hang_on_start_stays_alive_without_output(tmp_path: Path, procs: Procs) -> None:
    """DEMO_HANG_ON_START=1: alive, no rollout, no checkpoint."""
    p = procs.start("slime_train.py", "--save", str(tmp_path), "--num-rollout", "3", env=child_env(DEMO_HANG_ON_START="1"))
    p.wait_log("hang on start")
    time.sleep(0.3)
    assert p.alive() and "rollout" not in p.log().replace("hang on start", "")
    assert not list(tmp_path.glob("iter_*"))


def test_die_mid_save_leaves_a_partial_iter_dir(tmp_path: Path) -> None:
    """DEMO_DIE_MID_SAVE_AT=N: iter_N has common.pt and the distcp but no metadata.json; the tracker is unchanged."""
    res = train("--save", str(tmp_path), "--save-interval", "5", "--num-rollout", "20", DEMO_DIE_MID_SAVE_AT="9")
    assert res.returncode == 1
    partial = tmp_path / "iter_0000009"
    assert (partial / "common.pt").is_file() and (partial / "__0_0.distcp").is_file()
    assert not (partial / "metadata.json").exists() and not (partial / ".metadata").exists()
    assert (tmp_path / c.TRACKER).read_text() == "4"
    with pytest.raises(c.DemoError):
        c.load_checkpoint(partial)


def test_sigkill_during_rollout_12_resumes_from_the_last_save(tmp_path: Path, procs: Procs) -> None:
    """SIGKILL at rollout 12 with --save-interval 5 leaves tracker 9; the same command resumes at 10 and ends at 20."""
    s = tmp_path / "s"
    assert train("--init-base", str(s)).returncode == 0
    args = ["--load", str(s), "--save", str(s), "--save-interval", "5", "--num-rollout", "21"]
    p = procs.start("slime_train.py", *args, env=child_env(DEMO_STEP_SECONDS="0.05"))
    p.wait_log("- rollout 11: {")  # rollout 12 is now in progress
    p.popen.send_signal(signal.SIGKILL)
    p.wait(5)
    assert (s / c.TRACKER).read_text() == "9"
    res = train(*args)
    assert res.returncode == 0, res.stderr
    assert rollouts_run(res.stdout)[0] == 10 and saves(res.stdout) == [14, 19, 20]
    assert (s / c.TRACKER).read_text() == "20"


def slime_cfg(tmp_path: Path, url: str, concurrency: int = 2) -> Path:
    cfg = tmp_path / "slime.yaml"
    cfg.write_text(json.dumps({"round_id": "round-000", "project_root": str(tmp_path), "seed": 7,
                               "shopsim_environment_base_url": url, "shopsim_episode_concurrency": concurrency,
                               "shopsim_training_output_dir": str(tmp_path / "runs" / "slime-training")}))
    return cfg


def test_rollouts_lease_release_and_write_triage(tmp_path: Path, procs: Procs) -> None:
    """Each rollout leases and releases ShopSim slots and writes group triage files (a fraction pending)."""
    _, url = start_shopsim(procs, slots=4)
    res = train("--save", str(tmp_path / "s"), "--save-interval", "100", "--num-rollout", "6",
                "--custom-config-path", str(slime_cfg(tmp_path, url, 4)), DEMO_TRIAGE_FRACTION="0.5")
    assert res.returncode == 0, res.stderr
    assert http("GET", url + "/healthz")[1]["free_slots"] == 4
    groups = sorted((tmp_path / "runs" / "slime-training" / "round-000").glob("group-*"))
    assert [g.name for g in groups] == [f"group-{i:09d}" for i in range(24)]
    triage = [json.loads((g / "triage.json").read_text()) for g in groups]
    pending = [t for t in triage if t["classification"] == "full_skill_failure_pending_analysis"]
    assert 0 < len(pending) < 24 and all(t["status"] == t["classification"] for t in triage)
    assert all((tmp_path / "runs" / "slime-training" / "round-000" / f"group-{t['group_id']:09d}" / "full-skill-retry.json").is_file() for t in pending)
    assert all((g / "rollout-0.json").is_file() for g in groups)


@pytest.mark.parametrize("fraction,expected", [("0", 0), ("1", 8)])
def test_triage_fraction_knob(tmp_path: Path, procs: Procs, fraction: str, expected: int) -> None:
    """DEMO_TRIAGE_FRACTION sets the share of groups marked full_skill_failure_pending_analysis."""
    _, url = start_shopsim(procs, slots=2)
    res = train("--save", str(tmp_path / "s"), "--num-rollout", "4", "--custom-config-path", str(slime_cfg(tmp_path, url)),
                DEMO_TRIAGE_FRACTION=fraction)
    assert res.returncode == 0, res.stderr
    files = list((tmp_path / "runs" / "slime-training" / "round-000").glob("group-*/triage.json"))
    assert len(files) == 8
    assert sum(json.loads(f.read_text())["status"] != "scored" for f in files) == expected


def test_leak_leases_at_the_end_keeps_slots_taken(tmp_path: Path, procs: Procs) -> None:
    """DEMO_LEAK_LEASES=1 without a crash: exit 0 with `concurrency` slots still leased."""
    _, url = start_shopsim(procs, slots=5)
    res = train("--save", str(tmp_path / "s"), "--num-rollout", "3", "--custom-config-path", str(slime_cfg(tmp_path, url, 2)),
                DEMO_LEAK_LEASES="1")
    assert res.returncode == 0, res.stderr
    assert http("GET", url + "/healthz")[1]["free_slots"] == 3


def test_leak_leases_with_crash_at(tmp_path: Path, procs: Procs) -> None:
    """DEMO_LEAK_LEASES=1 with DEMO_CRASH_AT=k: leases at rollout k, then exits 1 without releasing."""
    _, url = start_shopsim(procs, slots=5)
    res = train("--save", str(tmp_path / "s"), "--num-rollout", "5", "--custom-config-path", str(slime_cfg(tmp_path, url, 2)),
                DEMO_LEAK_LEASES="1", DEMO_CRASH_AT="2")
    assert res.returncode == 1
    assert rollouts_run(res.stdout) == [0, 1]
    assert http("GET", url + "/healthz")[1]["free_slots"] == 3


def test_shopsim_down_aborts_after_8_unscored_groups(tmp_path: Path) -> None:
    """With ShopSim unreachable the trainer stops after 8 consecutive unscored groups: one line, exit 1."""
    res = train("--save", str(tmp_path / "s"), "--num-rollout", "10",
                "--custom-config-path", str(slime_cfg(tmp_path, f"http://127.0.0.1:{free_port()}", 4)))
    assert res.returncode == 1
    assert "8 consecutive unscored groups" in res.stderr and res.stderr.count("\n") == 1


def test_step_seconds_knob_sets_the_step_time(tmp_path: Path) -> None:
    """DEMO_STEP_SECONDS is slept every rollout and shows in the step_time field."""
    res = train("--save", str(tmp_path), "--num-rollout", "2", DEMO_STEP_SECONDS="0.2")
    times = [float(x) for x in re.findall(r"\"perf/step_time\": ([0-9.]+)", res.stdout)]
    assert len(times) == 2 and min(times) >= 0.2


def test_full_skill_retry_is_shaped_as_the_real_analyst_requires(tmp_path: Path, procs: Procs) -> None:
    """The retry trace passes the real `training analyze` acceptance (ShopSimRL@d020cbb
    training_analysis._OnlineCardPipeline.load_retry_trace): a completed train job with r_success 0,
    provenance skills.diagnostic_full_skill true, selected_skills = the curriculum's full skill
    (id, version, content) and the triage's episode_id. Before, every card was an ANALYST_ERROR."""
    _, url = start_shopsim(procs, slots=2)
    chunks = [{"skill_id": "c1", "version": "v7", "content": "### 搜索\n- a", "metadata": {"estimated_effect": 0.1},
               "contribution": 0.1, "inclusion_probability": 0.9}, {"skill_id": "c2", "content": "b", "metadata": {}}]
    cur = tmp_path / "curriculum.json"
    cur.write_text(json.dumps({"schema_version": "shopsimrl-skill-curriculum-v1", "round_id": "round-000",
                               "state_id": "s1", "chunks": chunks}))
    cfg = json.loads(slime_cfg(tmp_path, url).read_text())
    (tmp_path / "slime.yaml").write_text(json.dumps({**cfg, "shopsim_curriculum_path": str(cur)}))
    res = train("--save", str(tmp_path / "s"), "--num-rollout", "2", "--custom-config-path", str(tmp_path / "slime.yaml"),
                DEMO_TRIAGE_FRACTION="1")
    assert res.returncode == 0, res.stderr
    triages = [json.loads(f.read_text()) for f in (tmp_path / "runs" / "slime-training" / "round-000").glob("group-*/triage.json")]
    assert triages
    for t in triages:
        retry = json.loads(Path(t["full_skill_retry"]["trace_path"]).read_text())
        assert retry["episode_id"] == t["full_skill_retry"]["episode_id"]
        assert retry["status"] == "completed" and retry["job"]["split"] == "train"
        assert retry["final"]["done"] is True and retry["final"]["reward_detail"]["r_success"] in (0, 0.0)
        assert retry["provenance"]["skills"]["diagnostic_full_skill"] is True
        assert [(s["skill_id"], s["version"], s["content"]) for s in retry["selected_skills"]] == [
            ("c1", "v7", "### 搜索\n- a"), ("c2", "1", "b")]
