"""Compile-report checks shared by the TPU and the GPU tests: a Scorer laid out on a described topology (nothing
runs on it), and what every compiled workload must show."""

from typing import Any

from maxscore.bench import chips, compile_report
from maxscore.scoring.scorer import Scorer


def abstract_scorer(topology: str, num_slices: int = 1, **overrides) -> Scorer:
  """A Scorer of `overrides["model"]` (at `num_layers` when given) on `topology`, with the other overrides as
  config key=value settings, as compile_check builds it."""
  options = compile_report.CompileOptions(topology=topology, num_slices=num_slices, model=overrides.pop("model"),
                                          num_layers=overrides.pop("num_layers", 0),
                                          overrides=tuple(f"{k}={v}" for k, v in overrides.items()))
  config = compile_report.build_config(options)
  devices = compile_report.describe_topology(topology, num_slices)
  mesh = compile_report.target_mesh(config.mesh, devices)
  return compile_report.abstract_scorer(config, mesh)


def assert_compiled(workload: dict[str, Any], algorithm: str, entries: list[str], kernel: str) -> None:
  """`workload` compiled with `algorithm` into the programs `entries`, each with `kernel` as its Pallas custom
  call, fitting in HBM with a positive roofline time."""
  assert workload["error"] is None, workload["error"]
  assert workload["algorithm"] == algorithm
  assert sorted({r["entry"] for r in workload["programs"]}) == sorted(entries)
  assert workload["fits"] and workload["pallas"], workload["programs"]
  for r in workload["programs"]:
    assert r["kernel"] == kernel and r["pallas"], r
    assert 0 < r["hbm_bytes"] < r["hbm_capacity"] and r["roofline_s"] > 0, r
  assert workload["items_per_s"] > 0


def compile_both_algorithms(scorer: Scorer, geometry: tuple[int, ...], chip: chips.Chip,
                            kernel: str) -> tuple[dict, dict]:
  """`geometry` compiled with packed and with prefill_extend, each checked by assert_compiled: (packed, extend)."""
  packed = compile_report.compile_workload(scorer, geometry, chip)
  assert_compiled(packed, "packed", ["packed_logprobs"], kernel)
  extend = compile_report.compile_workload(scorer, geometry, chip, "prefill_extend")
  assert_compiled(extend, "prefill_extend", ["prefill", "extend_logprobs"], kernel)
  return packed, extend
