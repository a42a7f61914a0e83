"""Compiles every scoring program for a TPU topology on this (CPU) host; prints fit and roofline.

  python scripts/compile_check.py --topology=v6e:1x1 --model=qwen3-0.6b --geometries=2000x500x20 \
      dtype=bfloat16 weight_dtype=bfloat16
  python scripts/compile_check.py --topology=v6e:2x2 --geometries=2000x500x20x4 ici_tensor_parallelism=2
  python scripts/compile_check.py --topology=v6e:2x2 --num_slices=2 dcn_data_parallelism=2
  python scripts/compile_check.py --topology=v6e:1x1 --search=num_items,query_len dtype=bfloat16 weight_dtype=bfloat16

Needs libtpu (`pip install "jax[tpu]==<your jax version>"`); run with JAX_PLATFORMS=cpu. Trailing
`key=value` arguments override configs/base.yml keys (mesh, dtypes, attention, buckets). What is
compiled is what Scorer.warmup builds; see maxscore/bench/compile_report.py for each figure.
The figures are compile-time bounds, not measurements.
"""

import json
import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling only: a TPU lock held elsewhere is fine

from absl import app, flags  # pylint: disable=g-import-not-at-top

from maxscore import cli
from maxscore.bench import chips, compile_report
from maxscore.config import ConfigError
from maxscore.errors import ScoreInputError

_D = compile_report.CompileOptions()


def define_flags(fv: flags.FlagValues) -> None:
  """The script's flags, on `fv` (the global FLAGS when run as a script, a fresh one in tests)."""
  flags.DEFINE_string("topology", _D.topology, "TPU topology: v4|v5e|v5p|v6e:<X>x<Y>[x<Z>]", flag_values=fv)
  flags.DEFINE_integer("num_slices", _D.num_slices, "slices (a multi-slice pod job: set dcn_data_parallelism)",
                       flag_values=fv)
  flags.DEFINE_string("model", _D.model, "configs/models/<model>.yml", flag_values=fv)
  flags.DEFINE_integer("num_layers", 0, "override the model's layer count (0: the model's own)", flag_values=fv)
  flags.DEFINE_list("geometries", ["x".join(map(str, g)) for g in _D.geometries],
                    "workloads QUERY_LENxNUM_ITEMSxITEM_LEN[xBATCH] (query_len counts the separator)",
                    flag_values=fv)
  flags.DEFINE_list("algorithms", list(_D.algorithms), "auto (the selector's choice), packed, prefill_extend, "
                    "serial", flag_values=fv)
  flags.DEFINE_integer("num_labels", _D.num_labels, "label tokens per item", flag_values=fv)
  flags.DEFINE_list("search", list(_D.search), "grow these dimensions of the first geometry (num_items, "
                    "query_len) until the programs stop fitting or reach the config's limits", flag_values=fv)
  flags.DEFINE_list("search_algorithms", list(_D.search_algorithms), "algorithms the search compiles",
                    flag_values=fv)
  flags.DEFINE_string("output_json", None, "write the full report here", flag_values=fv)


def options_from_flags(fv: flags.FlagValues, overrides) -> compile_report.CompileOptions:
  return compile_report.CompileOptions(
      topology=fv.topology, num_slices=fv.num_slices, model=fv.model, num_layers=fv.num_layers or None,
      geometries=tuple(compile_report.parse_geometry(g) for g in fv.geometries),
      algorithms=tuple(fv.algorithms), num_labels=fv.num_labels, search=tuple(fv.search),
      search_algorithms=tuple(fv.search_algorithms), overrides=tuple(overrides))


def check(argv, fv: flags.FlagValues) -> dict:
  """Compiles what the flags describe, prints the table, writes --output_json; returns the report."""
  try:
    report = compile_report.run(options_from_flags(fv, argv[1:]))
  except (ValueError, ScoreInputError, ConfigError, chips.TopologyError) as e:
    cli.fail(e)
  print(compile_report.summary(report), end="")
  if fv.output_json:
    with open(fv.output_json, "w") as f:
      json.dump(report, f, indent=1)
  return report


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> None:
  check(argv, fv)


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the check (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, check, argv)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  app.run(main)
