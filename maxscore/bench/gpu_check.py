"""What `make gpu-check` runs on a machine with a GPU, in one process and a few minutes:

1. the pallas_gpu kernel, compiled by Triton, against the dense reference kernel on the device
   (f32 and bf16, with and without a cached prefix, GQA, sliding window and soft-capping), forward and
   backward (loss, dq, dk, dv; the gradient program holds three Triton calls);
2. the scorer against transformers on the same device: a small random model, every algorithm with
   pallas_gpu and with shared_prefix, float32 (bench.run_score's cross-checks);
3. the fine-tuning step (Qwen3-0.6B's dimensions, 28 layers, full and LoRA) with pallas_gpu's backward and
   with shared_prefix: step times and losses on the same weights and batches;
4. the real-depth workloads (SmolLM2-135M's and Qwen3-0.6B's dimensions at full depth) against
   transformers on the same GPU, in bfloat16, against the bf16 matmul peak measured in the run;
5. on request (`parts=attention`), pallas_gpu's block sizes, warps and stages swept on the first seed
   workload's packed row (maxscore/bench/attention_sweep.py), and the fastest that agrees with the default
   run through the scorer there beside the default;
6. on request (`parts=int8`), what quantization=int8 (w8a8) runs: each projection's quantize, int8 dot and
   dequantize timed against bf16, the optimized HLO read for int8 x int8 -> int32 dots and for where the
   activation quantization is fused (maxscore/bench/int8_profile.py), and the model at full depth in bf16,
   int8_weights and int8;
7. on request (`parts=seed`), the reference workload of the field's multi-item scoring (a 2,000-token query,
   500 items of 20 tokens, Qwen3-0.6B's dimensions at 28 layers), and the same at 8,000 query tokens: auto,
   packed and prefill_extend against serial and transformers with prefix reuse, in the same process. It runs
   last, one workload at a time, so a call cut short keeps the int8 part and the 2,000-token workload.

    report = run_gpu_check(GpuCheckOptions())   # JSON-ready; gpu_check_report.summary_lines(report) prints it

`quick=true` runs every part at toy sizes, so the path is exercised on CPU (Pallas interpret mode)
by the tests. Each part records its error instead of stopping the others.
"""

import dataclasses
import functools
import os
import time
import traceback
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from layers.kernels import pallas_gpu, reference
from layers.kernels.base import KernelOptions, PrefixKV, SegmentLayout
from maxscore.bench import attention_sweep, int8_profile, kernel_grads, measure, train_bench
from maxscore.bench.harness import BenchOptions, run_benchmark
from maxscore.bench.suite import Workload, parse_workloads
from maxscore.bench.train_bench import TrainBenchOptions
from maxscore.config import load_config
from maxscore.scoring.selector import packed_row_tokens

# (name, prefix P, items N, item tokens L, q heads, kv heads, head_dim, dtype, cached prefix, window, softcap)
_KERNEL_CASES = (
    ("f32 GQA 4", 37, 5, 23, 8, 2, 64, "float32", False, None, None),
    ("f32 cached prefix", 300, 12, 40, 8, 8, 128, "float32", True, None, None),
    ("bf16 GQA 3", 32, 20, 100, 9, 3, 64, "bfloat16", False, None, None),
    ("bf16 cached prefix", 70, 30, 80, 16, 8, 128, "bfloat16", True, None, None),
    ("f32 window+softcap", 90, 6, 30, 4, 2, 64, "float32", False, 48, 50.0),
)
_TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}
# The seed part's gate on label log-probs against serial: bf16 at 28 layers differed by 0.008-0.022 in the
# earlier GPU runs (BENCHMARKS.md); this catches a broken program, not bf16 rounding.
_SEED_BAND = 0.1
_TRITON_TARGET = "__gpu$xla.gpu.triton"  # Pallas' Triton custom call (jax/_src/pallas/triton)
_TRITON_KERNELS = ("packed_flash_forward", "packed_flash_dq", "packed_flash_dkv")
_PARTS = ("kernels", "kernel_grads", "scorer_parity", "train", "speed", "attention", "int8", "seed")
_DEFAULT_PARTS = _PARTS[:5]  # attention, int8 and seed run when named (their own prepared call: BENCHMARKS.md)
_HF_BATCH_SIZES = (16, 64, 256)  # transformers' batch sizes tried, those whose prefix K/V fits hf_kv_gib



