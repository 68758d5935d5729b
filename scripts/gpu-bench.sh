#!/bin/bash
# The GPU checks and benchmarks of docs/benchmarks/gpu-h200.md, on a CUDA machine with
# vLLM importable. VLLM_SITE names a folder vLLM was installed into with --target (as
# ../shared/gpu/README.md does); it is put first on PYTHONPATH.
#   usage: [VLLM_SITE=DIR] scripts/gpu-bench.sh OUT_FOLDER [tests|bench|tp2]...
#          (default steps: all three)
# Each run's whole output goes to OUT_FOLDER/NAME.log (tests, synthetic,
# synthetic-portable, synthetic-tp2); its last lines are shown without vLLM's warnings.
# A run that fails is named on stderr with its exit status and the log's end, the other
# runs still go, and the script then exits 1 (2: an unknown step; 1 before any step: no
# GPU or an unwritable OUT_FOLDER).
set -uo pipefail
out=${1:-runs/gpu}
shift || true
steps=${*:-tests bench tp2}
for step in $steps; do
  case $step in
    tests|bench|tp2) ;;
    *) echo "gpu-bench: unknown step '$step' (tests, bench, tp2)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out" || exit 1
export PYTHONPATH=${VLLM_SITE:+$VLLM_SITE:}$PWD VLLM_USE_FLASHINFER_SAMPLER=0 \
  HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || {
  echo "gpu-bench: nvidia-smi failed (exit $?): no GPU to run on" >&2; exit 1; }
failed=()

# run NAME LINES COMMAND...: COMMAND's output into $out/NAME.log, its last LINES lines
# shown; NAME is recorded as failed when COMMAND exits non-zero.
run() {
  local name=$1 lines=$2 log="$out/$1.log" rc=0
  shift 2
  echo "== $name"
  "$@" > "$log" 2>&1 || rc=$?
  grep -v -e WARNING -e '^\s*$' "$log" | tail -n "$lines"
  if [ "$rc" -ne 0 ]; then
    { echo "gpu-bench: step $name FAILED (exit $rc); the end of $log:"
      tail -n 20 "$log"; } >&2
    failed+=("$name")
  fi
}
# bench NAME "VAR=VALUE ..." ARGS...: `bench synthetic` into $out/NAME.json and NAME.log.
bench() {
  local name=$1 envs=$2
  shift 2
  # shellcheck disable=SC2086  # envs: one word per assignment
  run "$name" 12 env $envs python -m inferscale_memory.cli bench synthetic \
    --shape llama-3.1-8b --k 0,10,20,50,100 --trials 10 --concurrency 64 --output-len 32 \
    --workdir "$out/work" --out "$out/$name.json" "$@"
}
for step in $steps; do
  case $step in
    tests) run tests 8 python -m pytest -q -p no:cacheprovider -s tests/test_gpu.py ;;
    bench)
      bench synthetic CUDA_VISIBLE_DEVICES=0 --connector-timing
      bench synthetic-portable "CUDA_VISIBLE_DEVICES=0 INFERSCALE_FUSED_INJECT=0" \
        --connector-timing ;;
    tp2) bench synthetic-tp2 "" --tensor-parallel-size 2 ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-bench: FAILED: ${failed[*]} (logs in $out)" >&2
  exit 1
fi
echo "gpu-bench: every step passed"
