"""Times the backbone fine-tuning step on this machine (CPU); tokens/s and % of the measured matmul peak.

  python scripts/bench_train.py                                   # Qwen3-0.6B dims at 2 layers, full and LoRA, 1 and 2 devices
  python scripts/bench_train.py --modes=full --devices=1 --batch_size=8 --remat=none

Every flag is a key of configs/bench_train.yml; trailing `key=value` arguments override configs/base.yml
keys. FLOPs per step: the cost model times the training multipliers (forward + backward + remat); see
maxscore/bench/train_bench.py.
"""

import dataclasses
import json

from absl import flags

from maxscore import cli
from maxscore.bench import train_bench
from maxscore.files import safety

ENTRY = "bench_train"
SECTIONS = {"bench": train_bench.TrainBenchOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/bench_train.yml as a flag, plus --output_json."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)
  flags.DEFINE_string("output_json", None, "write the full report here", flag_values=fv)


def bench(argv, fv: flags.FlagValues) -> dict:
  """Runs the benchmark the flags describe, prints its table, writes --output_json; returns the report."""
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["bench"]
    report = train_bench.run(dataclasses.replace(opts, overrides=opts.overrides + tuple(argv[1:])))
  print(train_bench.summary(report), end="")
  if fv.output_json:
    with cli.one_line_errors():
      safety.atomic_write_text(fv.output_json, json.dumps(report, indent=1))
  return report


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> None:
  bench(argv, fv)


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the benchmark (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, bench, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
