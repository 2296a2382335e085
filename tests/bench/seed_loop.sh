#!/usr/bin/env bash
# The BASELINE of tests/bench: a faithful bash port of ShopSimRL's scripts/run_full_train.sh
# (github.com/XBQNRCM/ShopSimRL; ../shared/SHOPSIMRL.md, "One round"), run over the demo
# stand-ins (run/demo/*.py) instead of slime, SGLang, ShopSimulator and the ShopSimRL tools.
#
# The control flow is the seed's, function for function and line for line: .env loaded by
# the same loop, RESUME_ROUND checks, restore_loop_inputs (which cannot resume after an
# incomplete gate), ensure_shopsim (HTTP status only), the for-loop over rounds, the
# tracker-based skip, the sidecar with its stop file, slime with --num-rollout (i+1)*20+1,
# --save-interval 10000 and --load (base for round 0, then the save dir), prune (keep the
# tracker's iter only), stop_analyst, analyze, serve_checkpoint (120 x 2 s on /v1/models),
# bare val, online-gate (its exit status decides: "gate incomplete; keep current
# skillbank"), stop_sglang, build-curriculum. `set -euo pipefail` as the seed: a crash of
# slime (or of any tool that exits non-zero) aborts the script, and a human must rerun it
# with RESUME_ROUND=k.
#
# What differs, and why (each also marked "PORT:" below):
# - Programs: the demo stand-ins, through "$PYTHON -S" (and the bench's shim, $SHIM, when set,
#   which paces and injects faults identically for this script and for shoprld).
# - No conda, setup_sys_cache.sh, nvidia-smi check, `ray start/stop --force`, `rm -rf /tmp/ray`:
#   the stand-ins use no GPUs and no Ray. run_shopsimrl_slime.sh is inlined as
#   run_shopsimrl_slime(): its `training check`, then slime's train.py stand-in.
# - stop_sglang: the seed kills the recorded pid and then runs `pkill -f sglang.launch_server`
#   (kill by name). We may not kill by name, so the server is started in its own session and
#   its whole process group is signalled; the effect (server and scheduler gone) is the same.
# - serve_checkpoint's probe: the seed waits on /v1/models. Real SGLang binds its port only
#   after loading, so /v1/models answering implies loaded weights; the stand-in binds before
#   loading, so the probe also asks /get_model_info to reproduce the real ordering.
# - The stand-in emit needs the URLs, the val sizes and the seed that the real emit takes
#   from its own defaults; they are passed as shoprld's demo recipe passes them.
# - Sleeps of the seed (2 s polls) are divided by $SCALE (the bench replays time 1000x faster).
#
# Inputs (environment): PROJECT_ROOT (the stand-in checkout: .env, artifacts/cold-start),
# PYTHON, DEMO_DIR, TRAIN_LOAD (the converted base), HF_CHECKPOINT, SHOPSIM_PORT, SGLANG_PORT,
# SHOPSIM_ENV_SLOTS, STEPS_PER_ROUND, NUM_ROUNDS, RESUME_ROUND, VAL_TASKS, VAL_CONCURRENCY,
# EPISODE_CONCURRENCY, SEED, SCALE, SHIM (optional).
set -euo pipefail

PROJECT_ROOT="${PROJECT_ROOT:?PROJECT_ROOT (the stand-in checkout) is required}"
cd "${PROJECT_ROOT}"

# PORT: the demo stand-ins instead of the conda envs and the real programs.
PYTHON="${PYTHON:-python3}"
DEMO_DIR="${DEMO_DIR:?DEMO_DIR (run/demo) is required}"
PYRUN=("${PYTHON}" -S)
if [[ -n "${SHIM:-}" ]]; then
  PYRUN+=("${SHIM}")
fi
SCALE="${SCALE:-1}"
SLEEP_2="$(awk -v s="${SCALE}" 'BEGIN { printf "%.4f", 2 / s }')"

