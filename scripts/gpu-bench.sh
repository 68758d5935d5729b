#!/bin/sh
# The GPU checks and benchmarks of docs/benchmarks/gpu-h200.md, on a CUDA machine where
# vLLM 0.26 was installed into /tmp/site as ../shared/gpu/README.md describes.
#   usage: scripts/gpu-bench.sh OUT_FOLDER
set -e
out=${1:-runs/gpu}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python -m pytest -q -p no:cacheprovider -s tests/test_gpu.py 2>&1 | tail -8
for fused in 1 0; do
  INFERSCALE_FUSED_INJECT=$fused python -m inferscale_memory.cli bench synthetic \
    --shape llama-3.1-8b --k 0,10,20,50,100 --trials 10 --concurrency 64 --output-len 32 \
    --connector-timing --workdir "$out/work" --out "$out/synthetic-fused$fused.json" \
    2>&1 | grep -v -e WARNING -e "^\s*$" | tail -12
done
