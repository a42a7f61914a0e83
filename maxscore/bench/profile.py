"""Where the time goes in a packed forward: its parts timed alone, as shares of the whole.

One packed row at a workload's buckets (by default the reference: P=2048 with 2001 real tokens, 512
slots of 20 with 500 real items; `--query_len=32 --num_items=64 --item_len=256` is one extend chunk
of the BEIR-like workload). Qwen3-0.6B dims, float32. Each part runs as its own jitted program, all
interleaved `repeats` times in one process (best kept), so every share is a ratio taken under the
same load. XLA:CPU's profiler names only whole fusions, so parts are timed directly instead:
  forward (full-vocabulary lm_head / label rows)   the scoring programs, apply_softmax false / true
  forward, former shared_prefix steps              the first, with the kernel's former step size and mask
  forward, own attention as one [L, L] block       the first, each slot's own attention unblocked
  dense only                                       the same forward with attention replaced by identity
    of which dense matmuls                         the layers' weight products alone (QKV, O, MLP)
  attention kernel                                 shared_prefix on [T] queries, once per layer
    of which own attention                         the slots against a 1-key prefix: their own blocks
  lm_head                                          one score row per item: [D, V] + log-sum-exp, or K label rows
Norms, RoPE and the embedding are `dense only` minus `dense matmuls`; prefix attention is the kernel
minus its own attention (`derived_shares`).
"""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from layers.decoder import Decoder
from layers.kernels import SegmentLayout, get_kernel
from layers.kernels import shared_prefix as sp
from maxscore.bench.harness import BenchOptions, bench_config
from maxscore.bench.workloads import make_requests
from maxscore.scoring import runner as runner_lib
from maxscore.scoring.layout import bucket
from maxscore.scoring.scorer import Scorer

_HI = jax.lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
  """scripts/profile_shares.py's settings (configs/profile.yml documents each key)."""
  repeats: int = 3
  num_layers: int = 2
  model: str = "qwen3-0.6b"
  query_len: int = 2000
  num_items: int = 500
  item_len: int = 20
  hf_profile: bool = False   # also profile transformers on the same workload (torch.profiler, by op category)

  def validate(self) -> "ProfileOptions":
    for name in ("repeats", "num_layers", "query_len", "num_items", "item_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
    return self


LABELS = (9454, 2753)


def _forward(decoder, output: str):
  def fn(params, tokens, positions, layout, score_index, labels):
    h = runner_lib.packed_hidden(decoder, params, tokens, positions, layout, score_index)
    return runner_lib.OUTPUTS[output](decoder, params, h, labels)
  return jax.jit(fn)


def _patched(fn, **constants):
  """`fn` traced with shared_prefix module constants set to `constants` (restored after tracing)."""
  def traced(*args):
    saved = {k: getattr(sp, k) for k in constants}
    for k, v in constants.items():
      setattr(sp, k, v)
    try:
      return fn.__wrapped__(*args)
    finally:
      for k, v in saved.items():
        setattr(sp, k, v)
  return jax.jit(traced)


def _dense_matmuls(m, t: int, num_layers: int):
  """The layers' weight products alone on [t, D] activations: QKV, O, gate/up and down, per layer."""
  d, qkv, o = m.hidden_size, (m.num_heads + 2 * m.num_kv_heads) * m.head_dim, m.num_heads * m.head_dim
  keys = jax.random.split(jax.random.PRNGKey(2), 5)
  w = [jax.random.normal(k, s) * 0.02 for k, s in zip(keys, ((d, qkv), (o, d), (d, 2 * m.mlp_dim), (m.mlp_dim, d)))]
  x = jax.random.normal(keys[4], (t, d))

  def fn(x, w_qkv, w_o, w_gu, w_down):
    for _ in range(num_layers):
      a = jnp.dot(x, w_qkv, precision=_HI)[:, :o]
      x = x + jnp.dot(a, w_o, precision=_HI)
      gu = jnp.dot(x, w_gu, precision=_HI)
      x = x + jnp.dot(gu[:, :m.mlp_dim] * gu[:, m.mlp_dim:], w_down, precision=_HI)
    return x
  return jax.jit(fn), (x, *w)


def geometry(opts: ProfileOptions, scorer: Scorer) -> tuple[int, int, int, int, int]:
  """(P, real prefix tokens, slots N, real items, slot length L) of the one packed row profiled."""
  bk, valid = scorer.config.buckets, opts.query_len + 1
  p = bucket(valid, bk.prefix_buckets, "query_len")
  n = bucket(opts.num_items, bk.item_count_buckets, "num_items")
  return p, valid, n, opts.num_items, bucket(opts.item_len, bk.item_buckets, "item_len")


def parts(opts: ProfileOptions) -> dict:
  """name -> (jitted fn, args) for every timed part."""
  scorer = Scorer.from_config(bench_config(BenchOptions(model=opts.model, num_layers=opts.num_layers)))
  run, m = scorer.runner, scorer.config.model
  p, valid, n, items, l = geometry(opts, scorer)
  t = p + n * l
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, m.vocab_size, (1, t)), jnp.int32)
  slot_valid = [opts.item_len] * items + [0] * (n - items)
  layout = SegmentLayout(jnp.asarray([valid], jnp.int32), jnp.asarray([slot_valid], jnp.int32), p, l, n)
  score_index = jnp.asarray(p + np.arange(n) * l + opts.item_len - 1, jnp.int32)[None]
  labels = jnp.asarray([x % m.vocab_size for x in LABELS], jnp.int32)
  fwd_args = (run.params, tokens, layout.serial_positions(), layout, score_index, labels)
  dec = run.decoder("shared_prefix")
  identity = Decoder(m, lambda q, *a, **kw: q, dtype=run.dtype, param_dtype=run.dtype, precision=run.precision)
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  qkv = (jax.random.normal(keys[0], (1, t, m.num_heads, m.head_dim)),
         jax.random.normal(keys[1], (1, t, m.num_kv_heads, m.head_dim)),
         jax.random.normal(keys[2], (1, t, m.num_kv_heads, m.head_dim)))
  own_layout = SegmentLayout(jnp.asarray([1], jnp.int32), layout.slot_valid_BxN, 1, l, n)
  own_qkv = tuple(x[:, p - 1:] for x in qkv)  # the slots behind a 1-token prefix
  attend = get_kernel("shared_prefix")
  per_layer = lambda f: jax.jit(lambda q, k, v: [f(q * (1 + 1e-3 * i), k, v) for i in range(opts.num_layers)])
  rows = (run.params, jax.random.normal(keys[3], (1, items, m.hidden_size)), labels)
  full = _forward(dec, "logprobs")
  return {
      "forward, full-vocabulary lm_head (apply_softmax=false)": (full, fwd_args),
      "forward, label-row lm_head (apply_softmax=true)": (_forward(dec, "logits"), fwd_args),
      "forward, apply_softmax=false, former shared_prefix steps": (
          _patched(full, _TILE_BYTES=90 << 20, _BIAS_COLUMN=False), fwd_args),
      "forward, apply_softmax=false, own attention as one [L, L] block": (_patched(full, _OWN_BLOCK=None), fwd_args),
      "dense only (attention = identity, no lm_head)": (_forward(identity, "hidden"), fwd_args),
      "  of which dense matmuls (QKV, O, MLP)": _dense_matmuls(m, t, opts.num_layers),
      "attention kernel (shared_prefix), all layers": (per_layer(lambda q, k, v: attend(q, k, v, layout)), qkv),
      "  of which own attention (slots behind a 1-token prefix)": (
          per_layer(lambda q, k, v: attend(q, k, v, own_layout)), own_qkv),
      f"lm_head [D, V] + log-sum-exp, {items} rows": (jax.jit(lambda *a: runner_lib.label_logprobs(dec, *a)), rows),
      f"lm_head label rows only, {items} rows": (jax.jit(lambda *a: runner_lib.label_logits(dec, *a)), rows),
  }


