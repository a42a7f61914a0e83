"""Builds the natural-question sets into the package assets from Debian's packages (maxscore/lm/question_sets.py):
the Perl FAQ and R FAQ test sets (perlfaq_beir/, rfaq_beir/) and the Python FAQ's dev and train questions in
python_docs_beir/.

  make question-sources      # perl-doc, r-doc-html and python3.11-doc, unpacked under out/
  python scripts/build_question_sets.py --perl_pod_dir=out/perl-doc/usr/share/perl/5.36.0/pod \\
      --r_manual_dir=out/r-doc/usr/share/R/doc/manual --docs_html=out/python-docs/usr/share/doc/python3.11/html

Every flag is a key of configs/question_sets.yml. Prints each set's counts as JSON. Input errors exit 2.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import json

from absl import flags

from maxscore import cli
from maxscore.lm import question_sets

ENTRY = "question_sets"
SECTIONS = {"question_sets": question_sets.QuestionSetOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/question_sets.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["question_sets"]
    stats = question_sets.build(opts)
  print(json.dumps(stats, indent=2))


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
