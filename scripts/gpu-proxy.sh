#!/bin/sh
# scripts/recompute_proxy.py on the GPU machine over the whole LoCoMo development set: one
# background process per model, group of k and shard (the plain model is bound by kernel
# launches, so several share the GPU well; each holds its float32 weights and its
# conversation's captures: ~17 GB for the 1.5B, so at most 4 of them on an 80 GB card). Needs only the image's torch and transformers, the wheels of
# pydantic & co. (the package's imports) and nltk (LoCoMo's F1 stems with its Porter
# stemmer; the image lacks it: `pip download --no-deps nltk` into WHEELS), and a model
# folder (../shared/gpu/remote-model.sh).
#   sh scripts/gpu-proxy.sh deps WHEELS DATA      wheels into /tmp/pyd; DATA (the dataset and
#                                                 retrieval.json) to /tmp/pxdata; the checkout
#                                                 to /tmp/repo
#   sh scripts/gpu-proxy.sh start LOG NAME        when LOG says MODEL OK, $SHARDS runs (1) per
#                                                 group of $K ("10 20 50": one run per k;
#                                                 "10,20,50": one run for all three, its
#                                                 captures shared) with $VARIANTS, each with
#                                                 its share of the questions (--shard); a
#                                                 run started again goes on where it ended
#   sh scripts/gpu-proxy.sh poll SECONDS          waits until every run ended (at most
#                                                 SECONDS), then copies rows and logs to
#                                                 $OUT as rows.tgz (a call brings back few files)
set -e
runs=/tmp/px
case "$1" in
deps)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pyd "$2"/*.whl
  mkdir -p /tmp/pxdata $runs && cp "$3"/* /tmp/pxdata/
  rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -r inferscale_memory scripts /tmp/repo/
  PYTHONPATH=/tmp/repo:/tmp/pyd python3 -c "import inferscale_memory.bench.locomo, nltk; print('deps OK')"
  ;;
start)
  log=$2 name=$3
  shards=${SHARDS:-1}
  for k in ${K:-10 20 50}; do
    i=0
    while [ "$i" -lt "$shards" ]; do
      run=$runs/$name-k$(echo "$k" | tr , -)-s$i
      rm -f "$run.done"
      (setsid nohup sh -c "
        until grep -q 'MODEL OK' $log 2>/dev/null; do sleep 2; done
        model=\$(grep 'MODEL OK' $log | sed 's/MODEL OK \([^ ]*\).*/\1/')
        cd /tmp/repo && PYTHONPATH=/tmp/repo:/tmp/pyd HF_HUB_OFFLINE=1 \
          PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 \
          scripts/recompute_proxy.py --model \$model --dataset /tmp/pxdata/locomo-dev.json \
          --retrieval /tmp/pxdata/retrieval.json --k $k --variants '$VARIANTS' \
          --shard $i/$shards --out $run.jsonl >> $run.log 2>&1
        echo \"exit \$?\" >> $run.log; touch $run.done
      " > /dev/null 2>&1 < /dev/null &)
      touch $run.started
      i=$((i + 1))
    done
  done
  ;;
poll)
  end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    left=0
    for s in $runs/*.started; do [ -e "${s%.started}.done" ] || left=$((left + 1)); done
    [ "$left" = 0 ] && break
    sleep 5
  done
  for s in $runs/*.started; do
    n=${s%.started}; printf '%s: %s rows %s\n' "${n##*/}" "$(wc -l < "$n.jsonl" 2>/dev/null || echo 0)" \
      "$([ -e "$n.done" ] && tail -1 "$n.log" || echo running)"
  done
  (cd $runs && tar czf "$OUT/rows.tgz" *.jsonl *.log /tmp/model-*.log 2>/dev/null) || true
  ;;
esac
