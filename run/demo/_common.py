"""Shared pure helpers of the demo stand-ins (stdlib only, imported by each script).

Nothing here talks to a network or starts a process, except `http_json`, the small
client the stand-ins use to call each other, and `ShopClient`, the ShopSim episode client of
the trainer, val and gate stand-ins. Contents:

- crash-consistent writes: `write_fsync`, `atomic_write_bytes`, `atomic_write_json`;
- canonical JSON and `fingerprint` (sha256 of canonical JSON), for reproducible files;
- deterministic "weights": `det_stream` yields bytes that depend only on a key, so a
  checkpoint's bytes depend only on (iteration, seed) whatever crash/resume path led there;
- the Megatron-layout checkpoint reader (`read_tracker`, `load_checkpoint`);
- a real safetensors writer/reader and the HF-dir layout shared by `slime_train.py
  --save-hf` and `convert_torch_dist_to_hf.py` (same bytes from the same checkpoint);
- `validate_hf_dir`, which the val server runs before serving or swapping weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

TRACKER = "latest_checkpointed_iteration.txt"
METADATA_JSON = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}
HF_INDEX = "model.safetensors.index.json"
HF_SHARDS = 2
HF_HIDDEN = 64  # columns of every 2-D demo tensor
DEFAULT_SEED = 1234  # slime's --seed default


class DemoError(Exception):
    """An operator-facing failure: the script prints `<prog>: <message>` and exits."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DemoError(f"{name}={raw!r} is not an integer", 2) from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise DemoError(f"{name}={raw!r} is not a number", 2) from None


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def run_main(prog: str, main: Any) -> None:
    """Run `main()`, turning every failure into one stderr line and an exit code."""
    try:
        code = main()
    except DemoError as exc:
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        code = exc.code
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = 1
    except Exception as exc:  # the contract is one line, never a traceback
        print(f"{prog}: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    sys.exit(code or 0)


# ---------------------------------------------------------------- files

def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_fsync(path: str | os.PathLike[str], data: bytes | Iterator[bytes]) -> None:
    """Plain (non-atomic) write, then fsync: how Megatron and HF writers write."""
    with open(path, "wb") as f:
        if isinstance(data, (bytes, bytearray)):
            f.write(data)
        else:
            for chunk in data:
                f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Temp file in the same dir, fsync, os.replace, fsync the dir."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp.{os.getpid()}")
    write_fsync(tmp, data)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, canonical_json(obj).encode("utf-8"))