@dataclasses.dataclass(frozen=True)
class GpuCheckOptions:
  """scripts/gpu_check.py's settings (configs/gpu_check.yml documents each)."""
  quick: bool = False                  # every part at toy sizes (CPU, interpret mode): the path, not the figures
  # Real-depth workloads, each "model:layers:name=QxNxL": full depth, so the scan's per-layer cost shows.
  speed_workloads: tuple[str, ...] = ("smollm2-135m:30:embedded=70x30x80", "smollm2-135m:30:beir=32x100x256",
                                      "qwen3-0.6b:28:beir=32x100x256", "qwen3-0.6b:28:msmarco=16x1000x96")
  dtype: str = "bfloat16"              # the speed part's compute and weight dtype (the parity part is float32)
  # Attention kernels the speed part times. Each adds four compiles per workload: with shared_prefix too the
  # whole check ran past ten minutes on an H100 (shared_prefix's speed rows are in BENCHMARKS.md).
  speed_kernels: tuple[str, ...] = ("pallas_gpu",)
  parts: tuple[str, ...] = _DEFAULT_PARTS  # the parts to run, in _PARTS' order (a rerun of one part: parts=speed)
  # The seed part's workloads, "model:layers:name=QxNxL" each, run one after the other (each saved as it ends).
  seed_workloads: tuple[str, ...] = ("qwen3-0.6b:28:reference=2000x500x20", "qwen3-0.6b:28:reference_8k=8000x500x20")
  # transformers expands the prefix K/V to its batch in bf16: 28 layers of Qwen3-0.6B hold 0.23 GB per item at a
  # 2,000-token query and 0.92 GB at 8,000, so batch 256 would need 59 and 235 GB. Batches of _HF_BATCH_SIZES
  # whose K/V fits this many GiB are tried (the smallest always).
  hf_kv_gib: float = 16.0
  int8_workload: str = "qwen3-0.6b:28:beir=32x100x256"  # the int8 part's model, depth and shape (one packed row)
  int8_repeats: int = 5                # int8 part: best of this many rounds of int8_inner back-to-back calls
  int8_inner: int = 20
  # Compile-time XLA options each w8a8 projection is also timed under ("flag=value+flag=value" per variant).
  int8_xla_variants: tuple[str, ...] = ("xla_gpu_enable_triton_gemm=false", "xla_gpu_triton_gemm_any=true")
  # attention part: pallas_gpu settings "BLOCK_QxBLOCK_KVxWARPSxSTAGES" timed on the first seed workload's packed
  # row (the first is the default, which the others are compared with); the fastest that agrees is then run
  # through the scorer at that workload (packed and auto).
  attention_settings: tuple[str, ...] = ("64x64x0x2", "64x64x4x2", "64x64x8x3", "128x64x8x2", "128x64x4x2",
                                         "128x64x8x3", "128x128x8x2", "128x32x8x2", "64x128x8x2", "32x64x4x2")

  def validate(self) -> "GpuCheckOptions":
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype={self.dtype!r} must be float32 or bfloat16")
    self.speed_groups()
    for w in self.seed_workloads + (self.int8_workload,):
      _workload(w)
    int8_profile.check_variants(self.int8_xla_variants)
    for setting in self.attention_settings:
      attention_sweep.parse_setting(setting)
    if self.hf_kv_gib <= 0 or self.int8_repeats < 1 or self.int8_inner < 1:
      raise ValueError(f"hf_kv_gib={self.hf_kv_gib}, int8_repeats={self.int8_repeats} and int8_inner="
                       f"{self.int8_inner} must be > 0")
    bad = [p for p in self.parts if p not in _PARTS]
    if bad or not self.parts:
      raise ValueError(f"parts={list(self.parts)}: each must be one of {list(_PARTS)}")
    return self

  def speed_groups(self) -> dict[tuple[str, int], tuple[str, ...]]:
    """{(model, layers): (suite workloads...)} in the order given."""
    groups: dict[tuple[str, int], tuple[str, ...]] = {}
    for w in self.speed_workloads:
      model, layers, spec = _split(w)
      groups[(model, layers)] = groups.get((model, layers), ()) + (spec,)
    return groups


