"""Campaign lifecycle (issue 9): clean with its reproducibility record, and moving machines.

Real demo campaigns, real daemon processes, a real filesystem. The move test "moves" a
half-finished campaign to another directory tree (other repo, volume and state paths),
deletes the old tree, finishes the campaign there, and compares with an unmoved run.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from shoprld.daemon.foundation.storage import checkpoints as ckpt
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.system.errors import LockError
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.ops.campaignexport import export_campaign
from shoprld.daemon.ops.campaignimport import Repointer, import_campaign
from shoprld.daemon.ops.clean import clean
from shoprld.daemon.ops.oneshot import LifecycleError
from shoprld.daemon.foundation.config.tomlwrite import dump_toml
from tests.demotree import (
    journal,
    kill_tree_leftovers,
    ledger_rows,
    make_tree,
    reference_run,
    results,
    run_daemon,
    start_daemon,
    status,
    wait_for,
)


def _layout(root: Path) -> Layout:
    return Layout.from_config(load_config(root / "campaign.toml"))


def _snapshot(top: Path) -> dict[str, tuple[int, bool]]:
    """Every path under ``top`` (symlinks not followed) -> (size, is_link)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            out[str(p.relative_to(top))] = (st.st_size if not p.is_dir() or p.is_symlink() else 0, p.is_symlink())
    return out


def _secret_values(root: Path) -> list[str]:
    vals = []
    for line in (root / "repo" / ".env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            vals.append(line.split("=", 1)[1].strip())
    return [v for v in vals if v]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished 2-round demo campaign, never modified: tests clean copies of it."""
    return reference_run(tmp_path_factory.mktemp("finished"), 2)


def _copy_tree(src: Path, dst: Path) -> Path:
    """A copy of a finished campaign tree that is its own campaign (relative config paths)."""
    shutil.copytree(src, dst, symlinks=True)
    link = dst / "repo" / "runs"
    if link.is_symlink():  # re-point the managed link into the copy, as the daemon would
        link.unlink()
        link.symlink_to(_layout(dst).runs, target_is_directory=True)
    return dst


@pytest.fixture(scope="module")
def reference3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unmoved, uninterrupted 3-round campaign: the results a moved one must match."""
    return reference_run(tmp_path_factory.mktemp("ref3"), 3)


# -- clean ------------------------------------------------------------------------------------------


def test_clean_dry_run_lists_what_would_go_with_sizes_and_changes_nothing(finished: Path, tmp_path: Path) -> None:
    """--dry-run lists every doomed path with a human size and a total, and writes nothing anywhere."""
    root = _copy_tree(finished, tmp_path / "c")
    before = _snapshot(root)
    out = io.StringIO()
    assert clean(root / "campaign.toml", dry_run=True, out=out) == 0
    text = out.getvalue()
    print(text)
    assert _snapshot(root) == before
    assert "would delete:" in text and " total, " in text
    for what in ("checkpoint iter_0000020", "checkpoint iter_0000040 (final", "HF export",
                 "rollout samples (runs/slime-training)", "eval dump", "wandb offline files"):
        assert what in text, what
    assert "MiB" in text and "KiB" in text
    assert "shared cache (never cleaned)" in text
    assert not (root / "repo" / "reports" / "shoprld" / "demo").exists()


def test_clean_writes_the_record_first_then_deletes_only_this_campaigns_heavy_dirs(finished: Path,
                                                                                   tmp_path: Path) -> None:
    """A real clean writes the reproducibility record, deletes checkpoints, HF export, rollout samples,
    eval dumps, tmp/ray/wandb contents, and keeps the shared cache, other campaigns, other users,
    logs, decision records, the small runs/ files, the ledger and the state dir."""
    root = _copy_tree(finished, tmp_path / "c")
    lay = _layout(root)
    pre_results = results(root)
    brev = lay.brev_root
    planted = {
        "shared cache": lay.cache_root / "huggingface" / "hub" / "model.safetensors",
        "another campaign": brev / "nemo-rl-auto-research" / "other" / "main" / "checkpoints" / "megatron"
        / "iter_0000020" / "common.pt",
        "another user": lay.ephemeral_root / "nemo-rl" / "alice" / "nemo-rl-auto-research" / "demo"
        / "qwen35-4b-train-100" / "tmp" / "x",
    }
    for p in planted.values():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"keep me")
    (lay.tmp / "scratch").write_bytes(b"x" * 5000)
    (lay.ray_tmp / "session_latest").mkdir(parents=True, exist_ok=True)
    keep_logs, keep_records = _snapshot(lay.logs), _snapshot(lay.artifacts)
    out = io.StringIO()
    assert clean(root / "campaign.toml", out=out) == 0
    print(out.getvalue())
    for what, p in planted.items():
        assert p.read_bytes() == b"keep me", what
    scan = ckpt.scan(lay.save_dir)
    assert scan.checkpoints == () and scan.tracker.kind == "missing"
    assert not lay.hf_dir(load_config(root / "campaign.toml")).exists()
    assert not (lay.runs / "slime-training").exists()
    assert not list(lay.runs.glob("*/traces*.jsonl"))
    assert not any(lay.tmp.iterdir()) and not any(lay.ray_tmp.iterdir()) and not any(lay.wandb_dir.iterdir())
    assert _snapshot(lay.logs) == keep_logs and _snapshot(lay.artifacts) == keep_records
    assert results(root) == pre_results  # the small result files stay on the volume too
    assert len(ledger_rows(root)) == 2 and (lay.state_dir / "state.json").exists()
    cleaned = [r for r in journal(root) if r["event"] == "campaign.cleaned"]
    assert len(cleaned) == 1 and cleaned[0]["freed_bytes"] > 2 * 1024**2


