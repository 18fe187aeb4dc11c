#!/usr/bin/env bash
# zeroserve one-shot GPU check (docs/benchmarks.md, "GPU check (benchmarks/gpu_check.sh)").
# From the repository root on a machine with one CUDA GPU and no network:
#
#     bash benchmarks/gpu_check.sh
#
# Every stage runs under its own `timeout` (clamped to what is left of ZS_BUDGET_S), logs to
# $W/logs/<stage>.log, and a failed stage does not stop the rest; a stage the budget cannot
# hold is skipped with the reason. The stages, most important first (the last are dropped
# first when time runs short):
#   1. environment, the carried wheels, the models: /tmp/m135 (SmolLM2-135M's config,
#      random weights saved as safetensors), /tmp/l1b and /tmp/l8b (Llama-3.2-1B's and
#      Llama-3.1-8B's published configs and a 128,256-id tokenizer, no weights: served
#      with --load-format dummy)
#   2. the Triton/CUDA kernel tests on the GPU (pytest; ZS_PYTEST=0: skipped)
#   3. transformers: prompt-logprob reference (fp32 oracle, bf16 yardstick; m135, the model
#      with weights on disk) and the generate + static cache + torch.compile baseline,
#      batch 1 and 32 (l1b from its config, m135)
#   4. per model: launch.py --device cuda, start-up time to /health, the first request's
#      TTFT against the steady one (client.py first), correctness check (m135),
#      bench at 1, 8, 32, 128 streams (nvidia-smi at 32)
#   5. m135 served in float32: the fp32 correctness check
#   6. prefix cache: the same prompt twice (inside every correctness check)
#   7. a json_schema response_format request and a tool_choice "required" request
#   8. faults under load: 256 chat streams, a third disconnecting, a tenth invalid, some
#      with 20 top logprobs (client_faults.py); then kill -9 the scheduler under streaming
#      load; streams end, /health returns
#  8a. preemption: m135 with a 64-block KV pool under 16 greedy streams of 256 tokens
#      (client_preempt.py; ZS_PREEMPT=0: skipped)
#   9. an in-process profile of l1b (else l8b) decode steps (and of steps that admit a
#      prompt; ZS_PROFILE=0: skipped)
#  8b. every family (Gemma 3, Qwen3, GPT-2, ...) on the real kernels and graphs (pytest)
#  9a. decode attention's splits in CUDA graphs at 200 and 2000 keys: the bucket's cap of
#      splits against caps 2 and 1 (benchmarks/gpu/bench_decode_splits.py)
#  9b. top-p without a sort: the sampler's top-p step, main's full sort against the radix
#      search, at 256 x 128,256 / 256 x 49,152 / 32 x 128,256, chat and flat rows
#      (benchmarks/bench_top_p.py; ZS_TOP_P=0: skipped)
#  9c. the few-row GEMV against cuBLAS (F.linear) on the 1B and 8B shapes' linears at 1, 2,
#      4, 8 rows: µs, GB/s, the route's pick, K splits 1-16 at 1 row (bench_gemv.py; ZS_GEMV=0:
#      skipped; on a CPU dry run its plumbing under the interpreter, tiny shapes)
#  9e. the sampler's draw on the chat mix: the torch path against the one Triton launch
#      (backends/triton_sample.py), to the host and the host's enqueue, at 32 and 256 rows,
#      vocabularies 49,152 and 128,256 (bench_sampler.py --device cuda; ZS_SAMPLER=0: skipped)
#  9d. speculative decoding's verify step: 1 + k decode rows against a plain step, at 1, 8
#      and 32 rows, k 1, 3, 7, on l1b (else l8b) (bench_spec_verify.py; ZS_SPEC=0: skipped)
#  9f. speculation served beside the overlap: ngram A/B in one engine, m135 float32, 1
#      stream, workloads repeat, chat, self (bench_spec.py --device cuda; ZS_SPEC=0: skipped)
#  10. the host's share of a decode step, per row (benchmarks/bench_host_step.py), greedy
#      and the chat mix
# (after 4 for l1b: l1b again with one frontend, 32 streams: the A/B of the default's
# several frontends, ZS_AB_FRONTENDS=1)
#  11. ZS_STARTUP_MODEL (l8b): a cold start (an empty ZEROSERVE_CACHE_DIR: no compiled
#      kernel cached), stopped, then a warm one (the same dir), each with its first-request
#      check; the warm server is benched at ZS_CONC_8B (1,64)
# One run holds l1b and m135 in ~6 minutes; the 8B shape is a second run:
#     ZS_MODELS=l8b ZS_PYTEST=0 ZS_FP32_CHECK=0 ZS_GGUF_CHECK=0 bash benchmarks/gpu_check.sh
# (2 and 3 run side by side: the compile warm-up overlaps the tests and the reference, and
# the baseline is timed once the GPU is otherwise idle; see benchmarks/gpu/hf_compile.py.)
# Results in $OUT (at most 8 files): summary.txt (the table), summary.json, details.json,
# run.log, stages.log, servers.log, pytest.log, profile.txt.
#
# Knobs: ZS_BUDGET_S (330), ZS_WAVES (16 waves of requests a level), ZS_WHEELS (.gpu/whl), ZS_SKIP_INSTALL=1, ZS_PY (python3),
# ZS_MODELS ("l1b m135"; l8b: the 8B shape), ZS_CONC (1,8,32,128,256), ZS_CHAT_AT (128,256: those
# levels again with bench_serving --mix chat), ZS_OUTPUT_LEN (128, bench tokens out),
# ZS_STARTUP_MODEL (l8b: the model started cold then warm), ZS_CONC_8B (1,64), ZS_PYTEST (1),
# ZS_PROFILE (1), ZS_FIRST_STEADY (8: steady requests after the first), ZS_HF_BATCHES (1,32: the compile baseline's batch sizes),
# ZS_SERVER_FLAGS (extra launch.py flags), ZS_AB_FRONTENDS (1 on a GPU: l1b again with one
# frontend, at ZS_AB_CONC streams: 32),
# ZS_FP32_CHECK (1), ZS_PREEMPT (1: stage 8a), ZS_PREEMPT_TOKENS (256), ZS_HF_NEW_TOKENS (128), ZS_TOP_P (1: stage 9b), ZS_SAMPLER (1: stage 9e), ZS_GEMV (1: stage 9c), ZS_SPEC (1: stage 9d), ZS_FP8 (1: l1b_fp8 after l1b and l8b_fp8 after
# l8b, served with ZS_FP8_FLAGS, "--quantization fp8 --kv-cache-dtype fp8"; benched at ZS_CONC_FP8 1,256 and
# ZS_CONC_8B_FP8 1,64),
# ZS_HF_BASELINE=1 (hf_ref's uncompiled baseline too), ZS_WORK (/tmp/zs-gpu-work),
# ZS_MODEL_ROOT (/tmp), ZS_SITE (/tmp/site), ZS_GPU_CHECK_DEVICE=cpu (a local dry run:
# ZS_SERVER_FLAGS defaults to "--kernels torch", transformers is timed without compile,
# the kernel tests run under TRITON_INTERPRET=1, stage timeouts x3: ZS_TIMEOUT_SCALE; the
# dummy models get --max-model-len 2048, a CPU's KV pool).
set -u
T0=$(date +%s)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" # benchmarks/
G="$HERE/gpu"
ZS="${ZS_PROJECT:-$(cd "$HERE/.." && pwd)}" # the checkout
cd "$ZS" || exit 1
OUT="${OUT:-/tmp/zs-gpu-out}"
W="${ZS_WORK:-/tmp/zs-gpu-work}"
PY="${ZS_PY:-python3}"
DEV="${ZS_GPU_CHECK_DEVICE:-cuda}"
MODELS="${ZS_MODELS:-l1b m135}"
MODELS="${MODELS//,/ }"
BUDGET="${ZS_BUDGET_S:-330}"
WHL="${ZS_WHEELS:-$ZS/.gpu/whl}"
SITE="${ZS_SITE:-/tmp/site}"
MROOT="${ZS_MODEL_ROOT:-/tmp}"
CONC="${ZS_CONC:-1,8,32,128,256}"
CONC_8B="${ZS_CONC_8B:-1,64}"
STARTUP_MODEL="${ZS_STARTUP_MODEL:-l8b}"
DUMMY="l1b l8b" # config.json and a tokenizer only: --load-format dummy
OUTPUT_LEN="${ZS_OUTPUT_LEN:-128}"
FP32_CHECK="${ZS_FP32_CHECK:-1}"
HF_NEW="${ZS_HF_NEW_TOKENS:-128}"
if [ "$DEV" = cpu ]; then
  SERVER_FLAGS="${ZS_SERVER_FLAGS---kernels torch}"
  TRITON_MODE=1
  COMPILE_FLAG="--no-compile"
  SLOW="${ZS_TIMEOUT_SCALE:-3}"
  PAR=(env OMP_NUM_THREADS=1) # stages 2 and 3 share the cores: no OpenMP spin-waiting