def _split(w: str) -> tuple[str, int, str]:
  """"model:layers:name=QxNxL" as (model, layers, "name=QxNxL")."""
  parts = w.split(":")
  if len(parts) != 3 or not parts[1].isdigit() or "=" not in parts[2]:
    raise ValueError(f"workload {w!r} is not model:layers:name=QxNxL")
  return parts[0], int(parts[1]), parts[2]


def _workload(w: str) -> tuple[str, int, Workload]:
  """"model:layers:name=QxNxL" as (model, layers, Workload); a ValueError naming the form otherwise."""
  model, layers, spec = _split(w)
  (workload,) = parse_workloads((spec,))
  if workload.batch_requests:
    raise ValueError(f"workload {w!r}: one request per call here (no xREQUESTS)")
  return model, layers, workload


def _case_arrays(rng, b, p, n, l, nh, kh, h, dtype, cached):
  prefix_valid_B = np.full(b, p)
  prefix_valid_B[1:] = rng.integers(1, p + 1, b - 1)
  slot_valid_BxN = rng.integers(0, l + 1, (b, n))
  slot_valid_BxN[0, 0], slot_valid_BxN[-1, -1] = 0, l
  layout = SegmentLayout(jnp.asarray(prefix_valid_B, jnp.int32), jnp.asarray(slot_valid_BxN, jnp.int32), p, l, n)
  t = layout.row_len - (p if cached else 0)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)
  q, k, v = normal(b, t, nh, h), normal(b, t, kh, h), normal(b, t, kh, h)
  pkv = PrefixKV(normal(1, p, kh, h), normal(1, p, kh, h)) if cached else None
  return q, k, v, layout, pkv


def kernel_parity(interpret: bool, cases=_KERNEL_CASES) -> list[dict[str, Any]]:
  """pallas_gpu (compiled, or interpreted on CPU) against reference.attend on the same arrays; the
  reference runs in float32 on the f32-cast inputs, so a bf16 row measures the kernel's bf16 error."""
  rows = []
  for name, p, n, l, nh, kh, h, dtype, cached, window, softcap in cases:
    row = dict(name=name, prefix=p, items=n, item_len=l, heads=f"{nh}/{kh}", head_dim=h, dtype=dtype,
               cached_prefix=cached, window=window, softcap=softcap)
    try:
      q, k, v, layout, pkv = _case_arrays(np.random.default_rng(len(rows)), 2, p, n, l, nh, kh, h, dtype, cached)
      options = KernelOptions(kernel_interpret=interpret)
      attend = jax.jit(functools.partial(pallas_gpu.attend, options=options, window=window, softcap=softcap))
      t0 = time.perf_counter()
      out = np.asarray(attend(q, k, v, layout, pkv).astype(jnp.float32))
      row["first_call_s"] = time.perf_counter() - t0
      f32 = lambda x: None if x is None else x.astype(jnp.float32)
      pkv32 = None if pkv is None else PrefixKV(f32(pkv.k), f32(pkv.v))
      want = np.asarray(reference.attend(f32(q), f32(k), f32(v), layout, pkv32, options=options, window=window,
                                         softcap=softcap))
      row["max_abs_diff"] = float(np.abs(out - want).max())
      row["finite"] = bool(np.isfinite(out).all())
      row["ok"] = row["finite"] and row["max_abs_diff"] <= _TOLERANCE[dtype]
    except Exception as e:  # noqa: BLE001 -- a kernel that does not compile is a finding, not a stop
      row.update(ok=False, error=f"{type(e).__name__}: {' '.join(str(e).split())[:2000]}")
    rows.append(row)
  return rows


