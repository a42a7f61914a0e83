"""Trained score heads vs no head: head kinds x seeds, nDCG@10 on dev and test, paired tests.

  python scripts/head_study.py                                   # the embedded default, as in docs/fine-tune.md
  python scripts/head_study.py --specs=lm_labels --seeds=0 --checkpoint_dir=ckpt/m --jsonl=data.jsonl
  python scripts/head_study.py --specs=linear,mlp,lm_labels,lm_labels_low_rank --seeds=0 \
      --learning_rates=3e-4,1e-3,3e-3,1e-2 --losses=listwise,pairwise,pointwise   # docs/fine-tune.md's sweep

Prints a markdown table (mean and range over seeds) and the paired t and randomization tests of the first
seed's exported head against the backbone without a head; writes the whole report as JSON.
Every flag is a key of configs/study.yml; trailing `key=value` arguments override configs/base.yml
keys. Input errors exit 2.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import json
import pathlib

from absl import flags

from maxscore import cli
from maxscore.datasets import data
from maxscore.files import safety
from maxscore.studies import head_study

ENTRY = "study"
SECTIONS = {"study": head_study.StudyOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/study.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  with cli.one_line_errors():
    o = cli.entry_from_flags(fv, ENTRY, SECTIONS)["study"]
    path = pathlib.Path(o.output_json or pathlib.Path(o.workdir) / "report.json")
    safety.check_output_file(path, [o.jsonl or data.DEFAULT_JSONL, o.checkpoint_dir or data.DEFAULT_CHECKPOINT],
                             "--output_json")
    report = head_study.study(o.checkpoint_dir, o.jsonl, o.specs, o.seeds, o.workdir, overrides=list(argv[1:]),
                              max_queries=o.max_queries, num_epochs=o.num_epochs,
                              learning_rates=list(o.learning_rates) or [None], losses=list(o.losses) or [None])
    path.parent.mkdir(parents=True, exist_ok=True)
    safety.atomic_write_text(path, json.dumps(report, indent=2) + "\n")
  print(head_study.markdown(report))
  print(f"\nreport: {path}")


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags, log_dir_flag="workdir")
