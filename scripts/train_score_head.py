"""Trains a score head on a frozen maxscore checkpoint; exports checkpoint + head for eval_rerank.py.

  python scripts/train_score_head.py --workdir=out/head --export_dir=out/head/model   # the embedded default
  python scripts/train_score_head.py --checkpoint_dir=ckpt/qwen3-0.6b --data_dir=beir/scifact \\
      --run_file=bm25.trec --train_split=train --dev_split=dev --head=lm_labels --delta=full --loss=listwise

Training data: the JSONL form (records with a `split` field) or BEIR + a first-stage run, as in
eval_rerank.py. A killed run restarted with the same flags resumes from its last checkpoint and
ends with the same head, bit for bit. Prints the summary JSON (also <workdir>/summary.json):
dev metrics before/after, head-training throughput and the share of time in the frozen forward.
Every flag is a key of configs/train.yml; trailing `key=value` arguments override configs/base.yml
keys. Input errors exit 2.
"""

import json

from absl import flags

from maxscore import cli
from maxscore.heads import train as train_lib
from maxscore.rerank import data
from maxscore.rerank.eval import PromptConfig

ENTRY = "train"
SECTIONS = {"run": train_lib.TrainRun, "train": train_lib.TrainConfig, "prompt": PromptConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/train.yml as a flag, plus repeatable --override for configs/base.yml."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)
  flags.DEFINE_multi_string("override", [], "key=value config override (repeatable)", flag_values=fv)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  overrides = list(argv[1:]) + list(fv.override)
  with cli.one_line_errors():
    s = cli.entry_from_flags(fv, ENTRY, SECTIONS)
    run = s["run"]
    jsonl = run.jsonl if (run.jsonl or run.data_dir or run.run_file) else str(data.DEFAULT_JSONL)
    train_set = data.load_rerank_set(jsonl, run.data_dir, run.run_file, run.train_split, run.rerank_top_k)
    dev_set = data.load_rerank_set(jsonl, run.data_dir, run.run_file, run.dev_split, run.rerank_top_k) \
        if run.dev_split else None
    if run.max_train_queries:
      train_set.queries = train_set.queries[:run.max_train_queries]
    if dev_set is not None and run.max_dev_queries:
      dev_set.queries = dev_set.queries[:run.max_dev_queries]
    summary = train_lib.train(s["train"], s["prompt"], run.checkpoint_dir, train_set, dev_set, run.workdir,
                              overrides=overrides, feature_cache=run.feature_cache, export_dir=run.export_dir,
                              overwrite=run.overwrite, progress=run.progress, step_delay_s=run.step_delay_s)
  print(json.dumps(summary, indent=2))


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="workdir")