ENV_FILE="${PROJECT_ROOT}/.env"
[[ -f "${ENV_FILE}" ]] || { echo "missing ${ENV_FILE}" >&2; exit 2; }
while IFS= read -r line || [[ -n "${line}" ]]; do
  line="${line%$'\r'}"
  [[ -z "${line}" || "${line}" == \#* ]] && continue
  export "${line?}"
done < "${ENV_FILE}"
: "${WANDB_API_KEY:?WANDB_API_KEY missing in .env}"

export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1,2,3}"
export NUM_GPUS="${NUM_GPUS:-4}"
export TP_SIZE="${TP_SIZE:-2}"
export ROLLOUT_TP_SIZE="${ROLLOUT_TP_SIZE:-1}"
export ROLLOUT_BATCH_SIZE="${ROLLOUT_BATCH_SIZE:-16}"
export N_SAMPLES_PER_PROMPT="${N_SAMPLES_PER_PROMPT:-8}"
export OVER_SAMPLING_BATCH_SIZE="${OVER_SAMPLING_BATCH_SIZE:-32}"
export GLOBAL_BATCH_SIZE="${GLOBAL_BATCH_SIZE:-64}"
export SAVE_INTERVAL="${SAVE_INTERVAL:-10000}"
export WANDB_PROJECT="${WANDB_PROJECT:-shopsimrl}"
export WANDB_GROUP="${WANDB_GROUP:-qwen35-4b-train-100}"
export WANDB_MODE="${WANDB_MODE:-online}"
export WANDB_DIR="${WANDB_DIR:-${PROJECT_ROOT}/runs/wandb}"
export HF_CHECKPOINT="${HF_CHECKPOINT:?HF_CHECKPOINT (the origin HF dir) is required}"
export TRAIN_SAVE="${TRAIN_SAVE:-${PROJECT_ROOT}/runs/slime-qwen35-4b}"
export SAVE_HF="${SAVE_HF:-${PROJECT_ROOT}/runs/slime-qwen35-4b-hf}"
export SHOPSIM_ENV_SLOTS="${SHOPSIM_ENV_SLOTS:-48}"
export SHOPSIM_PORT="${SHOPSIM_PORT:-5700}"
STEPS_PER_ROUND="${STEPS_PER_ROUND:-20}"
NUM_ROUNDS="${NUM_ROUNDS:-5}"
RESUME_ROUND="${RESUME_ROUND:-0}"
SGLANG_PORT="${SGLANG_PORT:-30000}"
SHOPSIM_HEALTH="http://127.0.0.1:${SHOPSIM_PORT}/healthz"
INITIAL_SKILLBANK="${INITIAL_SKILLBANK:-${PROJECT_ROOT}/artifacts/cold-start/selected_skillbank.json}"
INITIAL_CURRICULUM="${INITIAL_CURRICULUM:-${PROJECT_ROOT}/artifacts/cold-start/curriculum.json}"
# PORT: TASK_DATA of run_shopsimrl_slime.sh (init-cold-start writes it next to the cold start).
TASK_DATA="${TASK_DATA:-${PROJECT_ROOT}/artifacts/cold-start/train_tasks.jsonl}"
# PORT: what the stand-in emit needs on its command line (shoprld's demo recipe passes the same).
EPISODE_CONCURRENCY="${EPISODE_CONCURRENCY:-4}"
VAL_TASKS="${VAL_TASKS:-40}"
VAL_CONCURRENCY="${VAL_CONCURRENCY:-8}"
SEED="${SEED:-20260830}"

# PORT: the nvidia-smi GPU count check is omitted (the stand-ins need no GPU).

mkdir -p "${TRAIN_SAVE}" "${SAVE_HF}" "${WANDB_DIR}" "${PROJECT_ROOT}/runs"

latest_iter() {
  local tracker="${TRAIN_SAVE}/latest_checkpointed_iteration.txt"
  [[ -f "${tracker}" ]] || { echo 0; return; }
  local raw
  raw="$(tr -d '[:space:]' < "${tracker}")"
  if [[ "${raw}" =~ ^iter_([0-9]+)$ ]]; then
    echo "$((10#${BASH_REMATCH[1]}))"
  elif [[ "${raw}" =~ ^[0-9]+$ ]]; then
    echo "$((10#${raw}))"
  else
    echo 0
  fi
}

restore_loop_inputs() {
  local start="$1"
  if (( start == 0 )); then
    skillbank="${INITIAL_SKILLBANK}"
    curriculum="${INITIAL_CURRICULUM}"
    history_ledger=""
    return
  fi
  local prev
  prev="$(printf 'round-%03d' "$((start - 1))")"
  local selected="${PROJECT_ROOT}/runs/${prev}-online-gate/selected_skillbank.json"
  # The seed's dead end: after an incomplete gate there is no selected_skillbank.json, and
  # nothing recorded which SkillBank was kept, so this round cannot be resumed.
  [[ -f "${selected}" ]] || {
    echo "RESUME_ROUND=${start} missing ${selected}" >&2
    exit 2
  }
  skillbank="${selected}"
  curriculum="${PROJECT_ROOT}/runs/$(printf 'round-%03d' "${start}")/curriculum.json"
  [[ -f "${curriculum}" ]] || {
    echo "RESUME_ROUND=${start} missing ${curriculum}" >&2
    exit 2
  }
  local gate_ledger="${PROJECT_ROOT}/runs/${prev}-online-gate/proposal_ledger.jsonl"
  local analysis_ledger="${PROJECT_ROOT}/runs/${prev}-online-analysis/proposal_ledger.jsonl"
  if [[ -f "${gate_ledger}" ]]; then
    history_ledger="${gate_ledger}"
  elif [[ -f "${analysis_ledger}" ]]; then
    history_ledger="${analysis_ledger}"
  else
    history_ledger=""
  fi
}

[[ "${RESUME_ROUND}" =~ ^[0-9]+$ ]] || {
  echo "RESUME_ROUND must be a non-negative integer" >&2
  exit 2
}
(( RESUME_ROUND < NUM_ROUNDS )) || {
  echo "RESUME_ROUND=${RESUME_ROUND} is past NUM_ROUNDS=${NUM_ROUNDS}" >&2
  exit 2
}
existing_iter="$(latest_iter)"
if (( RESUME_ROUND == 0 )); then
  if (( existing_iter > 0 )); then
    echo "TRAIN_SAVE already has checkpoint ${existing_iter}; clear ${TRAIN_SAVE} or set RESUME_ROUND" >&2
    exit 2
  fi
else
  min_iter=$((RESUME_ROUND * STEPS_PER_ROUND))
  if (( existing_iter < min_iter )); then
    echo "RESUME_ROUND=${RESUME_ROUND} needs iter >= ${min_iter}, have ${existing_iter}" >&2
    exit 2
  fi
fi

ensure_shopsim() {
  # The seed checks the HTTP status only (never `ready`), as here.
  if curl -sf -m 3 "${SHOPSIM_HEALTH}" >/dev/null; then
    return
  fi
  echo "starting ShopSimulator on :${SHOPSIM_PORT} slots=${SHOPSIM_ENV_SLOTS}"
  # PORT: shop_env/start.sh (which execs the Flask app) -> the stand-in, same variables.
  SHOPSIM_ENV_SLOTS="${SHOPSIM_ENV_SLOTS}" \
    SHOPSIM_PORT="${SHOPSIM_PORT}" \
    SHOPSIM_HOST=127.0.0.1 \
    SHOPSIM_RUNS_ROOT="${PROJECT_ROOT}/runs" \
    nohup "${PYRUN[@]}" "${DEMO_DIR}/shopsim.py" \
    > "${PROJECT_ROOT}/runs/shopsim-env.log" 2>&1 &
  echo $! > "${PROJECT_ROOT}/runs/shopsim-env.pid"
  for _ in $(seq 1 60); do
    curl -sf -m 3 "${SHOPSIM_HEALTH}" >/dev/null && return
    sleep "${SLEEP_2}"
  done
  echo "ShopSimulator did not become ready; see ${PROJECT_ROOT}/runs/shopsim-env.log" >&2
  exit 1
}

prune_checkpoints() {
  "${PYTHON}" -S - <<'PY'
import os, shutil
from pathlib import Path
save = Path(os.environ["TRAIN_SAVE"])
tracker = save / "latest_checkpointed_iteration.txt"
if not tracker.is_file():
    raise SystemExit(f"missing {tracker}")
raw = tracker.read_text(encoding="utf-8").strip()
if raw.startswith("iter_"):
    keep = raw
elif raw.isdigit():
    keep = f"iter_{int(raw):07d}"
else:
    raise SystemExit(f"unrecognized tracker value {raw!r} in {tracker}")
removed = []
for path in save.iterdir():
    if path.is_dir() and path.name.startswith("iter_") and path.name != keep:
        shutil.rmtree(path)
        removed.append(path.name)
print(f"kept {keep}; removed {removed or 'nothing'}")
PY
}

stop_sglang() {
  if [[ -f "${PROJECT_ROOT}/runs/sglang-val.pid" ]]; then
    local pid
    pid="$(cat "${PROJECT_ROOT}/runs/sglang-val.pid")"
    kill "${pid}" >/dev/null 2>&1 || true
    # PORT: the seed follows with `pkill -f "sglang.launch_server"` (kill by name, which hits
    # every SGLang on the box). The server runs in its own session here, so its process group
    # is exactly the server and its scheduler: signal the group instead.
    kill -TERM -- "-${pid}" >/dev/null 2>&1 || true
    rm -f "${PROJECT_ROOT}/runs/sglang-val.pid"
  fi
}

stop_analyst() {
  local pid_file="${PROJECT_ROOT}/runs/analyst.pid"
  local stop_file="${PROJECT_ROOT}/runs/analyst.stop"
  if [[ -f "${pid_file}" ]]; then
    touch "${stop_file}"
    local pid
    pid="$(tr -d '[:space:]' < "${pid_file}")"
    if [[ "${pid}" =~ ^[1-9][0-9]*$ ]] && kill -0 "${pid}" 2>/dev/null; then
      wait "${pid}" 2>/dev/null || true
    fi
    rm -f "${pid_file}"
  fi
  rm -f "${stop_file}"
}

serve_checkpoint() {
  stop_sglang
  [[ -d "${SAVE_HF}" && -f "${SAVE_HF}/config.json" ]] || {
    echo "missing HF export at ${SAVE_HF}; slime --save-hf should have written it" >&2
    exit 1
  }
  echo "serving ${SAVE_HF} on :${SGLANG_PORT} tp=${ROLLOUT_TP_SIZE} dp=$((NUM_GPUS / ROLLOUT_TP_SIZE))"
  # PORT: `python3 -m sglang.launch_server` -> the stand-in, same flags; setsid so that
  # stop_sglang can signal its process group (see there).
  CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES}" nohup setsid "${PYRUN[@]}" "${DEMO_DIR}/valserver.py" \
    --model-path "${SAVE_HF}" \
    --host 127.0.0.1 \
    --port "${SGLANG_PORT}" \
    --served-model-name Qwen/Qwen3.5-4B \
    --tool-call-parser qwen3_coder \
    --reasoning-parser qwen3 \
    --mem-fraction-static "${SGLANG_MEM_FRACTION:-0.7}" \
    --tp "${ROLLOUT_TP_SIZE}" \
    --dp-size "$((NUM_GPUS / ROLLOUT_TP_SIZE))" \
    > "${PROJECT_ROOT}/runs/sglang-val.log" 2>&1 &
  echo $! > "${PROJECT_ROOT}/runs/sglang-val.pid"
  for _ in $(seq 1 120); do
    # PORT: + /get_model_info, because the stand-in binds before loading (see the header).
    curl -sf -m 3 "http://127.0.0.1:${SGLANG_PORT}/v1/models" >/dev/null \
      && curl -sf -m 3 "http://127.0.0.1:${SGLANG_PORT}/get_model_info" | grep '"weights_fingerprint": "' >/dev/null \
      && return
    sleep "${SLEEP_2}"
  done
  echo "sglang val server did not become ready; see ${PROJECT_ROOT}/runs/sglang-val.log" >&2
  exit 1
}