def test_record_holds_config_git_rounds_commands_checkpoint_results_and_no_secret(finished: Path,
                                                                                  tmp_path: Path) -> None:
    """The record in reports/shoprld/<campaign>/ has every piece the issue lists, the result files
    byte-identical to the campaign's, the final checkpoint's iteration and size, and no secret value."""
    root = _copy_tree(finished, tmp_path / "c")
    pre_results = results(root)
    final = ckpt.scan(_layout(root).save_dir).latest_complete
    assert final is not None
    assert clean(root / "campaign.toml", out=io.StringIO()) == 0
    rec = root / "repo" / "reports" / "shoprld" / "demo"
    names = sorted(str(p.relative_to(rec)) for p in rec.rglob("*") if p.is_file())
    print("record files:", *names, sep="\n  ")
    for name in ("README.md", "campaign.toml", "config.resolved.json", "git.json", "rounds.json", "ledger.tsv",
                 "commands.json", "commands.txt", "checkpoint.json", "envinfo.json", "state.json", "cleanup.json"):
        assert name in names, name
    assert (rec / "campaign.toml").read_text() == (root / "campaign.toml").read_text()
    got = {str(p.relative_to(rec / "results")): p.read_bytes() for p in (rec / "results").rglob("*") if p.is_file()}
    assert {k: v for k, v in got.items() if k in pre_results} == pre_results
    git = json.loads((rec / "git.json").read_text())
    assert len(git["commit"]) == 40 and git["branch"] == "main"
    rounds = json.loads((rec / "rounds.json").read_text())
    assert [r["round"] for r in rounds] == [0, 1]
    assert all(r["val"]["primary"]["success_rate"] is not None and r["gate"]["decision"] for r in rounds)
    ck = json.loads((rec / "checkpoint.json").read_text())["final"]
    assert (ck["iteration"], ck["bytes"]) == (final.iteration, final.bytes) == (40, final.bytes)
    cmds = json.loads((rec / "commands.json").read_text())
    train1 = cmds["round-001"]["stages"]["train"]["argv"]
    assert train1[train1.index("--num-rollout") + 1] == "41"
    assert train1[train1.index("--load") + 1] == str(_layout(root).save_dir)
    env = json.loads((rec / "envinfo.json").read_text())
    assert env["stage_envs"] and env["stage_envs"][0]["versions"]["python"].count(".") == 2
    blob = b"".join(p.read_bytes() for p in rec.rglob("*") if p.is_file())
    for secret in _secret_values(root):
        assert secret.encode() not in blob


