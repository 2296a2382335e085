"""STAND-IN for slime's `train.py` (THUDM/slime, launched by ShopSimRL's
`scripts/run_shopsimrl_slime.sh` through `ray job submit`). No model is trained.

What it keeps from slime and Megatron, because the daemon relies on it:
- the loop `for rollout_id in range(start, num_rollout)`: `--num-rollout` is an absolute end;
- resume from `<load>/latest_checkpointed_iteration.txt`: an integer N or `release` (iteration
  0, dir `release/`), as Megatron's read_metadata accepts; anything else (`iter_N` too) is
  "Invalid metadata file" and exit 1. start = tracker + 1, or 0 without a tracker;
- saves when `(rollout_id + 1) % save_interval == 0` or at the last rollout; the Megatron
  iteration saved is the rollout id; `iter_{N:07d}/` gets common.pt, __R_0.distcp, .metadata,
  metadata.json (each fsynced, in that order), then the tracker is written with a plain
  open('w'), then `--save-hf` in slime's order (old weights deleted, config.json, shards
  under temp names then renamed, the index LAST), then the data-sampler state
  `rollout/global_dataset_state_dict_N.pt`;
- no save on SIGTERM (the default action: the process dies at once);
- WANDB_API_KEY comes from the environment and is never printed.

Each rollout leases ShopSim slots (reset/interact/terminate/release_one), sleeps
DEMO_STEP_SECONDS, writes `runs/slime-training/<round>/group-%09d/{rollout-0.json,
triage.json[, full-skill-retry.json]}` (the round named by the curriculum's `round_id`, task
ids from the train half of the service's `/healthz` `tasks`) and logs slime's own lines:
`[time] rollout_metrics.py:0 - perf <id>: {...}` and `[time] train_metric_utils.py:0 - rollout
<id>: {...}`. Helper mode: `--init-base DIR` writes the converted base model as
convert_hf_to_torch_dist.py leaves it (tracker `release`, dir `release/`).

Exit codes: 0 done; 1 fault-injected crash or ShopSim failure (8 consecutive unscored groups);
1 also for a tracker Megatron rejects; 2 usage or configuration error (missing WANDB_API_KEY,
unreadable config).
Fault knobs: see run/demo/README.md (DEMO_CRASH_AT, DEMO_STALL_AT, DEMO_DIE_MID_SAVE_AT,
DEMO_HANG_ON_START, DEMO_HANG_AFTER_ENGINES_AT, DEMO_HANG_IN_TRAIN_AT, DEMO_SLOW_AT, DEMO_LEAK_LEASES,
DEMO_FAULT_RESUME_AT_ZERO, DEMO_FAULT_ONCE_DIR,
DEMO_CKPT_BYTES, DEMO_CKPT_SHARDS, DEMO_HF_BYTES, DEMO_SAVE_SECONDS, DEMO_SAVE_BLOCK_SECONDS,
DEMO_SAVE_FIRST_BLOCK_SECONDS, DEMO_SAVE_ASYNC_SECONDS, DEMO_TIMER_DECIMALS,
DEMO_TOUCH_ON_CRASH, DEMO_STEP_SECONDS,
DEMO_TRIAGE_FRACTION, DEMO_LOG_MIB); run/demo/_faults.py lists the trainer's fault knobs for the benches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import _common as c

PROG = "slime_train"
MAX_FAILED_GROUPS = 8  # slime aborts the job after 8 consecutive unscored groups


def log(msg: str) -> None:
    print(msg, flush=True)


def slime_log(msg: str, where: str = "train.py:0") -> None:
    """slime's logging format (`slime/observability/logging_utils.py`): `[time] file:line - msg`."""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {where} - {msg}", flush=True)


SGLANG_LINE = ("[{t} DP0 TP0] INFO:     127.0.0.1:51234 - \"POST /generate HTTP/1.1\" 200 OK #running-req: 61, "
               "#token: 412345, token usage: 0.43, gen throughput (token/s): 5123.4 " + "x" * 80 + "\n")


