"""On-disk formats of the stand-ins: safetensors, HF dirs, trackers, deterministic weights."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

import _common as c


def test_safetensors_header_round_trips(tmp_path: Path) -> None:
    """A written shard parses back: 8-byte LE length, JSON header padded to 8, offsets cover the data."""
    c.write_hf_dir(tmp_path, "digest", 4096, c.default_hf_config())
    shard = tmp_path / "model-00001-of-00002.safetensors"
    raw = shard.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    assert hlen % 8 == 0
    header = json.loads(raw[8:8 + hlen])
    assert header["__metadata__"] == {"format": "pt"}
    assert header == c.read_safetensors_header(shard)
    ends = sorted(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert 8 + hlen + ends[-1] == len(raw)


def test_index_covers_every_shard_and_tensor(tmp_path: Path) -> None:
    """The index names each tensor once, every shard it names exists, and total_size is the tensor bytes."""
    c.write_hf_dir(tmp_path, "digest", 256 << 10, c.default_hf_config())
    index = json.loads((tmp_path / c.HF_INDEX).read_text())
    shards = set(index["weight_map"].values())
    assert shards == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    total = 0
    for shard in shards:
        header = c.read_safetensors_header(tmp_path / shard)
        names = {n for n, s in index["weight_map"].items() if s == shard}
        assert names == set(header) - {"__metadata__"}
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    assert total == index["metadata"]["total_size"]
    assert c.validate_hf_dir(tmp_path)


def test_hf_dir_files_are_written_index_first(tmp_path: Path) -> None:
    """Index, then shards, then config.json: modification times never go backwards in that order."""
    c.write_hf_dir(tmp_path, "digest", 64 << 10, c.default_hf_config())
    order = [c.HF_INDEX, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"]
    times = [(tmp_path / n).stat().st_mtime_ns for n in order]
    assert times == sorted(times)


@pytest.mark.parametrize("damage", ["missing_shard", "truncated_shard", "bad_index", "index_names_absent_tensor"])
def test_validate_hf_dir_rejects_damage(tmp_path: Path, damage: str) -> None:
    """A missing or truncated shard, an unparseable index or an index naming absent tensors is refused."""
    c.write_hf_dir(tmp_path, "digest", 64 << 10, c.default_hf_config())
    shard = tmp_path / "model-00002-of-00002.safetensors"
    if damage == "missing_shard":
        shard.unlink()
    elif damage == "truncated_shard":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif damage == "bad_index":
        (tmp_path / c.HF_INDEX).write_text("{")
    else:
        index = json.loads((tmp_path / c.HF_INDEX).read_text())
        index["weight_map"]["model.extra.weight"] = shard.name
        (tmp_path / c.HF_INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError):
        c.validate_hf_dir(tmp_path)


def test_det_stream_depends_only_on_key() -> None:
    """The same key gives the same bytes at the exact length; another key gives other bytes."""
    a = b"".join(c.det_stream(b"k1", 200_000))
    assert len(a) == 200_000
    assert a == b"".join(c.det_stream(b"k1", 200_000))
    assert a != b"".join(c.det_stream(b"k2", 200_000))
    assert a[:65536] != a[65536:131072]  # blocks differ


@pytest.mark.parametrize("text,expected", [("20", 20), (" 20\n", 20), ("iter_20", 20), ("iter_0000020\n", 20), ("release", 0)])
def test_read_tracker_accepts_megatron_forms(tmp_path: Path, text: str, expected: int) -> None:
    """The tracker may hold N, iter_N (whitespace-tolerant) or release."""
    (tmp_path / c.TRACKER).write_text(text)
    assert c.read_tracker(tmp_path) == expected


def test_read_tracker_missing_and_garbage(tmp_path: Path) -> None:
    """No tracker reads as None; an unparseable one is a config error (exit code 2)."""
    assert c.read_tracker(tmp_path) is None
    (tmp_path / c.TRACKER).write_text("twenty")
    with pytest.raises(c.DemoError) as err:
        c.read_tracker(tmp_path)
    assert err.value.code == 2


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    """atomic_write_json replaces the target and leaves nothing else behind."""
    c.atomic_write_json(tmp_path / "x.json", {"b": 1, "a": 2})
    c.atomic_write_json(tmp_path / "x.json", {"a": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 3}
