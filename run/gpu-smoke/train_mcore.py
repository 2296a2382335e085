#!/usr/bin/env python3
"""A tiny slime-like trainer on megatron-core's public API, for shoprld's GPU smoke (issue 11).

    torchrun --standalone --nproc-per-node N run/gpu-smoke/train_mcore.py \\
        --load DIR --save DIR --save-interval K --num-rollout END [--tensor-model-parallel-size N] \\
        [--hidden-size 1024 --num-layers 8 --num-attention-heads 16 --vocab-size 32768 --seq-length 512] \\
        [--micro-batch-size 4 --steps-per-rollout 3 --lr 1e-4 --seed S] [--optimizer megatron|torch] \\
        [--device cuda|cpu-emulate] [ANY OTHER slime FLAG ...]

What is real: a megatron-core ``GPTModel`` (local layer spec, tensor parallel over every rank),
wrapped in megatron-core's ``DistributedDataParallel`` and optimised by ``get_megatron_optimizer``
(fp32 Adam states), trained on random tokens, and saved with ``megatron.core.dist_checkpointing``
(the torch_dist backend) in Megatron's on-disk layout:

    <save>/iter_{N:07d}/{__R_k.distcp, .metadata, metadata.json}   (written by dist_checkpointing)
    <save>/latest_checkpointed_iteration.txt                       (rank 0, after a barrier, LAST,
                                                                     a plain open('w'), as Megatron)

slime's loop semantics: ``--num-rollout`` is an absolute end id, ``for rollout_id in
range(start, num_rollout)`` with ``start = tracker + 1`` (0 with no tracker under ``--load``);
a save when ``(rollout_id + 1) % save_interval == 0`` or at the last rollout; the iteration saved
is the rollout id. One rollout = ``--steps-per-rollout`` optimizer steps. No save on SIGTERM
(like slime). Progress, one line per rollout on rank 0: ``rollout <id>/<num_rollout-1> ...``.
Save lines: ``saving checkpoint iter N`` and ``saved checkpoint iter N in X s (B bytes)``.

``--optimizer torch`` swaps megatron-core's optimizer for plain ``torch.optim.AdamW`` whose
state is sharded with megatron-core's own helpers (the same ``optimizer.state.*`` keys that
megatron-core's FP32Optimizer writes): a fallback, and what ``--device cpu-emulate`` (tests only:
gloo, CPU tensors, no CUDA) uses.

Exit: 0 done; 1 a training or I/O failure; 2 usage or an unparseable tracker (as Megatron).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

TRACKER = "latest_checkpointed_iteration.txt"
PROG = "train_mcore"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # slime's subset
    p.add_argument("--load", required=True, help="dir holding latest_checkpointed_iteration.txt (resume point)")
    p.add_argument("--save", required=True, help="Megatron save dir")
    p.add_argument("--save-interval", type=int, required=True)
    p.add_argument("--num-rollout", type=int, required=True, help="absolute end rollout id (exclusive)")
    p.add_argument("--tensor-model-parallel-size", type=int, default=0, help="0: the world size")
    p.add_argument("--seed", type=int, default=1234)
    # the model
    p.add_argument("--hidden-size", type=int, default=1024)
    p.add_argument("--num-layers", type=int, default=8)
    p.add_argument("--num-attention-heads", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=32768)
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--steps-per-rollout", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--optimizer", choices=("megatron", "torch"), default="megatron")
    p.add_argument("--save-thread-count", type=int, default=2, help="files per rank in each save")
    p.add_argument("--mp-tmpdir", choices=("auto", "keep"), default="auto",
                   help="auto: when $TMPDIR is too long for AF_UNIX sockets, give multiprocessing a short one")
    # cpu-emulate: tests only (gloo, CPU tensors, the torch optimizer; megatron-core's CUDA calls patched)
    p.add_argument("--device", choices=("cuda", "cpu-emulate"), default="cuda")
    args, unknown = p.parse_known_args(argv)
    args.cpu_emulate = args.device == "cpu-emulate"
    if args.save_interval < 1:
        p.error("--save-interval must be >= 1")
    if args.num_rollout < 0:
        p.error("--num-rollout must be >= 0")
    return args, unknown


def read_tracker(load_dir: str) -> int | None:
    """Megatron's tracker: N (or iter_N). None when absent. Unparseable: exit 2, like Megatron."""
    path = Path(load_dir) / TRACKER
    try:
        raw = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    m = re.fullmatch(r"(?:iter_)?(\d+)", raw)
    if not m:
        print(f"{PROG}: ERROR: unparseable tracker {path}: {raw!r}", file=sys.stderr, flush=True)
        sys.exit(2)
    return int(m.group(1))


def iter_dir(save: str, iteration: int) -> str:
    return os.path.join(save, f"iter_{iteration:07d}")


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


