#!/usr/bin/env bash
# The GPU smoke (issue 11): the ONE script the device command calls, from the repo root.
#
#   bash run/gpu-smoke/smoke.sh          # results land in $OUT (the device's return folder)
#
# 1. installs the carried wheels (.whl/: megatron-core, shoprld and its deps) into /tmp/site;
# 2. records the machine (nvidia-smi, torch, megatron-core, disk);
# 3. (formerly patched the installed engine for megatron-core 0.19's missing common.pt; the
#    engine now handles it);
# 4. preflight: a tiny model through train_mcore.py twice (fresh, then resume), the exporter and
#    deep_verify; megatron-core's optimizer, else the torch fallback;
# 5. lays out a demo-like tree in $SMOKE_DIR with run/gpu-smoke/campaign.toml (free ports, every
#    GPU, TP = GPU count) and runs the 3-round campaign with `shoprld run`, while monitor.py
#    SIGKILLs the trainer during the saves of SMOKE_KILL_AT (default 5,7: the first attempt of
#    round 1 during iter 5's save, its relaunch during iter 7's) and deep-verifies every commit;
# 6. writes smoke_report.json, status.json, journal.jsonl, train_logs.txt, smoke.log (tail) to $OUT.
#
# Knobs: OUT, SMOKE_DIR (/tmp/gsmoke), SMOKE_PY (python3), SMOKE_KILL_AT (5,7),
# SMOKE_DAEMON_TIMEOUT (seconds, 420), SMOKE_DEVICE (cuda | cpu-emulate:
# tests only), SMOKE_NGPU (default: torch's device count), SMOKE_MODEL ("hidden layers heads vocab
# seq", default "1024 8 16 32768 512"), SMOKE_PREFLIGHT (1), SMOKE_SKIP_INSTALL (0).
set -u -o pipefail
T0=$(date +%s)
REPO=$(pwd)
HERE=$REPO/run/gpu-smoke
OUT=${OUT:-/tmp/gsmoke-out}
W=${SMOKE_DIR:-/tmp/gsmoke}
PY=${SMOKE_PY:-python3}
DEVICE=${SMOKE_DEVICE:-cuda}
KILL_AT=${SMOKE_KILL_AT:-5,7}
PATCH=0  # the engine needs no patch any more (see step 3)
DTIMEOUT=${SMOKE_DAEMON_TIMEOUT:-420}
read -r HID LAYERS HEADS VOCAB SEQ <<<"${SMOKE_MODEL:-1024 8 16 32768 512}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
log() { echo "[smoke $(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }

# -- 1. wheels -------------------------------------------------------------------------------
if [ "${SMOKE_SKIP_INSTALL:-0}" != 1 ]; then
  rm -rf /tmp/site
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$REPO"/.whl/*.whl || { log "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/site/bin:$PATH
fi
log "installed; shoprld from $($PY -c 'import shoprld.daemon as d; print(d.__file__)')"
rm -rf "$W"; mkdir -p "$W"

# -- 2. the machine ----------------------------------------------------------------------------
$PY - "$W/env.json" <<'EOF'
import json, shutil, subprocess, sys, platform
env = {"python": sys.version.split()[0], "platform": platform.platform()}
try:
    env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used,driver_version",
                                        "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
except Exception as exc:
    env["nvidia_smi"] = f"unavailable: {exc}"
try:
    import torch
    env.update(torch=torch.__version__, cuda=torch.version.cuda, gpus=torch.cuda.device_count())
except Exception as exc:
    env["torch"] = f"unavailable: {exc}"
try:
    from importlib.metadata import version
    env["megatron_core"] = version("megatron-core")
    env["safetensors"] = version("safetensors")
except Exception as exc:
    env["megatron_core"] = f"unavailable: {exc}"
du = shutil.disk_usage("/tmp")
env["tmp_disk"] = {"total_gib": round(du.total / 2**30, 1), "free_gib": round(du.free / 2**30, 1)}
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env))
EOF
if [ "$DEVICE" = cuda ]; then
  NGPU=${SMOKE_NGPU:-$($PY -c 'import torch; print(torch.cuda.device_count())')}
else
  NGPU=${SMOKE_NGPU:-2}
fi
[ "${NGPU:-0}" -ge 1 ] || { log "no GPU visible"; exit 1; }
GPUS=$($PY -c "print(', '.join(str(i) for i in range($NGPU)))")
log "GPUs: $NGPU ([$GPUS]); device=$DEVICE; model: hidden=$HID layers=$LAYERS heads=$HEADS vocab=$VOCAB seq=$SEQ"

