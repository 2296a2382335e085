"""Reading the real tools' stdout (issue 14, blocker 2): `shopsimrl training check` prints
``json.dumps(payload, ensure_ascii=False, indent=2, default=str)``, possibly after other lines;
TRAIN takes the last complete top-level object, and a truncated or missing one is one line that
names the command and what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.tools.payload import ToolOutputError, last_json_object
from shoprld.states.train import CHECK, _output_of_last, check_verdict

# The real check's payload (contracts/shopsimrl-tools.md §3.2 and its appendix).
REAL = {"status": "ready", "scope": "offline_inputs_only", "round_id": "round-000",
        "curriculum_state_id": "9f" * 32, "skillbank_sha256": "ab" * 32, "active_chunks": 4,
        "training_tasks": 500, "skill_free_probability": 0.2, "episode_concurrency": 32}
REAL_TEXT = json.dumps(REAL, ensure_ascii=False, indent=2, default=str) + "\n"

# Lines a tool may print before its payload: progress, warnings, a Ray prefix, text with braces.
noise_line = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
            max_size=60),
    st.sampled_from(["[1/4] task-000001__sample-000 status=completed reward=1.0", "{not json", "{}x",
                     "  {\"nested\": true}", "UserWarning: something", "(pid=12) {\"a\": 1} trailing"]),
)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                        st.text(max_size=20))
payload = st.dictionaries(st.text(min_size=1, max_size=10), st.recursive(
    json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8), max_size=6).map(lambda d: {"status": "ready", **d})


def test_the_real_checks_indented_output_reads() -> None:
    """The exact bytes the real check prints give its payload; the old one-line reader saw nothing."""
    assert last_json_object(REAL_TEXT, source=CHECK) == REAL
    assert check_verdict(REAL_TEXT, 0) is None


@settings(max_examples=40, deadline=None)
@given(before=st.lists(noise_line, max_size=6), obj=payload, indent=st.sampled_from([None, 2, 4]),
       ascii_only=st.booleans())
def test_the_last_object_reads_after_any_lines(before: list[str], obj: dict, indent: int | None,
                                               ascii_only: bool) -> None:
    """Whatever lines come first, an object printed last (indented or not, unicode kept or escaped) reads back."""
    text = "".join(line + "\n" for line in before) + json.dumps(obj, ensure_ascii=ascii_only, indent=indent) + "\n"
    assert last_json_object(text, source=CHECK) == obj


@settings(max_examples=40, deadline=None)
@given(before=st.lists(noise_line, max_size=4), obj=payload, cut=st.integers(min_value=1))
def test_a_truncated_payload_is_one_line_naming_the_command(before: list[str], obj: dict, cut: int) -> None:
    """Output cut anywhere inside the payload is a one-line error naming the command and the missing brace."""
    body = json.dumps(obj, ensure_ascii=False, indent=2)
    cut = 1 + cut % (len(body) - 1)  # keep at least "{", drop at least the final "}"
    text = "".join(line + "\n" for line in before) + body[:cut]
    with pytest.raises(ToolOutputError) as info:
        last_json_object(text, source=CHECK)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(CHECK)
    assert "truncated" in msg and "closing brace" in msg
    assert check_verdict(text, 0) == ("retry", msg)


@settings(max_examples=40, deadline=None)
@given(before=st.lists(noise_line, max_size=6))
def test_no_payload_is_one_line(before: list[str]) -> None:
    """Output with no top-level object at all says so in one line naming the command."""
    text = "".join(line + "\n" for line in before if not line.startswith("{"))
    with pytest.raises(ToolOutputError) as info:
        last_json_object(text, source=CHECK)
    assert str(info.value).startswith(f"{CHECK}: printed no JSON object") and "\n" not in str(info.value)


def test_the_real_failure_is_its_exit_status_and_last_traceback_line() -> None:
    """The real check fails with a traceback and exit 1: the reason is the exception line, not a JSON error."""
    tb = ("Traceback (most recent call last):\n  File \"cli.py\", line 9, in main\n"
          "ValueError: skillbank sha256 does not match curriculum.source.skillbank_sha256\n")
    kind, msg = check_verdict(tb, 1)  # type: ignore[misc]
    assert kind == "fail" and msg == f"{CHECK} exited 1: ValueError: skillbank sha256 does not match " \
                                     "curriculum.source.skillbank_sha256"


@pytest.mark.parametrize(("text", "want"), [
    ('{\n  "scope": "offline_inputs_only"\n}\n', "has no 'status' key (keys: scope)"),
    ('{\n  "status": "error"\n}\n', "reported status 'error', not 'ready'"),
    ('[\n  "ready"\n]\n', "printed no JSON object"),
])
def test_valid_json_of_the_wrong_shape_fails_in_one_line(text: str, want: str) -> None:
    """A payload without status, with another status, or not an object: the stage fails naming what is wrong."""
    kind, msg = check_verdict(text, 0)  # type: ignore[misc]
    assert kind == "fail" and want in msg and msg.startswith(CHECK)


def test_only_the_last_check_launch_counts(tmp_path: Path) -> None:
    """An earlier attempt's ready payload in the same stage log is not this attempt's verdict."""
    log = tmp_path / "r000-train.log"
    log.write_text("=== shoprld 2026-12-01T00:00:00Z start check: python3 run_shopsimrl.py training check x\n"
                   + REAL_TEXT + "=== shoprld 2026-12-01T00:01:00Z start trainer: python3 train.py\n"
                   "=== shoprld 2026-12-01T00:02:00Z start check: python3 run_shopsimrl.py training check x\n"
                   "Traceback (most recent call last):\nKeyError: 'chunks'\n")
    out = _output_of_last(log, "check")
    assert out.startswith("Traceback") and check_verdict(out, 1) == ("fail", f"{CHECK} exited 1: KeyError: 'chunks'")
