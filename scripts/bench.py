"""Benchmarks scoring (or the attention kernels alone) on this machine; prints a table, writes JSON.

  python scripts/bench.py                                  # issue 5's reference workload, Qwen3-0.6B dims, 2 layers
  python scripts/bench.py --query_len=300 --num_items=10 --item_len=10 --batch_requests=64 --algorithms=auto
  python scripts/bench.py --mode=kernels                   # shared_prefix vs reference at P=2001, N=500, L=20
  python scripts/bench.py --query_len=200 --num_items=50 --item_len=10 --num_layers=1 matmul_precision=default

Trailing `key=value` arguments override configs/base.yml keys. See maxscore/benchmark.py for
what each figure means (model FLOPs follow DESIGN.md section 3).
"""

import json

from absl import app, flags

from maxscore import cli
from maxscore.bench import harness as benchmark
from maxscore.files import safety

_D = benchmark.BenchOptions()


def define_flags(fv: flags.FlagValues) -> None:
  """The script's flags, on `fv` (the global FLAGS when run as a script, a fresh one in tests)."""
  flags.DEFINE_enum("mode", _D.mode, ["score", "kernels"], "score: algorithms end to end; kernels: attention alone",
                    flag_values=fv)
  flags.DEFINE_string("model", _D.model, "configs/models/<model>.yml", flag_values=fv)
  flags.DEFINE_integer("num_layers", _D.num_layers, "override the model's layer count (0: the model's own)",
                       flag_values=fv)
  flags.DEFINE_integer("query_len", _D.query_len, "query tokens (a separator token is added: P = query_len + 1)",
                       flag_values=fv)
  flags.DEFINE_integer("num_items", _D.num_items, "items per request", flag_values=fv)
  flags.DEFINE_integer("item_len", _D.item_len, "tokens per item", flag_values=fv)
  flags.DEFINE_integer("separator_token_id", _D.separator_token_id, "separator s between query and item; "
                       "-1: none", flag_values=fv)
  flags.DEFINE_list("algorithms", list(_D.algorithms), "serial, packed, prefill_extend, auto", flag_values=fv)
  flags.DEFINE_list("kernels", None, "attention kernels; score mode: the `attention` key the algorithms use "
                    "(default shared_prefix); kernels mode: kernels to time (default shared_prefix,reference)",
                    flag_values=fv)
  flags.DEFINE_list("labels", [str(x) for x in _D.labels], "label token ids", flag_values=fv)
  flags.DEFINE_integer("repeats", _D.repeats, "warm timed runs per algorithm (best kept)", flag_values=fv)
  flags.DEFINE_integer("serial_items", _D.serial_items, "serial scores only this many items (scaled to items/s, "
                       "flagged as a subset); 0: all", flag_values=fv)
  flags.DEFINE_bool("hf_baseline", _D.hf_baseline, "also run transformers with prefix reuse on the same weights",
                    flag_values=fv)
  flags.DEFINE_integer("hf_batch_size", _D.hf_batch_size, "items per transformers forward", flag_values=fv)
  flags.DEFINE_integer("hf_repeats", _D.hf_repeats, "timed transformers runs (best kept)", flag_values=fv)
  flags.DEFINE_integer("batch_requests", _D.batch_requests, "score this many requests of the geometry per "
                       "score_batch call (0: one request per call)", flag_values=fv)
  flags.DEFINE_bool("warmup_check", _D.warmup_check, "first-request latency with and without Scorer.warmup",
                    flag_values=fv)
  flags.DEFINE_integer("mixed_requests", _D.mixed_requests, "also run this many mixed-shape requests and "
                       "compare executables compiled with buckets touched", flag_values=fv)
  flags.DEFINE_integer("num_heads", _D.num_heads, "kernels mode: query heads", flag_values=fv)
  flags.DEFINE_integer("num_kv_heads", _D.num_kv_heads, "kernels mode: key/value heads", flag_values=fv)
  flags.DEFINE_integer("head_dim", _D.head_dim, "kernels mode: head width", flag_values=fv)
  flags.DEFINE_integer("seed", _D.seed, "random weights and tokens", flag_values=fv)
  flags.DEFINE_string("output_json", None, "write the full report here", flag_values=fv)


def options_from_flags(fv: flags.FlagValues, overrides) -> benchmark.BenchOptions:
  return benchmark.BenchOptions(
      mode=fv.mode, model=fv.model, num_layers=fv.num_layers or None, query_len=fv.query_len,
      num_items=fv.num_items, item_len=fv.item_len,
      separator_token_id=None if fv.separator_token_id < 0 else fv.separator_token_id,
      algorithms=tuple(fv.algorithms), kernels=tuple(fv.kernels) if fv.kernels else None,
      labels=tuple(int(x) for x in fv.labels), repeats=fv.repeats, serial_items=fv.serial_items or None,
      hf_baseline=fv.hf_baseline, hf_batch_size=fv.hf_batch_size, hf_repeats=fv.hf_repeats,
      batch_requests=fv.batch_requests, warmup_check=fv.warmup_check, mixed_requests=fv.mixed_requests,
      num_heads=fv.num_heads, num_kv_heads=fv.num_kv_heads, head_dim=fv.head_dim, seed=fv.seed,
      overrides=tuple(overrides))


def bench(argv, fv: flags.FlagValues) -> dict:
  """Runs the benchmark the flags describe, prints its table, writes --output_json; returns the report."""
  with cli.one_line_errors():
    report = benchmark.run_benchmark(options_from_flags(fv, argv[1:]))
  print(benchmark.summary(report))
  if fv.output_json:
    with cli.one_line_errors():
      safety.atomic_write_text(fv.output_json, json.dumps(benchmark.to_json(report), indent=1))
  return report


def main(argv, fv: flags.FlagValues = flags.FLAGS) -> None:
  bench(argv, fv)


def run(argv) -> dict:
  """Parses `argv` into fresh flags and runs the benchmark (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, bench, argv)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  app.run(main)
