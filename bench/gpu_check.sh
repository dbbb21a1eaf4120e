#!/usr/bin/env bash
# GPU check for an H200 machine (Python 3.12, its own torch, nvcc, no network),
# run from a copy of this repo:  bash bench/gpu_check.sh OUT_DIR
# Builds the extension from source against that machine's torch (sm_90a only),
# runs the GPU tests and the CUDA build checks, compute-sanitizer on a small step, and the
# GPU kernel benchmark; writes JSON + logs to OUT_DIR (default bench/results/).
# Budget: under 8 minutes (GPU_CHECK_BUDGET_S, default 480, bounds every step).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench/results}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
PY="${PYTHON:-python3}"
status=0
step() { echo; echo "== $* ($(date -u +%H:%M:%S), ${SECONDS}s)"; }
# One deadline for the whole script (GPU_CHECK_BUDGET_S, default 480 s): every
# step's timeout is its own cap or what is left, whichever is smaller, so a
# hung step cannot eat a session's device time.
DEADLINE=$(( SECONDS + ${GPU_CHECK_BUDGET_S:-480} ))
cap() { local left=$(( DEADLINE - SECONDS )); (( left < 5 )) && left=5; echo $(( $1 < left ? $1 : left )); }

step "environment"
nvidia-smi || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

step "build (sm_90a) against this machine's torch"
export LOCALARGMAX_CUDA_ARCH="${LOCALARGMAX_CUDA_ARCH:-90a}"
rm -rf build/cmake-py* localargmax/_C*.so
timeout "$(cap 420)" "$PY" -m pip install --no-deps --no-build-isolation -e . > "$OUT/gpu_build.log" 2>&1 || { tail -50 "$OUT/gpu_build.log"; echo "BUILD FAILED"; exit 1; }
"$PY" -c "import localargmax; assert localargmax.WITH_CUDA, 'built without CUDA'; print('WITH_CUDA', localargmax.WITH_CUDA)" || exit 1

step "GPU tests (every gpu-marked test: the CUDA paths of each op), then the build checks against this torch"
timeout "$(cap 240)" "$PY" -m pytest -q --maxfail=30 -p no:cacheprovider -m gpu tests --junitxml="$OUT/gpu_tests.xml" || status=1
timeout "$(cap 60)" "$PY" -m pytest -q -p no:cacheprovider tests/test_build.py || status=1

step "compute-sanitizer (memcheck, racecheck) on a small step"
cat > /tmp/lam_sanitize.py <<'PYEOF'
import os, torch, localargmax
h = torch.randn(9, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(3001, 4096, device="cuda", dtype=torch.bfloat16)
for path in ("simt", "mma", "gemm"):  # every CUDA path (LOCALARGMAX_CUDA_PATH)
    os.environ["LOCALARGMAX_CUDA_PATH"] = path
    for fn in (lambda: localargmax.shard_argmax(h, w, num_valid=2999),
               lambda: localargmax.shard_argmax(h[:1], w[:, :4088], num_valid=3001),
               lambda: localargmax.shard_topk(h, w, 8, num_valid=2999),
               lambda: localargmax.shard_sample(h, w, torch.ones(9, device="cuda"), 1, 0)):
        fn()
torch.cuda.synchronize(); print("ok")
PYEOF
if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck; do
    timeout "$(cap 90)" compute-sanitizer --tool "$tool" --error-exitcode 9 "$PY" /tmp/lam_sanitize.py > "$OUT/sanitizer_$tool.log" 2>&1 \
      && echo "$tool: clean" || { echo "$tool: FAILED or unavailable (see sanitizer_$tool.log)"; tail -5 "$OUT/sanitizer_$tool.log"; }
  done
else
  echo "compute-sanitizer not found: skipped"
fi

step "kernel benchmark: bf16, Qwen3 151936x4096 at tp 1,2,4,8 and DeepSeek-V3 129280x7168 at tp 8"
B="1,4,16,64,256,1024"
for tp in 1 2 4 8; do
  rows=$(( (151936 + tp - 1) / tp ))
  timeout "$(cap 90)" "$PY" -m localargmax.bench --kernel-only --device cuda --model qwen3 --rows "$rows" --dtype bfloat16 \
    --batch "$B" --no-progress --json "$OUT/gpu_kernel_qwen3_tp${tp}.json" || status=1
done
timeout "$(cap 90)" "$PY" -m localargmax.bench --kernel-only --device cuda --model deepseek-v3 --rows 16160 --dtype bfloat16 \
  --batch "$B" --no-progress --json "$OUT/gpu_kernel_deepseek_v3_tp8.json" || status=1

step "whole step (lm_head_argmax) in a world-size-1 NCCL group"
timeout "$(cap 120)" "$PY" -m localargmax.bench --device cuda --tp 1 --model qwen3 --dtype bfloat16 --batch 1,16,64 \
  --no-progress --json "$OUT/gpu_step_qwen3_tp1.json" || status=1

step "done, status $status"
exit $status
