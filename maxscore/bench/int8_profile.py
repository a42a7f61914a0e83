"""What quantization=int8 (w8a8) runs, and what each of its parts costs against bf16, on this backend.

For each distinct projection of a model (q, k/v, o, gate/up, down) at the token count of one packed row of a
workload, it times, each as its own jitted program (best of `repeats` rounds of `inner` back-to-back calls):

- bf16: the projection as quantization=none runs it (einsum in the compute dtype);
- int8_weights: int8 weights cast to the compute dtype in the einsum, the output rescaled;
- w8a8: quantization=int8 as the model runs it (layers/quantization.py `einsum`), and its three parts alone:
  `quantize` (per-token absmax, scale, round to int8), `int8_dot` (int8 x int8 -> int32) and `dequantize`
  (the int32 output times the token and channel scales, in the compute dtype);
- w8a8 under each XLA option set of `xla_variants` (compile-time options, e.g. forcing cuBLAS or Triton GEMMs),
  and with the weight stored [out, in] (both operands contracting their minor dim, the layout int8 GEMM
  libraries ask for), so a faster reachable path shows up as a faster row.

It also reads the optimized HLO of each w8a8 projection and of the model's packed program at the workload
(one layer: the scanned body is the same at any depth; maxscore/bench/hlo_text.py): whether the dots take
int8 operands and run as int8 x int8 -> int32, how (cuBLAS call, Triton fusion, plain dot), and what each
activation quantization is fused with. With `hlo_dir` the texts are written there.

    report = profile(model_cfg, tokens=25_633, dtype="bfloat16")
"""

import dataclasses
import functools
import os
import re
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from layers import quantization as quant
from layers.config import ModelConfig
from maxscore.bench import compile_report, hlo_text
from maxscore.bench.measure import time_call


@dataclasses.dataclass(frozen=True)
class Projection:
  name: str            # the projections it stands for, e.g. "gate/up"
  equation: str
  x_shape: tuple[int, ...]
  w_shape: tuple[int, ...]
  num_contracting: int

  @property
  def flops(self) -> float:
    contracted = int(np.prod(self.w_shape[:self.num_contracting]))
    return 2.0 * int(np.prod(self.x_shape)) * int(np.prod(self.w_shape)) / contracted


def projections(model: ModelConfig, tokens: int) -> list[Projection]:
  """The distinct projection shapes of one decoder layer (layers/attention.py, layers/mlp.py), on one row of
  `tokens` tokens."""
  d, n, k, h, f = model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim, model.mlp_dim
  return [Projection("q", "BTD,DNH->BTNH", (1, tokens, d), (d, n, h), 1),
          Projection("k/v", "BTD,DNH->BTNH", (1, tokens, d), (d, k, h), 1),
          Projection("o", "BTNH,NHD->BTD", (1, tokens, n, h), (n, h, d), 2),
          Projection("gate/up", "BTD,DF->BTF", (1, tokens, d), (d, f), 1),
          Projection("down", "BTF,FD->BTD", (1, tokens, f), (f, d), 1)]


def _transposed_equation(p: Projection) -> Optional[str]:
  """The equation with a 2-D weight stored [out, in] (None for multi-dim weights)."""
  if len(p.w_shape) != 2:
    return None
  lhs, out = p.equation.split("->")
  x_spec, w_spec = lhs.split(",")
  return f"{x_spec},{w_spec[::-1]}->{out}"


def _hlo_facts(text: str) -> dict[str, Any]:
  module = hlo_text.parse(text)
  found = hlo_text.dots(module)
  return dict(dots=found, int8_dots=len(hlo_text.int8_dots(found)), quantizations=hlo_text.int8_conversions(module),
              kernels=hlo_text.kernel_count(module))


def _save(hlo_dir: Optional[str], name: str, text: str) -> Optional[str]:
  if not hlo_dir:
    return None
  os.makedirs(hlo_dir, exist_ok=True)
  path = os.path.join(hlo_dir, re.sub(r"[^\w.\-]+", "_", name).strip("_") + ".hlo.txt")  # plain file names
  with open(path, "w") as f:
    f.write(text)
  return path


def _variant_options(variant: str) -> dict[str, Any]:
  """"flag=value+flag=value" as compiler options (booleans and integers parsed; "+" joins options, since the
  variants' flag is itself a comma-separated list)."""
  out: dict[str, Any] = {}
  for item in filter(None, variant.split("+")):
    key, _, value = item.partition("=")
    if not key or not value:
      raise ValueError(f"int8_xla_variants entry {variant!r} is not flag=value[+flag=value...], e.g. "
                       "xla_gpu_triton_gemm_any=true")
    out[key] = {"true": True, "false": False}.get(value.lower(), int(value) if value.lstrip("-").isdigit() else value)
  return out


def check_variants(variants: Sequence[str]) -> None:
  for v in variants:
    _variant_options(v)