def engine_chatter(nbytes: int) -> None:
    """About ``nbytes`` of SGLang-like request lines on stdout (what four engines print)."""
    line = SGLANG_LINE.format(t=time.strftime("%Y-%m-%d %H:%M:%S"))
    n = max(1, nbytes // len(line))
    for _ in range(0, n, 1000):
        sys.stdout.write(line * min(1000, n - _))
    sys.stdout.flush()


def read_tracker(load_dir: str) -> tuple[int, Path] | None:
    """Megatron's `read_metadata`: the tracker holds an integer or `release` (iteration 0, dir
    `release/`); anything else (`iter_N` included) is an error and the job dies."""
    path = Path(load_dir) / c.TRACKER
    try:
        raw = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if raw == "release":
        return 0, Path(load_dir) / "release"
    try:
        iteration = int(raw)
    except ValueError:
        # Megatron prints this and calls sys.exit(); inside slime's train actor that fails the job.
        raise c.DemoError(f"ERROR: Invalid metadata file {path}. Exiting", 1) from None
    return iteration, Path(load_dir) / c.iter_dir_name(iteration)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog=PROG, description="slime train.py stand-in (demo)")
    p.add_argument("--load")
    p.add_argument("--save")
    p.add_argument("--save-interval", type=int)
    p.add_argument("--num-rollout", type=int)
    p.add_argument("--save-hf")
    # Megatron's flags; slime passes them through (arguments.py reset_arg "--async-save").
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--use-persistent-ckpt-worker", action="store_true")
    p.add_argument("--custom-config-path")
    p.add_argument("--hf-checkpoint")
    p.add_argument("--ref-load")
    p.add_argument("--seed", type=int, default=c.DEFAULT_SEED)
    p.add_argument("--use-wandb", action="store_true")
    p.add_argument("--wandb-mode", choices=["online", "offline", "disabled"], default="online")
    p.add_argument("--wandb-project")
    p.add_argument("--wandb-group")
    p.add_argument("--wandb-dir")
    p.add_argument("--disable-wandb-random-suffix", action="store_true")
    p.add_argument("--init-base", metavar="DIR", help="demo helper: write the converted base model (iteration 0) and exit")
    return p.parse_known_args(argv)


# ---------------------------------------------------------------- faults

class Faults:
    """Fault knobs from the environment; with DEMO_FAULT_ONCE_DIR each fires once."""

    def __init__(self) -> None:
        self.crash_at = c.env_int("DEMO_CRASH_AT", None)
        self.stall_at = c.env_int("DEMO_STALL_AT", None)
        self.die_mid_save_at = c.env_int("DEMO_DIE_MID_SAVE_AT", None)
        self.hang_on_start = c.env_flag("DEMO_HANG_ON_START")
        # slime#1484: hangs after the engines report ready, before any rollout (the launch that
        # starts at rollout K; with DEMO_FAULT_ONCE_DIR, once).
        self.hang_after_engines_at = c.env_int("DEMO_HANG_AFTER_ENGINES_AT", None)
        # slime#1487: rollout K completes, `Timer actor_train start`, then nothing.
        self.hang_in_train_at = c.env_int("DEMO_HANG_IN_TRAIN_AT", None)
        # A slow step that keeps moving: rollout K's generations and training F times slower.
        slow = os.environ.get("DEMO_SLOW_AT", "")
        at, _, factor = slow.partition(":")
        self.slow_at = int(at) if at.strip().isdigit() else None
        self.slow_factor = float(factor) if factor else 3.0
        self.leak_leases = c.env_flag("DEMO_LEAK_LEASES")
        self.resume_at_zero = c.env_flag("DEMO_FAULT_RESUME_AT_ZERO")
        self.once_dir = os.environ.get("DEMO_FAULT_ONCE_DIR") or None

    def fire(self, name: str) -> bool:
        """True when fault `name` should fire now (and, once-only, marks it fired)."""
        if not self.once_dir:
            return True
        marker = Path(self.once_dir) / name
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            with open(marker, "x") as f:
                f.write(f"{os.getpid()}\n")
        except FileExistsError:
            return False
        return True


def stall_forever(what: str) -> None:
    """Alive, no progress: no trainer line, no ShopSim request, no generated token. The engine
    stand-in (its /metrics, its access lines) goes on, as SGLang's servers do in a hung job."""
    log(f"[demo fault] {what}: alive, making no progress")
    while True:
        time.sleep(3600)


