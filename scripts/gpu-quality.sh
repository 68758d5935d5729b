#!/bin/bash
# GPU side of docs/quality.md: the answer-quality sweep (scripts/quality_sweep.py) on the whole
# LoCoMo dev set with the 0.5B model at every k, then the 1.5B model at k = 10 and 50, as one
# background job, after ../shared/gpu/README.md has staged vLLM into /tmp/vllm-stage and the
# models' parts into /tmp/model-0.5b and /tmp/model-1.5b (each converted by `gpu-quality.sh
# model DIR`). Results land in /tmp/quality; `poll` copies them to $OUT.
#
#   bash scripts/gpu-quality.sh start        from the checkout's root (with .bundle/data)
#   bash scripts/gpu-quality.sh model DIR    convert the model bundle in DIR, in the background
#   bash scripts/gpu-quality.sh poll [S]     wait up to S seconds (default 240) for the end
#
# SETTINGS05 overrides the 0.5B settings (NAME=order,tail,context[,from]) and K05 its k;
# the 1.5B model runs (at K15) the baseline and the two settings with the smallest
# worst-k loss on the 0.5B among those whose KV TTFT is at most 0.6x the text path's at
# every k >= 10, or SETTINGS15. SEQUENTIAL: questions per conversation in the TTFT sample;
# SYNTHETIC=0 skips `bench synthetic`.
set -u
Q=/tmp/quality
DATA=.bundle/data/locomo-dev.json
: "${SETTINGS05:=base=rank,0,0 t4=rank,4,0 c16=rank,0,16 t4c16=rank,4,16 t4c32=rank,4,32 t4n16=rank,4,16,similar}"
: "${SYNTHETIC_ARGS:=}" "${K05:=5,10,20,50}" "${K15:=10,50}" "${SETTINGS15:=}" "${SEQUENTIAL:=2}"

log() { echo "[$(date +%T) +$(( $(date +%s) - t0 ))s] $*"; }
wait_file() { local n=0; while [ ! -e "$1" ] && [ $n -lt "$2" ]; do sleep 2; n=$((n + 2)); done; }

case ${1:-} in
start)
  rm -rf $Q /tmp/repo && mkdir -p $Q /tmp/repo
  tar -cf - --exclude=./.git --exclude='./.bundle/[0-9m]*' . | tar -xf - -C /tmp/repo
  cd /tmp/repo && setsid nohup bash scripts/gpu-quality.sh run > /dev/null 2>&1 < /dev/null &
  sleep 1; cat $Q/job.log 2>/dev/null
  ;;
model)
  dir=$2
  cd "$dir" && (setsid nohup sh -c "sh remote-model.sh > model.log 2>&1; \
    if grep -q 'MODEL OK' model.log; then tail -n 1 model.log | cut -d' ' -f3 > model.ok; \
    else touch model.failed; fi" > /dev/null 2>&1 < /dev/null &)
  ;;
run)
  exec >> $Q/job.log 2>&1
  t0=$(date +%s)
  log "install"
  (cd /tmp/vllm-stage && sh remote-install.sh) > $Q/install.log 2>&1 || {
    tail -n 30 $Q/install.log; log "install failed"; touch $Q/done; exit 1; }
  log "installed"
  export PYTHONPATH=/tmp/site:/tmp/repo VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING PYTHONUNBUFFERED=1
  for size in 0.5b 1.5b; do
    wait_file /tmp/model-$size/model.ok 900
    if [ ! -e /tmp/model-$size/model.ok ]; then log "no $size model"; continue; fi
    model=$(cat /tmp/model-$size/model.ok)
    if [ $size = 0.5b ]; then ks=$K05; settings=$SETTINGS05; else
      ks=$K15 settings=$SETTINGS15
      # shellcheck disable=SC2086
      [ -n "$settings" ] || settings="base=rank,0,0 $(python3 scripts/quality_sweep.py \
        --dataset $DATA --out $Q/q0.5b --pick 2 $SETTINGS05)"
    fi
    log "sweep $size k=$ks: $settings"
    # shellcheck disable=SC2086
    python3 scripts/quality_sweep.py --model "$model" --dataset $DATA --k $ks \
      --concurrency 64 --sequential "$SEQUENTIAL" --out $Q/q$size $settings > $Q/sweep-$size.log 2>&1
    log "sweep $size rc=$?"
    grep -a '^|' $Q/sweep-$size.log | sort -u | tail -n 40
  done
  if [ "${SYNTHETIC:-1}" = 0 ]; then touch $Q/done; exit 0; fi
  log "synthetic"
  timeout 300 python3 -m inferscale_memory.cli bench synthetic --shape llama-3.1-8b \
    --k 0,5,10,20,50,100 --trials 10 --concurrency 64 --output-len 32 --workdir $Q/synthetic \
    --out $Q/synthetic.json $SYNTHETIC_ARGS > $Q/synthetic.log 2>&1
  log "synthetic rc=$?"; grep -a -e '^|' -e shape -e throughput $Q/synthetic.log
  touch $Q/done
  ;;
poll)
  w=${2:-240} t=0
  while [ $t -lt "$w" ] && [ ! -e $Q/done ]; do sleep 2; t=$((t + 2)); done
  echo "== $(date +%T) waited ${t} s"
  tail -n 45 $Q/job.log 2>/dev/null
  for size in 0.5b 1.5b; do grep -a '^|' $Q/sweep-$size.log 2>/dev/null | tail -n 3; done
  if [ -n "${OUT:-}" ]; then
    cp $Q/job.log $OUT/ 2>/dev/null
    tar -czf $OUT/quality.tgz -C /tmp --exclude='*.png' --exclude=requests.jsonl \
      --exclude=synthetic quality 2>/dev/null
    ls -la $OUT
  fi
  ;;
*)
  sed -n '2,13p' "$0"; exit 2 ;;
esac