def kernel_grad_parity(interpret: bool, cases=_KERNEL_CASES) -> list[dict[str, Any]]:
  """pallas_gpu's backward (its custom VJP: the dq and dkv kernels) against reference.attend's gradients: the
  loss and dq, dk, dv of one weighted sum over the real queries (maxscore/bench/kernel_grads.py). The error
  is relative to the largest reference entry; on the GPU the gradient program that ran is also searched for
  its Triton calls (forward, dq, dkv)."""
  rows = []
  for name, p, n, l, nh, kh, h, dtype, cached, window, softcap in cases:
    row = dict(name=name, dtype=dtype, cached_prefix=cached, window=window, softcap=softcap)
    try:
      q, k, v, layout, pkv = _case_arrays(np.random.default_rng(len(rows)), 2, p, n, l, nh, kh, h, dtype, cached)
      options = KernelOptions(kernel_interpret=interpret)
      f32 = lambda x: x.astype(jnp.float32)
      pkv32 = None if pkv is None else PrefixKV(f32(pkv.k), f32(pkv.v))
      t0 = time.perf_counter()
      lowered = kernel_grads.loss_and_grads_fn(functools.partial(pallas_gpu.attend, options=options), q.shape,
                                               layout, pkv, window, softcap).lower(q, k, v)
      compiled = lowered.compile()
      got = jax.block_until_ready(compiled(q, k, v))
      row["first_call_s"] = time.perf_counter() - t0
      want = kernel_grads.loss_and_grads(functools.partial(reference.attend, options=options), f32(q), f32(k),
                                         f32(v), layout, pkv32, window, softcap)
      errors = {"loss": abs(float(got[0]) - float(want[0])) / max(1.0, abs(float(want[0])))}
      for part_name, g, w in zip(("dq", "dk", "dv"), got[1], want[1]):
        g, w = np.asarray(g.astype(jnp.float32)), np.asarray(w)
        errors[part_name] = float(np.abs(g - w).max() / max(1.0, float(np.abs(w).max())))
      row["relative_error"] = errors
      row["finite"] = bool(all(np.isfinite(np.asarray(g.astype(jnp.float32))).all() for g in got[1]))
      # The loss sums ~1e6 bf16 products with random signs: its error is no measure of a bf16 kernel's, whose
      # outputs the forward part checks; a float32 loss must agree.
      gated = errors if dtype == "float32" else {k_: v_ for k_, v_ in errors.items() if k_ != "loss"}
      row["ok"] = row["finite"] and max(gated.values()) <= _TOLERANCE[dtype]
      if not interpret:  # the forward, dq and dkv Triton calls, as lowered and as XLA compiled them
        text = compiled.as_text()
        row["triton_calls"] = dict(lowered=lowered.as_text().count(_TRITON_TARGET),
                                   compiled_names=sorted(n for n in _TRITON_KERNELS if n in text))
        row["ok"] = row["ok"] and row["triton_calls"]["lowered"] == 3
    except Exception as e:  # noqa: BLE001 -- a backward that does not compile is a finding, not a stop
      row.update(ok=False, error=f"{type(e).__name__}: {' '.join(str(e).split())[:2000]}")
    rows.append(row)
  return rows


def train_steps(quick: bool, dtype: str, interpret: bool) -> dict[str, Any]:
  """The fine-tuning step (full and LoRA) with pallas_gpu's backward and with shared_prefix (XLA), on the same
  weights and batch (maxscore/bench/train_bench.py): step time each, and the losses after the same steps."""
  kw = dict(model="qwen3-0.6b", num_layers=28, modes=("full", "lora"), devices=(1,), batch_size=8, query_len=200,
            num_items=20, item_len=20, repeats=5)
  if quick:
    kw.update(model="tiny-qwen3", num_layers=2, batch_size=2, query_len=16, num_items=3, item_len=4, repeats=1)
  # One peak for both kernels (in the compute dtype; toy sizes in quick mode, where the figures mean nothing).
  peak = measure.measure_matmul_peak((512,) if quick else (2048, 4096), dtype=dtype)
  runs = {}
  for kernel in ("pallas_gpu", "shared_prefix"):
    options = TrainBenchOptions(**kw, overrides=(f"attention={kernel}", f"dtype={dtype}",
                                                 f"kernel_interpret={str(interpret).lower()}")).validate()
    runs[kernel] = train_bench.measure_here(options, 1, peak)
  by = {k: {r["mode"]: r for r in run["rows"]} for k, run in runs.items()}
  compare = {m: dict(step_s_ratio=by["shared_prefix"][m]["step_s"] / by["pallas_gpu"][m]["step_s"],
                     loss_relative_diff=abs(by["pallas_gpu"][m]["loss"] - by["shared_prefix"][m]["loss"])
                     / max(1.0, abs(by["shared_prefix"][m]["loss"])))
             for m in kw["modes"]}
  return dict(options=kw, dtype=dtype, runs=runs, shared_prefix_over_pallas_gpu=compare)


