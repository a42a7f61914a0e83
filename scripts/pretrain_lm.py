"""Pretrains a small decoder with the next-token loss on local text; exports a maxscore checkpoint.

  python scripts/pretrain_lm.py --workdir=out/pretrain --export_dir=out/pretrain/model
  python scripts/pretrain_lm.py --model_name=tiny-qwen3 --sources=pydoc --num_steps=200 --workdir=out/pt_small

Text: CPython's reference topics (pydoc_data) and the standard library's docstrings and sources of the
running Python (maxscore/lm/corpus.py), without the sections whose titles are the --held_out_splits
queries of the rerank set (--jsonl; the embedded one by default). Their text is the held-out set whose
perplexity is reported beside a unigram baseline's. Without --tokenizer_path a sentencepiece tokenizer of
--vocab_size is trained on the same text first. A killed run restarted with the same flags resumes and
ends bit for bit where an uninterrupted one would. Prints the summary JSON (also <workdir>/summary.json).
Every flag is a key of configs/pretrain.yml.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import json

from absl import flags

from maxscore import cli
from maxscore.lm import pretrain as pretrain_lib
from maxscore.training import trainer

ENTRY = "pretrain"
SECTIONS = {"run": pretrain_lib.PretrainRun, "pretrain": pretrain_lib.PretrainConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/pretrain.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    s = cli.entry_from_flags(fv, ENTRY, SECTIONS)
    with trainer.ctrl_c_note(s["run"].workdir):  # Ctrl-C: one line (cli.run_script), where a rerun goes on from
      summary = pretrain_lib.run_pretraining(s["run"], s["pretrain"])
  print(json.dumps(summary, indent=2))


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="workdir")