class Engine:
    """What the daemon can see of slime's SGLang engines: the server-ready line, and with
    DEMO_ENGINE_METRICS_PORT a Prometheus `/metrics` (`sglang:num_running_reqs`,
    `sglang:generation_tokens_total`) whose requests are logged as uvicorn's access lines (the
    lines slime#1487's log kept printing while training hung). DEMO_ENGINE_PING_S: an access line
    of a health check every S seconds (the router's polls), noise the daemon must not count.
    A generation turn (DEMO_GEN_SECONDS) counts tokens as it goes, and a running request."""

    TOKENS_PER_SLICE = 40

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.tokens = 0
        self.running = 0
        self.gen_s = c.env_float("DEMO_GEN_SECONDS", 0.0) or 0.0
        self.slow = 1.0
        port = c.env_int("DEMO_ENGINE_METRICS_PORT", None)
        if port is not None:
            self._serve(port)
        ping = c.env_float("DEMO_ENGINE_PING_S", 0.0) or 0.0
        if ping > 0:
            threading.Thread(target=self._ping, args=(ping,), daemon=True).start()
        log(f"(SGLangEngine pid={os.getpid()}) INFO:     Uvicorn running on http://127.0.0.1:{port or 0} "
            "(Press CTRL+C to quit)")

    @staticmethod
    def access(path: str) -> None:
        print(f"(SGLangEngine pid={os.getpid()}) [{time.strftime('%Y-%m-%d %H:%M:%S')}] INFO:     "
              f'127.0.0.1:40000 - "GET {path} HTTP/1.1" 200 OK', flush=True)

    def _ping(self, every: float) -> None:
        while True:
            time.sleep(every)
            self.access("/health")

    def _serve(self, port: int) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != "/metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                with engine.lock:
                    body = ("# TYPE sglang:num_running_reqs gauge\n"
                            f'sglang:num_running_reqs{{model_name="demo"}} {float(engine.running)}\n'
                            "# TYPE sglang:generation_tokens_total counter\n"
                            f'sglang:generation_tokens_total{{model_name="demo"}} {float(engine.tokens)}\n').encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                engine.access("/metrics")

            def log_message(self, *args: Any) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()

    def generate(self) -> None:
        """One generation turn of a rollout: DEMO_GEN_SECONDS (x the slow factor), tokens growing."""
        total = self.gen_s * self.slow
        if total <= 0:
            return
        with self.lock:
            self.running += 1
        try:
            slices = max(1, int(total / 0.01))
            for _ in range(slices):
                time.sleep(total / slices)
                with self.lock:
                    self.tokens += self.TOKENS_PER_SLICE
        finally:
            with self.lock:
                self.running -= 1


# ---------------------------------------------------------------- checkpoints

def write_data(save: Path, iteration: int, seed: int, faults: Faults | None, save_s: float) -> str:
    """The shards of `iter_N/` (common.pt, __R_0.distcp, .metadata), each fsynced, written over
    ``save_s`` seconds; return the weights digest (what `_common.load_checkpoint` computes from them)."""
    ckpt_bytes = c.env_int("DEMO_CKPT_BYTES", 1 << 20) or 0
    shards = max(1, c.env_int("DEMO_CKPT_SHARDS", 1) or 1)
    hf_bytes = c.env_int("DEMO_HF_BYTES", 256 << 10) or 0
    d = save / c.iter_dir_name(iteration)
    d.mkdir(parents=True, exist_ok=True)
    common = {"format": "shoprld-demo-common-v1 (stand-in for a torch pickle)",
              "iteration": iteration, "seed": seed, "hf_bytes": hf_bytes}
    c.write_fsync(d / "common.pt", c.canonical_json(common).encode())
    records: dict[str, Any] = {}
    for rank in range(shards):
        name = f"__{rank}_0.distcp"
        size = ckpt_bytes // shards + (1 if rank < ckpt_bytes % shards else 0)
        h = hashlib.sha256()

        def stream(rank: int = rank, size: int = size, h: Any = h) -> Any:
            for chunk in c.det_stream(c.distcp_key(iteration, seed, rank), size):
                h.update(chunk)
                # DEMO_SAVE_SECONDS: a real save's minutes, spent while its shards grow (the
                # saving phase's signal), not in one sleep after them.
                if save_s:
                    time.sleep(save_s * len(chunk) / max(1, ckpt_bytes))
                yield chunk

        c.write_fsync(d / name, stream())
        records[name] = {"size": size, "sha256": h.hexdigest()}
    if faults and faults.die_mid_save_at == iteration and faults.fire("die_mid_save"):
        log(f"[demo fault] dying in the middle of the save of iteration {iteration}")
        os._exit(1)
    dcp = {"format": "shoprld-demo-dcp-v1 (stand-in for torch DCP metadata)",
           "iteration": iteration, "shards": records}
    c.write_fsync(d / ".metadata", c.canonical_json(dcp).encode())
    digest = hashlib.sha256()
    for name, info in sorted(records.items()):
        digest.update(name.encode() + b"\0" + bytes.fromhex(info["sha256"]))
    return digest.hexdigest()


def finalize(save: Path, iteration: int) -> None:
    """megatron-core's finalize functions, in their order: `metadata.json` (serialization.py's
    metadata_finalize_fn), then Megatron's tracker (checkpointing.py's iter_finalize_fn), a
    plain (non-atomic) write."""
    d = save / c.iter_dir_name(iteration)
    c.write_fsync(d / "metadata.json", c.canonical_json(c.METADATA_JSON).encode())
    c.fsync_dir(d)
    c.fsync_dir(save)
    with open(save / c.TRACKER, "w") as f:
        f.write(str(iteration))