def profile_projection(p: Projection, dtype: Any, repeats: int, inner: int, variants: Sequence[str],
                       hlo_dir: Optional[str] = None) -> dict[str, Any]:
  """One projection's rows (module docstring): {"name", "flops", "ms": {what: ms}, "tflops": {...}, "hlo": ...}."""
  kx, kw = jax.random.split(jax.random.PRNGKey(0))  # drawn on the device: the GPU's rows are ~10^8 values
  x = jax.random.normal(kx, p.x_shape, dtype)
  w = jax.random.normal(kw, p.w_shape, jnp.float32) * 0.02
  axes = tuple(range(p.num_contracting))
  wq, scale = quant.quantize(w, axes)
  w_dt = w.astype(dtype)
  nc, eq = p.num_contracting, p.equation
  xq, x_scale = jax.jit(functools.partial(quant.quantize_activations, num_contracting=nc))(x)
  y32 = jax.jit(functools.partial(quant.int8_dot, eq))(xq, wq)
  w8a8 = lambda x_, wq_, s_: quant.einsum(eq, x_, (wq_, s_), nc, "int8", dtype)
  programs: dict[str, tuple[Callable, tuple]] = {
      "bf16": (lambda x_, w_: jnp.einsum(eq, x_, w_), (x, w_dt)),
      "int8_weights": (lambda x_, wq_, s_: quant.einsum(eq, x_, (wq_, s_), nc, "int8_weights", dtype), (x, wq, scale)),
      "w8a8": (w8a8, (x, wq, scale)),
      "quantize": (functools.partial(quant.quantize_activations, num_contracting=nc), (x,)),
      "int8_dot": (functools.partial(quant.int8_dot, eq), (xq, wq)),
      "dequantize": (lambda y_, xs_, s_: quant.dequantize_output(y_, xs_, s_, nc, dtype), (y32, x_scale, scale)),
  }
  t_eq = _transposed_equation(p)
  if t_eq:
    programs["w8a8 weight [out, in]"] = (lambda x_, wq_, s_: quant.einsum(t_eq, x_, (wq_, s_), nc, "int8", dtype),
                                         (x, wq.T, scale))
  row: dict[str, Any] = dict(name=p.name, equation=eq, x_shape=list(p.x_shape), w_shape=list(p.w_shape),
                             flops=p.flops, ms={}, hlo={})
  for what, (fn, args) in programs.items():
    compiled = jax.jit(fn).lower(*args).compile()
    row["ms"][what] = 1e3 * time_call(compiled, args, repeats, inner)
    if what in ("bf16", "w8a8", "w8a8 weight [out, in]", "int8_dot"):
      text = compiled.as_text()
      row["hlo"][what] = dict(_hlo_facts(text), file=_save(hlo_dir, f"{p.name} {what}", text))
  for variant in variants:
    what = f"w8a8 [{variant}]"
    try:  # an option this XLA does not know is a finding, not a stop
      compiled = jax.jit(w8a8).lower(x, wq, scale).compile(compiler_options=_variant_options(variant))
      row["ms"][what] = 1e3 * time_call(compiled, (x, wq, scale), repeats, inner)
      row["hlo"][what] = dict(_hlo_facts(compiled.as_text()), file=None)
    except Exception as e:  # noqa: BLE001
      row.setdefault("errors", {})[what] = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
  bf16 = row["ms"]["bf16"]
  row["x_bf16"] = {k: bf16 / v for k, v in row["ms"].items() if k != "bf16"}  # > 1: faster than bf16
  row["parts_ms"] = sum(row["ms"][k] for k in ("quantize", "int8_dot", "dequantize"))
  row["tflops"] = {k: p.flops / (v * 1e-3) / 1e12 for k, v in row["ms"].items()
                   if k in ("bf16", "int8_weights", "w8a8", "int8_dot", "w8a8 weight [out, in]")}
  return row


def model_program_hlo(config: Any, geometry: Sequence[int], hlo_dir: Optional[str] = None) -> dict[str, Any]:
  """The scorer's packed program at `geometry` (query, items, item tokens) for `config` (its quantization,
  kernel and dtype), compiled and not run (abstract params): its dots and int8 conversions."""
  scorer = compile_report.abstract_scorer(config, compile_report.target_mesh(config.mesh, jax.devices()))
  scorer.warmup([tuple(geometry)], algorithm="packed")
  out = {}
  for program in scorer.runner.programs.values():
    text = program.compiled.as_text()
    name = (f"{program.entry} {config.runtime.quantization} {program.kernel} B{program.batch} "
            f"P{program.prefix_len} N{program.num_slots} L{program.slot_len}")
    facts = _hlo_facts(text)
    out[name] = dict(facts, dots=_dot_summary(facts["dots"]), file=_save(hlo_dir, name, text))
  return out


def _dot_summary(found: list[dict[str, Any]]) -> dict[str, int]:
  """{"kind operands -> result": count}: how many dots of each kind and types a program holds."""
  out: dict[str, int] = {}
  for d in found:
    key = f"{d['kind']} {'x'.join(d['operands'])} -> {d['result']}"
    out[key] = out.get(key, 0) + 1
  return out


def profile(model: ModelConfig, tokens: int, dtype: str = "bfloat16", repeats: int = 5, inner: int = 20,
            variants: Sequence[str] = (), hlo_dir: Optional[str] = None) -> dict[str, Any]:
  """Every projection of `model` at `tokens` (profile_projection), and totals over one layer's projections
  (each counted as often as the layer runs it: k/v and gate/up twice)."""
  check_variants(variants)
  dt = jnp.dtype(dtype)
  rows = [profile_projection(p, dt, repeats, inner, variants, hlo_dir) for p in projections(model, tokens)]
  count = {"k/v": 2, "gate/up": 2}
  keys = set.intersection(*(set(r["ms"]) for r in rows))
  layer_ms = {k: sum(count.get(r["name"], 1) * r["ms"][k] for r in rows) for k in sorted(keys)}
  return dict(tokens=tokens, dtype=dtype, backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
              repeats=repeats, inner=inner, variants=list(variants), projections=rows, layer_ms=layer_ms,
              layer_x_bf16={k: layer_ms["bf16"] / v for k, v in layer_ms.items() if k != "bf16"},
              int8_dots_everywhere=all(r["hlo"]["w8a8"]["int8_dots"] >= 1 for r in rows))