def test_record_alone_reproduces_the_results_after_the_volume_is_wiped(finished: Path, tmp_path: Path) -> None:
    """After clean and wiping the whole volume, the record's config run on a fresh tree (same commit,
    same inputs) gives byte-identical results to the record's result files."""
    root = _copy_tree(finished, tmp_path / "c")
    assert clean(root / "campaign.toml", out=io.StringIO()) == 0
    rec = root / "repo" / "reports" / "shoprld" / "demo"
    shutil.rmtree(root / "ephemeral")
    fresh = tmp_path / "fresh"
    make_tree(fresh, rounds=2)  # the same deterministic inputs: models, cold start, .env
    shutil.copy2(rec / "campaign.toml", fresh / "campaign.toml")
    try:
        proc = run_daemon(fresh / "campaign.toml")
    finally:
        kill_tree_leftovers(fresh)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recorded = {str(p.relative_to(rec / "results")): p.read_bytes() for p in (rec / "results").rglob("*")
                if p.is_file()}
    assert results(fresh) == {k: v for k, v in recorded.items() if k in results(fresh)}
    assert set(results(fresh)) <= set(recorded)


def test_clean_keep_final_keeps_the_resume_point_tracker_and_data_state(finished: Path, tmp_path: Path) -> None:
    """--keep-final deletes every other checkpoint but leaves the final one committed and complete,
    with its tracker and slime's data-sampler state for that iteration."""
    root = _copy_tree(finished, tmp_path / "c")
    lay = _layout(root)
    assert clean(root / "campaign.toml", keep_final=True, out=io.StringIO()) == 0
    scan = ckpt.scan(lay.save_dir)
    assert [c.iteration for c in scan.checkpoints] == [40]
    assert scan.consistent and ckpt.is_complete(lay.save_dir, 40)
    assert [p.name for p in (lay.save_dir / "rollout").iterdir()] == ["global_dataset_state_dict_40.pt"]


def test_clean_refuses_paths_that_resolve_outside_the_campaign_root_or_onto_kept_dirs(finished: Path,
                                                                                    tmp_path: Path) -> None:
    """A ray dir symlinked outside the campaign root, a wandb dir symlinked onto the experiment dir, and a
    link inside tmp pointing outside are never followed: their targets survive, the refusals are listed."""
    root = _copy_tree(finished, tmp_path / "c")
    lay = _layout(root)
    outside = tmp_path / "outside"
    (outside / "ray").mkdir(parents=True)
    (outside / "ray" / "precious").write_bytes(b"not the campaign's")
    (outside / "file").write_bytes(b"not the campaign's either")
    shutil.rmtree(lay.ray_tmp)
    lay.ray_tmp.symlink_to(outside / "ray", target_is_directory=True)
    shutil.rmtree(lay.wandb_dir)
    lay.wandb_dir.symlink_to(lay.exp_dir, target_is_directory=True)
    (lay.tmp / "escape").symlink_to(outside / "file")
    (lay.tmp / "escape-dir").symlink_to(outside, target_is_directory=True)
    exp_before = {k for k in _snapshot(lay.exp_dir) if k.startswith(("logs", "artifacts"))}
    dry = io.StringIO()
    clean(root / "campaign.toml", dry_run=True, out=dry)
    assert "refused" in dry.getvalue() and "outside the campaign root" in dry.getvalue()
    out = io.StringIO()
    assert clean(root / "campaign.toml", out=out) == 0
    text = out.getvalue()
    print(text)
    assert (outside / "ray" / "precious").read_bytes() == b"not the campaign's"
    assert (outside / "file").read_bytes() == b"not the campaign's either"
    assert f"refused     {lay.ray_tmp}: resolves to {os.path.realpath(outside / 'ray')}, outside" in text
    assert f"refused     {lay.wandb_dir}: resolves to" in text and "which clean keeps" in text
    assert exp_before <= set(_snapshot(lay.exp_dir))
    assert not os.path.lexists(lay.tmp / "escape")  # the link itself was the campaign's: gone
    rec = json.loads((root / "repo" / "reports" / "shoprld" / "demo" / "cleanup.json").read_text())
    assert {Path(r["path"]) for r in rec["refused"]} == {lay.ray_tmp, lay.wandb_dir}


def test_clean_refuses_while_a_daemon_runs_the_campaign(tmp_path: Path) -> None:
    """While `shoprld run` holds the campaign's lock, clean exits 3 with one line and deletes nothing."""
    campaign = make_tree(tmp_path, rounds=2, edits={r'^step_seconds = ".*"$': 'step_seconds = "0.25"'})
    proc = start_daemon(campaign)
    try:
        def in_train() -> bool:
            try:
                return bool(status(tmp_path).get("state") == "TRAIN")
            except (OSError, ValueError):
                return False

        wait_for(in_train, 60, "the daemon in TRAIN")
        before = _snapshot(tmp_path / "ephemeral")
        with pytest.raises(LockError) as err:
            clean(campaign, out=io.StringIO())
        assert err.value.exit_code == 3 and "\n" not in str(err.value)
        assert "clean refused" in str(err.value) and "shoprld stop" in str(err.value)
        with pytest.raises(LockError):
            clean(campaign, dry_run=True, out=io.StringIO())
        after = _snapshot(tmp_path / "ephemeral")
        assert {k for k in before if "iter_" in k} <= set(after)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            kill_tree_leftovers(tmp_path)


