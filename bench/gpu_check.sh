#!/usr/bin/env bash
# The first-GPU-run check (issues #10, #11): one command, one H200 lease.
#
# THE `run` CALL a session with a GPU makes (device tool), verbatim:
#   command:   bash bench/gpu_check.sh "$OUT"
#   timeout_s: 590
#   carry:     []   (nothing: the extension is built there, from source, for sm_90a)
# then give_back at once, and commit what came back under bench/results/gpu_<date>/
# with the commit it ran on. The whole script is bounded by
# GPU_CHECK_BUDGET_S (default 560 s; 30 s under timeout_s for the kill margin).
#
# Steps, in this order; each one's timeout is its own cap or what is left of the
# budget (less 10 s kept for the summary), whichever is smaller; a step that
# times out is recorded as TIMEOUT and the next step runs. The caps are set in
# one place (CAPS below) and add up to the budget less the reserve; the plan is
# printed first and written as plan.json ({"budget_s", "reserve_s", "steps":
# {name: cap_s}, "memcheck_tools_s"}; tests/test_gpu_check.py fails when the
# caps exceed the budget). Caps:
#   1 env       <= 10 s  nvidia-smi clocks/ECC/power, torch/CUDA/cuBLAS versions,
#                        Python.h present, compute-sanitizer path, pytest-timeout
#   2 build     <= 230 s python setup.py build_ext --inplace, LOCALARGMAX_CUDA_ARCH=90a
#                        only, fresh; no pip at all (and PIP_NO_INDEX=1 besides), so
#                        nothing reaches the network; ptxas register/spill lines and
#                        cuobjdump resource usage of the build kept in build.txt
#   3 configs   <= 25 s  bench/gpu_check.py configs: one call of every config of the build
#                        (simt, gemm, each mma/<name>) in worker subprocesses, 8 s each: ok /
#                        refused / error / hang, into configs.json (in bench.tar.gz); the
#                        configs that error or hang are skipped by the tune, the tests
#                        (LOCALARGMAX_TEST_SKIP_PATHS) and the sanitizer
#   4 smoke     <= 25 s  bench/gpu_check.py smoke: every CUDA path (simt, mma, gemm;
#                        argmax, sample, top-k) on planted problems, ids exact and values
#                        within the float32 bound of the float64 logit; filtered sampling
#                        (top-k / top-p / min-p) ids against float64 (30 s budget)
#   5 steptime  <= 20 s  bench/gpu_check.py step-timing (issue #65): the kernel, the eager planned step
#                        (StepPlan.run), the step captured in a CUDA graph, and vLLM's own local-argmax
#                        sequence eager and captured, world size 1, Qwen3 TP-8 shard, B 1/8/32/64/128,
#                        into step_timing.json (in bench.tar.gz) with the issue's targets
#   6 bench     <= 95 s  first the tune sub-step (<= 45 s, GPU_CHECK_CAP_TUNE): python -m bench.tune
#                        times simt, gemm and each mma config (mma/<name>)
#                        on the engine shapes, smallest shard first, for --seconds (its cap
#                        less 20 s), and writes the MEASURED dispatch table and its timings into
#                        the bench dir (dispatch_table_measured.json, tune.json, in bench.tar.gz;
#                        the dry run cannot tune, so it says so and writes the model's table,
#                        dispatch_table_predicted.json); then the kernel benchmark, CUDA-graph
#                        timed (localargmax/bench/timing.py), each shape <= 90 s:
#                        Qwen3 tp 8, Llama-3 tp 8, DeepSeek-V3 tp 8 (B 1..256 and 1024),
#                        Qwen3 tp 1 (B 1..256); every path (simt only at B <= 8), torch
#                        matmul+max, the whole step, the device-to-device copy; and
#                        sampling on the full Qwen3 head (B 1..256) beside FlashSampling's
#                        baselines and published H200 ratios (second, so it always runs); then
#                        one TP-8 rank's target sampling with vLLM's noise (--noise vllm, B 1/16/64),
#                        and top-8 on the Qwen3 TP-8 shard (B 1..256)
#   7 tests     <= 45 s  the GPU pytest files, the ones that failed in the 2026-12-04 rerun first
#                        (the planned step's capture, test_step.py, test_shard_argmax_cuda.py), 30 s per test (pytest-timeout if there,
#                        else bench/pytest_alarm.py), junit XML with the seeds
#   8 memcheck  <= 100 s compute-sanitizer memcheck of bench/gpu_check.py sanitize
#                        (caching allocator off; one TMA, one > 48 KiB config and n16_r64_w2
#                        at B 135 among its calls), then racecheck: each tool gets at least 45 s
#   then the one-screen summary (summary.txt, and the end of the console output).
#
# Files under the output folder, at most 8 (the device tool brings back 8), each
# rewritten whole as the steps go, so a kill at any point still leaves <= 8:
#   plan.json      the steps' caps          (and the seven below)
#   gpu_check.log  the whole console        env.txt      environment facts
#   build.txt      build tail + ptxas lines bench.tar.gz bench_*.json + smoke.json + the tuned
#                                                        table (dispatch_table_*.json, tune.json)
#   tests.xml      pytest junit XML         sanitizer.txt memcheck (+ racecheck) log
#   summary.txt    step status, pytest counts, smoke, the benchmark table
#
# The plan alone (plan.json in OUTDIR, nothing run): bash bench/gpu_check.sh --plan OUTDIR
# Dry run on a machine without a GPU (tests/test_gpu_check.py runs it):
#   bash bench/gpu_check.sh --dry-run OUTDIR
# walks the same steps and writes the same files: no nvidia-smi needed; the build
# is CPU-only and in place, and only when no extension is built yet (or
# GPU_CHECK_DRY_BUILD=always); smoke and benchmark on the CPU with tiny shapes;
# the same pytest files (they skip without a GPU); the sanitizer is skipped with a
# message and its workload runs on the CPU without it.
# Knobs: GPU_CHECK_BUDGET_S (whole script), GPU_CHECK_CAP_<STEP> (one step's cap in
# seconds, STEP = ENV BUILD CONFIGS SMOKE STEPTIME BENCH TESTS MEMCHECK; TUNE for the bench step's tune
# sub-step), GPU_CHECK_TESTS (pytest
# arguments selecting the tests), GPU_CHECK_BENCH (shape labels to run), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
PLAN_ONLY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
if [[ "${1:-}" == "--plan" ]]; then PLAN_ONLY=1; shift; fi
OUTDIR="${1:-bench/results/gpu_check}"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PY="${PYTHON:-python3}"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
mkdir -p "$WORK/bench"
STEPS="$WORK/steps.txt"
: > "$STEPS"
exec > >(tee -a "$OUTDIR/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if (( DRY )); then DEVICE=cpu; else DEVICE=cuda; fi

BUDGET=${GPU_CHECK_BUDGET_S:-560}
RESERVE=10
DEADLINE=$(( SECONDS + BUDGET ))
# The plan: every step's cap (GPU_CHECK_CAP_<STEP> overrides one), in run order.
STEP_NAMES="env build configs smoke steptime bench tests memcheck"
declare -A CAPS=([env]=10 [build]=230 [configs]=25 [smoke]=25 [steptime]=20 [bench]=95 [tests]=45 [memcheck]=100)
MEMCHECK_TOOL_MIN=45  # seconds each sanitizer tool gets at least (memcheck, then racecheck)
for s in $STEP_NAMES; do v="GPU_CHECK_CAP_${s^^}"; CAPS[$s]=${!v:-${CAPS[$s]}}; done
{
  printf '{"budget_s": %d, "reserve_s": %d, "steps": {' "$BUDGET" "$RESERVE"
  sep=""; for s in $STEP_NAMES; do printf '%s"%s": %d' "$sep" "$s" "${CAPS[$s]}"; sep=", "; done
  printf '}, "memcheck_tools_s": {"memcheck": %d, "racecheck": %d}}\n' \
    $(( CAPS[memcheck] - MEMCHECK_TOOL_MIN - 4 )) "$MEMCHECK_TOOL_MIN"
} > "$OUTDIR/plan.json"
total=0; for s in $STEP_NAMES; do total=$(( total + CAPS[$s] )); done
echo "plan: $(tr -d '\n' < "$OUTDIR/plan.json") (caps sum ${total}s of $(( BUDGET - RESERVE ))s)"
if (( PLAN_ONLY )); then rm -rf "$WORK"; exit 0; fi
status=0
built=0

# cap STEP WANT: seconds this step may run (0: none left).
cap() {
  local want=${CAPS[$1]:-$2} left
  left=$(( DEADLINE - RESERVE - SECONDS ))
  (( left < 0 )) && left=0
  echo $(( want < left ? want : left ))
}
# record STEP RC SECONDS NOTE
record() { printf '%-10s %4s %8s  %s\n' "$1" "$2" "$3" "$4" >> "$STEPS"; }
bundle() {  # the bench archive and the summary, rewritten whole
  tar -czf "$WORK/bench.tar.gz" -C "$WORK" bench 2>/dev/null && cp "$WORK/bench.tar.gz" "$OUTDIR/bench.tar.gz"
  "$PY" bench/gpu_check.py summary --bench-dir "$WORK/bench" --steps "$STEPS" --junit "$OUTDIR/tests.xml" \
    --out "$OUTDIR/summary.txt" > /dev/null 2>&1 || true
}
# run_step NAME WANT FUNCTION: run FUNCTION under its cap in its own process group.
run_step() {
  local name=$1 want=$2 fn=$3 c t0 rc note=""
  c=$(cap "$name" "$want")
  export STEP_CAP=$c
  echo; echo "== $name (cap ${c}s; $(date -u +%H:%M:%S), ${SECONDS}s of ${BUDGET}s)"
  if (( c < 2 )); then
    echo "$name: SKIPPED, no budget left"; record "$name" - 0 "skipped: budget spent"; bundle; return 0
  fi
  t0=$SECONDS
  timeout -s TERM -k 15 "$c" bash -c "$fn"
  rc=$?
  if (( rc == 124 || rc == 137 )); then note="TIMEOUT after ${c}s"; echo "$name: $note"; fi
  (( rc != 0 )) && status=1
  [[ -z "$note" && $rc != 0 ]] && note="FAILED"
  [[ -z "$note" ]] && note="ok"
  record "$name" "$rc" $(( SECONDS - t0 )) "$note"
  bundle
  return $rc
}
export ROOT OUTDIR WORK PY DRY DEVICE

step_env() {
  {
    echo "date: $(date -u +%FT%TZ)   dry_run: $DRY   host: ${HOSTNAME:-?}   cores: $(nproc)"
    echo "commit: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo 'unknown (no .git)')"
    echo "sources sha256: $(cd "$ROOT" && find csrc localargmax bench tests setup.py CMakeLists.txt -type f \( -name '*.py' -o -name '*.c*' -o -name '*.h' -o -name '*.sh' -o -name '*.txt' \) -not -path '*/__pycache__/*' -not -path 'bench/results/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16) (compare: the same command on the commit that ran)"
    if command -v nvidia-smi > /dev/null; then
      timeout 5 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,ecc.mode.current,power.limit --format=csv
      timeout 5 nvidia-smi -q -d CLOCK,ECC,POWER,PERFORMANCE | grep -v '^\s*$' | head -90
    else
      echo "nvidia-smi: not found"
    fi
    timeout 8 "$PY" - <<'PYEOF'
import importlib.metadata as md, importlib.util, os, shutil, sys, sysconfig
import torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs", p.total_memory >> 20, "MiB")
for dist in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12", "triton", "cmake", "ninja", "pytest", "pytest-timeout"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        pass
try:
    import ctypes
    v = ctypes.c_int()
    lib = ctypes.CDLL("libcublas.so." + str(torch.version.cuda or "0").split(".")[0])
    lib.cublasGetProperty(0, ctypes.byref(v)); major = v.value
    lib.cublasGetProperty(1, ctypes.byref(v)); minor = v.value
    lib.cublasGetProperty(2, ctypes.byref(v)); print(f"cublas loaded {major}.{minor}.{v.value}")
except Exception as exc:
    print("cublas version: not read", type(exc).__name__)
inc = sysconfig.get_paths()["include"]
print("Python.h", "present" if os.path.exists(os.path.join(inc, "Python.h")) else "MISSING", inc)
cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
print("compute-sanitizer", shutil.which("compute-sanitizer") or (os.path.join(cuda_home, "bin/compute-sanitizer") if os.path.exists(os.path.join(cuda_home, "bin/compute-sanitizer")) else "not found"))
print("nvcc", shutil.which("nvcc") or (os.path.join(cuda_home, "bin/nvcc") if os.path.exists(os.path.join(cuda_home, "bin/nvcc")) else "not found"))
PYEOF
    NVCC=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
    [[ -x "$NVCC" ]] && timeout 3 "$NVCC" --version | tail -2
  } > "$OUTDIR/env.txt" 2>&1
  cat "$OUTDIR/env.txt"
}

step_build() {
  local log="$WORK/build.log"
  if (( DRY )); then
    if [[ "${GPU_CHECK_DRY_BUILD:-}" != always ]] && ls localargmax/_C*.so > /dev/null 2>&1; then
      echo "dry run: reusing the built extension $(ls localargmax/_C*.so) (GPU_CHECK_DRY_BUILD=always rebuilds)" | tee "$log"
    else
      LOCALARGMAX_CUDA=0 "$PY" setup.py build_ext --inplace > "$log" 2>&1
    fi
  else
    if ! "$PY" -c "import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))"; then
      echo "BUILD IMPOSSIBLE: Python.h missing for $PY (see env.txt)" | tee "$log"
      cp "$log" "$OUTDIR/build.txt"; return 3
    fi
    rm -rf build/cmake-py* localargmax/_C*.so
    LOCALARGMAX_CUDA_ARCH=90a "$PY" setup.py build_ext --inplace > "$log" 2>&1
  fi
  local rc=$?
  {
    echo "== build exit $rc; last 40 lines of setup.py output"
    tail -40 "$log"
    echo "== ptxas lines (registers, spills, stack) of this build"
    grep -hE 'ptxas info|spill|stack frame' build/cmake-py*/build.log 2>/dev/null || echo "(none: no CUDA in this build)"
    local so; so=$(ls localargmax/_C*.so 2>/dev/null | head -1)
    local cuobjdump; cuobjdump=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
    if [[ -n "$so" && -x "$cuobjdump" ]] && (( ! DRY )); then
      echo "== cuobjdump --dump-resource-usage $so"
      timeout 20 "$cuobjdump" --dump-resource-usage "$so" 2>&1 | head -300
    fi
  } > "$OUTDIR/build.txt" 2>&1
  tail -15 "$OUTDIR/build.txt"
  (( rc == 0 )) || { echo "BUILD FAILED (build.txt)"; return $rc; }
  "$PY" -c "import localargmax as l; print('WITH_CUDA', l.WITH_CUDA); import sys; sys.exit(0 if l.WITH_CUDA or $DRY else 4)" \
    || { echo "built without CUDA kernels"; return 4; }
}

step_configs() {
  "$PY" bench/gpu_check.py configs --device "$DEVICE" --budget $(( STEP_CAP - 5 )) --json "$WORK/bench/configs.json"
}
skipped_configs() {  # the configs step's "skip" list, comma-separated ('' when none or no step)
  "$PY" -c "import json, sys; print(','.join(json.load(open(sys.argv[1])).get('skip', [])))" \
    "$WORK/bench/configs.json" 2> /dev/null || true
}

step_smoke() {
  local tiny=""; (( DRY )) && tiny=--tiny
  local budget=$(( STEP_CAP - 10 < 30 ? STEP_CAP - 10 : 30 ))  # 10 s for torch import and CUDA init
  exec "$PY" bench/gpu_check.py smoke --device "$DEVICE" $tiny --budget "$budget" --json "$WORK/bench/smoke.json"
}

# label model rows batches [op] (rows: the rank-0 shard, shard_vocab(V, 0, tp, pad_to=64).rows;
# op: argmax unless named; sample-vllm: --op sample --noise vllm; topk8: --op topk --k 8). qwen3_sample: FlashSampling's
# side-by-side cells: the full Qwen3 head (its published H200 table is for tp 1) against Gumbel-max
# on cuBLAS logits and compiled softmax + multinomial, each row with the published ratio beside ours.
# qwen3_target_tp8: one TP-8 rank's local work of the target's sampler with vLLM's noise (issue #57):
# the fused op (gemm path) against vllm-gumbel-logits (vLLM's gumbel_sample on the shard's logits);
# the exchange is not timed on one GPU (bench.predict_cli --target-sampling predicts it).
# qwen3_topk8_tp8: tree drafting's top-8 (issue #69: auto runs the tensor-core kernel for bf16 top-k,
# one weight pass up to 256 rows, PREDICTED; the forced fused-mma and fused-simt rows beside it) against
# torch's matmul + topk.
BENCH_SHAPES="qwen3_tp8:qwen3:18992:1,8,32,64,96,128,256,1024
qwen3_sample:qwen3:151936:1,16,64,128,256:sample
qwen3_target_tp8:qwen3:18992:1,16,64:sample-vllm
qwen3_topk8_tp8:qwen3:18992:1,8,16,32,64,128,256:topk8
llama3_tp8:llama3:16032:1,8,32,64,96,128,256,1024
deepseek_v3_tp8:deepseek-v3:16160:1,8,32,64,96,128,256,1024
qwen3_tp1:qwen3:151936:1,8,32,64,96,128,256"
export BENCH_SHAPES
bench_tune() {  # the tune sub-step of bench (its own cap; what it writes goes into bench.tar.gz)
  local per=$1 rc
  if (( per < 10 )); then echo "tune: skipped, bench budget spent"; return 0; fi
  if (( DRY )); then
    echo "-- tune (cap ${per}s): SKIPPED on the CPU (bench.tune needs a GPU and exits 2 without one);" \
      "the model's table instead, dispatch_table_predicted.json"
    timeout -s TERM -k 5 "$per" "$PY" -m bench.predict_cli --batch 1 \
      --write-table "$WORK/bench/dispatch_table_predicted.json" > /dev/null
  else
    echo "-- tune (cap ${per}s, timing for $(( per - 15 ))s): paths and mma variants -> dispatch_table_measured.json"
    timeout -s TERM -k 5 "$per" "$PY" -m bench.tune --seconds $(( per - 15 )) \
      --skip "$(skipped_configs)" \
      --write-table "$WORK/bench/dispatch_table_measured.json" --json "$WORK/bench/tune.json" 2>&1 \
      | grep -v '^tune .* \.\.\.$'
  fi
  rc=${PIPESTATUS[0]}
  (( rc == 0 )) || { echo "tune: FAILED or TIMEOUT (exit $rc)"; return 1; }
  tar -czf "$WORK/bench.tar.gz" -C "$WORK" bench && cp "$WORK/bench.tar.gz" "$OUTDIR/bench.tar.gz"
}
step_bench() {
  local end=$(( SECONDS + ${STEP_CAP:-200} )) label model rows batches op extra per left rc status=0
  left=$(( end - SECONDS - 2 ))
  per=${GPU_CHECK_CAP_TUNE:-45}
  bench_tune $(( per < left ? per : left )) || status=1
  while IFS=: read -r label model rows batches op; do
    [[ -n "${GPU_CHECK_BENCH:-}" && " $GPU_CHECK_BENCH " != *" $label "* ]] && continue
    left=$(( end - SECONDS - 2 ))
    (( left < 5 )) && { echo "bench $label: skipped, bench budget spent"; continue; }
    per=$(( left < 90 ? left : 90 ))
    op=${op:-argmax}
    local op_args=""
    [[ $op == sample-vllm ]] && { op=sample; op_args="--noise vllm"; }
    [[ $op == topk8 ]] && { op=topk; op_args="--k 8"; }
    if (( DRY )); then
      extra="--smoke --rows 2048 --batch 1,8"
      [[ $op == sample ]] && extra+=" --no-compile"  # torch.compile of the baselines takes minutes on 2 cores
    else
      extra="--rows $rows --batch $batches --steps 100 --warmup 5"
    fi
    echo "-- bench $label ($model, $rows rows, $op; cap ${per}s)"
    timeout -s TERM -k 5 "$per" "$PY" -m localargmax.bench --kernel-only --device "$DEVICE" --model "$model" --dtype bfloat16 \
      --op "$op" $op_args $extra --max-seconds 2 --no-progress --json "$WORK/bench/bench_$label.json" 2>&1 | grep -v '^  [a-z-]* B=[0-9]* \.\.\.$'
    rc=${PIPESTATUS[0]}
    (( rc == 0 )) || { echo "bench $label: FAILED or TIMEOUT (exit $rc)"; status=1; }
    tar -czf "$WORK/bench.tar.gz" -C "$WORK" bench && cp "$WORK/bench.tar.gz" "$OUTDIR/bench.tar.gz"
  done <<< "$BENCH_SHAPES"
  return $status
}

step_steptime() {
  local tiny=""; (( DRY )) && tiny=--tiny
  exec "$PY" bench/gpu_check.py step-timing --device "$DEVICE" $tiny --budget $(( STEP_CAP - 10 )) \
    --json "$WORK/bench/step_timing.json"
}

step_tests() {
  local sel=() t=()
  if [[ -n "${GPU_CHECK_TESTS:-}" ]]; then
    read -r -a sel <<< "$GPU_CHECK_TESTS"
  else
    # every test parametrized by a CUDA path carries the gpu marker (tests/conftest.py); the files of the
    # tests that failed in the 2026-12-04 rerun first (pytest keeps the first of duplicate paths)
    sel=(-m gpu tests/test_step_plan.py tests/test_step.py tests/test_shard_argmax_cuda.py tests)
  fi
  # per-test timeout: pytest-timeout where installed, else the SIGALRM plugin;
  # the plugin also turns SIGTERM (this step's timeout) into KeyboardInterrupt,
  # so pytest still writes the junit XML of the tests it ran.
  if "$PY" -c "import pytest_timeout" 2> /dev/null; then t=(--timeout "${GPU_CHECK_TEST_TIMEOUT:-30}"); else t=(--alarm-timeout "${GPU_CHECK_TEST_TIMEOUT:-30}"); fi
  export PYTHONPATH="$ROOT/bench:$PYTHONPATH"
  LOCALARGMAX_TEST_SKIP_PATHS="$(skipped_configs)"
  export LOCALARGMAX_TEST_SKIP_PATHS
  exec "$PY" -m pytest -p pytest_alarm "${t[@]}" -q -p no:cacheprovider -rfE --durations=10 \
    --maxfail=50 -o junit_family=xunit1 --junitxml="$OUTDIR/tests.xml" "${sel[@]}"
}

step_memcheck() {
  local san out="$OUTDIR/sanitizer.txt" left
  if (( DRY )); then
    echo "compute-sanitizer: SKIPPED (--dry-run, no GPU); its workload ran on the CPU without it:" > "$out"
    "$PY" bench/gpu_check.py sanitize --device cpu --skip "$(skipped_configs)" >> "$out" 2>&1
    local rc=$?; cat "$out"; return $rc
  fi
  san=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
  if [[ ! -x "$san" ]]; then echo "compute-sanitizer: not found, SKIPPED" | tee "$out"; return 0; fi
  local end=$(( SECONDS + ${STEP_CAP:-100} )) rc=0 tool skip
  skip=$(skipped_configs)
  : > "$out"
  for tool in memcheck racecheck; do
    left=$(( end - SECONDS - 2 ))
    # memcheck leaves racecheck its MEMCHECK_TOOL_MIN seconds (a kill margin of 4 s between them)
    [[ $tool == memcheck ]] && left=$(( left - MEMCHECK_TOOL_MIN - 2 ))
    if (( left < 10 )); then echo "$tool: SKIPPED (${left}s left)" | tee -a "$out"; continue; fi
    echo "== compute-sanitizer --tool $tool (${left}s)" >> "$out"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 2 "$left" "$san" --tool "$tool" --error-exitcode 9 --print-limit 30 \
      "$PY" bench/gpu_check.py sanitize --device cuda --skip "$skip" >> "$out" 2>&1
    local r=$?
    echo "$tool: exit $r ($( ((r == 0)) && echo clean || echo 'ERRORS, TIMEOUT or unavailable'))" | tee -a "$out"
    (( r == 0 )) || rc=$r
  done
  tail -25 "$out"
  return $rc
}
export MEMCHECK_TOOL_MIN
export -f step_env step_build step_configs skipped_configs step_smoke step_steptime bench_tune step_bench step_tests step_memcheck

echo "gpu_check: $( ((DRY)) && echo 'DRY RUN (CPU)' || echo 'GPU run'), budget ${BUDGET}s, output $OUTDIR, scratch $WORK"
run_step env 10 step_env
if run_step build 230 step_build; then built=1; fi
if (( built )); then
  run_step configs 25 step_configs
  run_step smoke 25 step_smoke
  run_step steptime 20 step_steptime
  run_step bench 95 step_bench
  bash -c '"$PY" bench/gpu_check.py summary --bench-dir "$WORK/bench" --steps "$WORK/steps.txt"' | tail -n +2
  run_step tests 45 step_tests
  run_step memcheck 100 step_memcheck
else
  for s in configs smoke steptime bench tests memcheck; do record "$s" - 0 "skipped: no build"; done
  echo "no build: smoke, steptime, bench, tests and memcheck skipped" | tee "$OUTDIR/sanitizer.txt"
fi
for f in tests.xml sanitizer.txt build.txt env.txt; do  # every file exists, whatever happened
  [[ -e "$OUTDIR/$f" ]] || echo "not written: its step did not run or was killed (see gpu_check.log)" > "$OUTDIR/$f"
done
record total "$status" "$SECONDS" "budget ${BUDGET}s"
bundle
echo
cat "$OUTDIR/summary.txt"
rm -rf "$WORK"
exit $status