class TorchAdam:
    """Plain torch AdamW behind megatron-core's optimizer surface (FP32Optimizer's format)."""

    def __init__(self, params: list[Any], lr: float, clip_grad: float = 1.0) -> None:
        import torch

        self.params = [p for p in params if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.01)
        self.clip_grad = clip_grad

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> tuple[bool, float | None, None]:
        import torch

        for p in self.params:  # megatron DDP keeps grads in main_grad
            if getattr(p, "main_grad", None) is not None:
                p.grad = p.main_grad
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad)
        self.optimizer.step()
        return True, float(norm), None

    def _init_state(self) -> None:
        import torch

        for p in self.params:
            st = self.optimizer.state[p]
            if not st:
                st["exp_avg"] = torch.zeros_like(p.data)
                st["exp_avg_sq"] = torch.zeros_like(p.data)

    def sharded_state_dict(self, model_sharded_state_dict: Any, is_loading: bool = False) -> dict[str, Any]:
        from megatron.core.dist_checkpointing.optimizer import (
            get_param_id_to_sharded_param_map,
            optim_state_to_sharding_state,
        )

        if is_loading:
            self._init_state()
        sd = self.optimizer.state_dict()
        id_map = get_param_id_to_sharded_param_map(model_sharded_state_dict, self.params)
        step = None
        for st in sd["state"].values():
            if "step" in st:
                step = st["step"]
        optim_state_to_sharding_state(sd, id_map, exclude_keys="step")
        if step is not None:
            sd["state"]["common_step"] = step
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        import copy

        step = sd["state"].pop("common_step", None)
        if step is not None:
            for st in sd["state"].values():
                st["step"] = copy.deepcopy(step)
        self.optimizer.load_state_dict(sd)


AF_UNIX_MAX = 107  # sun_path, less the NUL


def short_mp_tmpdir(mode: str) -> tuple[str, str] | None:
    """dist_checkpointing.save starts a multiprocessing Manager, whose AF_UNIX socket lives at
    ``<tmp>/pymp-XXXXXXXX/listener-XXXXXXXX`` (32 more bytes). shoprld sets TMPDIR to the
    experiment's tmp dir on the volume, which can be too long for that ("OSError: AF_UNIX path too
    long" in the save). With ``auto``, point Python's tempfile and this process's TMPDIR (so
    multiprocessing, in spawned children too) at a short private dir instead. Returns (long, short) when it did."""
    import tempfile

    base = tempfile.gettempdir()
    if mode != "auto" or len(base) + 32 <= AF_UNIX_MAX:
        return None
    short = f"/tmp/mp-{os.getuid()}"
    os.makedirs(short, mode=0o700, exist_ok=True)
    tempfile.tempdir = short
    os.environ["TMPDIR"] = short  # spawned helpers (the Manager's server picks its own address)
    return base, short