def derived_shares(best: dict[str, float]) -> dict[str, float]:
  """Parts not timed alone, by difference: norms + RoPE + embedding, and prefix attention (seconds)."""
  get = lambda prefix: next(v for k, v in best.items() if k.startswith(prefix))
  return {"norms + RoPE + embedding (dense only - dense matmuls)": get("dense only") - get("  of which dense"),
          "prefix attention (kernel - own attention)": get("attention kernel") - get("  of which own")}


# torch ops by category: the weight products (nn.Linear: q/k/v/o, gate/up/down, lm_head) and attention
# (sdpa and its CPU flash kernel, or an eager bmm); everything else is norms, RoPE, activations and copies.
_HF_DENSE = ("aten::mm", "aten::addmm")
_HF_ATTENTION = ("scaled_dot_product", "flash_attention", "aten::bmm", "aten::baddbmm", "aten::_softmax")


def hf_profile(opts: ProfileOptions) -> dict[str, float]:
  """transformers on the same workload (prefix K/V reused, all items in one batch), best of `repeats` wall
  seconds, and one profiled run's self CPU seconds by category, scaled to that wall time."""
  import torch

  from maxscore.bench.hf_baseline import hf_label_logprobs, hf_model_like
  cfg = bench_config(BenchOptions(model=opts.model, num_layers=opts.num_layers))
  model = hf_model_like(cfg.model)
  request = make_requests(cfg.model.vocab_size, opts.query_len, opts.num_items, opts.item_len,
                          [x % cfg.model.vocab_size for x in LABELS])[0]
  run = lambda: hf_label_logprobs(model, request, opts.num_items, cfg.scoring.separator_token_id)
  run()
  walls = []
  for _ in range(opts.repeats):
    t0 = time.perf_counter()
    run()
    walls.append(time.perf_counter() - t0)
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    run()
  self_s = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
  total = sum(self_s.values()) or 1.0
  dense = sum(v for k, v in self_s.items() if k in _HF_DENSE)
  attention = sum(v for k, v in self_s.items() if any(a in k for a in _HF_ATTENTION))
  wall = min(walls)
  return {"transformers forward (prefix reused, one batch)": wall,
          "  dense matmuls (nn.Linear: QKV, O, MLP, lm_head)": wall * dense / total,
          "  attention (sdpa)": wall * attention / total,
          "  norms, RoPE, activations, copies (the rest)": wall * (total - dense - attention) / total}


def time_parts(todo: dict, repeats: int) -> dict[str, list[float]]:
  """Seconds of every part, each compiled first, then all interleaved `repeats` times."""
  for fn, args in todo.values():
    jax.block_until_ready(fn(*args))  # compile
  times = {name: [] for name in todo}
  for _ in range(repeats):
    for name, (fn, args) in todo.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - t0)
  return times