# -- 3. the engine change megatron-core 0.19 needs ---------------------------------------------
CKPY=$($PY -c 'import shoprld.daemon.foundation.storage.checkpoints as c; print(c.__file__)')
# (The device run of 2026-11-30 patched the installed copy here; the fix is now in
# daemon/foundation/storage/checkpoints.py itself, so nothing is patched any more.)
: "$CKPY"

# -- 4. preflight: tiny model, fresh + resume, exporter, deep_verify ---------------------------
OPT=megatron
if [ "${SMOKE_PREFLIGHT:-1}" = 1 ]; then
  PF=$W/preflight; mkdir -p "$PF"
  pf_run() {  # $1 optimizer, $2 num-rollout
    timeout 100 $PY -m torch.distributed.run --standalone --nproc-per-node "$NGPU" "$HERE/train_mcore.py" \
      --load "$PF/save-$1" --save "$PF/save-$1" --save-interval 1 --num-rollout "$2" --hidden-size 256 \
      --num-layers 2 --num-attention-heads 4 --vocab-size 1024 --seq-length 128 --steps-per-rollout 2 \
      --optimizer "$1" --device "$DEVICE" >>"$PF/train-$1.log" 2>&1
  }
  PF_OK=""
  for opt in megatron torch; do
    t=$(date +%s)
    if pf_run $opt 2 && pf_run $opt 3; then
      PF_OK=$opt; log "preflight with --optimizer $opt passed in $(( $(date +%s) - t ))s"; break
    fi
    log "preflight with --optimizer $opt FAILED; tail:"; tail -n 25 "$PF/train-$opt.log"
  done
  [ -n "$PF_OK" ] || { log "preflight failed with both optimizers"; cp "$PF"/train-*.log "$OUT"/ 2>/dev/null; exit 1; }
  OPT=$PF_OK
  $PY "$HERE/export_dcp_to_hf.py" --input-dir "$PF/save-$OPT/iter_0000002" --output-dir "$PF/hf" >"$PF/export.log" 2>&1
  EXPORT_RC=$?
  $PY - "$PF" "$OPT" "$EXPORT_RC" "$REPO" <<'EOF'
import json, os, re, sys
from pathlib import Path
pf, opt, rc, repo = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
from shoprld.daemon.foundation.storage.checkpoints import scan
from shoprld.daemon.foundation.storage.deepverify import deep_verify
from shoprld.daemon.foundation.storage import hfexport
sys.path.insert(0, os.path.join(repo, "run", "demo"))
import _common
s = scan(pf / f"save-{opt}")
rec = {"optimizer": opt, "checkpoints": [(c.iteration, c.complete, c.bytes) for c in s.checkpoints],
       "files_iter2": sorted(os.listdir(pf / f"save-{opt}" / "iter_0000002")),
       "deep_verify_iter2": deep_verify(pf / f"save-{opt}" / "iter_0000002").__dict__,
       "export_rc": rc, "export_log": (pf / "export.log").read_text()[-600:],
       "train_lines": [l for l in (pf / f"train-{opt}.log").read_text(errors="replace").splitlines()
                       if re.match(r"(rollout|saved|loaded|optimizer:|parameters:|no tracker|train_mcore)", l)]}
try:
    rec["hfexport_verify"] = hfexport.verify(pf / "hf").detail
    rec["valserver_fingerprint"] = _common.validate_hf_dir(pf / "hf")
except Exception as exc:
    rec["hf_error"] = f"{type(exc).__name__}: {exc}"
json.dump(rec, open(pf / "preflight.json", "w"), indent=1, default=str)
print(json.dumps(rec, default=str)[:3000])
EOF
fi