def _cpu_emulate_patch() -> None:
    """Tests only: let megatron-core's CUDA-assuming code run on CPU tensors."""
    import torch

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse_args(argv)
    t_start = time.time()
    swapped = short_mp_tmpdir(args.mp_tmpdir)
    import torch
    import torch.distributed as dist

    if args.cpu_emulate:
        _cpu_emulate_patch()
        dist.init_process_group("gloo")
        device: Any = torch.device("cpu")
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        device = torch.device("cuda", local_rank)
    rank, world = dist.get_rank(), dist.get_world_size()

    def log(msg: str, all_ranks: bool = False) -> None:
        if rank == 0 or all_ranks:
            print(f"{msg}" if not all_ranks else f"[rank{rank}] {msg}", flush=True)

    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp = args.tensor_model_parallel_size or world
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    if not args.cpu_emulate:
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(args.seed)
    torch.manual_seed(args.seed)
    if unknown:
        log(f"accepted slime flags {' '.join(unknown)}")
    if swapped:
        log(f"WARNING: TMPDIR {swapped[0]} is {len(swapped[0])} chars, too long for multiprocessing's AF_UNIX "
            f"sockets (+32, max {AF_UNIX_MAX}); using {swapped[1]} for them")
    log(f"{PROG}: world={world} tp={tp} torch={torch.__version__} device={device} "
        f"model: layers={args.num_layers} hidden={args.hidden_size} heads={args.num_attention_heads} "
        f"vocab={args.vocab_size} seq={args.seq_length} optimizer={args.optimizer}")

    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        tensor_model_parallel_size=tp, pipeline_dtype=torch.float32, params_dtype=torch.float32,
        use_cpu_initialization=args.cpu_emulate, hidden_dropout=0.0, attention_dropout=0.0,
    )
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=args.vocab_size, max_sequence_length=args.seq_length)
    model.to(device)
    n_local = sum(p.numel() for p in model.parameters())
    log(f"parameters: {n_local} on rank 0 (x{tp} shards); fp32 weights + 2 fp32 Adam states "
        f"~ {n_local * 12 * tp / 2**30:.2f} GiB per checkpoint")

    if args.optimizer == "megatron" and not args.cpu_emulate:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        ddp = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False), module=model)
        optimizer: Any = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=args.lr, weight_decay=0.01, clip_grad=1.0, bf16=False, fp16=False,
            params_dtype=torch.float32, use_distributed_optimizer=False), [ddp])
        net: Any = ddp
    else:
        optimizer = TorchAdam(list(model.parameters()), args.lr)
        ddp = None
        net = model
    log(f"optimizer: {type(optimizer).__name__}" + (f" over {type(optimizer.optimizer).__name__}"
                                                     if hasattr(optimizer, "optimizer") else ""))

    def state_dict_for(iteration: int, loading: bool) -> dict[str, Any]:
        msd = model.sharded_state_dict(prefix="")
        return {
            "model": msd,
            "optimizer": optimizer.sharded_state_dict(msd, is_loading=loading),
            "iteration": iteration,
            "checkpoint_version": 3.0,
            "args": {"num_layers": args.num_layers, "hidden_size": args.hidden_size,
                     "num_attention_heads": args.num_attention_heads, "vocab_size": args.vocab_size,
                     "seq_length": args.seq_length, "tensor_model_parallel_size": tp, "seed": args.seed,
                     "optimizer": type(optimizer).__name__, "world_size": world},
        }

    # -- resume (slime: start_rollout_id = tracker + 1) --------------------------------------------
    tracker = read_tracker(args.load)
    start = 0
    if tracker is not None:
        t0 = time.time()
        src = iter_dir(args.load, tracker)
        loaded = dist_checkpointing.load(state_dict_for(tracker, True), src)
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])
        if int(loaded["iteration"]) != tracker:
            log(f"{PROG}: ERROR: {src} holds iteration {loaded['iteration']}, tracker says {tracker}")
            return 1
        start = tracker + 1
        log(f"loaded checkpoint iter {tracker} from {src} in {time.time() - t0:.2f} s; "
            f"resume: tracker={tracker} start_rollout_id={start}")
    else:
        log(f"no tracker under {args.load}: fresh start at rollout 0")
    log(f"ready in {time.time() - t_start:.1f} s; rollouts {start}..{args.num_rollout - 1}")

    save_strategy = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=args.save_thread_count)

    def save(iteration: int) -> None:
        d = iter_dir(args.save, iteration)
        if rank == 0:
            os.makedirs(d, exist_ok=True)
        dist.barrier()
        log(f"saving checkpoint iter {iteration}")
        t0 = time.time()
        dist_checkpointing.save(state_dict_for(iteration, False), d, sharded_strategy=save_strategy)
        dist.barrier()
        took = time.time() - t0
        if rank == 0:  # Megatron: the tracker LAST, a plain write, after the barrier
            with open(os.path.join(args.save, TRACKER), "w") as fh:
                fh.write(str(iteration))
        dist.barrier()
        log(f"saved checkpoint iter {iteration} in {took:.3f} s ({dir_bytes(d) if rank == 0 else 0} bytes)")

    gen = torch.Generator().manual_seed(args.seed)
    pos = torch.arange(args.seq_length).unsqueeze(0).expand(args.micro_batch_size, -1).to(device)
    for rollout_id in range(start, args.num_rollout):
        t0 = time.time()
        losses = []
        for k in range(args.steps_per_rollout):
            gen.manual_seed(args.seed * 1_000_003 + rollout_id * 101 + k)  # same tokens on every TP rank
            tokens = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length + 1), generator=gen)
            inp, labels = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
            if ddp is not None:
                ddp.zero_grad_buffer()
            optimizer.zero_grad()
            try:
                out = net(inp, pos, None, labels=labels)
                loss = out.float().mean()
            except Exception as exc:  # --cpu-emulate only: some kernels need CUDA
                if not args.cpu_emulate:
                    raise
                if not losses:
                    log(f"cpu-emulate: forward unavailable ({type(exc).__name__}); using a parameter-norm loss")
                loss = sum((p.float() ** 2).mean() for p in model.parameters())
            loss.backward()
            if ddp is not None:
                ddp.finish_grad_sync()
            ok, grad_norm, _ = optimizer.step()
            losses.append(float(loss.detach()))
        if device.type == "cuda":
            torch.cuda.synchronize()
        log(f"rollout {rollout_id}/{args.num_rollout - 1} step_time={time.time() - t0:.3f} "
            f"loss={sum(losses) / len(losses):.4f} grad_norm={grad_norm if grad_norm is None else round(grad_norm, 4)}")
        if (rollout_id + 1) % args.save_interval == 0 or rollout_id == args.num_rollout - 1:
            save(rollout_id)
    log(f"done: rollouts {start}..{args.num_rollout - 1} in {time.time() - t_start:.1f} s")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # dist_checkpointing's writer uses multiprocessing: keep the guard
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
