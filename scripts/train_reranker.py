"""Trains a reranker: a score head on a frozen checkpoint, or with --train_backbone the whole model (or LoRA
adapters with --lora_rank); exports checkpoint + head for eval_rerank.py.

  python scripts/train_reranker.py --workdir=out/head --export_dir=out/head/model   # the embedded default
  python scripts/train_reranker.py --checkpoint_dir=ckpt/qwen3-0.6b --data_dir=beir/scifact \\
      --run_file=bm25.trec --train_split=train --dev_split=dev --head=lm_labels --delta=full --loss=listwise
  # a pod: one process per host, the state sharded over the mesh (fsdp x tensor), the batch over data x fsdp
  python scripts/train_reranker.py --train_backbone --batch_size=64 --coordinator_address=host0:1234 \\
      --num_processes=4 --process_id=$ID ici_fsdp_parallelism=4 dcn_data_parallelism=4 ...

Training data: the JSONL form (records with a `split` field) or BEIR + a first-stage run, as in
eval_rerank.py; or --groups_file, groups of one query's positives and negatives (scripts/mine_negatives.py),
with --group_size to draw one positive and group_size - 1 negatives per query per step, and --loss=distill
to train toward the groups' teacher scores (pos_scores/neg_scores). A killed run restarted with the same flags resumes from its last checkpoint and
ends with the same head, bit for bit. Prints the summary JSON (also <workdir>/summary.json):
dev metrics before/after, head-training throughput and the share of time in the frozen forward.
Every flag is a key of configs/train.yml; trailing `key=value` arguments set configs/base.yml keys, the
mesh's ici_/dcn_*_parallelism among them. --coordinator_address, --num_processes and --process_id
start a multi-process run as in eval_rerank.py; process 0 writes the metrics, summary and export, every process
its own checkpoint shards. Input errors exit 2. Ctrl-C prints one line (the step reached and the checkpoint
a rerun resumes from) and exits 130.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import json

from absl import flags

from maxscore import cli
from maxscore.datasets import data
from maxscore.rerank.prompts import PromptConfig
from maxscore.datasets import groups
from maxscore.training import trainer
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import TrainConfig, TrainRun

ENTRY = "train"
SECTIONS = {"run": TrainRun, "train": TrainConfig, "prompt": PromptConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/train.yml as a flag, plus the multi-process flags."""
  cli.define_job_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  cli.join_job(fv)  # before any other JAX call
  with cli.one_line_errors():
    s = cli.entry_from_flags(fv, ENTRY, SECTIONS)
    run = s["run"]
    sources = data.sources_or_default(run.jsonl, run.data_dir, run.run_file, "train")
    if run.groups_file:  # mined groups (scripts/mine_negatives.py) instead of the train split
      train_set = groups.load_groups(run.groups_file)
    else:
      train_set = data.load_rerank_set(*sources, run.train_split, run.rerank_top_k)
    dev_set = data.load_rerank_set(*sources, run.dev_split, run.rerank_top_k) if run.dev_split else None
    if run.max_train_queries:
      train_set.queries = train_set.queries[:run.max_train_queries]
    if dev_set is not None and run.max_dev_queries:
      dev_set.queries = dev_set.queries[:run.max_dev_queries]
    with trainer.ctrl_c_note(run.workdir):  # Ctrl-C: one line (cli.run_script), where a rerun goes on from
      summary = train_lib.train(s["train"], s["prompt"], run.checkpoint_dir, train_set, dev_set, run.workdir,
                                overrides=argv[1:], feature_cache=run.feature_cache, export_dir=run.export_dir,
                                overwrite=run.overwrite, progress=run.progress,
                                adapters_dir=run.adapters_dir, export_only=run.export_only,
                                init_from=run.init_from)
  if summary:  # process 0 reports
    print(json.dumps(summary, indent=2))


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="workdir")
