"""Times the backbone fine-tuning step on this machine (CPU); tokens/s and % of the measured matmul peak.

  python scripts/bench_train.py                                   # Qwen3-0.6B dims at 2 layers, full and LoRA, 1 and 2 devices
  python scripts/bench_train.py --modes=full --devices=1 --batch_size=8 --remat=none

Every flag is a key of configs/bench_train.yml; trailing `key=value` arguments override configs/base.yml
keys. FLOPs per step: the cost model times the training multipliers (forward + backward + remat); see
maxscore/bench/train_bench.py.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses

from absl import flags

from maxscore import cli
from maxscore.bench import train_bench

ENTRY = "bench_train"
SECTIONS = {"bench": train_bench.TrainBenchOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/bench_train.yml as a flag, plus --output_json."""
  cli.define_report_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> dict:
  """Runs the benchmark the flags describe, prints its table, writes --output_json; returns the report."""
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["bench"]
    report = train_bench.run(dataclasses.replace(opts, overrides=opts.overrides + tuple(argv[1:])))
  print(train_bench.summary(report), end="")
  cli.write_report(fv, report)
  return report


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the benchmark (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