def _bench(**kw) -> dict[str, Any]:
  return run_benchmark(BenchOptions(**kw).validate())


def _labels(vocab_size: int) -> tuple[int, ...]:
  """The bench's label ids (Qwen3's " yes"/" no"), or two small ids for a toy vocabulary."""
  labels = BenchOptions.labels
  return labels if max(labels) < vocab_size else (3, 7)


def hf_batch_sizes(model: str, layers: int, workload: Workload, kv_gib: float) -> tuple[int, ...]:
  """The batch sizes of _HF_BATCH_SIZES whose prefix K/V (bf16, expanded to the batch by transformers'
  cache, every layer at once) fits `kv_gib`; the smallest always."""
  cfg = load_config([f"model_name={model}", f"num_layers={layers}"]).model
  per_item = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (workload.query_len + 1 + workload.item_len) * 2
  fits = tuple(b for b in _HF_BATCH_SIZES if b * per_item <= kv_gib * 2 ** 30)
  return fits or _HF_BATCH_SIZES[:1]


def seed_run(spec: str, kernels: tuple[str, ...], dtype: str, kv_gib: float, interpret: bool,
             quick: bool) -> dict[str, Any]:
  """One seed workload: serial (its first items), packed, prefill_extend and auto with each kernel, and
  transformers with prefix reuse on the same device, against the matmul peak measured in the run."""
  model, layers, w = _workload(spec)
  sizes = hf_batch_sizes(model, layers, w, kv_gib)
  vocab = load_config([f"model_name={model}"]).model.vocab_size
  return _bench(model=model, num_layers=layers, suite=True, suite_workloads=(f"{w.name}={w.shape}",),
                labels=_labels(vocab),
                algorithms=("serial", "packed", "prefill_extend", "auto"), repeats=1 if quick else 3,
                serial_items=2, hf_batch_size=sizes[0], hf_batch_sizes=sizes[1:], kernels=kernels,
                peak_sizes=(256,) if quick else (2048, 4096),
                overrides=(f"dtype={dtype}", f"weight_dtype={dtype}", f"kernel_interpret={str(interpret).lower()}"))


def int8_check(opts: GpuCheckOptions, interpret: bool, hlo_dir: Optional[str]) -> dict[str, Any]:
  """What w8a8 runs (module docstring, 5.): its projections at the packed row of opts.int8_workload, the
  packed program's HLO at one layer, and the model at full depth in bf16, int8_weights and int8 (auto)."""
  model, layers, w = _workload(opts.int8_workload)
  kernel = opts.speed_kernels[0]
  over = [f"dtype={opts.dtype}", f"weight_dtype={opts.dtype}", f"kernel_interpret={str(interpret).lower()}"]
  config = load_config([f"model_name={model}", "num_layers=1", "quantization=int8", f"attention={kernel}",
                        "compilation_cache_dir=none", "separator_token_id=198"] + over)
  _, tokens = packed_row_tokens(w.query_len + 1, [w.item_len] * w.num_items, config.buckets)
  out: dict[str, Any] = dict(workload=opts.int8_workload, kernel=kernel, packed_row_tokens=tokens)
  out["projections"] = _guarded(lambda: int8_profile.profile(
      config.model, tokens, opts.dtype, opts.int8_repeats, opts.int8_inner, opts.int8_xla_variants, hlo_dir))
  out["program"] = _guarded(lambda: int8_profile.model_program_hlo(
      config, (w.query_len + 1, w.num_items, w.item_len), hlo_dir))
  out["model"] = _guarded(lambda: _bench(
      model=model, num_layers=layers, query_len=w.query_len, num_items=w.num_items, item_len=w.item_len,
      labels=_labels(config.model.vocab_size), algorithms=("auto",), kernels=(kernel,),
      quantizations=("int8_weights", "int8"), hf_baseline=False,
      repeats=1 if opts.quick else 3, peak_sizes=(256,) if opts.quick else (2048, 4096), overrides=tuple(over)))
  return out