else
  SERVER_FLAGS="${ZS_SERVER_FLAGS-}"
  TRITON_MODE=0
  COMPILE_FLAG=""
  SLOW="${ZS_TIMEOUT_SCALE:-1}"
  PAR=(env)
fi
HF_EXTRA="--no-baseline"
[ "${ZS_HF_BASELINE:-0}" = 1 ] && HF_EXTRA=""
RESERVE=12 # always kept back for the summary
HOLD=0     # kept back, on top of RESERVE, for what is still to come (set per stage)
mkdir -p "$OUT"
rm -rf "$W"
mkdir -p "$W/logs"
RUNLOG="$W/run.log"
: >"$W/stages.txt"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export ZEROSERVE_CACHE_DIR="$W/zs-cache"
export PYTHONPATH="$ZS"
BOOK="$ZS/benchmarks/data/pride_and_prejudice_ch1-6.txt"
declare -A PORT=([m135]=18731 [l1b]=18732 [m135_fp32]=18733 [m135_gguf]=18734 [l1b_1fe]=18735
  [l8b]=18736 [l8b_cold]=18737 [l1b_cold]=18738 [m135_cold]=18739
  [l1b_warm]=18740 [m135_warm]=18741 [l1b_fp8]=18742 [l8b_fp8]=18743 [m135_pre]=18744)
FP8="${ZS_FP8:-1}"
# the FP8 servers' flags; a CPU dry run has no FP8 KV cache (the GPU's: the start refuses it)
FP8_DEFAULT="--quantization fp8 --kv-cache-dtype fp8"
[ "$DEV" = cpu ] && FP8_DEFAULT="--quantization fp8"
FP8_FLAGS="${ZS_FP8_FLAGS-$FP8_DEFAULT}"

has_model() { [[ " $MODELS " == *" $1 "* ]] && [ -f "$MROOT/$1/config.json" ]; }
is_dummy() { [[ " $DUMMY " == *" $1 "* ]]; }
model_flags() { # MODEL: what launch.py needs for it beyond SERVER_FLAGS
  if is_dummy "$1"; then
    echo "--load-format dummy"
    [ "$DEV" = cpu ] && echo "--max-model-len 2048"
  fi
  return 0
}
elapsed() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - $(elapsed))); }
say() { echo "[$(elapsed)s] $*" | tee -a "$RUNLOG"; }
skip() { # NAME WHY...
  local name=$1
  shift
  say "SKIP $name: $*"
  echo "$name skip 0 $*" >>"$W/stages.txt"
}

