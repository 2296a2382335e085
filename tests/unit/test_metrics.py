"""The node_exporter textfile: written atomically, and parsed back by prometheus_client's parser."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from shoprld.daemon.core.metrics import TextfileMetrics, extras_problem


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "campaign")))] = s.value
    return out


def test_status_document_becomes_parseable_metrics(tmp_path: Path) -> None:
    """Every documented metric is present with the status document's numbers; no temp file is left."""
    doc = {"state": "TRAIN", "round": 2, "step": 7, "step_seconds": 1.5, "eta_seconds": 19.5,
           "disk": {"free_bytes": 123456}, "last_checkpoint": {"iteration": 47},
           "rounds_done": [{"round": 0, "val": 0.4}, {"round": 1, "val": 0.45}]}
    path = tmp_path / "textfile" / "shoprld.prom"
    TextfileMetrics(path, "demo").write(doc, {"restarts": 3, "stalls": 1})
    s = _samples(path)
    assert s[("shoprld_state", (("state", "TRAIN"),))] == 1 and s[("shoprld_state", (("state", "DONE"),))] == 0
    assert s[("shoprld_round", ())] == 2 and s[("shoprld_step", ())] == 7
    assert s[("shoprld_step_seconds", ())] == 1.5 and s[("shoprld_eta_seconds", ())] == 19.5
    assert s[("shoprld_disk_free_bytes", ())] == 123456 and s[("shoprld_last_checkpoint_iteration", ())] == 47
    assert s[("shoprld_restarts_total", ())] == 3 and s[("shoprld_stalls_total", ())] == 1
    assert s[("shoprld_round_metric", (("round", "1"),))] == 0.45
    assert [p.name for p in path.parent.iterdir()] == ["shoprld.prom"]


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