# -- moving machines --------------------------------------------------------------------------------


def _copy_item(item: dict[str, Any], roots: dict[str, Path]) -> Path:
    dst = roots[item["root"]] / item["rel"]
    dst.parent.mkdir(parents=True, exist_ok=True)
    if item["kind"] == "dir":
        shutil.copytree(item["src"], dst, symlinks=True)
    else:
        shutil.copy2(item["src"], dst)
    return dst


def test_move_a_half_finished_campaign_and_finish_it_with_identical_results(reference3: Path,
                                                                           tmp_path: Path) -> None:
    """Kill a 3-round campaign when round 2's trainer starts, export it, copy what the checklist says
    into a new tree (other repo, volume and state paths), delete the old tree, import, and run: the
    campaign resumes at round 2 without retraining rounds 0-1 and its results equal an unmoved run's."""
    t0 = time.monotonic()
    old, new = tmp_path / "old", tmp_path / "elsewhere"
    marks = tmp_path / "marks"
    marks.mkdir()
    campaign = make_tree(old, rounds=3)
    try:
        proc = run_daemon(campaign, env={"SHOPRLD_TEST_KILL": "TRAIN:mid:2", "SHOPRLD_TEST_KILL_DIR": str(marks)})
    finally:
        kill_tree_leftovers(old)  # the orphaned trainer and services of the killed daemon
    assert proc.returncode == -9, proc.stderr[-2000:]
    # The journal's last transition is where it died (status.json may lag a hand-off by 50 ms).
    last = [j for j in journal(old) if j["event"] == "transition"][-1]
    assert (last["dst"], last["round"]) == ("TRAIN", 2)
    bundle = tmp_path / "demo-move.tar"
    out = io.StringIO()
    assert export_campaign(campaign, bundle, out=out) == 0
    print(out.getvalue())
    with tarfile.open(bundle) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    manifest = json.loads(members["shoprld-move/manifest.json"])
    assert "shoprld-move/MOVE_CHECKLIST.md" in members and (tmp_path / "demo-move.tar.MOVE_CHECKLIST.md").exists()
    heavy = [n for n in members if n.endswith((".distcp", ".safetensors", ".pt", ".log")) or "slime-training" in n
             or n.endswith("/.env")]
    assert heavy == []
    assert sum(len(v) for v in members.values()) < 1024**2
    for secret in _secret_values(old):
        assert not any(secret.encode() in v for v in members.values())
    for name in ("state/state.json", "state/journal.jsonl", "state/status.json", "ledger/repo.tsv",
                 "config/campaign.toml", "exp/artifacts/gate/round-001.json", "exp/artifacts/export/round-001.json",
                 "exp/runs/round-002/selected_skillbank.json", "exp/runs/round-002/curriculum.json"):
        assert f"shoprld-move/{name}" in members, name
    assert manifest["checkpoint"]["iteration"] == 40

    # The new machine: a clone of the repo at the recorded commit, new volume and state paths.
    new.mkdir()
    subprocess.run(["git", "clone", "-q", str(old / "repo"), str(new / "repo")], check=True, timeout=60)
    assert (new / "repo" / "artifacts" / "cold-start" / "curriculum.json").exists()  # user data, in git
    eph_rel = Path(manifest["roots"]["exp_dir"]).relative_to(manifest["roots"]["ephemeral_root"])
    roots = {"repo": new / "repo", "project_root": new / "repo", "ephemeral_root": new / "volume",
             "state_dir": new / "daemon-state", "config_dir": new}
    roots["exp_dir"] = roots["ephemeral_root"] / eph_rel
    roots["campaign_root"] = roots["exp_dir"].parent
    required = [i for i in manifest["copy"] if i["required"]]
    assert {i["what"].split(" (")[0] for i in required} >= {"resume checkpoint iter_0000040", "checkpoint tracker",
                                                            "base model", "HF origin dir", ".env"}

    def do_import() -> int:
        buf = io.StringIO()
        rc = import_campaign(bundle, roots["repo"], roots["ephemeral_root"], roots["state_dir"], out=buf)
        print(buf.getvalue())
        return rc

    # Not copied yet: the import refuses and writes nothing.
    with pytest.raises(LifecycleError, match="checkpoint not ready: .*iter_0000040: missing"):
        do_import()
    assert not (new / "campaign.toml").exists() and not (roots["state_dir"] / "state.json").exists()
    for item in required:
        _copy_item(item, roots)
    # A torn copy (metadata.json lost) is refused too.
    meta = roots["exp_dir"] / "checkpoints" / "megatron" / "iter_0000040" / "metadata.json"
    saved = meta.read_bytes()
    meta.unlink()
    with pytest.raises(LifecycleError, match="incomplete"):
        do_import()
    meta.write_bytes(saved)

    shutil.rmtree(old)  # the old machine is gone: nothing may still point there
    assert do_import() == 0
    new_cfg = tomllib.loads((new / "campaign.toml").read_text())
    assert new_cfg["storage"]["repo"] == str(roots["repo"])
    assert new_cfg["storage"]["ephemeral_root"] == str(roots["ephemeral_root"])
    assert new_cfg["train"]["base_load"] == str(new / "models" / "base_torch_dist")
    for p in (roots["state_dir"] / "state.json", roots["exp_dir"] / "artifacts" / "inject" / "round-001.json",
              new / "repo" / "reports" / "shoprld" / "demo.tsv"):
        assert str(old) not in p.read_text(), p
    assert json.loads((roots["state_dir"] / "state.json").read_text())["children"] == {}

    try:
        proc = run_daemon(new / "campaign.toml")
    finally:
        kill_tree_leftovers(new)
    took = time.monotonic() - t0
    print(f"move test: kill + export + copy + import + finish took {took:.1f}s")
    assert proc.returncode == 0, proc.stderr[-2000:]
    st = json.loads((roots["state_dir"] / "status.json").read_text())
    assert st["state"] == "DONE" and [r["round"] for r in st["rounds_done"]] == [0, 1, 2]
    assert results(new) == results(reference3)
    assert [int(r[0]) for r in ledger_rows(new)] == [0, 1, 2]
    events = [json.loads(line) for line in (roots["state_dir"] / "journal.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("campaign.imported") == 1
    after = events[[e["event"] for e in events].index("campaign.imported"):]
    commits = [e["iteration"] for e in after if e["event"] == "checkpoint.committed"]
    assert commits == [60], commits  # round 2 trained once; rounds 0-1 never retrained


# -- the small parts --------------------------------------------------------------------------------


def test_repointer_rewrites_whole_root_prefixes_only_longest_first() -> None:
    """A root is replaced only as a whole path prefix, the longest matching root wins, and a path that
    merely shares a prefix string (/old/repo2) or sits deeper in another path is left alone."""
    rp = Repointer([("/old", "/new"), ("/old/repo", "/n/r"), ("/old/eph", "/vol")])
    assert rp.text("/old/repo/runs/x.json") == "/n/r/runs/x.json"
    assert rp.text('{"a": "/old/eph/nemo", "b": "/old/repo"}') == '{"a": "/vol/nemo", "b": "/n/r"}'
    assert rp.text("--load /old/models/base --save=/old/eph/ck") == "--load /new/models/base --save=/vol/ck"
    assert rp.text("/old/repo2/x /x/old/repo /oldish") == "/new/repo2/x /x/old/repo /oldish"
    assert rp.text("/x/old/repo") == "/x/old/repo"
    assert rp.text("/oldish/y") == "/oldish/y"


def test_dump_toml_round_trips_a_campaign_file() -> None:
    """The TOML writer's output parses back to the same data (the shipped demo and slime recipes)."""
    recipes = Path(__file__).resolve().parents[2] / "run"
    for f in (recipes / "demo" / "campaign.toml", recipes / "slime-4xa800.toml"):
        data = tomllib.loads(f.read_text())
        assert tomllib.loads(dump_toml(data, "header\nline two")) == data, f
    odd = {"t": {"s": 'q"uote\\ \t\n \x7f é', "k.ey": [1, 2.5, True, {"x": "y"}], "sub": {"a": {"b": 1}}}}
    assert tomllib.loads(dump_toml(odd)) == odd
