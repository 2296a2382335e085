"""The relaunch record (daemon/round/relaunch.py): a tool is reused only for the same bytes in
and out (issue 30, item 3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoprld.daemon.round import relaunch


def _tree(d: Path, data: bytes) -> tuple[list[str], Path, Path]:
    inp, out = d / "curriculum.json", d / "slime.yaml"
    inp.write_bytes(data)
    out.write_bytes(b"rollout: 1\n")
    return ["python3", "/nonexistent/emit.py", "--curriculum", str(inp), "--round-id", "round-000"], inp, out


@settings(max_examples=100)
@given(data=st.binary(min_size=1, max_size=256), at=st.integers(0, 255), flip=st.integers(1, 255))
def test_any_changed_input_byte_runs_the_tool_again(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                                                    at: int, flip: int) -> None:
    d = tmp_path_factory.mktemp("t")
    argv, inp, out = _tree(d, data)
    fp = relaunch.fingerprint(argv, {"A": "1"}, relaunch.named_files(argv))
    rec = d / "rec.json"
    relaunch.remember(rec, fp=fp or "", seconds=1.5, outputs=relaunch.outputs_digest([out]))
    assert relaunch.reusable(rec, relaunch.fingerprint(argv, {"A": "1"}, relaunch.named_files(argv)))
    changed = bytearray(data)
    changed[at % len(data)] ^= flip
    inp.write_bytes(bytes(changed))
    assert relaunch.reusable(rec, relaunch.fingerprint(argv, {"A": "1"}, relaunch.named_files(argv))) is None


def test_a_changed_argv_env_output_or_a_missing_file_runs_it_again(tmp_path: Path) -> None:
    argv, inp, out = _tree(tmp_path, b"{}")
    fp = relaunch.fingerprint(argv, {}, relaunch.named_files(argv))
    assert fp is not None and relaunch.named_files(argv) == [inp]  # the missing script is not a file
    rec = relaunch.record_path(tmp_path, "round-000", "emit")
    relaunch.remember(rec, fp=fp, seconds=2.0, outputs=relaunch.outputs_digest([out]))
    assert (relaunch.reusable(rec, fp) or {}).get("seconds") == 2.0
    assert relaunch.fingerprint([*argv[:-1], "round-001"], {}, [inp]) != fp
    assert relaunch.fingerprint(argv, {"DEMO": "1"}, [inp]) != fp
    assert relaunch.fingerprint(argv, {}, [inp, tmp_path / "gone"]) is None  # unreadable: never reused
    assert relaunch.reusable(rec, None) is None
    out.write_bytes(b"rollout: 2\n")  # an output edited by hand
    assert relaunch.reusable(rec, fp) is None
    out.write_bytes(b"rollout: 1\n")
    assert relaunch.reusable(rec, fp) is not None
    out.unlink()
    assert relaunch.reusable(rec, fp) is None
    relaunch.forget(rec)
    relaunch.forget(rec)  # twice is fine
    assert relaunch.reusable(rec, fp) is None


def test_the_record_holds_hashes_and_seconds_only(tmp_path: Path) -> None:
    secret = "sk-live-0123456789abcdef"
    argv = ["python3", "tool.py", "--key", secret]
    fp = relaunch.fingerprint(argv, {"TOKEN": secret}, [])
    rec = tmp_path / "r.json"
    relaunch.remember(rec, fp=fp or "", seconds=0.5)
    assert secret not in rec.read_text()


def _opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files file_digest reads (its module's ``open``)."""
    seen: list[str] = []

    def counting(path: Path, *a: object, **k: object) -> object:
        seen.append(str(path))
        return open(path, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(relaunch, "open", counting, raising=False)
    return seen


def test_a_settled_files_digest_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter an argv names is hashed once per daemon, not before every emit."""
    f = tmp_path / "interp"
    f.write_bytes(b"x" * 100_000)
    monkeypatch.setattr(relaunch, "RACY_S", 0.0)  # its ctime is now and cannot be set back
    opens = _opens(monkeypatch)
    first = relaunch.file_digest(f)
    assert relaunch.file_digest(f) == first and opens == [str(f)]
    f.write_bytes(b"y" * 100_000)  # same size, new bytes; its mtime moved past any coarse tick
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert relaunch.file_digest(f) != first and len(opens) == 2


def test_a_just_written_file_is_hashed_every_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Racy clean: within RACY_S of its last change a write in the same timestamp tick could
    keep its stamps, so its digest is not remembered."""
    f = tmp_path / "fresh"
    f.write_bytes(b"a" * 10)
    opens = _opens(monkeypatch)
    relaunch.file_digest(f)
    relaunch.file_digest(f)
    assert opens == [str(f), str(f)]
