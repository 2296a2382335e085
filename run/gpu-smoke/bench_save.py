#!/usr/bin/env python3
"""How long a Megatron ``torch_dist`` save blocks training, sync and async (issue 30, item 2).

    torchrun --standalone --nproc-per-node 1 run/gpu-smoke/bench_save.py --out results.jsonl \\
        [--dir /tmp/bsave] [--layers-list auto] [--hidden 4096]

What is real: megatron-core's ``GPTModel`` (local spec), its ``DistributedDataParallel`` and
``get_megatron_optimizer`` (Adam, fp32 states, one real step so the states exist), and
``megatron.core.dist_checkpointing.save`` with the ``torch_dist`` backend, the format slime's
Megatron saves. For each model size (two sizes, so a line through the points scales by bytes):

- **sync**: ``dist_checkpointing.save(...)`` then the tracker, as Megatron's synchronous
  ``save_checkpoint`` does: the whole time blocks training;
- **async**: ``dist_checkpointing.save(..., async_sharded_save=True, async_strategy="mcore")``,
  then ``AsyncCallsQueue(persistent=True).schedule_async_request`` (what Megatron's
  ``schedule_async_save`` does with ``--use-persistent-ckpt-worker``): the time until that returns
  is the **blocking** part (planning, the device-to-host copy of every tensor, the hand-off to the
  persistent worker); then training would go on. ``maybe_finalize_async_calls(blocking=True)``
  (what slime's ``save_model`` calls at the start of the NEXT save, or at a forced-sync one) waits
  for the worker's writes and runs the finalize functions (``metadata.json``, then the tracker):
  the **full** time. A GPU matmul loop runs between schedule and finalize, to show that training
  goes on meanwhile (its step time is reported against the same loop with no save running).

``nvidia-resiliency-ext`` (Megatron's default ``async_strategy="nvrx"``) is not installed on the
device: megatron-core's own ``mcore`` strategy is used, the one Megatron falls back to.

One JSON object per line: the machine, then one per (size, mode).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dir", default="/tmp/bsave")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--layers-list", default="auto", help="comma-separated layer counts, or auto (from free disk/RAM/GPU)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model_parallel_cuda_manual_seed(1234)
    out = open(args.out, "a")

    def emit(obj: dict[str, Any]) -> None:
        line = json.dumps(obj)
        print(line, flush=True)
        out.write(line + "\n")
        out.flush()

    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(root)
    mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu_total = torch.cuda.get_device_properties(0).total_memory
    h, v = args.hidden, args.vocab
    per_layer = 12 * h * h + 13 * h  # attention qkv+proj, mlp 4h, norms, biases
    fixed = 2 * v * h                # untied embedding + output layer
    # Checkpoint ~12 bytes/param (fp32 weights + 2 fp32 Adam states); on the GPU ~16 (+ fp32 grads).
    ck_budget = min(0.40 * disk.free, 0.30 * mem_total, 0.70 * gpu_total * 12 / 16)
    max_layers = max(2, int((ck_budget / 12 - fixed) // per_layer))
    layers_list = ([max(1, max_layers // 4), max_layers] if args.layers_list == "auto"
                   else [int(x) for x in args.layers_list.split(",")])
    emit({"kind": "machine", "gpu": torch.cuda.get_device_name(0), "gpu_total_gib": round(gpu_total / 2**30, 1),
          "host_mem_gib": round(mem_total / 2**30, 1), "disk_free_gib": round(disk.free / 2**30, 1),
          "dir": str(root), "torch": torch.__version__,
          "megatron_core": __import__("importlib.metadata").metadata.version("megatron-core"),
          "cpus": os.cpu_count(), "layers_list": layers_list, "hidden": h, "vocab": v})

    def busy_step(x: torch.Tensor) -> float:
        t0 = time.perf_counter()
        for _ in range(20):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for layers in layers_list:
        torch.cuda.empty_cache()
        config = TransformerConfig(num_layers=layers, hidden_size=h, num_attention_heads=args.heads,
                                   tensor_model_parallel_size=1, pipeline_dtype=torch.float32,
                                   params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0)
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=v,
                         max_sequence_length=256).cuda()
        ddp = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False), module=model)
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-5, bf16=False, fp16=False,
                                                     params_dtype=torch.float32, use_distributed_optimizer=False), [ddp])
        n_params = sum(p.numel() for p in model.parameters())
        tokens = torch.randint(0, v, (1, 257), device="cuda")
        pos = torch.arange(256, device="cuda").unsqueeze(0)
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(tokens[:, :-1], pos, None, labels=tokens[:, 1:]).float().mean().backward()
        ddp.finish_grad_sync()
        opt.step()  # the Adam states now exist and are saved
        torch.cuda.synchronize()

        def sd(it: int) -> dict[str, Any]:
            msd = model.sharded_state_dict(prefix="")
            return {"model": msd, "optimizer": opt.sharded_state_dict(msd), "iteration": it, "checkpoint_version": 3.0}

        x = torch.randn(4096, 4096, device="cuda") / 64
        busy_idle = sorted(busy_step(x) for _ in range(5))[2]
        base = {"layers": layers, "params": n_params, "hidden": h,
                "gpu_mem_alloc_gib": round(torch.cuda.memory_allocated() / 2**30, 2)}

        # -- sync -------------------------------------------------------------------------
        d = root / f"sync_{layers}" / "iter_0000001"
        d.mkdir(parents=True)
        strategy = TorchDistSaveShardedStrategy("torch_dist", 1)
        dist.barrier()
        t0 = time.perf_counter()
        dist_checkpointing.save(sd(1), str(d), sharded_strategy=strategy)
        (d.parent / TRACKER).write_text("1")
        t_sync = time.perf_counter() - t0
        nbytes = dir_bytes(d)
        emit({"kind": "save", "mode": "sync", **base, "bytes": nbytes, "blocking_s": round(t_sync, 3),
              "full_s": round(t_sync, 3), "gb_per_s": round(nbytes / t_sync / 1e9, 3),
              "files": sorted(p.name for p in d.iterdir())[:6]})
        shutil.rmtree(d.parent)
        os.sync()

        # -- async (persistent worker, as --async-save --use-persistent-ckpt-worker) -------------
        queue = AsyncCallsQueue(persistent=True)
        t_warm = time.perf_counter()
        AsyncCallsQueue.warmup_persistent_caller(0)
        t_warm = time.perf_counter() - t_warm
        for it in (1, 2):  # the second shows a warm worker and a plan reused
            d = root / f"async_{layers}" / f"iter_{it:07d}"
            d.mkdir(parents=True)
            dist.barrier()
            t0 = time.perf_counter()
            req = dist_checkpointing.save(sd(it), str(d), sharded_strategy=strategy, async_sharded_save=True,
                                          async_strategy="mcore")
            tracker = d.parent / TRACKER
            req.add_finalize_fn(lambda it=it, tracker=tracker: tracker.write_text(str(it)))
            t_req = time.perf_counter() - t0
            queue.schedule_async_request(req)
            t_block = time.perf_counter() - t0
            marks = {"metadata_json_at_block": (d / "metadata.json").exists(), "tracker_at_block": tracker.exists()}
            busy = [busy_step(x)]  # training goes on while the worker writes
            while queue.get_num_unfinalized_calls() and not queue.maybe_finalize_async_calls(blocking=False):
                busy.append(busy_step(x))
                if len(busy) > 100000:
                    break
            queue.maybe_finalize_async_calls(blocking=True)
            t_full = time.perf_counter() - t0
            nbytes = dir_bytes(d)
            emit({"kind": "save", "mode": "async", "iteration": it, **base, "bytes": nbytes,
                  "plan_s": round(t_req, 3), "blocking_s": round(t_block, 3), "full_s": round(t_full, 3),
                  "worker_warmup_s": round(t_warm, 3) if it == 1 else 0.0, **marks,
                  "tracker_at_full": tracker.exists(), "metadata_json_at_full": (d / "metadata.json").exists(),
                  "busy_steps_during": len(busy), "busy_step_s_median": round(sorted(busy)[len(busy) // 2], 4),
                  "busy_step_s_idle": round(busy_idle, 4)})
            shutil.rmtree(d)
            os.sync()
        queue.close()
        shutil.rmtree(root / f"async_{layers}", ignore_errors=True)
        del model, ddp, opt, x
        torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
