"""The benchmark run for scripts/bench.py: every algorithm and the transformers baseline on one workload.

    opts = BenchOptions(query_len=2000, num_items=500, item_len=20, num_layers=2)
    report = run_benchmark(opts)          # {"peak": ..., "flops": ..., "rows": [...], ...}
    print(summary(report))

Items/s and model FLOP/s (maxscore.scoring.cost_model) against the matmul peak measured at the
start and end of the same run (`measure`); per-algorithm timing in `workloads`; the baseline in
`hf_baseline`; tables in `report`.
"""

import dataclasses
import os
import pathlib
import tempfile
from typing import Any, Literal, Optional

import numpy as np

from layers.quantization import QUANTIZATIONS
from maxscore.bench.hf_baseline import hf_scorer, run_hf_baseline
from maxscore.bench.kernels import run_kernels
from maxscore.bench.measure import check_peak_sizes, machine_info, measure_matmul_peak
from maxscore.bench.suite import parse_workloads, run_suite
from maxscore.bench.workloads import (
  fresh_scorer,
  lm_head_cols,
  make_requests,
  mixed_shape_run,
  run_algorithm,
  warmup_check,
)
from maxscore.config import CODE_ONLY, Config, load_config
from maxscore.errors import ScoreInputError
from maxscore.scoring.cost_model import model_flops
from maxscore.scoring.scorer import Scorer


