"""Benchmarks: items/s and model FLOP/s against the matmul peak measured in the same run.

`harness` runs a whole benchmark (every algorithm and the transformers baseline on one
workload); `measure`, `workloads`, `hf_baseline`, `kernels` and `report` are its parts.
"""

from maxscore.bench.harness import BenchOptions, bench_config, run_benchmark
from maxscore.bench.measure import measure_matmul_peak
from maxscore.bench.report import (
           KERNEL_COLUMNS,
           SCORE_COLUMNS,
           format_table,
           summary,
           to_json,
)
from maxscore.bench.workloads import make_requests, mixed_shape_run, warmup_check

__all__ = ["BenchOptions", "KERNEL_COLUMNS", "SCORE_COLUMNS", "bench_config", "format_table", "make_requests",
           "measure_matmul_peak", "mixed_shape_run", "run_benchmark", "summary", "to_json", "warmup_check"]