def attention_check(opts: GpuCheckOptions, interpret: bool) -> dict[str, Any]:
  """pallas_gpu's settings swept on the first seed workload's packed row (maxscore/bench/attention_sweep.py),
  then the fastest setting that agrees with the default run through the scorer there: packed and auto in the
  compute dtype, against serial, with the default setting in the same call."""
  model, layers, w = _workload(opts.seed_workloads[0])
  cfg = load_config([f"model_name={model}"]).model
  heads = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
  rows = attention_sweep.sweep(opts.attention_settings, w, *heads, dtype=opts.dtype, interpret=interpret,
                               repeats=1 if opts.quick else 5, inner=1 if opts.quick else 10)
  best = attention_sweep.best_setting(rows, _TOLERANCE[opts.dtype])
  out: dict[str, Any] = dict(workload=opts.seed_workloads[0], heads=heads, rows=rows, best=best["setting"])
  over = [f"dtype={opts.dtype}", f"weight_dtype={opts.dtype}", f"kernel_interpret={str(interpret).lower()}"]
  scored = {}
  for setting in dict.fromkeys((opts.attention_settings[0], best["setting"])):
    knobs = tuple(f"{k}={v}" for k, v in attention_sweep.parse_setting(setting).items())
    scored[setting] = _guarded(lambda knobs=knobs: _bench(
        model=model, num_layers=layers, query_len=w.query_len, num_items=w.num_items,
        item_len=w.item_len, labels=_labels(cfg.vocab_size), algorithms=("serial", "packed", "auto"),
        kernels=("pallas_gpu",), serial_items=2, hf_baseline=False, repeats=1 if opts.quick else 3,
        peak_sizes=(256,) if opts.quick else (2048, 4096), overrides=tuple(over) + knobs))
  out["scored"] = scored
  return out


def _guarded(part: Callable[[], Any]) -> Any:
  try:
    return part()
  except Exception as e:  # noqa: BLE001
    return dict(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])


