"""Mines hard negatives for reranker training: per judged query of a BEIR split, its positives and negatives
drawn from a first stage's ranks, as the group JSONL FlagEmbedding and sentence-transformers train on.

  python scripts/mine_negatives.py --data_dir=beir/scifact --output=out/scifact_groups.jsonl \\
      --range_min=10 --range_max=100 --num_negatives=15 --margin=0
  # a maxscore checkpoint's own ranking as the first stage: eval_rerank.py's run.trec on the train split
  python scripts/mine_negatives.py --data_dir=beir/scifact --run_file=out/eval_train/run.trec \\
      --output=out/groups.jsonl --sampling=top

The first stage is BM25 over the whole corpus (bm25s) unless --run_file names a TREC run. A judged-relevant
document is never a negative; --margin also drops what the first stage scores within that margin of the
query's lowest-scored positive. Prints a JSON summary (queries written and skipped, documents kept out); the
output is written whole or not at all. Every flag is a key of configs/mine.yml. Input errors exit 2.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses
import json
import pathlib

import tqdm
from absl import flags

from maxscore import cli
from maxscore.files import safety
from maxscore.groups import mining

ENTRY = "mine"
SECTIONS = {"mine": mining.MiningConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/mine.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    cfg = cli.entry_from_flags(fv, ENTRY, SECTIONS)["mine"]
    if not cfg.output:
      raise mining.MiningError("--output is required: the group JSONL file to write")
    inputs = [cfg.data_dir, cfg.run_file]
    safety.check_output_file(cfg.output, inputs, "--output", overwrite=cfg.overwrite)
    output = pathlib.Path(cfg.output)
    records, counts = mining.mine(cfg, on_query=lambda: bar.update())  # skipped queries advance the bar too
    output.parent.mkdir(parents=True, exist_ok=True)
    with tqdm.tqdm(total=counts.queries, unit="query", desc="mining") as bar, safety.atomic_output(output) as out:
      mining.write_records(records, out)
  print(json.dumps({"output": cfg.output, **dataclasses.asdict(counts)}, indent=2))


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