# stage NAME TIMEOUT CMD...: CMD under `timeout` (times ZS_TIMEOUT_SCALE), clamped to the budget less RESERVE and
# HOLD; its output in $W/logs/NAME.log; rc 99 when there was no time to run it
stage() {
  local name=$1 want=$2
  shift 2
  local l to t rc
  l=$(left)
  to=$((want * SLOW))
  ((to > l - RESERVE - HOLD)) && to=$((l - RESERVE - HOLD))
  if ((to < 5)); then
    skip "$name" "budget (${l}s left, ${HOLD}s held for higher-priority stages)"
    return 99
  fi
  say ">>> $name (timeout ${to}s)"
  t=$(date +%s)
  timeout -k 5 "$to" "$@" >"$W/logs/$name.log" 2>&1
  rc=$?
  say "<<< $name rc=$rc ($(($(date +%s) - t))s)$( ((rc == 124)) && echo ' TIMED OUT')"
  if ((rc != 0)); then tail -n 15 "$W/logs/$name.log" | cut -c1-300 | sed 's/^/      /' | tee -a "$RUNLOG"; fi
  echo "$name $rc $(($(date +%s) - t))" >>"$W/stages.txt"
  return $rc
}

is_alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

children_of() { # pids whose parent is $1 (from /proc: no pgrep needed)
  local d
  for d in /proc/[0-9]*; do
    [ "$(awk '/^PPid:/{print $2}' "$d/status" 2>/dev/null)" = "$1" ] && echo "${d#/proc/}"
  done
}

SPID=""
STAG=""
SPAWN=""
SERVER_ENV=() # VAR=value words for the next server's environment (the cold / warm start)
start_server() { # TAG MODEL_DIR PORT [flags...]
  local tag=$1 model=$2 port=$3
  shift 3
  STAG=$tag
  SPAWN=$(date +%s.%N)
  # its own session (setsid): SIGTERM to the group reaches launch.py, which stops its
  # children (each in a session of its own) in order; cwd $W so `python -m` finds no stray
  # package in the working directory
  # shellcheck disable=SC2086
  (cd "$W" && exec env "${SERVER_ENV[@]}" setsid "$PY" "$ZS/launch.py" --model "$model" --device "$DEV" \
    --port "$port" --drain-timeout 5 $SERVER_FLAGS $(model_flags "$(basename "$model")") "$@") \
    >"$W/server_$tag.log" 2>&1 &
  SPID=$!
  say "server $tag: pid $SPID, ${SERVER_ENV[*]} launch.py --model $model --device $DEV --port $port --drain-timeout 5 $SERVER_FLAGS $(model_flags "$(basename "$model")" | tr '\n' ' ')$*"
}

stop_server() {
  [ -z "$SPID" ] && return 0
  local t i k kids
  t=$(date +%s)
  kids="$(children_of "$SPID") $(grep -o 'started [a-z0-9-]* (pid [0-9]*)' "$W/server_$STAG.log" 2>/dev/null | grep -o '[0-9]*)' | tr -d ')')"
  if is_alive "$SPID"; then
    if [ "$(awk '{print $5}' "/proc/$SPID/stat" 2>/dev/null)" = "$SPID" ]; then
      kill -TERM -- "-$SPID" 2>/dev/null
    else
      kill -TERM "$SPID" 2>/dev/null
    fi
    for ((i = 0; i < 120; i++)); do is_alive "$SPID" || break; sleep 0.25; done
    if is_alive "$SPID"; then
      say "server $STAG: still up 30s after SIGTERM; SIGKILL"
      kill -KILL -- "-$SPID" 2>/dev/null || kill -KILL "$SPID" 2>/dev/null
    fi
  fi
  wait "$SPID" 2>/dev/null
  local rc=$?
  sleep 0.5
  for k in $kids; do
    if is_alive "$k"; then
      say "server $STAG: leftover pid $k ($(tr '\0' ' ' <"/proc/$k/cmdline" 2>/dev/null | cut -c1-80)); SIGKILL"
      kill -KILL "$k" 2>/dev/null
    fi
  done
  say "server $STAG: stopped (launch.py exit $rc, $(($(date +%s) - t))s)"
  echo "stop_$STAG $rc $(($(date +%s) - t))" >>"$W/stages.txt"
  SPID=""
}

