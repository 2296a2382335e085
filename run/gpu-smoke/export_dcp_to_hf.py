#!/usr/bin/env python3
"""EXPORT_HF converter for the GPU smoke: a Megatron torch_dist checkpoint -> HF safetensors dir.

    python run/gpu-smoke/export_dcp_to_hf.py --input-dir <save>/iter_N --output-dir OUT \\
        [--origin-hf-dir ORIG] [--dtype bf16|fp32] [--max-shard-size 512MiB] [-f]

Reads the checkpoint through torch DCP on CPU (``FileSystemReader`` + ``dcp.load(no_dist=True)``),
single process, no GPU, like slime's ``tools/convert_torch_dist_to_hf.py``: only the model's
tensors (``optimizer.*`` is skipped), layer-stacked tensors (``decoder.layers.*``, shape
``[num_layers, ...]``) split per layer. Writes, in slime's order, each file fsynced:
``model.safetensors.index.json`` FIRST, then ``model-0000i-of-0000N.safetensors``, then
``config.json`` (the model's own shape, read from the checkpoint's common state, over ORIG's
config.json when there is one) and ORIG's ``tokenizer*`` files. Refuses an existing OUT without
``-f``. Exit: 0 done; 1 an unreadable or partial checkpoint, or OUT exists; 2 usage.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

PROG = "export_dcp_to_hf"
INDEX = "model.safetensors.index.json"


def die(msg: str, code: int = 1) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def parse_size(text: str) -> int:
    units = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
    t = text.strip().lower()
    num = t.rstrip("kmgib")
    unit = t[len(num):]
    if unit not in units or not num:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(float(num) * units[unit])


def hf_name(key: str, layer: int | None) -> str:
    """Megatron GPTModel key -> an HF-style name (per-layer for the stacked decoder tensors)."""
    if layer is not None:
        return "model.layers.%d.%s" % (layer, key[len("decoder.layers."):])
    fixed = {
        "embedding.word_embeddings.weight": "model.embed_tokens.weight",
        "embedding.position_embeddings.weight": "model.embed_positions.weight",
        "output_layer.weight": "lm_head.weight",
    }
    if key in fixed:
        return fixed[key]
    if key.startswith("decoder.final_layernorm."):
        return "model.norm." + key[len("decoder.final_layernorm."):]
    return "model." + key


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_fsync(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--input-dir", required=True, help="<save>/iter_N")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--origin-hf-dir", default="", help="config.json and tokenizer files to carry over")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--max-shard-size", type=parse_size, default=parse_size("512MiB"))
    p.add_argument("--vocab-size", type=int, default=None, help="accepted (slime's flag); unused")
    p.add_argument("-f", "--force", action="store_true", help="overwrite OUT")
    args = p.parse_args(argv)
    t0 = time.time()

    src, out = Path(args.input_dir), Path(args.output_dir)
    if not src.is_dir():
        die(f"checkpoint dir not found: {src}")
    for name in (".metadata", "metadata.json"):
        if not (src / name).is_file():
            die(f"partial checkpoint {src}: {name} is missing (a torn or in-progress save)")
    try:
        backend = json.loads((src / "metadata.json").read_text()).get("sharded_backend")
    except (OSError, ValueError, AttributeError) as exc:
        die(f"{src}/metadata.json: unreadable ({exc})")
    if backend != "torch_dist":
        die(f"{src}/metadata.json: sharded_backend is {backend!r}, not torch_dist")
    if out.exists():
        if not args.force:
            die(f"{out} exists; pass -f to overwrite")
        shutil.rmtree(out)

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    reader = dcp.FileSystemReader(str(src))
    try:
        meta = reader.read_metadata()
    except Exception as exc:  # noqa: BLE001 - any reader failure is a bad checkpoint
        die(f"{src}/.metadata: unreadable ({type(exc).__name__}: {exc})")
    keys = {k: v for k, v in meta.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata) and not k.startswith("optimizer.")}
    if not keys:
        die(f"{src}: no model tensors in .metadata")

    # The common state (megatron-core >= 0.1x keeps it inside DCP as ShardedObject 'common_state').
    common: dict[str, Any] = {}
    ckey = next((k for k, v in meta.state_dict_metadata.items()
                 if k.startswith("common_state") and isinstance(v, BytesStorageMetadata)), None)
    try:
        if ckey is not None:
            buf: dict[str, Any] = {ckey: io.BytesIO()}
            dcp.load(buf, storage_reader=dcp.FileSystemReader(str(src)), no_dist=True)
            raw = buf[ckey]
            if isinstance(raw, io.BytesIO):
                raw.seek(0)
                raw = torch.load(raw, weights_only=True)
            if isinstance(raw, list) and raw:  # megatron-core saves it wrapped in a list
                raw = raw[0]
            common = raw if isinstance(raw, dict) else {}
        elif (src / "common.pt").is_file():  # the legacy layout
            common = torch.load(src / "common.pt", weights_only=False)
    except Exception as exc:  # noqa: BLE001
        print(f"{PROG}: warning: common state unreadable ({type(exc).__name__}: {exc})", file=sys.stderr)

    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in keys.items()}
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(src)), no_dist=True)
    except Exception as exc:  # noqa: BLE001 - a missing or short shard
        die(f"{src}: cannot read the model tensors ({type(exc).__name__}: {str(exc).splitlines()[0][:300]})")
    t_read = time.time() - t0

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    tensors: list[tuple[str, Any]] = []
    num_layers = 0
    for key in sorted(state):
        t = state[key]
        if key.startswith("decoder.layers."):
            num_layers = max(num_layers, t.shape[0])
            for i in range(t.shape[0]):
                tensors.append((hf_name(key, i), t[i].to(dtype).contiguous()))
        else:
            tensors.append((hf_name(key, None), t.to(dtype).contiguous()))
    tensors.sort(key=lambda nt: nt[0])

    shards: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > args.max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append((name, t))
        size += nbytes
    n = len(shards)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    total = sum(t.numel() * t.element_size() for _, t in tensors)

    from safetensors.torch import save_file

    out.mkdir(parents=True)
    index = {"metadata": {"total_size": total},
             "weight_map": {name: files[i] for i, shard in enumerate(shards) for name, _ in shard}}
    write_fsync(out / INDEX, json.dumps(index, indent=2, sort_keys=True).encode())  # the index FIRST
    for file, shard in zip(files, shards):
        save_file(dict(shard), str(out / file), metadata={"format": "pt"})
        fsync_file(out / file)

    margs = common.get("args") if isinstance(common.get("args"), dict) else {}
    config: dict[str, Any] = {}
    origin = Path(args.origin_hf_dir) if args.origin_hf_dir else None
    if origin is not None and (origin / "config.json").is_file():
        try:
            config = json.loads((origin / "config.json").read_text())
        except ValueError:
            config = {}
    embed = state.get("embedding.word_embeddings.weight")
    config.update({
        "architectures": ["MegatronGPTSmokeForCausalLM"],
        "model_type": "megatron-gpt-smoke",
        "hidden_size": int(embed.shape[1]) if embed is not None else margs.get("hidden_size"),
        "num_hidden_layers": num_layers,
        "num_attention_heads": margs.get("num_attention_heads"),
        "vocab_size": int(embed.shape[0]) if embed is not None else margs.get("vocab_size"),
        "max_position_embeddings": margs.get("seq_length"),
        "torch_dtype": "bfloat16" if args.dtype == "bf16" else "float32",
        "megatron_iteration": common.get("iteration"),
        "megatron_checkpoint": str(src),
    })
    write_fsync(out / "config.json", json.dumps(config, indent=2, sort_keys=True).encode())
    if origin is not None and origin.is_dir():
        for f in sorted(origin.glob("tokenizer*")):
            if f.is_file():
                shutil.copyfile(f, out / f.name)
                fsync_file(out / f.name)
    dfd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    print(f"{PROG}: {src} (iteration {common.get('iteration')}) -> {out}: {len(tensors)} tensors, {n} shards, "
          f"{total} bytes {args.dtype}; read {t_read:.2f} s, total {time.time() - t0:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