# -- 5. the campaign ---------------------------------------------------------------------------
T=$W/tree
$PY - "$T" "$HERE" "$GPUS" "$NGPU" "$OPT" "$DEVICE" "$HID" "$LAYERS" "$HEADS" "$VOCAB" "$SEQ" <<'EOF'
import re, shutil, sys
from pathlib import Path
from shoprld.daemon.ops.demo import _free_port, create_tree
tree, here, gpus, ngpu, opt, device, hid, layers, heads, vocab, seq = sys.argv[1:]
tree = Path(tree); tree.mkdir(parents=True, exist_ok=True)
create_tree(tree, fast=True)
text = (Path(here) / "campaign.toml").read_text()
text = text.replace("127.0.0.1:5700", f"127.0.0.1:{_free_port()}").replace("127.0.0.1:30000", f"127.0.0.1:{_free_port()}")
text = re.sub(r"^visible = \[.*\]$", f"visible = [{gpus}]", text, flags=re.M)
text = re.sub(r"^tp_size = \d+$", f"tp_size = {ngpu}", text, flags=re.M)
for k, v in (("optimizer", opt), ("train_device", device), ("hidden_size", hid), ("num_layers", layers),
             ("num_attention_heads", heads), ("vocab_size", vocab), ("seq_length", seq)):
    text = re.sub(rf'^{k} = ".*"$', f'{k} = "{v}"', text, flags=re.M)
(tree / "campaign.toml").write_text(text)
for f in ("train_mcore.py", "export_dcp_to_hf.py"):
    shutil.copy2(Path(here) / f, tree / f)
EOF
[ -f "$T/campaign.toml" ] || { log "tree setup failed"; exit 1; }
SAVE=$($PY -c "
from shoprld.daemon.foundation.config.config import load_config; from shoprld.daemon.foundation.records.layout import Layout
print(Layout.from_config(load_config('$T/campaign.toml')).save_dir)")
$PY -m shoprld.daemon.ops.cli check -c "$T/campaign.toml" >"$W/check.log" 2>&1; log "shoprld check rc=$? (tail below)"; tail -n 3 "$W/check.log"
log "campaign: $T/campaign.toml; save dir $SAVE; kill during the saves of iterations $KILL_AT"
mkdir -p "$T/torn"
D0=$(date +%s.%N)
timeout -s TERM -k 30 "$DTIMEOUT" $PY -m shoprld.daemon.ops.cli run -c "$T/campaign.toml" >"$W/daemon.log" 2>&1 &
DPID=$!
$PY "$HERE/monitor.py" --save-dir "$SAVE" --events "$W/monitor.jsonl" --torn-dir "$T/torn" --kill-at "$KILL_AT" \
    --daemon-pid "$DPID" --stop-file "$W/monitor.stop" >"$W/monitor.log" 2>&1 &
MPID=$!
( while kill -0 $DPID 2>/dev/null; do sleep 15; log "… $(tail -n 1 "$W/daemon.log" 2>/dev/null | cut -c1-160)"; done ) &
TPID=$!
wait $DPID; DRC=$?
D1=$(date +%s.%N)
touch "$W/monitor.stop"; wait $MPID; kill $TPID 2>/dev/null; wait $TPID 2>/dev/null
DS=$($PY -c "print(round($D1 - $D0, 1))")
log "daemon exit $DRC after ${DS}s"
tail -n 15 "$W/daemon.log"
# leftovers (a torchrun rank outlives a group kill: each rank has its own session)
ps -eo pid,pgid,sid,etimes,args | grep -E 'train_mcore|valserver|shopsim' | grep -v grep | tee "$W/leftovers.txt"

# -- 6. results --------------------------------------------------------------------------------
$PY -m shoprld.daemon.ops.cli status --json -c "$T/campaign.toml" >"$OUT/status.json" 2>"$W/status.err" || cp "$T/state/status.json" "$OUT/status.json"
cp "$T/state/journal.jsonl" "$OUT/journal.jsonl" 2>/dev/null
cat "$W/monitor.log" >>"$W/monitor.jsonl.log" 2>/dev/null
$PY "$HERE/report.py" --tree "$T" --events "$W/monitor.jsonl" --out "$OUT" --daemon-rc "$DRC" --daemon-s "$DS" \
    --preflight "$W/preflight/preflight.json" --env "$W/env.json" --patched "$PATCH"
{ echo "##### monitor events"; cat "$W/monitor.jsonl"; echo "##### monitor log"; cat "$W/monitor.log";
  echo "##### daemon log (tail)"; tail -n 200 "$W/daemon.log"; echo "##### check"; cat "$W/check.log";
  echo "##### leftovers"; cat "$W/leftovers.txt"; echo "##### du"; du -sh "$SAVE"/* "$T"/torn/* 2>/dev/null;
  echo "##### nvidia-smi"; nvidia-smi 2>&1 | head -30; } >"$OUT/details.txt" 2>&1
log "done in $(( $(date +%s) - T0 ))s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