# PORT: scripts/run_shopsimrl_slime.sh, inlined: its own pre-flight (`training check` must say
# ready), then `ray job submit ... -- python3 train.py ...`, which blocks; here the train.py
# stand-in runs in the foreground with the seed's checkpoint, rollout and W&B arguments.
run_shopsimrl_slime() {
  local verdict
  verdict="$("${PYRUN[@]}" "${DEMO_DIR}/shopsimrl.py" training check "${CUSTOM_CONFIG}" --task-data "${TASK_DATA}")"
  [[ "${verdict}" == *'"ready"'* ]] || { echo "training check: ${verdict}" >&2; exit 1; }
  "${PYRUN[@]}" "${DEMO_DIR}/slime_train.py" \
    --hf-checkpoint "${HF_CHECKPOINT}" --load "${TRAIN_LOAD}" --save "${TRAIN_SAVE}" \
    --save-interval "${SAVE_INTERVAL}" --save-hf "${SAVE_HF}" \
    --custom-config-path "${CUSTOM_CONFIG}" \
    --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}" \
    --over-sampling-batch-size "${OVER_SAMPLING_BATCH_SIZE}" --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" \
    --global-batch-size "${GLOBAL_BATCH_SIZE}" --tensor-model-parallel-size "${TP_SIZE}" \
    --use-wandb --wandb-mode "${WANDB_MODE}" --wandb-project "${WANDB_PROJECT}" \
    --wandb-group "${WANDB_GROUP}" --wandb-dir "${WANDB_DIR}" --disable-wandb-random-suffix
}

