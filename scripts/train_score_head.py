"""Trains a score head on a frozen maxscore checkpoint; exports checkpoint + head for eval_rerank.py.

  python scripts/train_score_head.py --workdir=out/head --export_dir=out/head/model   # the embedded default
  python scripts/train_score_head.py --checkpoint_dir=ckpt/qwen3-0.6b --data_dir=beir/scifact \\
      --run_file=bm25.trec --train_split=train --dev_split=dev --head=lm_labels --delta=full --loss=listwise

Training data: the JSONL form (records with a `split` field) or BEIR + a first-stage run, as in
eval_rerank.py. A killed run restarted with the same flags resumes from its last checkpoint and
ends with the same head, bit for bit. Prints the summary JSON (also <workdir>/summary.json):
dev metrics before/after, head-training throughput and the share of time in the frozen forward.
Trailing `key=value` arguments override configs/base.yml keys. Input errors exit 2.
"""

import dataclasses
import json

from absl import app, flags

from maxscore import cli

from maxscore.heads import train as train_lib
from maxscore.rerank import data, eval as eval_lib, prompts


def define_flags(fv: flags.FlagValues) -> None:
  t, e = train_lib.TrainConfig(), eval_lib.EvalConfig()
  flags.DEFINE_string("checkpoint_dir", None, f"backbone checkpoint; default: the embedded default "
                      f"({data.DEFAULT_CHECKPOINT.name}); an existing head in it is ignored", flag_values=fv)
  flags.DEFINE_string("jsonl", None, f"rerank set in the JSONL form; default: the embedded {data.DEFAULT_JSONL.name}",
                      flag_values=fv)
  flags.DEFINE_string("data_dir", None, "BEIR dataset directory", flag_values=fv)
  flags.DEFINE_string("run_file", None, "first-stage TREC run (with --data_dir)", flag_values=fv)
  flags.DEFINE_string("train_split", "train", "split to train on (JSONL split field or BEIR qrels/<split>.tsv)",
                      flag_values=fv)
  flags.DEFINE_string("dev_split", "dev", "split to evaluate on every --eval_every steps; '' = none",
                      flag_values=fv)
  flags.DEFINE_integer("rerank_top_k", 100, "candidates per query (by first-stage rank); 0 = all", flag_values=fv)
  flags.DEFINE_integer("max_train_queries", 0, "use only the first N train queries; 0 = all", flag_values=fv)
  flags.DEFINE_integer("max_dev_queries", 0, "use only the first N dev queries; 0 = all", flag_values=fv)
  flags.DEFINE_string("workdir", "out/train_head", "checkpoints, metrics.jsonl, summary.json", flag_values=fv)
  flags.DEFINE_string("export_dir", None, "write base checkpoint + trained head here (for eval_rerank.py)",
                      flag_values=fv)
  flags.DEFINE_string("feature_cache", None, "npz file for the frozen features (reused when it matches)",
                      flag_values=fv)
  flags.DEFINE_bool("overwrite", False, "discard the workdir (and replace --export_dir) instead of resuming; "
                    "only directories maxscore wrote are removed", flag_values=fv)
  # Head, loss, optimizer, loop.
  flags.DEFINE_enum("head", t.head, ["lm_labels", "linear", "mlp"], "head kind", flag_values=fv)
  flags.DEFINE_enum("delta", t.delta, ["full", "low_rank", "none"], "lm_labels: hidden-state term of the label-logit "
                    "delta: h @ W [D, K], h @ A @ B (rank --rank), or none (bias only)", flag_values=fv)
  flags.DEFINE_integer("rank", t.rank, "lm_labels with --delta=low_rank: rank of h @ A @ B", flag_values=fv)
  flags.DEFINE_bool("use_bias", t.use_bias, "lm_labels: trainable bias on the label logits", flag_values=fv)
  flags.DEFINE_integer("num_outputs", t.num_outputs, "linear/mlp: 1 = one relevance logit, 0 = one per label",
                       flag_values=fv)
  flags.DEFINE_integer("mlp_hidden", t.mlp_hidden, "mlp: hidden width", flag_values=fv)
  flags.DEFINE_enum("loss", t.loss, sorted(train_lib.LOSSES), "ranking loss", flag_values=fv)
  flags.DEFINE_float("learning_rate", t.learning_rate, "peak learning rate", flag_values=fv)
  flags.DEFINE_float("end_learning_rate", t.end_learning_rate, "learning rate at the last step", flag_values=fv)
  flags.DEFINE_integer("warmup_steps", t.warmup_steps, "linear warmup steps", flag_values=fv)
  flags.DEFINE_float("weight_decay", t.weight_decay, "AdamW weight decay", flag_values=fv)
  flags.DEFINE_float("clip_norm", t.clip_norm, "gradient clipping by global norm", flag_values=fv)
  flags.DEFINE_integer("batch_size", t.batch_size, "queries per step", flag_values=fv)
  flags.DEFINE_integer("num_epochs", t.num_epochs, "epochs over the train queries", flag_values=fv)
  flags.DEFINE_integer("num_steps", t.num_steps, "total steps; 0 = from --num_epochs", flag_values=fv)
  flags.DEFINE_integer("seed", t.seed, "head init and data order", flag_values=fv)
  flags.DEFINE_integer("log_every", t.log_every, "train-loss lines every N steps", flag_values=fv)
  flags.DEFINE_integer("eval_every", t.eval_every, "dev eval every N steps (0 = start and end only)", flag_values=fv)
  flags.DEFINE_integer("save_every", t.save_every, "checkpoint every N steps (and at the end)", flag_values=fv)
  flags.DEFINE_integer("keep_checkpoints", t.keep_checkpoints, "checkpoints kept", flag_values=fv)
  flags.DEFINE_bool("train_backbone", t.train_backbone, "fine-tune the whole model (remat) instead of the head only",
                    flag_values=fv)
  flags.DEFINE_string("algorithm", None, "scoring algorithm for the frozen features (default: the selector's)",
                      flag_values=fv)
  # Prompts, as eval_rerank.py builds them.
  flags.DEFINE_enum("template", e.template, sorted(prompts.TEMPLATES), "prompt template", flag_values=fv)
  flags.DEFINE_string("instruction", e.instruction, "the {instruction} of templates that have one", flag_values=fv)
  flags.DEFINE_list("labels", list(e.labels), "label words or ids, positive first; default: the template's",
                    flag_values=fv)
  flags.DEFINE_enum("score_mode", e.score_mode, sorted(eval_lib.SCORE_MODES), "ranking score for dev metrics",
                    flag_values=fv)
  flags.DEFINE_integer("max_query_tokens", e.max_query_tokens, "cut queries to this many tokens", flag_values=fv)
  flags.DEFINE_integer("max_item_tokens", e.max_item_tokens, "cut documents to this many tokens", flag_values=fv)
  flags.DEFINE_list("metrics", list(e.metrics), "dev metrics (trec_eval names or aliases)", flag_values=fv)
  flags.DEFINE_multi_string("override", [], "key=value config override (repeatable)", flag_values=fv)
  flags.DEFINE_bool("progress", True, "log progress", flag_values=fv)
  # For tests: simulate a slow step so a supervisor can kill the run mid-way.
  flags.DEFINE_float("step_delay_s", 0.0, "sleep this long after every step (tests)", flag_values=fv)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  overrides = list(argv[1:]) + list(fv.override)
  names = {f.name for f in dataclasses.fields(train_lib.TrainConfig)}
  cfg = train_lib.TrainConfig(**{n: fv[n].value for n in names})
  prompt = eval_lib.EvalConfig(template=fv.template, instruction=fv.instruction, labels=tuple(fv.labels),
                               score_mode=fv.score_mode, max_query_tokens=fv.max_query_tokens,
                               max_item_tokens=fv.max_item_tokens, metrics=tuple(fv.metrics))
  jsonl = fv.jsonl if (fv.jsonl or fv.data_dir or fv.run_file) else str(data.DEFAULT_JSONL)
  with cli.one_line_errors():
    cfg.validate()
    prompt.validate()
    train_set = data.load_rerank_set(jsonl, fv.data_dir, fv.run_file, fv.train_split, fv.rerank_top_k)
    dev_set = data.load_rerank_set(jsonl, fv.data_dir, fv.run_file, fv.dev_split, fv.rerank_top_k) \
        if fv.dev_split else None
    if fv.max_train_queries:
      train_set.queries = train_set.queries[:fv.max_train_queries]
    if dev_set is not None and fv.max_dev_queries:
      dev_set.queries = dev_set.queries[:fv.max_dev_queries]
    summary = train_lib.train(cfg, prompt, fv.checkpoint_dir, train_set, dev_set, fv.workdir,
                              overrides=overrides, feature_cache=fv.feature_cache, export_dir=fv.export_dir,
                              overwrite=fv.overwrite, progress=fv.progress, step_delay_s=fv.step_delay_s)
  print(json.dumps(summary, indent=2))


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  app.run(main)