BGPIDS=""
cleanup() {
  stop_server
  local p c
  for p in $BGPIDS; do # a background stage's `timeout` leads a process group of its own
    for c in $(children_of "$p"); do kill -TERM "$c" 2>/dev/null; done
  done
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

# serve TAG MODEL_DIR PORT REF [flags...]: start, wait for /health (start-up time from the
# spawn), correctness check against REF (prefix-cache repeat included). 0 when it answered.
serve() {
  local tag=$1 model=$2 port=$3 ref=$4 wait_s=90
  shift 4
  [[ "$tag" == l8b* ]] && wait_s=150 # the 8B's cold start: every kernel compiled
  [ "$DEV" = cpu ] && wait_s=150
  start_server "$tag" "$model" "$port" "$@"
  local url="http://127.0.0.1:$port"
  if ! stage "wait_$tag" $wait_s "$PY" "$G/client.py" wait "$url" "$SPID" $wait_s \
    "$W/ready_$tag.json" "$SPAWN"; then
    return 1
  fi
  sleep 0.3 # launch.py logs its line after its own /health poll
  say "server $tag: $(grep -o 'zeroserve ready.*' "$W/server_$tag.log" | head -1 | cut -c1-200)"
  grep -i -E 'graph|\bKV\b|warm-up|compiled kernels' "$W/server_$tag.log" | grep -v -E '(GET|POST) /' |
    head -8 | cut -c1-200 | sed 's/^/      /' | tee -a "$RUNLOG"
  # the first request after /health (nothing else sent yet) against the steady ones
  stage "first_$tag" 60 "$PY" "$G/client.py" first "$url" "$W/first_$tag.json" \
    --steady "${ZS_FIRST_STEADY:-8}"
  grep -E 'first request' "$W/logs/first_$tag.log" | cut -c1-250 | sed 's/^/      /' | tee -a "$RUNLOG"
  if [ -s "$ref" ]; then
    stage "check_$tag" 60 "$PY" "$G/client.py" check "$url" "$ref" "$W/check_$tag.json"
    grep -E 'max\|dlp\||greedy|chat stream|same prompt' "$W/logs/check_$tag.log" |
      cut -c1-250 | sed 's/^/      /' >>"$RUNLOG"
  elif [ -n "$ref" ]; then
    skip "check_$tag" "no transformers reference ($ref)"
  fi
  return 0
}

# bench TAG SECONDS [MODEL_DIR [CONC [HINT]]]: the streaming benchmark for at most SECONDS
# (and HOLD respected); MODEL_DIR ($MROOT/TAG) for the tokenizer, CONC ($CONC) the levels,
# HINT (TAG) the tag whose correctness check times the first level
bench() {
  # 16 waves a level (ZS_WAVES): a level of one wave (0.5 s at 32 streams on an H100) is
  # mostly its ramp and its tail, and nvidia-smi's 200 ms samples see nothing of its steady
  # state; at 8 waves (1.9 s at 32 streams) the ramp and the tail were still ~10% of it
  local tag=$1 want=$2 model=${3:-$MROOT/$1} conc=${4:-$CONC} hint=${5:-$1}
  local l end factor=${ZS_WAVES:-16} minn=8
  l=$(left)
  ((want > l - RESERVE - HOLD - 5)) && want=$((l - RESERVE - HOLD - 5))
  if ((want < 10)); then
    skip "bench_$tag" "budget (${l}s left, ${HOLD}s held)"
    return
  fi
  end=$(($(date +%s) + want))
  stage "bench_$tag" $((want + 15)) "$PY" "$G/bench.py" "http://127.0.0.1:${PORT[$tag]}" \
    "$model" "$ZS" "$W/bench_$tag.json" --conc "$conc" --factor "$factor" \
    --min-n "$minn" --deadline "$end" --output-len "$OUTPUT_LEN" --label "$tag" \
    --hint-json "$W/check_$hint.json" --server-pid "$SPID" --one-client-at 32 \
    --chat-at "${ZS_CHAT_AT-128,256}"
  grep -E 'c=[0-9]+(/1client|/chat)?: rc|cut|skipped' "$W/logs/bench_$tag.log" | cut -c1-400 |
    sed 's/^/      /' | tee -a "$RUNLOG"
}

sched_rss() { # TAG: the scheduler's resident memory (host) now, from its pid in the server log
  local pid
  pid=$(grep -o 'scheduler replica 0 joined: pid [0-9]*' "$W/server_$1.log" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
  [ -n "$pid" ] && say "server $1: scheduler pid $pid $(grep -E '^(VmRSS|RssAnon|RssFile)' "/proc/$pid/status" 2>/dev/null | tr -s ' \t' ' ' | tr '\n' ' ')"
}

answered() { # TAG: the check's requests were answered (or there was no reference to check)
  [ ! -s "$W/ref_$1.json" ] || grep -q '"greedy": {' "$W/check_$1.json" 2>/dev/null
}

ok_first() { # TAG: the first-request check's requests were answered (a stall is no reason to stop)
  grep -q '"all_tokens": true' "$W/first_$1.json" 2>/dev/null
}

say "zeroserve GPU check: device=$DEV models='$MODELS' budget=${BUDGET}s python=$PY out=$OUT work=$W wheels=$WHL"

# ---- 1. wheels, environment, models --------------------------------------------------
if [ "${ZS_SKIP_INSTALL:-0}" = 1 ]; then
  skip install "ZS_SKIP_INSTALL=1"
elif ! compgen -G "$WHL/*.whl" >/dev/null; then
  skip install "no wheels in $WHL (set ZS_WHEELS)"
else
  if ! stage install 60 bash -c "rm -rf '$SITE' && '$PY' -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target '$SITE' '$WHL'/*.whl && ls '$SITE'"; then
    # no pip (or it failed): a wheel is a zip of what --target would hold
    stage install_unzip 60 "$PY" -c "import glob, sys, zipfile
for w in sorted(glob.glob(sys.argv[2] + '/*.whl')):
    zipfile.ZipFile(w).extractall(sys.argv[1]); print('unzipped', w)" "$SITE" "$WHL"
  fi
  export PYTHONPATH="$SITE:$ZS"
fi
stage env 45 "$PY" "$G/env_info.py" "$W/env.json" "$SITE"
grep -E '"(gpu|torch|torch_cuda|transformers|nvidia_smi_L)"' "$W/logs/env.log" | cut -c1-200 |
  sed 's/^/      /' | tee -a "$RUNLOG"
# shellcheck disable=SC2086
stage models 90 "$PY" "$G/make_models.py" "$G/smollm2-tok" "$MROOT" $MODELS
grep '^{' "$W/logs/models.log" | cut -c1-200 | sed 's/^/      /' | tee -a "$RUNLOG"
GGUF="$MROOT/m135-q8_0.gguf"
if has_model m135 && [ "${ZS_GGUF_CHECK:-1}" = 1 ]; then
  stage make_gguf 45 "$PY" "$G/make_gguf.py" "$MROOT/m135" "$GGUF" && tail -n 1 "$W/logs/make_gguf.log" |
    cut -c1-200 | sed 's/^/      /' | tee -a "$RUNLOG"
fi

# ---- 2 + 3. kernel tests, transformers reference and compile baseline, side by side -----
GO="$W/go_compile"
HOLD=150 # the servers' minimum (l1b and m135: start, check, a short bench, stop)
((HOLD > BUDGET / 2)) && HOLD=$((BUDGET / 2))
tests=()
missing=()
# the backend's tests first: the kernels' own passed compiled on an H100 (8d77919), these never
# (a file::test runs that test alone: the top-p search's CUDA check, not its file's CPU tests)
for f in tests/scheduler_worker/test_cuda_backend.py tests/scheduler_worker/test_sampling_device.py \
  tests/scheduler_worker/test_triton_kernels.py tests/scheduler_worker/test_triton_decode_splits.py \
  tests/scheduler_worker/test_triton_gemv.py tests/scheduler_worker/test_sample_rows.py \
  "tests/scheduler_worker/test_penalty_counts.py::test_kept_counts_give_the_per_row_logits_bit_for_bit[cuda]" \
  tests/scheduler_worker/test_top_p.py::test_the_radix_search_on_cuda_keeps_what_the_cpu_keeps_and_never_waits; do
  if [ -f "${f%%::*}" ]; then tests+=("$f"); else missing+=("$f"); fi
done
printf '%s\n' "${missing[@]}" >"$W/pytest_missing.txt"
if [ "${ZS_PYTEST:-1}" != 1 ]; then
  skip pytest "ZS_PYTEST=${ZS_PYTEST}"
  P_TEST=""
elif ((${#tests[@]})); then
  # -o addopts="": not the repo's `-m 'not slow'`; without pytest-timeout the ini's
  # `timeout` key only warns. rc 5 (nothing collected) is reported, not an error.
  # the families' sweep (every family on the real kernels) runs later, as time allows:
  # here it would hold back the compile baseline, which waits for these tests
  stage pytest 150 "${PAR[@]}" TRITON_INTERPRET=$TRITON_MODE "$PY" -m pytest -q -p no:cacheprovider \
    -o addopts="" -rfEs -k "not every_family" "${tests[@]}" &
  P_TEST=$!
else
  skip pytest "none of the kernel test files exists yet (${missing[*]})"
  P_TEST=""
fi
REFS=() # transformers loads the same weights: the models with weights on disk
for m in m135; do has_model $m && REFS+=("$m"); done
(
  for m in "${REFS[@]}"; do
    # shellcheck disable=SC2086
    stage "hf_ref_$m" 75 "${PAR[@]}" "$PY" "$G/hf_ref.py" "$MROOT/$m" "$W/ref_$m.json" --device "$DEV" \
      --text "$BOOK" --new-tokens "$HF_NEW" $HF_EXTRA
    grep -E 'greedy|done in|reference done' "$W/logs/hf_ref_$m.log" | cut -c1-250 |
      sed 's/^/      /' >>"$RUNLOG"
  done
) &
P_REF=$!
CDIRS=() # the compile baseline: speed only, so a config's random init will do (not the 8B)
for m in l1b m135; do has_model $m && CDIRS+=("$MROOT/$m"); done
if ((${#CDIRS[@]})); then
  # shellcheck disable=SC2086
  stage hf_compile 170 "${PAR[@]}" "$PY" "$G/hf_compile.py" "$W/compile.json" "${CDIRS[@]}" \
    --new-tokens "$HF_NEW" --device "$DEV" --go-file "$GO" --max-wait 140 \
    --batches "${ZS_HF_BATCHES:-1,32}" $COMPILE_FLAG &
  P_COMP=$!
else
  skip hf_compile "no model directory"
  P_COMP=""
fi
BGPIDS="$P_TEST $P_REF $P_COMP"
# the compile workers time generate only once the tests and the reference are done
[ -n "$P_TEST" ] && wait "$P_TEST"
wait "$P_REF"
touch "$GO"
say "kernel tests and transformers reference done: the compile baseline may time now"
[ -n "$P_COMP" ] && wait "$P_COMP"
grep -E 'tok/s|failed|done' "$W/logs/hf_compile.log" 2>/dev/null | cut -c1-250 |
  sed 's/^/      /' | tee -a "$RUNLOG"
BGPIDS=""

# ---- 4-8. the servers: l1b, then m135 (+ structured output, fault), then m135 in fp32 ----
if has_model l1b; then
  HOLD=0
  has_model m135 && HOLD=70 # m135's start, check, a short bench
  if serve l1b "$MROOT/l1b" "${PORT[l1b]}" ""; then
    if ok_first l1b; then bench l1b 75; else skip bench_l1b "the server did not answer"; fi
  fi
  HOLD=0
  stop_server
  # FP8 weights on the same shape, 1 and 256 streams (issue 57: TPOT <= 0.65 ms, >= 1.2x
  # the bf16 server's 256-stream tok/s just measured)
  HOLD=0
  has_model m135 && HOLD=70
  if [ "$FP8" != 1 ]; then
    skip l1b_fp8 "ZS_FP8=$FP8"
  elif (($(left) - RESERVE - HOLD < 45)); then
    skip l1b_fp8 "budget ($(left)s left, ${HOLD}s held)"
  else
    # shellcheck disable=SC2086
    if serve l1b_fp8 "$MROOT/l1b" "${PORT[l1b_fp8]}" "" $FP8_FLAGS; then
      if ok_first l1b_fp8; then bench l1b_fp8 40 "$MROOT/l1b" "${ZS_CONC_FP8:-1,256}"; fi
    fi
    stop_server
  fi
  # the A/B of several frontends (the GPU default, min(4, cpus // 4)) against one, at 32
  # streams in the same run: the GPU-busy target's figure either way (ZS_AB_FRONTENDS=0: off)
  HOLD=0
  has_model m135 && HOLD=70
  ab_default=1
  [ "$DEV" = cpu ] && ab_default=0 # one frontend is the CPU's default already
  if [ "${ZS_AB_FRONTENDS:-$ab_default}" != 1 ]; then
    skip l1b_1fe "ZS_AB_FRONTENDS=${ZS_AB_FRONTENDS:-$ab_default} (device $DEV)"
  elif [[ "$SERVER_FLAGS" == *--api-server* ]]; then
    skip l1b_1fe "ZS_SERVER_FLAGS sets the frontends already"
  elif [ ! -s "$W/bench_l1b.json" ]; then
    skip l1b_1fe "no l1b bench to compare with"
  elif (($(left) - RESERVE - HOLD < 45)); then
    skip l1b_1fe "budget ($(left)s left, ${HOLD}s held)"
  else
    if serve l1b_1fe "$MROOT/l1b" "${PORT[l1b_1fe]}" "" --api-servers 1; then
      bench l1b_1fe 25 "$MROOT/l1b" "${ZS_AB_CONC:-32}" l1b
    fi
    stop_server
  fi
  HOLD=0
fi
if has_model m135; then
  HOLD=0
  [ "$FP32_CHECK" = 1 ] && HOLD=30
  if serve m135 "$MROOT/m135" "${PORT[m135]}" "$W/ref_m135.json"; then
    if answered m135; then bench m135 50; else skip bench_m135 "the server did not answer the check"; fi
    sched_rss m135
    stage structured_m135 25 "$PY" "$G/client.py" structured "http://127.0.0.1:${PORT[m135]}" \
      "$W/structured_m135.json"
    grep -E 'json_schema|tool_required' "$W/logs/structured_m135.log" | cut -c1-250 |
      sed 's/^/      /' >>"$RUNLOG"
    # seeded alone == among 127 others, a stop string, n=3, a grammar, all overlapped
    stage overlap_m135 30 "$PY" "$G/client.py" overlap "http://127.0.0.1:${PORT[m135]}" \
      "$W/overlap_m135.json" --others 127 --tokens 48
    grep -E 'overlap checks' "$W/logs/overlap_m135.log" | cut -c1-400 | sed 's/^/      /' >>"$RUNLOG"
    # faults and bad input under load: a third of 256 chat streams disconnect, a tenth are
    # invalid, some ask for 20 top logprobs; the rest whole, at speed; nothing leaked
    FM=(--streams 256 --tokens 128)
    [ "$DEV" = cpu ] && FM=(--streams 24 --tokens 16)
    if (($(left) - RESERVE - HOLD >= 40)); then
      stage faults_m135 40 "$PY" "$G/client_faults.py" "http://127.0.0.1:${PORT[m135]}" \
        "${FM[@]}" --out "$W/faults_m135.json"
      grep -E 'fault mix|problem' "$W/logs/faults_m135.log" | cut -c1-400 |
        sed 's/^/      /' | tee -a "$RUNLOG"
    else
      skip faults_m135 "budget ($(left)s left, needs 40s + ${HOLD}s held)"
    fi
    if (($(left) - RESERVE - HOLD >= 45)); then
      stage fault_m135 90 "$PY" "$G/client.py" fault "http://127.0.0.1:${PORT[m135]}" "$SPID" \
        "$W/fault_m135.json" --streams 16 --tokens 4096
      grep -E 'kill|streams:|/health|after restart|fault check' "$W/logs/fault_m135.log" |
        cut -c1-250 | sed 's/^/      /' | tee -a "$RUNLOG"
    else
      skip fault_m135 "budget ($(left)s left, needs 45s + ${HOLD}s held)"
    fi
  fi
  HOLD=0
  stop_server
  if [ "$FP32_CHECK" != 1 ]; then
    skip m135_fp32 "ZS_FP32_CHECK=$FP32_CHECK"
  elif [ ! -s "$W/ref_m135.json" ]; then
    skip m135_fp32 "no transformers reference for m135"
  elif (($(left) - RESERVE < 25)); then
    skip m135_fp32 "budget ($(left)s left)"
  else
    serve m135_fp32 "$MROOT/m135" "${PORT[m135_fp32]}" "$W/ref_m135.json" --dtype float32
    stop_server
  fi
  # the default model's way onto a GPU: a GGUF file (Q8_0) dequantized tensor by tensor onto
  # the device, never a float32 copy on the host (the scheduler's RSS says so)
  if [ ! -s "$GGUF" ]; then
    skip m135_gguf "no GGUF file ($GGUF)"
  elif (($(left) - RESERVE < 25)); then
    skip m135_gguf "budget ($(left)s left)"
  else
    if serve m135_gguf "$GGUF" "${PORT[m135_gguf]}" "$W/ref_m135.json"; then
      sched_rss m135_gguf
    fi
    stop_server
  fi
  # preemption: a KV pool of 64 blocks under 16 greedy streams of 256 tokens (their KV ~5x
  # the pool), overlapped and in graphs: every request whole, the preemptions counted, each
  # text against the same request's alone (client_preempt.py)
  if [ "${ZS_PREEMPT:-1}" != 1 ]; then
    skip preempt_m135 "ZS_PREEMPT=${ZS_PREEMPT}"
  elif (($(left) - RESERVE < 40)); then
    skip preempt_m135 "budget ($(left)s left)"
  else
    if serve m135_pre "$MROOT/m135" "${PORT[m135_pre]}" "" --num-kv-blocks 64 \
      --max-model-len 1024; then
      stage preempt_m135 60 "$PY" "$G/client.py" preempt "http://127.0.0.1:${PORT[m135_pre]}" \
        "$W/preempt_m135.json" --streams 16 --tokens "${ZS_PREEMPT_TOKENS:-256}"
      grep -E 'preemption check' "$W/logs/preempt_m135.log" | cut -c1-300 | sed 's/^/      /' |
        tee -a "$RUNLOG"
    fi
    stop_server
  fi
fi

# ---- 11. cold and warm start (ZS_STARTUP_MODEL, l8b), the warm server benched ---------
# cold: an empty ZEROSERVE_CACHE_DIR and no TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR,
# so the scheduler compiles every kernel (its cache goes under that dir); warm: the same
# dir again. Each start's first request is checked against its steady ones.
SM="$STARTUP_MODEL"
if ! has_model "$SM"; then
  skip "startup_$SM" "$SM is not in ZS_MODELS ($MODELS)"
elif (($(left) - RESERVE < 60)); then
  skip "startup_$SM" "budget ($(left)s left)"
else
  COLD="$W/cold-cache"
  rm -rf "$COLD"
  SERVER_ENV=(-u TRITON_CACHE_DIR -u TORCHINDUCTOR_CACHE_DIR "ZEROSERVE_CACHE_DIR=$COLD")
  HOLD=40 # the warm start and its first-request check
  serve "${SM}_cold" "$MROOT/$SM" "${PORT[${SM}_cold]}" ""
  HOLD=0
  stop_server
  say "cold start left $(find "$COLD" -type f 2>/dev/null | wc -l) files in $COLD ($(du -sh "$COLD" 2>/dev/null | cut -f1))"
  if (($(left) - RESERVE < 30)); then
    skip "startup_${SM}_warm" "budget ($(left)s left)"
  else
    WT="$SM" # the 8B's warm server is its only one; another model's has served already
    [ "$SM" != l8b ] && WT="${SM}_warm"
    if serve "$WT" "$MROOT/$SM" "${PORT[$WT]}" ""; then
      if [ "$WT" = l8b ] && ok_first l8b; then bench l8b 90 "$MROOT/l8b" "$CONC_8B"; fi
    fi
  fi
  stop_server
  SERVER_ENV=()
fi
# the 8B shape with FP8 weights: 1-stream TPOT <= 3.0 ms (issue 57)
if ! has_model l8b; then
  skip l8b_fp8 "l8b is not in ZS_MODELS ($MODELS)"
elif [ "$FP8" != 1 ]; then
  skip l8b_fp8 "ZS_FP8=$FP8"
elif (($(left) - RESERVE < 60)); then
  skip l8b_fp8 "budget ($(left)s left)"
else
  # shellcheck disable=SC2086
  if serve l8b_fp8 "$MROOT/l8b" "${PORT[l8b_fp8]}" "" $FP8_FLAGS; then
    if ok_first l8b_fp8; then bench l8b_fp8 45 "$MROOT/l8b" "${ZS_CONC_8B_FP8:-1,64}"; fi
  fi
  stop_server
fi

# ---- 8b. every family on the real kernels and graphs (test_cuda_backend.py) ----------
if [ ! -f tests/scheduler_worker/test_cuda_backend.py ]; then
  skip pytest_families "tests/scheduler_worker/test_cuda_backend.py is not there"
elif (($(left) - RESERVE < 40)); then
  skip pytest_families "budget ($(left)s left)"
else
  stage pytest_families 120 env TRITON_INTERPRET=$TRITON_MODE "$PY" -m pytest -q \
    -p no:cacheprovider -o addopts="" -rfEs -k every_family \
    tests/scheduler_worker/test_cuda_backend.py
fi

# ---- 9a. decode attention's splits in graphs: the bucket's cap against caps 2 and 1 ------
if [ "$DEV" != cuda ]; then
  skip decode_splits "not on a GPU"
elif (($(left) - RESERVE < 25)); then
  skip decode_splits "budget ($(left)s left)"
else
  stage decode_splits 30 "$PY" "$G/bench_decode_splits.py" --batches 1,8,32 --contexts 200,2000
fi

# ---- 9b. top-p without a sort: main's full sort against the radix search ---------------
if [ "${ZS_TOP_P:-1}" != 1 ]; then
  skip top_p "ZS_TOP_P=${ZS_TOP_P}"
elif (($(left) - RESERVE < 25)); then
  skip top_p "budget ($(left)s left)"
elif [ "$DEV" = cuda ]; then
  stage top_p 40 "$PY" "$ZS/benchmarks/bench_top_p.py" --device cuda --repeat 10
else # the plumbing only: a CPU's sort of 256 x 128,256 rows takes seconds
  stage top_p 40 "$PY" "$ZS/benchmarks/bench_top_p.py" --device cpu --shapes 32x49152 \
    --dists chat --repeat 1
fi
[ -f "$W/logs/top_p.log" ] && grep -E '^(cpu|cuda)' "$W/logs/top_p.log" | cut -c1-300 |
  sed 's/^/      /' | tee -a "$RUNLOG"

# ---- 9e. the sampler's draw: the torch path against the one Triton launch -------------
if [ "${ZS_SAMPLER:-1}" != 1 ]; then
  skip sampler "ZS_SAMPLER=${ZS_SAMPLER}"
elif [ "$DEV" != cuda ]; then # interpreted, one call takes seconds: its tests cover it
  skip sampler "not on a GPU (tests/scheduler_worker/test_sample_rows.py runs the kernel)"
elif (($(left) - RESERVE < 25)); then
  skip sampler "budget ($(left)s left)"
else
  stage sampler 40 "$PY" "$ZS/benchmarks/bench_sampler.py" --device cuda --rows 32 256 \
    --vocab 49152 128256 --repeat 10 --rounds 2
fi
[ -f "$W/logs/sampler.log" ] && grep -E '^cuda' "$W/logs/sampler.log" | cut -c1-300 |
  sed 's/^/      /' | tee -a "$RUNLOG"

# ---- 9c. the few-row GEMV against cuBLAS: µs a call, GB/s, the route's pick ----------
if [ "${ZS_GEMV:-1}" != 1 ]; then
  skip gemv "ZS_GEMV=${ZS_GEMV}"
elif (($(left) - RESERVE < 25)); then
  skip gemv "budget ($(left)s left)"
elif [ "$DEV" = cuda ]; then
  stage gemv 40 "$PY" "$G/bench_gemv.py" --models 1b,8b --rows 1,2,4,8 --splits 1,2,4,8,16
else # the plumbing only: the interpreter on tiny shapes
  stage gemv 40 "$PY" "$G/bench_gemv.py" --device cpu --rows 1,8 --splits 1,2
fi
[ -f "$W/logs/gemv.log" ] && grep -E 'SMs|batch 1|check at|sweep' "$W/logs/gemv.log" | cut -c1-250 |
  sed 's/^/      /' | tee -a "$RUNLOG"

# ---- 9d. speculative decoding's verify step on the device (issue 53) ------------------
# a (1 + k)-token verify as decode rows against a plain decode step, at 1, 8 and 32 rows,
# k 1, 3, 7 (the target: <= 1.15 decode steps at one row for k <= 7); its cost and the
# CPU's measured acceptance decide whether speculation may be on by default on a GPU
PM="" # the stages below run on the 1B shape, else the 8B's
for m in l1b l8b; do has_model $m && [ -z "$PM" ] && PM=$m; done
if [ "${ZS_SPEC:-1}" != 1 ]; then
  skip spec_verify "ZS_SPEC=${ZS_SPEC}"
elif [ -z "$PM" ]; then
  skip spec_verify "neither l1b nor l8b is in ZS_MODELS ($MODELS)"
elif (($(left) - RESERVE < 45)); then
  skip spec_verify "budget ($(left)s left)"
else
  SPEC_SHAPE=(--rows 1 8 32 --context 800 --num-speculative-tokens 1 3 7 --reps 9)
  [ "$DEV" = cpu ] && SPEC_SHAPE=(--rows 1 --context 32 --num-speculative-tokens 3 --reps 2)
  stage spec_verify 45 "$PY" "$ZS/benchmarks/bench_spec_verify.py" --costs --model "$MROOT/$PM" \
    --load-format dummy --device "$DEV" --paths rows "${SPEC_SHAPE[@]}"
  grep -E '^rows ' "$W/logs/spec_verify.log" | cut -c1-250 | sed "s/^/      $PM /" | tee -a "$RUNLOG"
fi

# ---- 9f. speculation served beside the overlap (issue 53; spec/overlap.py) ------------
# one engine, ngram drafts switched per request (A/B rounds alternated), m135 in float32
# (random weights: the outputs repeat, so prompt lookup finds drafts in `repeat`; `chat`
# what the gate's tries cost where fewer are found; `self` its own output as the
# prediction, every draft accepted: the verify's best case); outputs equal token for token
if [ "${ZS_SPEC:-1}" != 1 ]; then
  skip spec_served "ZS_SPEC=${ZS_SPEC}"
elif ! has_model m135; then
  skip spec_served "m135 is not in ZS_MODELS ($MODELS)"
elif (($(left) - RESERVE < 75)); then
  skip spec_served "budget ($(left)s left)"
else
  SPEC_RUN=(--rounds 4 --max-tokens 128)
  [ "$DEV" = cpu ] && SPEC_RUN=(--rounds 2 --max-tokens 16 --async-scheduling on)
  stage spec_served 75 "$PY" "$ZS/benchmarks/bench_spec.py" --model "$MROOT/m135" \
    --device "$DEV" --dtype float32 --workload repeat chat self "${SPEC_RUN[@]}"
  grep -E 'median tok/s|^overlapped:' "$W/logs/spec_served.log" | cut -c1-250 |
    sed 's/^/      m135 /' | tee -a "$RUNLOG"
fi

# ---- 9. profile ----------------------------------------------------------------------
if [ "${ZS_PROFILE:-1}" != 1 ]; then
  skip profile "ZS_PROFILE=${ZS_PROFILE}"
elif [ -z "$PM" ]; then
  skip profile "no l1b or l8b model"
elif (($(left) - RESERVE < 30)); then
  skip profile "budget ($(left)s left)"
else
  # shellcheck disable=SC2046,SC2086
  stage profile 90 "$PY" "$G/profile_step.py" "$MROOT/$PM" --device "$DEV" --batches 1,32,128 \
    --steps 20 --mixed 4 --cprofile 30 -- $SERVER_FLAGS $(model_flags $PM)
fi

# ---- 10. the host's share of a decode step (CPU only: the forward stubbed as a graph) ---
if (($(left) - RESERVE < 20)); then
  skip host_step "budget ($(left)s left)"
else
  stage host_step 45 "$PY" "$ZS/benchmarks/bench_host_step.py" --rows 32 128 256 512 \
    --steps 100 --kernels torch
fi
if (($(left) - RESERVE < 30)); then
  skip host_step_chat "budget ($(left)s left)"
else
  # the chat mix: the sampler's torch ops run on this host's CPU here (printed apart)
  stage host_step_chat 40 "$PY" "$ZS/benchmarks/bench_host_step.py" --rows 32 256 \
    --steps 30 --kernels torch --mix chat
fi

# ---- summary (never skipped) ---------------------------------------------------------
say ">>> summary"
timeout -k 5 30 "$PY" "$G/summarize.py" "$W" "$OUT" "$(elapsed)" "$BUDGET" >"$W/logs/summary.log" 2>&1 ||
  say "summary failed: $(tail -n 5 "$W/logs/summary.log")"
for f in "$W"/logs/*.log; do
  echo "===== $(basename "$f") (last 80 lines)"
  tail -n 80 "$f" | cut -c1-1000
done >"$OUT/stages.log" 2>/dev/null
for f in "$W"/server_*.log; do
  [ -e "$f" ] || continue
  echo "===== $(basename "$f"): first 60 and last 300 lines"
  head -n 60 "$f" | cut -c1-1000
  echo "..."
  tail -n 300 "$f" | cut -c1-1000
done >"$OUT/servers.log" 2>/dev/null
[ -f "$W/logs/pytest.log" ] && tail -n 3000 "$W/logs/pytest.log" | cut -c1-2000 >"$OUT/pytest.log"
[ -f "$W/logs/pytest_families.log" ] && { echo "===== pytest_families"; tail -n 1000 \
  "$W/logs/pytest_families.log" | cut -c1-2000; } >>"$OUT/pytest.log"
[ -f "$W/logs/profile.log" ] && cut -c1-2000 "$W/logs/profile.log" | head -n 2000 >"$OUT/profile.txt"
for f in host_step host_step_chat; do
  [ -f "$W/logs/$f.log" ] && grep "^rows" "$W/logs/$f.log" >>"$OUT/profile.txt"
done
[ -f "$W/logs/decode_splits.log" ] && cat "$W/logs/decode_splits.log" >>"$OUT/profile.txt"
[ -f "$W/logs/top_p.log" ] && cat "$W/logs/top_p.log" >>"$OUT/profile.txt"
[ -f "$W/logs/gemv.log" ] && cat "$W/logs/gemv.log" >>"$OUT/profile.txt"
cat "$W/logs/summary.log"
say "done in $(elapsed)s; files in $OUT: $(cd "$OUT" && echo *) run.log"
cp "$RUNLOG" "$OUT/run.log"