def write_checkpoint(save: Path, iteration: int, seed: int, faults: Faults | None) -> str:
    """A synchronous save: `iter_N/` in Megatron's order, each file fsynced, then the tracker;
    return the weights digest."""
    save_s = c.env_float("DEMO_SAVE_SECONDS", 0.0) or 0.0
    digest = write_data(save, iteration, seed, faults, save_s)
    c.write_fsync(save / c.iter_dir_name(iteration) / "metadata.json", c.canonical_json(c.METADATA_JSON).encode())
    c.fsync_dir(save / c.iter_dir_name(iteration))
    c.fsync_dir(save)
    # DEMO_SAVE_SECONDS (the wall time a real save takes: a 53 GB checkpoint takes minutes) was
    # spent while write_data wrote the shards; with no shard bytes, it is spent here.
    if save_s and (c.env_int("DEMO_CKPT_BYTES", 1 << 20) or 0) <= 0:
        time.sleep(save_s)
    # Megatron writes the tracker last, with a plain (non-atomic) write.
    with open(save / c.TRACKER, "w") as f:
        f.write(str(iteration))
    return digest


class AsyncSaver:
    """Megatron's `--async-save` with `--use-persistent-ckpt-worker`, as slime drives it.

    A save blocks for DEMO_SAVE_BLOCK_SECONDS (planning and the device-to-host copy: what
    bench_save.py measures as the blocking part; the process's first async save blocks for
    DEMO_SAVE_FIRST_BLOCK_SECONDS instead, when set: it sets up the worker and its host buffers,
    47 s against 1.2 s at 53 GB on an H100), then a worker thread writes the shards over
    DEMO_SAVE_ASYNC_SECONDS (the background write; default DEMO_SAVE_SECONDS, which is a sync
    save's time), while training goes on. Nothing marks the
    save complete until it is finalized: `metadata.json`, then the tracker. slime finalizes a
    save only at the start of the NEXT one (`save_model`: `maybe_finalize_async_save(blocking=True)`
    before `save(...)`) or right after a forced-sync save (the last rollout): so iteration k's
    tracker lands only when save k+1 starts, and a kill in between leaves `iter_k/` without
    `metadata.json` and the tracker at the save before it."""

    def __init__(self, save: Path, seed: int, faults: Faults) -> None:
        self.save, self.seed, self.faults = save, seed, faults
        self.pending: tuple[int, threading.Thread, list[str]] | None = None
        self.scheduled = 0  # saves scheduled by this process (its first one blocks longer)

    def finalize_pending(self) -> None:
        if self.pending is None:
            return
        iteration, worker, _ = self.pending
        worker.join()
        finalize(self.save, iteration)
        self.pending = None
        slime_log(f"successfully saved checkpoint from iteration {iteration:7d} to {self.save} [ t 1/1, p 1/1 ]",
                  "checkpointing.py:0")

    def schedule(self, iteration: int) -> None:
        block = c.env_float("DEMO_SAVE_BLOCK_SECONDS", 0.0) or 0.0
        if not self.scheduled:
            block = c.env_float("DEMO_SAVE_FIRST_BLOCK_SECONDS", block) or 0.0
        self.scheduled += 1
        time.sleep(block)
        digest: list[str] = []

        def work() -> None:
            write_s = c.env_float("DEMO_SAVE_ASYNC_SECONDS", c.env_float("DEMO_SAVE_SECONDS", 0.0)) or 0.0
            digest.append(write_data(self.save, iteration, self.seed, self.faults, write_s))
            if (c.env_int("DEMO_CKPT_BYTES", 1 << 20) or 0) <= 0:  # no shards to spend it on
                time.sleep(write_s)

        worker = threading.Thread(target=work, name=f"ckpt-worker-{iteration}", daemon=True)
        worker.start()
        self.pending = (iteration, worker, digest)
        slime_log(f"scheduled an async checkpoint save at iteration {iteration:7d} to {self.save}",
                  "checkpointing.py:0")

    def digest(self, iteration: int) -> str:
        """The weights digest of the pending save (waits for its writes: --save-hf needs them)."""
        assert self.pending is not None and self.pending[0] == iteration
        self.pending[1].join()
        return self.pending[2][0]


