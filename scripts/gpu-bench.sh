#!/bin/sh
# The GPU checks and benchmarks of docs/benchmarks/gpu-h200.md, on a CUDA machine with
# vLLM importable. VLLM_SITE names a folder vLLM was installed into with --target (as
# ../shared/gpu/README.md does); it is put first on PYTHONPATH.
#   usage: [VLLM_SITE=DIR] scripts/gpu-bench.sh OUT_FOLDER [tests|bench|tp2]...
#          (default steps: all three)
set -e
out=${1:-runs/gpu}
shift || true
steps=${*:-tests bench tp2}
mkdir -p "$out"
export PYTHONPATH=${VLLM_SITE:+$VLLM_SITE:}$PWD VLLM_USE_FLASHINFER_SAMPLER=0 \
  HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
bench() {
  python -m inferscale_memory.cli bench synthetic --shape llama-3.1-8b --k 0,10,20,50,100 \
    --trials 10 --concurrency 64 --output-len 32 --workdir "$out/work" "$@" 2>&1 \
    | grep -v -e WARNING -e "^\s*$" | tail -12
}
for step in $steps; do
  case $step in
    tests) python -m pytest -q -p no:cacheprovider -s tests/test_gpu.py 2>&1 | tail -8 ;;
    bench)
      CUDA_VISIBLE_DEVICES=0 bench --connector-timing --out "$out/synthetic.json"
      CUDA_VISIBLE_DEVICES=0 INFERSCALE_FUSED_INJECT=0 bench --connector-timing \
        --out "$out/synthetic-portable.json" ;;
    tp2) bench --tensor-parallel-size 2 --out "$out/synthetic-tp2.json" ;;
  esac
done
