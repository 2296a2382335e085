"""The node_exporter textfile: written atomically, and parsed back by prometheus_client's parser."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from shoprld.daemon.core.metrics import WARN_EVERY_S, TextfileMetrics, extras_problem, textfile_problem
from shoprld.daemon.foundation.records.outputs import Protected
from tests.fsfixtures import read_only, tmpfs_fixture  # noqa: F401  (fixtures)

# A mid-run status document (TRAIN, round 2, a checkpoint, a plan, disk limits).
MID_RUN = {"state": "TRAIN", "round": 2, "step": 7, "step_seconds": 1.5, "eta_seconds": 19.5,
           "daemon": {"pid": 1, "started_at": 1_700_000_000.0},
           "plan": {"campaign_eta_seconds": 3600.0},
           "disk": {"free_bytes": 123456, "soft_limit_bytes": 5000, "hard_limit_bytes": 2000},
           "last_checkpoint": {"iteration": 47, "committed_at": 1_700_000_500.0},
           "rounds_done": [{"round": 0, "val": 0.4}, {"round": 1, "val": 0.45}]}
COUNTERS = {"restarts": 3, "stalls": 1, "failures": {"python_exception": 2, "stall": 1}}


def _promtool() -> str | None:
    """Prometheus' own linter: $SHOPRLD_PROMTOOL, else promtool on PATH."""
    return os.environ.get("SHOPRLD_PROMTOOL") or shutil.which("promtool")


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "campaign")))] = s.value
    return out


def test_status_document_becomes_parseable_metrics(tmp_path: Path) -> None:
    """Every documented metric is present with the status document's numbers; no temp file is left."""
    path = tmp_path / "textfile" / "shoprld.prom"
    TextfileMetrics(path, "demo", clock=lambda: 1_700_000_900.0).write(MID_RUN, COUNTERS)
    s = _samples(path)
    assert s[("shoprld_state", (("state", "TRAIN"),))] == 1 and s[("shoprld_state", (("state", "DONE"),))] == 0
    assert s[("shoprld_round", ())] == 2 and s[("shoprld_step", ())] == 7
    assert s[("shoprld_step_seconds", ())] == 1.5 and s[("shoprld_eta_seconds", ())] == 19.5
    assert s[("shoprld_disk_free_bytes", ())] == 123456 and s[("shoprld_last_checkpoint_iteration", ())] == 47
    assert s[("shoprld_restarts_total", ())] == 3 and s[("shoprld_stalls_total", ())] == 1
    assert s[("shoprld_round_metric", (("round", "1"),))] == 0.45
    assert s[("shoprld_last_write_timestamp_seconds", ())] == 1_700_000_900.0
    assert s[("shoprld_daemon_start_timestamp_seconds", ())] == 1_700_000_000.0
    assert s[("shoprld_last_checkpoint_timestamp_seconds", ())] == 1_700_000_500.0
    assert s[("shoprld_campaign_eta_seconds", ())] == 3600.0
    assert s[("shoprld_disk_soft_limit_bytes", ())] == 5000 and s[("shoprld_disk_hard_limit_bytes", ())] == 2000
    assert s[("shoprld_failures_total", (("cause", "python_exception"),))] == 2
    assert [p.name for p in path.parent.iterdir()] == ["shoprld.prom"]


def test_counters_are_counters_and_info_is_info(tmp_path: Path) -> None:
    """Prometheus types: *_total are counters (no _created sample: their origin is state.json),
    the version is an _info metric."""
    path = tmp_path / "m.prom"
    TextfileMetrics(path, "demo").write(MID_RUN, COUNTERS)
    types = {f.name: f.type for f in text_string_to_metric_families(path.read_text())}
    assert types["shoprld_restarts"] == types["shoprld_stalls"] == types["shoprld_failures"] == "counter"
    assert types["shoprld_info"] == types["shoprld_state"] == "gauge"  # the text format has no info type
    text = path.read_text()
    assert "# TYPE shoprld_restarts_total counter" in text and "_created" not in text
    assert 'shoprld_info{campaign="demo",version="' in text


def test_promtool_check_metrics_is_clean(tmp_path: Path) -> None:
    """``promtool check metrics`` (Prometheus' own lint) exits 0 with no finding on a mid-run file."""
    tool = _promtool()
    if tool is None:
        pytest.skip("promtool not found (set SHOPRLD_PROMTOOL or install Debian's prometheus)")
    path = tmp_path / "m.prom"
    TextfileMetrics(path, "demo").write(MID_RUN, COUNTERS)
    res = subprocess.run([tool, "check", "metrics"], input=path.read_text(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr


def test_a_bad_path_warns_once_then_hourly_then_says_recovered(tmp_path: Path) -> None:
    """Written at every status update, a bad textfile must not warn hundreds of times a night."""
    now = [1000.0]
    (tmp_path / "file").write_text("")
    m = TextfileMetrics(tmp_path / "file" / "m.prom", "demo", clock=lambda: now[0])
    with capture_logs() as logs:
        for _ in range(200):
            now[0] += 10
            assert m.write(MID_RUN, COUNTERS) is False
        warns = [e for e in logs if e["event"] == "metrics.write_failed"]
        assert len(warns) == 1 and "fix" in warns[0]
        now[0] += WARN_EVERY_S
        m.write(MID_RUN, COUNTERS)
        warns = [e for e in logs if e["event"] == "metrics.write_failed"]
        assert len(warns) == 2 and warns[1]["failed_since_last_warning"] == 200
        m.path = tmp_path / "ok" / "m.prom"
        assert m.write(MID_RUN, COUNTERS) is True
    assert [e["event"] for e in logs][-1] == "metrics.write_recovered"


def test_textfile_problem_names_a_directory_this_user_cannot_write(tmp_path: Path, tmpfs: object) -> None:
    """check and run: a textfile on a read-only volume (its dir, or the nearest existing parent of
    a dir the writer would make) is one line naming that directory; a dir not made yet under a
    writable parent is fine (the writer makes it)."""
    own = Protected()
    assert textfile_problem(None, own) is None and textfile_problem(tmp_path / "m.prom", own) is None
    assert textfile_problem(tmp_path / "not" / "yet" / "m.prom", own) is None
    root = tmpfs("1m")  # type: ignore[operator]
    (root / "textfile").mkdir()
    with read_only(root):
        for target in (root / "textfile" / "m.prom", root / "not" / "yet" / "m.prom"):
            line = textfile_problem(target, own)
            assert line is not None and "is not a directory this user can write" in line and "fix:" in line
            assert "\n" not in line
    assert textfile_problem(root / "textfile" / "m.prom", own) is None


def test_unknown_numbers_are_nan_and_a_bad_path_never_raises(tmp_path: Path) -> None:
    """Before the first step the step time is NaN; an unwritable path is logged, not raised."""
    path = tmp_path / "m.prom"
    TextfileMetrics(path, "demo").write({"state": "PREFLIGHT_DISK", "disk": None}, {})
    assert math.isnan(_samples(path)[("shoprld_step_seconds", ())])
    (tmp_path / "file").write_text("")
    TextfileMetrics(tmp_path / "file" / "m.prom", "demo").write({}, {})


def test_extras_problem_only_when_configured() -> None:
    """No textfile, no requirement; with prometheus-client installed, none either."""
    assert extras_problem(None) is None and extras_problem(Path("/x.prom")) is None