def save_hf(out: str, weights_digest: str, hf_bytes: int, config: bytes) -> None:
    """slime's `--save-hf` order (`hf_checkpoint_saver.py`): delete the old weights and index,
    copy config.json, write shards under temp names and rename them, the index LAST. The bytes
    equal the converter's (`_common.write_hf_dir`), only the order differs."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    for old in [*d.glob("*.safetensors"), *d.glob("*.bin"), d / c.HF_INDEX]:
        old.unlink(missing_ok=True)
    c.write_fsync(d / "config.json", config)
    plan = c.hf_tensor_plan(hf_bytes)
    per = -(-len(plan) // c.HF_SHARDS)
    shards = [plan[i * per:(i + 1) * per] for i in range(c.HF_SHARDS)]
    files = [f"model-{i + 1:05d}-of-{c.HF_SHARDS:05d}.safetensors" for i in range(c.HF_SHARDS)]
    total = 0
    for k, (file, shard) in enumerate(zip(files, shards)):
        header, offsets = c.safetensors_header(shard)
        total += offsets[-1][1] if offsets else 0

        def body(header: bytes = header, shard: list[Any] = shard, offsets: list[Any] = offsets) -> Any:
            yield header
            for (name, _, _), (begin, stop) in zip(shard, offsets):
                yield from c.det_stream(f"hf:{weights_digest}:{name}".encode(), stop - begin)

        c.write_fsync(d / f"model-{k}.safetensors", body())
        os.replace(d / f"model-{k}.safetensors", d / file)
    weight_map = {name: files[i] for i, shard in enumerate(shards) for name, _, _ in shard}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    c.write_fsync(d / c.HF_INDEX, c.canonical_json(index).encode("utf-8"))
    c.fsync_dir(d)


def save_all(args: argparse.Namespace, iteration: int, faults: Faults, saver: AsyncSaver | None = None,
             force_sync: bool = False) -> None:
    save = Path(args.save)
    if saver is not None:  # slime's save_model: finish the previous async save first
        saver.finalize_pending()
    log(f"saving checkpoint iter {iteration} to {save}")
    if saver is None:
        digest = write_checkpoint(save, iteration, args.seed, faults)
        slime_log(f"successfully saved checkpoint from iteration {iteration:7d} to {save} [ t 1/1, p 1/1 ]",
                  "checkpointing.py:0")
    else:
        saver.schedule(iteration)
        # --save-hf needs the weights: the stand-in waits for its own writes to read them back
        # (slime's save_hf gathers them from the model in memory instead).
        digest = saver.digest(iteration) if args.save_hf else ""
        if force_sync:  # slime: the last rollout's save is finalized at once (train.py force_sync)
            saver.finalize_pending()
    if args.save_hf:
        hf_bytes = c.env_int("DEMO_HF_BYTES", 256 << 10) or 0
        save_hf(args.save_hf.format(rollout_id=iteration), digest, hf_bytes, c.hf_config_from(args.hf_checkpoint))
        log(f"saved hf checkpoint iter {iteration} to {args.save_hf}")
    state = {"format": "shoprld-demo-dataset-state-v1", "rollout_id": iteration, "epoch": 0,
             "sample_offset": (iteration + 1) * 16}
    (save / "rollout").mkdir(exist_ok=True)
    c.write_fsync(save / "rollout" / f"global_dataset_state_dict_{iteration}.pt", c.canonical_json(state).encode())


def timed_save(args: argparse.Namespace, iteration: int, faults: Faults, saver: AsyncSaver | None = None,
               force_sync: bool = False) -> None:
    """slime's `@timer` around `save_model` (slime/observability/timer.py): `Timer save_model
    start`, the save (checkpoint, --save-hf, data state), `Timer save_model end (elapsed: X.Xs)`.
    DEMO_SAVE_SECONDS (in write_checkpoint, before the tracker) is part of the time logged."""
    slime_log("Timer save_model start", "timer.py:0")
    t0 = time.monotonic()
    save_all(args, iteration, faults, saver, force_sync)
    # slime prints a tenth of a second; DEMO_TIMER_DECIMALS (1) gives a bench that scales time
    # down 1000x the resolution a real save's seconds have (the daemon reads any decimals).
    decimals = max(1, c.env_int("DEMO_TIMER_DECIMALS", 1) or 1)
    slime_log(f"Timer save_model end (elapsed: {time.monotonic() - t0:.{decimals}f}s)", "timer.py:0")


# ---------------------------------------------------------------- rollouts

def read_custom_config(path: str) -> dict[str, Any]:
    """slime's --custom-config-path: a block-YAML mapping (PyYAML when installed)."""
    try:
        return c.load_config_file(path)
    except ValueError as exc:
        raise c.DemoError(str(exc), 2) from None


def curriculum_round(path: Any) -> str:
    try:
        return str(c.read_json(path, "curriculum").get("round_id") or "round-000") if path else "round-000"
    except c.DemoError:
        return "round-000"


class Rollouts:
    """One rollout = a few GRPO groups, each one ShopSim episode, run concurrently."""

    def __init__(self, cfg: dict[str, Any], seed: int, engine: Engine | None = None):
        self.engine = engine
        self.url = (cfg.get("shopsim_environment_base_url") or cfg.get("shopsim_url") or "").rstrip("/")
        self.concurrency = int(cfg.get("shopsim_episode_concurrency") or cfg.get("episode_concurrency") or 4)
        self.timeout = float(cfg.get("shopsim_environment_timeout") or 30)
        # The training dir is named after the CURRICULUM's round_id (the real emitter writes none).
        self.curriculum_path = cfg.get("shopsim_curriculum_path")
        self.round_id = curriculum_round(self.curriculum_path)
        out = cfg.get("shopsim_training_output_dir")
        self.out_dir = Path(out) / self.round_id if out else None
        self.seed = seed
        self.tasks: list[int] | None = None
        self.fraction = c.env_float("DEMO_TRIAGE_FRACTION", 0.25)
        self.failed_in_a_row = 0
        self.client = c.ShopClient(self.url, self.timeout)

    def train_tasks(self) -> list[int]:
        """The train split of the tasks the service serves (its `/healthz` `tasks`, never a fixed
        range: a real ShopSimulator serves only its catalog's ids): the lower half, as the demo's
        val tool takes the upper half."""
        if self.tasks is None:
            ids = self.client.task_ids()
            self.tasks = ids[:max(1, len(ids) // 2)]
        return self.tasks

    def episode(self, group: int, leak: bool) -> dict[str, Any]:
        tasks = self.train_tasks()
        task = tasks[int(c.unit("train-task", self.seed, self.round_id, group) * len(tasks))]
        if leak:
            lease = self.client.call({"action": "reset", "idx": task})
            return {"group": group, "task_id": task, "leaked": {"env_idx": lease["env_idx"], "lease_id": lease["lease_id"]}}
        skill = min(0.9, 0.4 + 0.002 * group)  # the demo policy "learns": better choices as groups go by
        out = self.client.play(task, f"train:{self.seed}:{self.round_id}:{group}", skill,
                               think=self.engine.generate if self.engine else None)
        return {"group": group, "task_id": task, "action": out["actions"][-1] if out["actions"] else None,
                "actions": out["actions"], "done": out["done"], "reward": out["reward"],
                "reward_detail": out["reward_detail"], "termination_reason": out["termination_reason"]}

    def run(self, rollout_id: int, leak: bool) -> list[dict[str, Any]]:
        groups = [rollout_id * self.concurrency + k for k in range(self.concurrency)]
        if not self.url:
            return []
        from concurrent.futures import ThreadPoolExecutor  # imported late: only rollouts with ShopSim need it

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = [pool.submit(self.episode, g, leak) for g in groups]
            results = []
            for g, fut in zip(groups, futures):
                try:
                    results.append(fut.result())
                    self.failed_in_a_row = 0
                except Exception as exc:
                    self.failed_in_a_row += 1
                    log(f"group {g}: unscored ({exc})")
                    if self.failed_in_a_row >= MAX_FAILED_GROUPS:
                        raise c.DemoError(f"{MAX_FAILED_GROUPS} consecutive unscored groups; "
                                          f"is ShopSim at {self.url} up? ({exc})") from None
        return results

    def retry_trace(self, r: dict[str, Any]) -> dict[str, Any]:
        """The failed full-skill retry in the shape the real `shopsimrl.slime_runtime` writes it
        (`_run_episode`'s trace, ShopSimRL@d020cbb): the real `training analyze` / `watch-analyze`
        accept a retry only if it is a completed train job with r_success 0, provenance
        `skills.diagnostic_full_skill` true and `selected_skills` = the curriculum's full skill
        (id, version, content); anything less is an ANALYST_ERROR card, and no analyst is asked."""
        chunks = []
        try:
            cur = c.read_json(self.curriculum_path, "curriculum") if self.curriculum_path else {}
            chunks = [ch for ch in cur.get("chunks") or [] if isinstance(ch, dict)]
        except c.DemoError:
            cur = {}
        skills = [{"skill_id": ch.get("skill_id"), "content": ch.get("content"), "version": str(ch.get("version", "1")),
                   "metadata": dict(ch.get("metadata") or {}),
                   "content_sha256": hashlib.sha256(json.dumps(ch.get("content"), ensure_ascii=False).encode()).hexdigest()}
                  for ch in chunks]
        state_id = cur.get("state_id") if isinstance(cur, dict) else None
        return {"schema_version": "shopsimrl-episode-v4",
                "episode_id": f"train-group-{r['group']:09d}-sample-{1:09d}-full-skill-retry", "status": "completed",
                "job": {"task_id": r["task_id"], "sample_id": 1, "seed": 0, "split": "train"},
                "provenance": {"skills": {"curriculum_state_id": state_id, "diagnostic_full_skill": True,
                                          "assignment": {"state_id": state_id, "group_key": str(r["group"]),
                                                         "mode": "diagnostic_full_skill",
                                                         "skill_ids": [s["skill_id"] for s in skills]}}},
                "reset": None, "selected_skills": skills, "conversation": [], "steps": [],
                "final": {"done": True, "reward": 0.0, "reward_detail": {"r_strict": 0.0, "r_success": 0.0},
                          "termination_reason": "action_limit"},
                "error": None, "task_id": r["task_id"]}

    def record(self, rollout_id: int, results: list[dict[str, Any]]) -> None:
        if self.out_dir is None:
            return
        for r in results:
            gdir = self.out_dir / f"group-{r['group']:09d}"
            gdir.mkdir(parents=True, exist_ok=True)
            pending = c.unit("triage", self.seed, self.round_id, r["group"]) < self.fraction
            status = "full_skill_failure_pending_analysis" if pending else "scored"
            c.atomic_write_json(gdir / "rollout-0.json", {"rollout_id": rollout_id, "sample_index": 0, **r})
            triage: dict[str, Any] = {"group_id": r["group"], "rollout_id": rollout_id, "round_id": self.round_id,
                                      "task_id": r["task_id"], "classification": status, "status": status,
                                      "reward": r.get("reward")}
            if pending:
                retry = self.retry_trace(r)
                c.atomic_write_json(gdir / "full-skill-retry.json", retry)
                triage["full_skill_retry"] = {"episode_id": retry["episode_id"], "trace_path": str(gdir / "full-skill-retry.json"),
                                              "reward": retry["final"]["reward_detail"], "scored": True}
            c.atomic_write_json(gdir / "triage.json", triage)


def init_base(out: str, seed: int) -> int:
    """`tools/convert_hf_to_torch_dist.py`: save iteration 1, then rename `iter_0000001/` to
    `release/` and write `release` in the tracker (Megatron's converted-base layout)."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    write_checkpoint(d, 1, seed, None)
    os.replace(d / c.iter_dir_name(1), d / "release")
    with open(d / c.TRACKER, "w") as f:
        f.write("release")
    log(f"wrote converted base model (tracker release, dir release/) to {d}")
    return 0


def check_wandb(args: argparse.Namespace) -> None:
    if not args.use_wandb or args.wandb_mode == "disabled":
        return
    if not os.environ.get("WANDB_API_KEY"):
        raise c.DemoError("WANDB_API_KEY is not set (W&B enabled)", 2)
    log(f"wandb: mode={args.wandb_mode} project={args.wandb_project} group={args.wandb_group} (key from environment)")
    if args.wandb_mode == "offline" and args.wandb_dir:
        run = Path(args.wandb_dir) / "wandb" / f"offline-run-demo-{args.wandb_group or 'nogroup'}"
        run.mkdir(parents=True, exist_ok=True)
        (run / "README").write_text("shoprld demo stand-in: offline W&B run marker\n")


# The share of a step's training time each forward-only log-prob pass takes (the reference
# model's and the actor's): a pass over the rollout's 128 samples at 1 unit a sample against 2
# optimizer steps of 64 at 4 (forward, backward, full recompute): 128 / (2 x 128 + 512) = 1/6.
LOG_PROB_SHARE = 1 / 6


def main() -> int:
    args, extra = parse_args(sys.argv[1:])
    if args.init_base:
        return init_base(args.init_base, args.seed)
    for flag in ("save", "num_rollout"):
        if getattr(args, flag) is None:
            raise c.DemoError(f"--{flag.replace('_', '-')} is required", 2)
    faults = Faults()
    if faults.hang_on_start and faults.fire("hang_on_start"):
        stall_forever("hang on start (DEMO_HANG_ON_START=1)")
    check_wandb(args)
    log(f"argv: {' '.join(sys.argv[1:])}")
    if extra:
        log(f"accepted slime flags (recorded, not used): {' '.join(extra)}")
    loaded = read_tracker(args.load) if args.load else None
    tracker = None if loaded is None else loaded[0]
    start = 0 if tracker is None else tracker + 1
    # slime#1558: --load restored the weights, but the rollout count restarted at 0. Only a
    # numbered checkpoint (a resume), not the converted base (`release`).
    if faults.resume_at_zero and loaded is not None and loaded[1].name != "release" \
            and faults.fire("resume_at_zero"):
        log(f"[demo fault] loaded iteration {tracker}, but rollouts restart at 0 (slime#1558)")
        start = 0
    end = args.num_rollout
    saver: AsyncSaver | None = None
    if args.async_save and not args.use_persistent_ckpt_worker:
        # Megatron's validate_args (megatron/training/arguments.py, "if args.use_dist_ckpt and
        # args.async_save"): a warning on stderr, then every save is synchronous. slime since
        # 8f732538 (2026-06) sets the worker itself; older slime, as this stand-in, does not.
        warnings.warn("--async-save is not supported without --use-persistent-ckpt-worker. "
                      "Disabling --async-save.", UserWarning, stacklevel=1)
        sys.stderr.flush()
    elif args.async_save:
        saver = AsyncSaver(Path(args.save), args.seed, faults)
    log(f"start_rollout_id={start} num_rollout={end} load={args.load} tracker={tracker}")
    cfg = read_custom_config(args.custom_config_path) if args.custom_config_path else {}
    # slime's order: the rollout manager starts the SGLang engines first, then the training
    # models load; the engines' "Uvicorn running" line is the last line slime#1484 printed.
    engine = Engine()
    if faults.hang_after_engines_at == start and faults.fire("hang_after_engines"):
        stall_forever(f"hang after the engines started, before rollout {start} (slime#1484)")
    rollouts = Rollouts(cfg, args.seed, engine)
    step_s = c.env_float("DEMO_STEP_SECONDS", 0.05)
    # A real round's job log is tens of MiB of SGLang request lines (issue 27): spread evenly.
    chatter = int((c.env_float("DEMO_LOG_MIB", 0.0) or 0.0) * 2**20) // max(1, end - start)
    train_lines = max(0, c.env_int("DEMO_TRAIN_LINES", 2) or 0)
    for rollout_id in range(start, end):
        t0 = time.monotonic()
        if faults.crash_at == rollout_id and faults.fire("crash_at"):
            if faults.leak_leases:
                rollouts.run(rollout_id, leak=True)
                log("[demo fault] leased ShopSim slots that will never be released")
            touch = os.environ.get("DEMO_TOUCH_ON_CRASH")
            if touch and args.custom_config_path:  # an input of emit/check edited before the relaunch
                with open(args.custom_config_path, "a") as fh:
                    fh.write("\n# edited before the relaunch (DEMO_TOUCH_ON_CRASH)\n")
                Path(touch).write_text("touched\n")
            log(f"[demo fault] crashing at rollout {rollout_id}")
            os._exit(1)
        if faults.stall_at == rollout_id and faults.fire("stall_at"):
            stall_forever(f"stall at rollout {rollout_id}")
        slow = faults.slow_factor if faults.slow_at == rollout_id else 1.0
        if slow != 1.0:
            log(f"[demo fault] rollout {rollout_id} runs {slow}x slower, its signals moving")
        engine.slow = slow
        results = rollouts.run(rollout_id, leak=False)
        engine.slow = 1.0
        if chatter:
            engine_chatter(chatter)
        rewards = [r["reward"] for r in results if "reward" in r]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        # slime's training (megatron_utils/actor.py train_actor): `Timer train start`, the
        # forward-only log-prob passes of the reference and the actor model (`Timer
        # ref_log_probs` / `Timer log_probs`), the rollout's data (slime#1487's last lines:
        # `rollout 16: {...}`, `passrate 16`, `Timer actor_train start`), then a line per
        # optimizer step (model.py). A pass over the rollout's samples forward only costs about
        # a sixth of the training time, the optimizer steps with full recompute the rest.
        train_s = step_s * slow
        slime_log("Timer train start", "timer.py:24")
        for name in ("ref_log_probs", "log_probs"):
            slime_log(f"Timer {name} start", "timer.py:24")
            time.sleep(train_s * LOG_PROB_SHARE)
            slime_log(f"Timer {name} end (elapsed: {train_s * LOG_PROB_SHARE:.1f}s)", "timer.py:24")
        slime_log(f"rollout {rollout_id}: {{\"rollout/reward\": {mean:.4f}, \"rollout/num_rollout\": {end}}}",
                  "train_metric_utils.py:0")
        slime_log("Timer actor_train start", "timer.py:24")
        if faults.hang_in_train_at == rollout_id and faults.fire("hang_in_train"):
            stall_forever(f"hang in training after rollout {rollout_id} (slime#1487)")
        optim_s = train_s * (1 - 2 * LOG_PROB_SHARE)
        for k in range(train_lines):
            time.sleep(optim_s / (train_lines + 1))
            slime_log(f"step {rollout_id * train_lines + k}: {{\"train/loss\": 0.0, \"train/grad_norm\": 1.0}}",
                      "model.py:0")
        time.sleep(optim_s / (train_lines + 1))
        slime_log(f"Timer actor_train end (elapsed: {optim_s:.1f}s)", "timer.py:24")
        slime_log(f"Timer train end (elapsed: {train_s:.1f}s)", "timer.py:24")
        rollouts.record(rollout_id, results)
        step_time = time.monotonic() - t0
        slime_log(f"perf {rollout_id}: {{\"perf/step_time\": {step_time:.3f}}}", "rollout_metrics.py:0")
        # slime's rule (train.py + utils/misc.py should_run_periodic_action, since PR #1143): every
        # `save_interval` rollouts, and always at the last one (daemon/round/saves.py has the lines).
        if args.save_interval is not None and ((rollout_id + 1) % args.save_interval == 0 or rollout_id == end - 1):
            timed_save(args, rollout_id, faults, saver, force_sync=rollout_id == end - 1)
        if (faults.leak_leases and faults.crash_at is None and rollout_id == end - 1
                and faults.fire("leak_leases")):
            rollouts.run(rollout_id, leak=True)
            log("[demo fault] exiting without releasing leased ShopSim slots")
            return 0
    log(f"training finished: {max(0, end - start)} rollout(s)")
    return 0


if __name__ == "__main__":
    c.run_main(PROG, main)
