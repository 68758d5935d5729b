#!/bin/bash
# GPU side of docs/quality.md: the answer-quality sweep (scripts/quality_sweep.py) on the whole
# LoCoMo dev set with the 0.5B model at every k, then the 1.5B model at k = 10 and 50, as one
# background job, after ../shared/gpu/README.md has staged vLLM into /tmp/vllm-stage and the
# models' parts into /tmp/model-0.5b and /tmp/model-1.5b (each converted by `gpu-quality.sh
# model DIR`). Results land in /tmp/quality; `poll` copies them to $OUT, without the
# questions' rows (LoCoMo text): each sweep's halves and evidence table (quality_analysis.py)
# is made on the GPU machine, as analysis-SIZE.md.
#
#   bash scripts/gpu-quality.sh start        from the checkout's root (with .bundle/data)
#   bash scripts/gpu-quality.sh model DIR    convert the model bundle in DIR, in the background
#   bash scripts/gpu-quality.sh poll [S]     wait up to S seconds (default 240) for the end
#                                            (a sweep still running: its halves so far,
#                                            partial-SIZE.md)
#
# The job goes on after a part fails (install, a model's conversion, a sweep, the 1.5B pick,
# `bench synthetic`) and lists it in $Q/failed; `poll` of a finished job names those parts on
# stderr and exits 1 (0: finished clean, or "still running"). QUALITY_DIR, VLLM_STAGE and
# MODELS_DIR (default /tmp: MODELS_DIR/model-0.5b, ...) move the folders named above, and
# REPO_COPY (default /tmp/repo) the copy of the checkout that the job runs in.
#
# SETTINGS05 overrides the 0.5B settings (NAME=order,tail,context) and K05 its k;
# the 1.5B model runs (at K15) the baseline and the two settings with the smallest
# worst-k loss on the 0.5B among those whose KV TTFT is at most 0.6x the text path's at
# every k >= 10, or SETTINGS15. SEQUENTIAL: questions per conversation in the TTFT sample;
# SYNTHETIC=0 skips `bench synthetic`. SIZES: the models in the order they run (default
# "0.5b 1.5b"; "1.5b 0.5b" needs SETTINGS15, since the pick reads the 0.5B's results).
# PARALLEL=1 runs the models' sweeps at once, each engine with GPU_SHARE (default 0.4) of
# the GPU's memory (needs SETTINGS15).
set -uo pipefail
Q=${QUALITY_DIR:-/tmp/quality} STAGE=${VLLM_STAGE:-/tmp/vllm-stage} MODELS=${MODELS_DIR:-/tmp}
REPO=${REPO_COPY:-/tmp/repo}
SITE=/tmp/site  # where the kit's remote-install.sh installs vLLM (fixed there)
DATA=.bundle/data/locomo-dev.json
: "${SETTINGS05:=base=rank,0,0 t4n4=rank,4,4 t4n2=rank,4,2 t4n1=rank,4,1}"
: "${SYNTHETIC_ARGS:=}" "${K05:=5,10,20,50}" "${K15:=10,50}" "${SETTINGS15:=}" "${SEQUENTIAL:=2}"
: "${SIZES:=0.5b 1.5b}"

log() { echo "[$(date +%T) +$(( $(date +%s) - t0 ))s] $*"; }
# wait_model DIR SECONDS: until DIR's conversion succeeded (model.ok) or failed (model.failed).
wait_model() { local n=0; while [ ! -e "$1/model.ok" ] && [ ! -e "$1/model.failed" ] &&
  [ $n -lt "$2" ]; do sleep 2; n=$((n + 2)); done; }
# fail PART: log it and add it to $Q/failed, which `poll` reports (and exits 1 on).
fail() { log "FAILED: $*"; echo "$*" >> $Q/failed; }