@dataclasses.dataclass(frozen=True)
class BenchOptions:
  """Everything scripts/bench.py's flags set (configs/bench.yml documents each); defaults are the
  reference workload (2000-token query, 500 items x 20 tokens, Qwen3-0.6B dims at 2 layers)."""
  mode: Literal["score", "kernels"] = "score"
  model: str = "qwen3-0.6b"
  num_layers: int = 2                  # 0: the model's own
  query_len: int = 2000
  num_items: int = 500
  item_len: int = 20
  separator_token_id: int = 198        # P = query_len + 1, as in the kernel geometry P=2001; -1: none
  algorithms: tuple[str, ...] = ("serial", "packed", "prefill_extend", "auto")
  kernels: tuple[str, ...] = ()        # (): shared_prefix (score), shared_prefix,reference (kernels)
  quantizations: tuple[str, ...] = ()  # score mode: also time int8_weights / int8 on the same float weights
  labels: tuple[int, ...] = (9454, 2753)
  apply_softmax: bool = False          # true: scores need only the label rows of the lm_head (no vocabulary lse)
  repeats: int = 3
  serial_items: int = 20               # 0: all
  hf_baseline: bool = True
  hf_batch_size: int = 32
  hf_batch_sizes: tuple[int, ...] = ()  # also try these batch sizes, keep the fastest
  hf_repeats: int = 1
  hf_device: str = "auto"              # auto: the GPU when JAX runs on one and torch sees it | cpu | cuda
  batch_requests: int = 0              # > 0: score this many requests of the geometry per score_batch call
  warmup_check: bool = False
  mixed_requests: int = 0              # > 0: a mixed-shape run of this many requests (executables vs buckets)
  num_heads: int = 16                  # kernels mode geometry
  num_kv_heads: int = 8
  head_dim: int = 128
  kernel_memory_fraction: float = 0.6  # kernels mode: do not run a kernel whose XLA temp exceeds this of RAM
  seed: int = 0
  peak_sizes: tuple[int, ...] = (2048, 4096)  # n of the [n, n] x [n, n] products that measure the matmul peak
  overrides: tuple[str, ...] = dataclasses.field(default=(), metadata=CODE_ONLY)  # configs/base.yml key=value
  suite: bool = False                  # run every suite workload (one process, one peak) instead of one geometry
  suite_workloads: tuple[str, ...] = ("reference=2000x500x20", "beir=32x100x256", "long_passages=32x100x512",
                                      "msmarco=16x1000x96", "small_requests=300x10x10x64")
  suite_only: tuple[str, ...] = ()     # run only these suite workloads (): all

  def validate(self) -> "BenchOptions":
    bad = [q for q in self.quantizations if q not in QUANTIZATIONS[1:]]
    if bad or len(set(self.quantizations)) != len(self.quantizations):
      raise ValueError(f"quantizations={list(self.quantizations)} must name each of {list(QUANTIZATIONS[1:])} "
                       "at most once (the float rows always run)")
    for name in ("query_len", "num_items", "item_len", "repeats", "hf_batch_size", "hf_repeats", "num_heads",
                 "num_kv_heads", "head_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
    for name in ("num_layers", "serial_items", "batch_requests", "mixed_requests"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
    if self.separator_token_id < -1:
      raise ValueError(f"separator_token_id={self.separator_token_id} must be a token id, or -1 for none")
    if self.hf_device not in ("auto", "cpu", "cuda"):
      raise ValueError(f"hf_device={self.hf_device!r} must be one of auto, cpu, cuda")
    check_peak_sizes(self.peak_sizes)
    if any(b < 1 for b in self.hf_batch_sizes):
      raise ValueError(f"hf_batch_sizes={list(self.hf_batch_sizes)} must all be >= 1")
    if self.suite:
      if self.mode != "score":
        raise ValueError(f"suite=true runs the score mode, not mode={self.mode}")
      parse_workloads(self.suite_workloads, self.suite_only)
    if not 0 < self.kernel_memory_fraction <= 1:
      raise ValueError(f"kernel_memory_fraction={self.kernel_memory_fraction} must be in (0, 1]")
    return self

  @property
  def separator(self) -> Optional[int]:
    return None if self.separator_token_id < 0 else self.separator_token_id

  def kernel_list(self) -> tuple[str, ...]:
    if self.kernels:
      return tuple(self.kernels)
    return ("shared_prefix", "reference") if self.mode == "kernels" else ("shared_prefix",)


def bench_config(opts: BenchOptions) -> Config:
  # No persistent compilation cache unless asked for: the bench times compiles, and a cache would time reads.
  over = ["compilation_cache_dir=none", f"model_name={opts.model}",
          f"label_token_ids=[{','.join(map(str, opts.labels))}]", f"apply_softmax={str(opts.apply_softmax).lower()}"]
  if opts.num_layers:
    over.append(f"num_layers={opts.num_layers}")
  if opts.separator is not None:
    over.append(f"separator_token_id={opts.separator}")
  return load_config(over + list(opts.overrides))


def _max_diff(a: list, b: list, n_items: Optional[int] = None) -> float:
  a, b = np.concatenate(a), np.concatenate(b)
  n = min(len(a), len(b)) if n_items is None else n_items
  return float(np.abs(a[:n] - b[:n]).max()) if n else 0.0


def run_score(opts: BenchOptions, peak_flops: float) -> dict[str, Any]:
  """Every algorithm (and the HF baseline) on the workload; rows plus cross-checks of their scores."""
  config = bench_config(opts)
  if opts.quantizations and config.runtime.quantization != "none":
    raise ValueError(f"quantizations={list(opts.quantizations)} times them against float rows: leave "
                     f"quantization={config.runtime.quantization} out of the configs/base.yml overrides")
  separator = config.scoring.separator_token_id
  bad = [t for t in list(opts.labels) + [separator or 0] if not 0 <= t < config.model.vocab_size]
  if bad:
    raise ScoreInputError(f"token ids {bad} (labels / separator) are outside the vocabulary [0, "
                          f"{config.model.vocab_size}) of model {opts.model}")
  with tempfile.TemporaryDirectory(prefix="maxscore_bench_") as workdir:
    hf_model, hf_error = None, None
    if opts.hf_baseline:
      try:
        hf_model, scorer = hf_scorer(config.model, config, pathlib.Path(workdir), opts.seed,
                                     opts.hf_device)
      except (ValueError, ImportError) as e:  # unsupported family, or no torch/transformers installed
        hf_error = f"HF baseline not run: {type(e).__name__}: {e}"
    if hf_model is None:
      scorer = Scorer.from_config(config)
    requests = make_requests(config.model.vocab_size, opts.query_len, opts.num_items, opts.item_len, opts.labels,
                             max(opts.batch_requests, 1), opts.seed, opts.apply_softmax)
    request = requests if opts.batch_requests else requests[0]
    flops = model_flops(config.model, opts.query_len, [opts.item_len] * opts.num_items, "packed",
                        separator is not None, lm_head_cols(requests[0]))
    choice = scorer.choose(scorer.validate(requests[0]), "auto")
    rows = []
    base_quantization = scorer.config.runtime.quantization
    for quantization in (base_quantization,) + tuple(opts.quantizations):
      for kernel in opts.kernel_list():
        same = kernel == scorer.config.kernel.attention and quantization == base_quantization
        kscorer = scorer if same else fresh_scorer(scorer, attention=kernel, quantization=quantization)
        for alg in opts.algorithms:
          max_items = (opts.serial_items or None) if alg == "serial" else None
          try:
            row = run_algorithm(kscorer, request, alg, opts.repeats, max_items, peak_flops, separator is not None)
          except Exception as e:  # noqa: BLE001 -- e.g. the reference kernel refusing a long row
            row = dict(name=alg, algorithm=alg, error=f"{type(e).__name__}: {' '.join(str(e).split())}")
          tag = "" if quantization == base_quantization else f"[{quantization}]"
          row.update(kernel=kernel, quantization=quantization, name=f"{alg}[{kernel}]{tag}"
                     + (f" x{opts.batch_requests}" if opts.batch_requests else ""))
          rows.append(row)
    hf = None
    if hf_model is not None:
      # transformers always computes the full-vocabulary lm_head: its FLOPs count it
      hf_flops = model_flops(config.model, opts.query_len, [opts.item_len] * opts.num_items, "packed",
                             separator is not None)["total"]
      hf = _fastest_hf(hf_model, requests[0], opts, peak_flops, hf_flops, separator)
      if opts.apply_softmax:  # compare like with like: the scores are then the labels' softmax
        hf["label_logprobs"] = [x - np.logaddexp.reduce(x, axis=-1, keepdims=True) for x in hf["label_logprobs"]]
    checks = _cross_checks(rows, hf, opts.num_items)
    if hf_error:
      checks["hf_error"] = hf_error
    rows += [hf] if hf else []
    report = dict(workload=dict(query_len=opts.query_len, num_items=opts.num_items, item_len=opts.item_len,
                                separator_token_id=separator, labels=list(opts.labels),
                                apply_softmax=opts.apply_softmax,
                                batch_requests=opts.batch_requests, model=opts.model,
                                model_config=dataclasses.asdict(config.model),
                                non_embedding_params=config.model.non_embedding_params()),
                  flops=flops, rows=rows, checks=checks,
                  selector=dict(algorithm=choice.algorithm, reason=choice.reason, kind=choice.kind))
    _add_speedups(rows)
    if opts.warmup_check:
      report["warmup"] = warmup_check(scorer, requests[0])
    if opts.mixed_requests:
      report["mixed_shapes"] = mixed_shape_run(scorer, opts.mixed_requests, opts.query_len, opts.num_items,
                                               opts.item_len, opts.labels, opts.seed)
  for r in rows:
    r.pop("label_logprobs", None)
  return report


def _fastest_hf(model, request: dict, opts: BenchOptions, peak_flops: float, flops: float,
                separator: Optional[int]) -> dict[str, Any]:
  """The transformers baseline at every batch size asked for; the fastest row, with the others' items/s."""
  rows = {}
  for b in dict.fromkeys((opts.hf_batch_size,) + tuple(opts.hf_batch_sizes)):
    rows[b] = run_hf_baseline(model, request, b, opts.hf_repeats, peak_flops, flops, separator)
    rows[b]["batch_size"] = b
  best = max(rows.values(), key=lambda r: r["items_per_s"])
  best["items_per_s_by_batch_size"] = {b: r["items_per_s"] for b, r in rows.items()}
  return best


def _cross_checks(rows: list[dict], hf: Optional[dict], num_items: int) -> dict[str, Any]:
  """Max label log-prob differences: every algorithm vs serial (its items), transformers vs the first other."""
  checks: dict[str, Any] = {}
  ok = [r for r in rows if "label_logprobs" in r]
  if not ok:
    return checks
  ref = next((r for r in ok if r["algorithm"] == "serial"), ok[0])
  n_ref = sum(len(x) for x in ref["label_logprobs"])
  checks["max_abs_logprob_diff_vs_" + ref["name"]] = {
      r["name"]: _max_diff(r["label_logprobs"], ref["label_logprobs"], n_ref) for r in ok if r is not ref}
  if hf is not None:
    best = next((r for r in ok if r["algorithm"] != "serial"), ok[0])
    diff = _max_diff(hf["label_logprobs"], best["label_logprobs"][:1], min(num_items, best["items_timed"]))
    checks.update(hf_vs=best["name"], hf_max_abs_logprob_diff=diff, hf_agrees_1e4=diff <= 1e-4)
  return checks


def _add_speedups(rows: list[dict]) -> None:
  serial = next((r for r in rows if r.get("algorithm") == "serial" and "items_per_s" in r), None)
  hf = next((r for r in rows if r.get("algorithm") == "hf_prefix_reuse"), None)
  unquantized = {(r["algorithm"], r.get("kernel")): r for r in rows
                 if r.get("quantization") == "none" and "items_per_s" in r}
  for r in rows:
    if "items_per_s" not in r:
      continue
    if serial:
      r["x_serial"] = r["items_per_s"] / serial["items_per_s"]
    if hf:
      r["x_hf"] = r["items_per_s"] / hf["items_per_s"]
    float_row = unquantized.get((r["algorithm"], r.get("kernel")))
    if r.get("quantization", "none") != "none" and float_row:
      r["x_float"] = r["items_per_s"] / float_row["items_per_s"]  # the same algorithm and kernel, unquantized


def run_benchmark(opts: BenchOptions) -> dict[str, Any]:
  """The whole benchmark for `opts.mode`: machine, measured peak, rows (JSON-ready)."""
  report: dict[str, Any] = dict(mode=opts.mode, options=dataclasses.asdict(opts), machine=machine_info())
  report["load_before"] = os.getloadavg()  # other jobs on the cores skew every ratio: quote quiet runs only
  dtype = bench_config(opts).runtime.dtype  # the peak in the dtype the scorer computes in
  report["peak"] = measure_matmul_peak(opts.peak_sizes, dtype=dtype)
  peak = report["peak"]["flops_per_s"]
  if opts.mode == "kernels":
    report.update(run_kernels(opts, peak))
  elif opts.suite:
    report.update(run_suite(opts, peak, run_score))
  elif opts.mode == "score":
    report.update(run_score(opts, peak))
  else:
    raise ValueError(f"mode={opts.mode!r} is not one of ['score', 'kernels']")
  # A different figure at the end means a noisy machine.
  report["peak_end"] = measure_matmul_peak(opts.peak_sizes, dtype=dtype)
  report["load_after"] = os.getloadavg()
  return report