ensure_shopsim
# PORT: the seed's trap also runs `ray stop --force` (no Ray here).
trap 'stop_analyst; stop_sglang' EXIT

skillbank="${INITIAL_SKILLBANK}"
curriculum="${INITIAL_CURRICULUM}"
history_ledger=""
restore_loop_inputs "${RESUME_ROUND}"
if (( RESUME_ROUND > 0 )); then
  export TRAIN_LOAD="${TRAIN_SAVE}"
  echo "===== resume from ${RESUME_ROUND} skillbank=${skillbank} curriculum=${curriculum} iter=$(latest_iter) ====="
  prune_checkpoints
else
  export TRAIN_LOAD="${TRAIN_LOAD:?TRAIN_LOAD (the converted base model) is required}"
fi

for (( i = RESUME_ROUND; i < NUM_ROUNDS; i++ )); do
  round_id="$(printf 'round-%03d' "${i}")"
  next_id="$(printf 'round-%03d' "$((i + 1))")"
  export NUM_ROLLOUT="$(( (i + 1) * STEPS_PER_ROUND + 1 ))"
  emit_args=(
    --project-root "${PROJECT_ROOT}"
    --round-id "${round_id}"
    --skillbank "${skillbank}"
    --curriculum "${curriculum}"
  )
  if [[ -n "${history_ledger}" ]]; then
    emit_args+=(--history-ledger "${history_ledger}")
  fi
  # PORT: + the stand-in emit's URL, size and seed flags (see the header).
  emit_args+=(
    --shopsim-url "http://127.0.0.1:${SHOPSIM_PORT}" --val-url "http://127.0.0.1:${SGLANG_PORT}"
    --episode-concurrency "${EPISODE_CONCURRENCY}" --val-tasks "${VAL_TASKS}"
    --val-concurrency "${VAL_CONCURRENCY}" --seed "${SEED}"
  )
  "${PYRUN[@]}" "${DEMO_DIR}/shopsimrl.py" emit "${emit_args[@]}"
  export CUSTOM_CONFIG="${PROJECT_ROOT}/runs/loop/${round_id}/slime.yaml"

  expected_iter=$(( (i + 1) * STEPS_PER_ROUND ))
  if (( $(latest_iter) >= expected_iter )); then
    echo "===== ${round_id} slime already saved iter $(latest_iter) (>= ${expected_iter}); skip ====="
    export TRAIN_LOAD="${TRAIN_SAVE}"
    prune_checkpoints
  else
    echo "===== ${round_id} slime NUM_ROLLOUT=${NUM_ROLLOUT} load=${TRAIN_LOAD} ====="
    rm -f "${PROJECT_ROOT}/runs/analyst.stop" "${PROJECT_ROOT}/runs/analyst.pid"
    "${PYRUN[@]}" "${DEMO_DIR}/shopsimrl.py" training watch-analyze \
      "${PROJECT_ROOT}/runs/loop/${round_id}/analysis.yaml" \
      --stop-file "${PROJECT_ROOT}/runs/analyst.stop" \
      > "${PROJECT_ROOT}/runs/loop/${round_id}/analyst.log" 2>&1 &
    echo $! > "${PROJECT_ROOT}/runs/analyst.pid"
    run_shopsimrl_slime
    prune_checkpoints
    export TRAIN_LOAD="${TRAIN_SAVE}"
    stop_analyst
  fi

  echo "===== ${round_id} compile cards / bare val / gate ====="
  # Analyst failure writes a current-skill-only pool and still continues to val/gate.
  "${PYRUN[@]}" "${DEMO_DIR}/shopsimrl.py" training analyze \
    "${PROJECT_ROOT}/runs/loop/${round_id}/analysis.yaml" \
    --wandb \
    --wandb-project "${WANDB_PROJECT}" \
    --wandb-group "${WANDB_GROUP}" \
    --wandb-mode "${WANDB_MODE}" \
    --wandb-dir "${WANDB_DIR}"
  serve_checkpoint
  "${PYRUN[@]}" "${DEMO_DIR}/shopsimrl.py" run \
    "${PROJECT_ROOT}/runs/loop/${round_id}/val.yaml"
  set +e
  "${PYRUN[@]}" "${DEMO_DIR}/shopsimrl.py" training online-gate \
    "${PROJECT_ROOT}/runs/loop/${round_id}/gate.yaml" \
    --wandb \
    --wandb-project "${WANDB_PROJECT}" \
    --wandb-group "${WANDB_GROUP}" \
    --wandb-mode "${WANDB_MODE}" \
    --wandb-dir "${WANDB_DIR}"
  gate_status=$?
  set -e
  stop_sglang

  selected="${PROJECT_ROOT}/runs/${round_id}-online-gate/selected_skillbank.json"
  gate_ledger="${PROJECT_ROOT}/runs/${round_id}-online-gate/proposal_ledger.jsonl"
  analysis_ledger="${PROJECT_ROOT}/runs/${round_id}-online-analysis/proposal_ledger.jsonl"
  if [[ -f "${gate_ledger}" ]]; then
    history_ledger="${gate_ledger}"
  elif [[ -f "${analysis_ledger}" ]]; then
    history_ledger="${analysis_ledger}"
  fi
  if (( gate_status == 0 )) && [[ -f "${selected}" ]]; then
    skillbank="${selected}"
    echo "${round_id} gate complete; next skillbank ${selected}"
  else
    echo "${round_id} gate incomplete; keep current skillbank for ${next_id}" >&2
  fi
  if (( i + 1 < NUM_ROUNDS )); then
    next_curriculum="${PROJECT_ROOT}/runs/${next_id}/curriculum.json"
    mkdir -p "$(dirname "${next_curriculum}")"
    "${PYRUN[@]}" "${DEMO_DIR}/shopsimrl.py" training build-curriculum \
      "${skillbank}" \
      "${next_curriculum}" \
      --round-id "${next_id}" \
      --skill-free-probability 0.20 \
      --rho-min 0.20 \
      --rho-max 0.90
    curriculum="${next_curriculum}"
  fi
done

echo "finished ${NUM_ROUNDS} rounds, ${STEPS_PER_ROUND} steps each"
