"""Compiles every scoring program for a TPU topology or a GPU on this (CPU) host; prints fit and roofline.

  python scripts/compile_check.py --topology=v6e:1x1 --model=qwen3-0.6b --geometries=2000x500x20 \
      dtype=bfloat16 weight_dtype=bfloat16
  python scripts/compile_check.py --topology=v6e:2x2 --geometries=2000x500x20x4 ici_tensor_parallelism=2
  python scripts/compile_check.py --topology=v6e:2x2 --num_slices=2 dcn_data_parallelism=2
  python scripts/compile_check.py --topology=v6e:1x1 --search=num_items,query_len dtype=bfloat16 weight_dtype=bfloat16
  python scripts/compile_check.py --topology=h100 --geometries=2000x500x20 dtype=bfloat16 weight_dtype=bfloat16
  python scripts/compile_check.py --topology=h100:8 ici_tensor_parallelism=8 dtype=bfloat16 weight_dtype=bfloat16
  python scripts/compile_check.py --train=full --topology=v6e:1x1 --geometries=200x20x20 --batch_size=8 dtype=bfloat16
  python scripts/compile_check.py --train=lora --lora_rank=16 --model=qwen3-8b --topology=v6e:2x2 \
      --geometries=200x20x20 ici_fsdp_parallelism=4 dtype=bfloat16 weight_dtype=bfloat16
  python scripts/compile_check.py --topology=v5e:1x1 --model=qwen3-8b --quantization=int8 dtype=bfloat16 \
      weight_dtype=bfloat16
  python scripts/compile_check.py --train=qlora --lora_rank=16 --model=qwen3-8b --topology=v5e:2x2 \
      --geometries=200x20x20 ici_fsdp_parallelism=4 dtype=bfloat16 weight_dtype=bfloat16

TPUs need libtpu (`pip install "jax[tpu]==<your jax version>"`), GPUs jax's CUDA plugin (`pip install
"jax[cuda12]==<your jax version>"`, the gpu-aot extra; no GPU); run with JAX_PLATFORMS=cpu. Every flag is
a key of configs/compile.yml; trailing `key=value` arguments override configs/base.yml keys (mesh,
dtypes, attention, buckets). What is compiled is what Scorer.warmup builds; see
maxscore/bench/compile_report.py for each figure. --quantization=int8_weights|int8 compiles the quantized
scorer (int8 weights and float32 scales in HBM; int8's dense FLOPs at the chip's int8 peak). With
--train=full|lora|qlora|head it compiles the training step instead (maxscore/bench/train_compile.py):
--batch_size queries per step at each geometry; qlora trains adapters on an int8_weights base.
The figures are compile-time bounds, not measurements.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses
import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only: a TPU lock held elsewhere is fine

from absl import flags  # pylint: disable=g-import-not-at-top

from maxscore import cli
from maxscore.bench import compile_report, compile_summary, train_compile
from maxscore.files import safety

ENTRY = "compile"
SECTIONS = {"compile": compile_report.CompileOptions, "train": train_compile.TrainCompileOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/compile.yml as a flag, plus --output_json."""
  cli.define_report_flags(fv, ENTRY, SECTIONS)


def options_from_flags(fv: flags.FlagValues, overrides):
  """(CompileOptions with the trailing overrides added, TrainCompileOptions)."""
  sections = cli.entry_from_flags(fv, ENTRY, SECTIONS)
  opts = sections["compile"]
  return dataclasses.replace(opts, overrides=opts.overrides + tuple(overrides)), sections["train"]


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> dict:
  """Compiles what the flags describe, prints the table, writes --output_json; returns the report."""
  with cli.one_line_errors():
    options, train = options_from_flags(fv, argv[1:])  # every flag checked before minutes of compiling
    safety.check_output_file(fv.output_json, [], "--output_json")
    summary = train_compile.summary if train.train else compile_summary.summary
    report = train_compile.run(options, train) if train.train else compile_report.run(options)
  print(summary(report), end="")
  cli.write_report(fv, report)
  return report


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the check (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