def run_gpu_check(opts: GpuCheckOptions, on_part: Optional[Callable[[str, Any], None]] = None,
                  hlo_dir: Optional[str] = None) -> dict[str, Any]:
  """The parts (module docstring) named in opts.parts; `on_part(name, result)` sees each as it ends (to save
  it early). The int8 part writes the optimized HLO it reads under `hlo_dir` when given."""
  quick = opts.quick
  interpret = jax.default_backend() != "gpu"
  report: dict[str, Any] = dict(backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
                                jax_version=jax.__version__, interpret=interpret, quick=quick,
                                load_before=os.getloadavg())
  # torch and transformers are imported here, before any part, and the time is recorded: on a fresh GPU
  # machine, transformers' import (its scan of the installed distributions' metadata) once stalled for over
  # 100 s inside the parity part, after the kernel parts, and never when it ran alone.
  t0 = time.perf_counter()
  try:
    import torch
    import transformers  # noqa: F401  pylint: disable=unused-import
    report.update(torch_version=torch.__version__, torch_cuda=torch.cuda.is_available(),
                  torch_device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
  except ImportError:
    report["torch_version"] = None
  report["import_torch_transformers_s"] = time.perf_counter() - t0

  def part(name, fn, key=None):
    if (key or name) not in opts.parts:
      return
    report[name] = _guarded(fn)
    if on_part:
      on_part(name, report[name])

  cases = tuple(c[:1] + (9, 2, 5) + c[4:] for c in _KERNEL_CASES) if quick else _KERNEL_CASES
  part("kernels", lambda: kernel_parity(interpret, cases))
  part("kernel_grads", lambda: kernel_grad_parity(interpret, cases))
  parity = dict(model="tiny-qwen3", num_layers=2, query_len=40, num_items=12, item_len=9, labels=(3, 7),
                algorithms=("serial", "packed", "prefill_extend"), repeats=1, serial_items=4, hf_batch_size=4,
                kernels=("pallas_gpu", "shared_prefix"),
                overrides=(f"kernel_interpret={str(interpret).lower()}", "gpu_block_q=16", "gpu_block_kv=16"),
                peak_sizes=(256,))  # parity, not speed: a small product stands in for the matmul peak
  part("scorer_parity", lambda: _bench(**parity))
  part("train", lambda: train_steps(quick, opts.dtype, interpret))
  runs = []
  for (model, layers), workloads in opts.speed_groups().items():
    kw = dict(model=model, num_layers=layers, suite=True, suite_workloads=workloads,
              algorithms=("serial", "packed", "prefill_extend", "auto"), repeats=3, serial_items=2,
              hf_batch_size=64, hf_batch_sizes=(16, 256), kernels=opts.speed_kernels,
              overrides=(f"dtype={opts.dtype}", f"weight_dtype={opts.dtype}",
                         f"kernel_interpret={str(interpret).lower()}"))
    if quick:
      kw.update(num_layers=2, suite_workloads=("tiny=16x6x8",), repeats=1, hf_batch_sizes=(), hf_batch_size=4)
    part(f"speed_{model}_{layers}", functools.partial(_bench, **kw), key="speed")
    runs.append(f"speed_{model}_{layers}")
  report["speed_parts"] = runs if "speed" in opts.parts else []
  part("attention", lambda: attention_check(opts, interpret))
  part("int8", lambda: int8_check(opts, interpret, hlo_dir))
  seeds = []
  for spec in opts.seed_workloads:
    name = f"seed_{_workload(spec)[2].name}"
    part(name, functools.partial(seed_run, spec, opts.speed_kernels, opts.dtype, opts.hf_kv_gib, interpret, quick),
         key="seed")
    seeds.append(name)
  report["seed_parts"] = seeds if "seed" in opts.parts else []
  report["load_after"] = os.getloadavg()
  return report


def all_ok(report: dict[str, Any]) -> bool:
  """Of the parts that ran (at least one): none failed; every kernel case, forward and backward, within
  tolerance; in the parity part every algorithm and kernel within 1e-4 of serial, and transformers within
  1e-4 of the scorer; in the seed part every row ran and every algorithm within _SEED_BAND of serial (bf16);
  the int8 part's three pieces ran; the attention part's scorer runs ran."""
  ran = [name for name in ("kernels", "kernel_grads", "scorer_parity", "train", *report.get("speed_parts", []),
                            *report.get("seed_parts", []), "int8", "attention") if name in report]
  if not ran or any(isinstance(report[name], dict) and "error" in report[name] for name in ran):
    return False
  if "int8" in report and any("error" in report["int8"][k] for k in ("projections", "program", "model")):
    return False
  if "attention" in report and any("error" in v for v in report["attention"]["scored"].values()):
    return False
  for name in report.get("seed_parts", []):
    (w,) = report[name]["workloads"]
    rows_ok = all("error" not in r for r in w["rows"])
    diffs = [d for k, v in w["checks"].items() if k.startswith("max_abs_logprob_diff_vs_") for d in v.values()]
    if not rows_ok or not diffs or not max(diffs) <= _SEED_BAND:  # NaN fails too
      return False
  cases = [r for name in ("kernels", "kernel_grads") for r in report.get(name, [])]
  if not all(r["ok"] for r in cases):
    return False
  if "scorer_parity" not in report:
    return True
  checks = report["scorer_parity"].get("checks", {})
  vs_serial = [d for k, v in checks.items() if k.startswith("max_abs_logprob_diff_vs_") for d in v.values()]
  return bool(vs_serial) and max(vs_serial) <= 1e-4 and bool(checks.get("hf_agrees_1e4"))
