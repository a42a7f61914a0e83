#!/bin/sh
# The reranker recipe where it is fast (`make gpu-train`, on a machine with a GPU and the image's own JAX):
# a GGUF base cut to its first layers -> train_reranker.py with every weight trained on teacher-scored groups
# (distillation toward the teacher alone: the best of the loss mixes measured, BENCHMARKS.md "Sixth attempt"),
# the best step by dev -> eval_rerank.py on the held-out test split, reranked and fused (rrf and learned).
# Everything large (the base, the optimizer's checkpoints, the export) stays in $WORK; $OUT gets only the
# small files: the dev curve (metrics.jsonl, selection.json), the run's summary and the test evals' reports.
#
#   sh scripts/gpu_train.sh GGUF GROUPS OUT [train_reranker flags...]
#
# Environment: PYTHON (default python3), WORK (default /tmp/maxscore_gpu_train), KEEP_LAYERS (16),
# DATA (the embedded python-docs set), ITEM_TOKENS (40), QUERY_TOKENS (24), FUSIONS (the test evals' fusions:
# "rrf learned"), EVAL_FLAGS (added to each eval),
# TRAIN_TIMEOUT (seconds; then the run stops at its next step as on Ctrl-C and its best dev step is exported).
set -eu
GGUF=$1; GROUPS=$2; OUT=$3; shift 3
PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/maxscore_gpu_train}
KEEP_LAYERS=${KEEP_LAYERS:-16}
DATA=${DATA:-maxscore/assets/default/python_docs_beir}
ITEM_TOKENS=${ITEM_TOKENS:-40}
QUERY_TOKENS=${QUERY_TOKENS:-24}
EVAL_FLAGS=${EVAL_FLAGS:-}
FUSIONS=${FUSIONS:-rrf learned}
TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-0}
mkdir -p "$OUT" "$WORK"
stamp() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/gpu_train.log"; }

stamp "convert: $GGUF, first $KEEP_LAYERS layers"
"$PYTHON" scripts/convert_gguf_checkpoint.py --gguf="$GGUF" --keep_layers="$KEEP_LAYERS" \
  --output_dir="$WORK/base" --overwrite >>"$OUT/gpu_train.log" 2>&1

stamp "train"
set -- --checkpoint_dir="$WORK/base" --groups_file="$GROUPS" --data_dir="$DATA" \
  --run_file="$DATA/bm25.trec" --rerank_top_k=20 --train_backbone --lora_rank=0 --remat=none --head=lm_labels \
  --template=plain --loss=listwise --distill_weight=1 --group_size=8 --max_item_tokens="$ITEM_TOKENS" \
  --max_query_tokens="$QUERY_TOKENS" --learning_rate=1e-4 --warmup_steps=10 --batch_size=4 --num_steps=768 \
  --eval_every=64 --save_every=128 --select_metric=ndcg@10 --patience=0 --workdir="$WORK/run" \
  --export_dir="$WORK/export" "$@"
rc=0
# SIGINT stops the run at its next step; a process started with SIGINT ignored (a background job of a script)
# cannot take it, so a kill follows 120 s later and the last complete checkpoint is what remains.
timeout -k 120 -s INT "$TRAIN_TIMEOUT" "$PYTHON" scripts/train_reranker.py "$@" --overwrite >"$OUT/train.log" 2>&1 \
  || rc=$?
if [ "$rc" = 130 ] || [ "$rc" = 124 ] || [ "$rc" = 137 ]; then  # stopped by TRAIN_TIMEOUT: export its best step
  stamp "train stopped at TRAIN_TIMEOUT=$TRAIN_TIMEOUT s; exporting its best step"
  "$PYTHON" scripts/train_reranker.py "$@" --export_only >>"$OUT/train.log" 2>&1 || stamp "export failed"
elif [ "$rc" != 0 ]; then
  stamp "train failed (exit $rc)"; tail -40 "$OUT/train.log"
fi
cp "$WORK/run/metrics.jsonl" "$WORK/run/selection.json" "$OUT/" 2>/dev/null || true

# One shape for every query (prefix, slots and rows padded to one bucket each), so one compile: with the default
# buckets (17 shapes over the test split) the eval on an H200 took 32-52 s a query over its first 4, which points to
# a compile per shape (not profiled); the trainer's dev evals, one shape, took 3.6 s per 100 queries there.
for fusion in $FUSIONS; do
  stamp "test eval, fusion=$fusion"
  "$PYTHON" scripts/eval_rerank.py --checkpoint_dir="$WORK/export" --data_dir="$DATA" --run_file="$DATA/bm25.trec" \
    --split=test --template=plain --max_item_tokens="$ITEM_TOKENS" --max_query_tokens="$QUERY_TOKENS" \
    --fusion="$fusion" --output_dir="$WORK/eval_$fusion" --overwrite $EVAL_FLAGS "prefix_buckets=[48]" \
    "item_buckets=[$((ITEM_TOKENS + 8))]" "item_count_buckets=[32]" length_group_ratio=1000 \
    >"$OUT/eval_$fusion.log" 2>&1 || stamp "eval failed"
  cp "$WORK/eval_$fusion/summary.json" "$OUT/eval_${fusion}_summary.json" 2>/dev/null || true
  tail -12 "$OUT/eval_$fusion.log"
done
stamp "done"