case ${1:-} in
start)
  rm -rf $Q "$REPO" && mkdir -p $Q "$REPO"
  tar -cf - --exclude=./.git --exclude='./.bundle/[0-9m]*' . | tar -xf - -C "$REPO" || {
    echo "gpu-quality: copying the checkout to $REPO failed" >&2; exit 1; }
  cd "$REPO" && setsid nohup bash scripts/gpu-quality.sh run > /dev/null 2>&1 < /dev/null &
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
  (cd $STAGE && sh remote-install.sh) > $Q/install.log 2>&1 || {
    tail -n 30 $Q/install.log; fail "install (see install.log)"; touch $Q/done; exit 1; }
  log "installed"
  export PYTHONPATH=$SITE:$REPO VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING PYTHONUNBUFFERED=1
  # sweep SIZE: that model's sweep (the 1.5B's settings picked from the 0.5B's results
  # unless SETTINGS15 names them).
  sweep() {
    local size=$1 model ks settings picked rc
    wait_model $MODELS/model-$size 900
    if [ ! -e $MODELS/model-$size/model.ok ]; then
      fail "no $size model ($MODELS/model-$size/model.log)"; return; fi
    model=$(cat $MODELS/model-$size/model.ok)
    if [ $size = 0.5b ]; then ks=$K05; settings=$SETTINGS05; else
      ks=$K15 settings=$SETTINGS15
      # shellcheck disable=SC2086
      if [ -z "$settings" ]; then
        picked=$(python3 scripts/quality_sweep.py --dataset $DATA --out $Q/q0.5b --pick 2 \
          $SETTINGS05) || fail "pick of the 1.5b settings rc=$?: $picked"
        settings="base=rank,0,0 $picked"
      fi
    fi
    log "sweep $size k=$ks: $settings"
    # shellcheck disable=SC2086
    python3 scripts/quality_sweep.py --model "$model" --dataset $DATA --k $ks \
      --concurrency 64 --sequential "$SEQUENTIAL" --out $Q/q$size $settings > $Q/sweep-$size.log 2>&1
    rc=$?
    log "sweep $size rc=$rc"
    [ $rc = 0 ] || { tail -n 20 $Q/sweep-$size.log; fail "sweep $size rc=$rc (sweep-$size.log)"; }
    grep -a '^|' $Q/sweep-$size.log | sort -u | tail -n 40
    # Halves and evidence need each question's rows (requests.jsonl), which hold LoCoMo
    # text and never leave this machine: the table is made here, from them.
    # shellcheck disable=SC2086
    python3 scripts/quality_analysis.py --dataset $DATA --out $Q/q$size \
      $(for s in $settings; do printf '%s ' "${s%%=*}"; done) > $Q/analysis-$size.md 2>&1 ||
      fail "analysis $size rc=$? (analysis-$size.md)"
    cat $Q/analysis-$size.md
  }
  if [ "${PARALLEL:-0}" = 1 ]; then
    # Every model's engine at once, each with GPU_SHARE of the device's memory.
    export INFERSCALE_GPU_MEMORY_UTILIZATION=${GPU_SHARE:-0.4}
    for size in $SIZES; do sweep $size & done
    wait
    unset INFERSCALE_GPU_MEMORY_UTILIZATION
  else
    for size in $SIZES; do sweep $size; done
  fi
  if [ "${SYNTHETIC:-1}" = 0 ]; then touch $Q/done; [ ! -e $Q/failed ]; exit; fi
  log "synthetic"
  timeout 300 python3 -m inferscale_memory.cli bench synthetic --shape llama-3.1-8b \
    --k 0,5,10,20,50,100 --trials 10 --concurrency 64 --output-len 32 --workdir $Q/synthetic \
    --out $Q/synthetic.json $SYNTHETIC_ARGS > $Q/synthetic.log 2>&1
  rc=$?
  log "synthetic rc=$rc"; grep -a -e '^|' -e shape -e throughput $Q/synthetic.log
  [ $rc = 0 ] || { tail -n 20 $Q/synthetic.log; fail "synthetic rc=$rc (synthetic.log)"; }
  touch $Q/done
  [ ! -e $Q/failed ]
  ;;
poll)
  w=${2:-240} t=0
  while [ $t -lt "$w" ] && [ ! -e $Q/done ]; do sleep 2; t=$((t + 2)); done
  echo "== $(date +%T) waited ${t} s"
  tail -n 45 $Q/job.log 2>/dev/null
  for size in 0.5b 1.5b; do
    grep -a '^|' $Q/sweep-$size.log 2>/dev/null | tail -n 3
    # A sweep still running: its halves so far (the k it finished are whole), so that a
    # machine taken back mid-run leaves them in the last poll's results.
    if [ ! -e $Q/analysis-$size.md ] && [ -d $Q/q$size ]; then
      names=$(cd $Q/q$size && for d in */; do [ -e "$d/requests.jsonl" ] && printf '%s ' "${d%/}"; done)
      # shellcheck disable=SC2086
      [ -n "$names" ] && PYTHONPATH=$SITE:$REPO python3 $REPO/scripts/quality_analysis.py \
        --dataset $REPO/$DATA --out $Q/q$size $names > $Q/partial-$size.md 2>&1
    fi
  done
  cat $Q/analysis-*.md $Q/partial-*.md 2>/dev/null
  status=0
  if [ -n "${OUT:-}" ]; then
    cp $Q/job.log $OUT/ 2>/dev/null
    # tar's status 1 (a file changed while read: the job is still writing) is no failure
    err=$(tar -czf $OUT/quality.tgz -C "$(dirname $Q)" --exclude='*.png' \
      --exclude=requests.jsonl --exclude=synthetic "$(basename $Q)" 2>&1)
    rc=$?
    [ $rc -le 1 ] || { echo "gpu-quality: packing $Q into $OUT/quality.tgz failed" \
      "(tar rc=$rc): $err" >&2; status=1; }
    ls -la $OUT
  fi
  if [ ! -e $Q/done ]; then
    echo "gpu-quality: still running (poll again)"
  elif [ -e $Q/failed ]; then
    echo "gpu-quality: FAILED:" >&2; sed 's/^/  /' $Q/failed >&2; status=1
  fi
  exit $status
  ;;
*)
  sed -n '2,27p' "$0"; exit 2 ;;
esac
