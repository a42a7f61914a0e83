"""Times reading a generated BEIR corpus through the document store against parsing it whole.

  python scripts/bench_corpus.py                                  # 200k documents, 1,000 queries x 100 candidates
  python scripts/bench_corpus.py --num_docs=2000000 --workdir=/tmp/corpus2m

Phases are timed apart (generation, index build, open + lookups, whole-corpus parse) with the process's peak RSS
after each; see maxscore/bench/corpus_bench.py. Every flag is a key of configs/bench_corpus.yml.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
from absl import flags

from maxscore import cli
from maxscore.bench import corpus_bench

ENTRY = "bench_corpus"
SECTIONS = {"bench": corpus_bench.CorpusBenchOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/bench_corpus.yml as a flag, plus --output_json."""
  cli.define_report_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> dict:
  del argv
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["bench"]
    report = corpus_bench.run(opts)
  print(corpus_bench.summary(report), end="")
  cli.write_report(fv, report)
  return report


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the benchmark (for tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