def fingerprint(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from its parts."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64)


def read_json(path: str | os.PathLike[str], what: str = "file") -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DemoError(f"{what} not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DemoError(f"{what} is not valid JSON/YAML-as-JSON: {path}: {exc}") from None


# ---------------------------------------------------------------- deterministic weights

_BLOCK = 1 << 16


def det_stream(key: bytes, nbytes: int) -> Iterator[bytes]:
    """`nbytes` deterministic bytes from `key`, in 64 KiB chunks.

    A 64 KiB pattern comes from sha256 in counter mode; each block starts with its own
    sha256(key, block index), so blocks differ. Cheap enough for gigabyte checkpoints.
    """
    pattern = b"".join(
        hashlib.sha256(key + b"/p/" + i.to_bytes(4, "big")).digest() for i in range(_BLOCK // 32)
    )
    block = 0
    left = nbytes
    while left > 0:
        head = hashlib.sha256(key + b"/b/" + block.to_bytes(8, "big")).digest()
        chunk = (head + pattern[32:])[: min(left, _BLOCK)]
        yield chunk
        left -= len(chunk)
        block += 1


def distcp_key(iteration: int, seed: int, rank: int) -> bytes:
    return f"shoprld-demo-weights:iter={iteration}:seed={seed}:rank={rank}".encode()


# ---------------------------------------------------------------- Megatron checkpoints

def iter_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def read_tracker(load_dir: str | os.PathLike[str]) -> int | None:
    """The tracker's iteration: None when absent. Accepts `N`, `iter_N`, `release` (0)."""
    path = Path(load_dir) / TRACKER
    try:
        raw = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if raw == "release":
        return 0
    match = re.fullmatch(r"(?:iter_)?(\d+)", raw)
    if not match:
        raise DemoError(f"unparseable tracker {path}: {raw!r} (want N or iter_N)", 2)
    return int(match.group(1))


def load_checkpoint(iter_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a demo torch_dist checkpoint and return its common state plus weights digest.

    Complete means: metadata.json parses, .metadata and common.pt parse, and each
    distcp shard has the size and sha256 that .metadata records.
    """
    d = Path(iter_dir)
    if not d.is_dir():
        raise DemoError(f"checkpoint dir not found: {d}")
    for name in ("metadata.json", ".metadata", "common.pt"):
        if not (d / name).is_file():
            raise DemoError(f"incomplete checkpoint {d}: {name} is missing")
    meta = read_json(d / "metadata.json", "metadata.json")
    if meta.get("sharded_backend") != "torch_dist":
        raise DemoError(f"{d}/metadata.json: sharded_backend is not torch_dist")
    dcp = read_json(d / ".metadata", ".metadata")
    common = read_json(d / "common.pt", "common.pt")
    digest = hashlib.sha256()
    for name, info in sorted(dcp.get("shards", {}).items()):
        path = d / name
        if not path.is_file() or path.stat().st_size != info["size"]:
            raise DemoError(f"incomplete checkpoint {d}: {name} is missing or truncated")
        shard_hash = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                shard_hash.update(chunk)
        if shard_hash.hexdigest() != info["sha256"]:
            raise DemoError(f"corrupt checkpoint {d}: {name} does not match .metadata")
        digest.update(name.encode() + b"\0" + shard_hash.digest())
    return {"common": common, "weights_digest": digest.hexdigest()}


# ---------------------------------------------------------------- safetensors / HF dir

DTYPE_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8}


def safetensors_header(tensors: list[tuple[str, str, list[int]]]) -> tuple[bytes, list[tuple[int, int]]]:
    """Header bytes (8-byte LE length + JSON padded to 8) and each tensor's data offsets."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offsets = []
    pos = 0
    for name, dtype, shape in tensors:
        size = DTYPE_SIZES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + size]}
        offsets.append((pos, pos + size))
        pos += size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob, offsets


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and check a safetensors header; raise ValueError naming what is wrong."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: shorter than the 8-byte header length")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > size - 8 or hlen > 100 << 20:
            raise ValueError(f"{path}: header length {hlen} exceeds the file")
        header = json.loads(f.read(hlen).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, stop = info["data_offsets"]
        expect = DTYPE_SIZES[info["dtype"]]
        for dim in info["shape"]:
            expect *= dim
        if stop - begin != expect or begin < 0:
            raise ValueError(f"{path}: tensor {name} offsets do not match its shape")
        end = max(end, stop)
    if 8 + hlen + end != size:
        raise ValueError(f"{path}: file size {size} != header+data {8 + hlen + end}")
    return header


def hf_tensor_plan(hf_bytes: int) -> list[tuple[str, str, list[int]]]:
    """A small Qwen-like tensor list whose total size is about `hf_bytes`."""
    names = ["model.embed_tokens.weight"]
    for layer in range(2):
        p = f"model.layers.{layer}"
        names += [f"{p}.self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [f"{p}.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    names.append("lm_head.weight")
    rows = max(1, hf_bytes // (len(names) * HF_HIDDEN * 2))
    plan = [(n, "BF16", [rows, HF_HIDDEN]) for n in names]
    plan.insert(-1, ("model.norm.weight", "BF16", [HF_HIDDEN]))
    return plan


def default_hf_config() -> bytes:
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": HF_HIDDEN,
        "num_hidden_layers": 2,
        "torch_dtype": "bfloat16",
        "shoprld_demo_stand_in": True,
    }
    return canonical_json(config).encode("utf-8")


def hf_config_from(origin: str | os.PathLike[str] | None) -> bytes:
    if origin and (Path(origin) / "config.json").is_file():
        return (Path(origin) / "config.json").read_bytes()
    return default_hf_config()


def write_hf_dir(out: str | os.PathLike[str], weights_digest: str, hf_bytes: int, config: bytes) -> None:
    """Write an HF safetensors dir in place, in the converter's order.

    The index first, then the shards, then config.json; every file fsynced. Tensor
    bytes depend only on the checkpoint's weights digest, so `--save-hf` and the
    converter produce identical files for the same iteration.
    """
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    plan = hf_tensor_plan(hf_bytes)
    per = -(-len(plan) // HF_SHARDS)
    shards = [plan[i * per:(i + 1) * per] for i in range(HF_SHARDS)]
    files = [f"model-{i + 1:05d}-of-{HF_SHARDS:05d}.safetensors" for i in range(HF_SHARDS)]
    weight_map = {name: files[i] for i, shard in enumerate(shards) for name, _, _ in shard}
    total = 0
    for shard in shards:
        _, offsets = safetensors_header(shard)
        total += offsets[-1][1] if offsets else 0
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_fsync(d / HF_INDEX, canonical_json(index).encode("utf-8"))
    for file, shard in zip(files, shards):
        header, offsets = safetensors_header(shard)

        def body(header: bytes = header, shard: list[tuple[str, str, list[int]]] = shard,
                 offsets: list[tuple[int, int]] = offsets) -> Iterator[bytes]:
            yield header
            for (name, _, _), (begin, stop) in zip(shard, offsets):
                key = f"hf:{weights_digest}:{name}".encode()
                yield from det_stream(key, stop - begin)

        write_fsync(d / file, body())
    write_fsync(d / "config.json", config)
    fsync_dir(d)


def validate_hf_dir(path: str | os.PathLike[str]) -> str:
    """Check an HF dir (index covers the shards, headers parse); return its fingerprint.

    The fingerprint is sha256 over the shard files' names and bytes, in name order.
    """
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"model path is not a directory: {d}")
    try:
        index = json.loads((d / HF_INDEX).read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        total = int(index["metadata"]["total_size"])
    except FileNotFoundError:
        raise ValueError(f"{d}: {HF_INDEX} is missing") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{d}/{HF_INDEX} does not parse: {exc}") from None
    if not (d / "config.json").is_file():
        raise ValueError(f"{d}: config.json is missing")
    seen = 0
    digest = hashlib.sha256()
    for shard in sorted(set(weight_map.values())):
        file = d / shard
        if not file.is_file():
            raise ValueError(f"{d}: shard {shard} named by the index is missing")
        try:
            header = read_safetensors_header(file)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{file}: bad safetensors header: {exc}") from None
        wanted = {n for n, s in weight_map.items() if s == shard}
        missing = wanted - set(header)
        if missing:
            raise ValueError(f"{file}: lacks tensors {sorted(missing)[:3]}")
        for name, info in header.items():
            if name != "__metadata__":
                seen += info["data_offsets"][1] - info["data_offsets"][0]
        digest.update(shard.encode() + b"\0")
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    if seen != total:
        raise ValueError(f"{d}: index total_size {total} != tensor bytes {seen}")
    return digest.hexdigest()


# ---------------------------------------------------------------- HTTP

def send_reply(handler: Any, status: int, body: Any) -> None:
    """One reply from a stdlib ``BaseHTTPRequestHandler``: JSON, or text/plain for a str.

    A client that went away (a caller that gave up waiting) is not an error of the server.
    """
    if isinstance(body, str):
        data, ctype = body.encode("utf-8"), "text/plain"
    else:
        data, ctype = json.dumps(body).encode("utf-8"), "application/json"
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:
        pass


def http_json(method: str, url: str, payload: Any = None, timeout: float = 30.0,
              headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One JSON request; returns (status, decoded body or None). Raises OSError when unreachable."""
    import urllib.error  # imported here: it costs ~0.1 s, and most subcommands never call out
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never use env proxies
    data = None if payload is None else json.dumps(payload).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with opener.open(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    try:
        return status, json.loads(body) if body else None
    except json.JSONDecodeError:
        return status, None


# ---------------------------------------------------------------- ShopSim episodes (trainer, val, gate)

class ShopError(RuntimeError):
    """A ShopSim answer that is not a result: HTTP status (None: no answer) and its error."""

    def __init__(self, action: str, status: int | None, error: Any):
        super().__init__(f"ShopSim {action} -> HTTP {status}: {error}")
        self.action, self.status, self.error = action, status, error


def numeric_components(detail: Any) -> dict[str, float]:
    """The numeric entries of a `reward_detail` (ints and floats, not bools).

    The real detail also holds strings, booleans, None and a dict (`price_resolution`):
    those are skipped, never passed to float().
    """
    if not isinstance(detail, dict):
        return {}
    return {k: float(v) for k, v in detail.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v}


class ShopClient:
    """The HTTP client of the ShopSim API, as the real runtime uses it (reset -> interact* ->
    terminate unless done -> release_one once).

    Per the contract (`../shared/contracts/README.md`): every answer is `{"result": ...}`; an
    error is `{"result": {"error"}}`, even with HTTP 200 ("No JSON data provided"); 409 means
    the lease is stale (released, or `release_all` ran), so the episode is lost; a 409 on the
    final `release_one` means the slot is not ours any more and is not an error.
    """

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def call(self, payload: dict[str, Any]) -> dict[str, Any]:
        action = str(payload.get("action"))
        try:
            status, body = http_json("POST", self.url + "/api/shop_agent", payload, timeout=self.timeout)
        except OSError as exc:
            raise ShopError(action, None, f"unreachable at {self.url} ({exc})") from None
        result = body.get("result") if isinstance(body, dict) else None
        if status != 200 or not isinstance(result, dict) or "error" in result:
            raise ShopError(action, status, result.get("error") if isinstance(result, dict) else body)
        return result

    def health(self) -> dict[str, Any]:
        try:
            status, body = http_json("GET", self.url + "/healthz", timeout=self.timeout)
        except OSError as exc:
            raise ShopError("healthz", None, f"unreachable at {self.url} ({exc})") from None
        if status != 200 or not isinstance(body, dict):
            raise ShopError("healthz", status, body)
        return body

    def task_ids(self) -> list[int]:
        """The service's task ids: 0 .. `/healthz` `tasks` - 1 (the real catalog numbers its tasks so)."""
        tasks = self.health().get("tasks")
        if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
            raise ShopError("healthz", 200, f"no usable 'tasks' count in /healthz ({tasks!r})")
        return list(range(tasks))

    def release(self, slot: int, lease_id: str) -> bool:
        """release_one, once. False when the lease was already stale (409)."""
        try:
            self.call({"action": "release_one", "env_idx": slot, "lease_id": lease_id})
        except ShopError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def play(self, task_id: int, key: str, skill: float, max_actions: int = 12,
             on_reset: Callable[[dict[str, Any]], tuple[str, float]] | None = None,
             think: Callable[[], None] | None = None) -> dict[str, Any]:
        """One episode of task `task_id` with the scripted `policy_action`; returns the final answer's
        `done`, `reward`, `reward_detail`, `termination_reason` and the actions played.

        `on_reset(reset answer)` may replace (key, skill), e.g. from a model's generation.
        `think()` runs before each action: the model's generation of it (the trainer stand-in's
        engine, which takes its time and counts its tokens).
        """
        lease = self.call({"action": "reset", "idx": task_id})
        slot, lease_id = lease["env_idx"], lease["lease_id"]
        instruction = str(lease.get("task_instruction", ""))
        state = lease.get("observation_state") or {}
        played: list[str] = []
        final: dict[str, Any] | None = None
        try:
            if on_reset is not None:
                key, skill = on_reset(lease)
            for step in range(max_actions):
                action = policy_action(instruction, state, key, step, skill)
                if action is None:
                    break
                played.append(action)
                if think is not None:
                    think()
                answer = self.call({"action": "interact", "env_idx": slot, "lease_id": lease_id,
                                    "response": f"Action: {action}"})
                state = answer.get("observation_state") or {}
                if answer.get("done"):
                    final = answer
                    break
            if final is None:
                final = self.call({"action": "terminate", "env_idx": slot, "lease_id": lease_id,
                                   "termination_reason": "action_limit"})
        finally:
            self.release(slot, lease_id)
        reward = final.get("reward")
        return {"done": bool(final.get("done")),
                "reward": float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else 0.0,
                "reward_detail": final.get("reward_detail") if isinstance(final.get("reward_detail"), dict) else {},
                "termination_reason": final.get("termination_reason"), "actions": played}


def policy_action(instruction: str, state: dict[str, Any], key: str, step: int, skill: float) -> str | None:
    """A scripted shopper: search the instruction, open a result, choose every option, buy.

    `skill` in [0, 1] is how often it takes the best-looking choice (the first result, an option
    value named in the instruction); the other choices are deterministic in (`key`, `step`).
    None means give up (the caller terminates the episode).
    """
    page = state.get("page_type")
    roll = unit("policy", key, step)
    if page == "search_home":
        query = " ".join(re.findall(r"[\u4e00-\u9fff]+|[A-Za-z0-9]+", instruction)[:6]) or "商品"
        return f"search[{query}]"
    if page == "search_results":
        asins = [a for a in state.get("actions") or [] if a not in ("back to search", "< prev", "next >")]
        if not asins:
            return None
        pick = 0 if roll < skill else int(unit("pick", key, step) * len(asins))
        return f"click[{asins[pick]}]"
    if page == "product_detail":
        missing = state.get("missing_option_axes") or []
        if not missing:
            return "click[buy now]"
        axis = missing[0]
        values = (state.get("available_options") or {}).get(axis) or []
        if not values:
            return None
        named = [v for v in values if v in instruction]
        value = named[0] if named and roll < skill else values[int(unit("option", key, step) * len(values))]
        return f"click[{axis}={value}]"
    return None


# ---------------------------------------------------------------- the tools' block YAML
# One reader for the stand-ins (shopsimrl.py, slime_train.py): what the real tools read with PyYAML.

def parse_scalar(t: str) -> Any:
    t = t.strip()
    if t in ("", "null", "~", "Null", "NULL"):
        return None
    if t in ("true", "True"):
        return True
    if t in ("false", "False"):
        return False
    if t == "{}":
        return {}
    if t == "[]":
        return []
    if t.startswith('"'):
        return json.loads(t)
    if t.startswith("'") and t.endswith("'") and len(t) >= 2:
        return t[1:-1].replace("''", "'")
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def parse_yaml(text: str) -> dict[str, Any]:
    """The block YAML the emitters write (nested mappings, scalars, lists of scalars)."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, Any]] = [(-1, root)]
    last_key: tuple[dict[str, Any], str] | None = None
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#") or raw.strip() == "---":
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        if line.startswith("- "):
            if last_key is None:
                raise ValueError(f"a list item with no key: {raw!r}")
            d, k = last_key
            if not isinstance(d[k], list):
                d[k] = []
            d[k].append(parse_scalar(line[2:]))
            continue
        while stack and indent <= stack[-1][0]:
            stack.pop()
        key, sep, rest = line.partition(":")
        if not sep:
            raise ValueError(f"not a mapping line: {raw!r}")
        parent = stack[-1][1]
        key = key.strip().strip('"')
        if rest.strip():
            parent[key] = parse_scalar(rest)
        else:
            parent[key] = {}
            stack.append((indent, parent[key]))
        last_key = (parent, key)
    return root


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A tool config (the emitted YAMLs): block YAML (PyYAML when installed), or JSON."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        import yaml  # the real tools read these with PyYAML
    except ImportError:
        data: Any = json.loads(text) if text.lstrip().startswith("{") else parse_yaml(text)
    else:
        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a mapping")
    return data
