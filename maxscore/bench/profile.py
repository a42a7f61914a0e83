"""Where the time goes in the reference packed forward: its parts timed alone, as shares of the whole.

One packed row at the reference workload's buckets (P=2048 with 2001 real tokens, 512 slots of 20
with 500 real items; Qwen3-0.6B dims, float32). Each part runs as its own jitted program, all
interleaved `repeats` times in one process (best kept), so every share is a ratio taken under the
same load. XLA:CPU's profiler names only whole fusions, so parts are timed directly instead:
  forward (full-vocabulary lm_head / label rows)   the scoring programs, apply_softmax false / true
  forward, former shared_prefix steps              the first, with the kernel's former step size and mask
  dense only                                       the same forward with attention replaced by identity
  attention kernel                                 shared_prefix on [T] queries, once per layer
  slot QK + PV products only                       the slot path's two GEMMs, same chunks, no softmax
  lm_head                                          500 score rows: [D, V] + log-sum-exp, or K label rows
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
from maxscore.scoring import runner as runner_lib
from maxscore.scoring.scorer import Scorer


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
  """scripts/profile_shares.py's settings (configs/profile.yml documents each key)."""
  repeats: int = 3
  num_layers: int = 2

  def validate(self) -> "ProfileOptions":
    if self.repeats < 1 or self.num_layers < 1:
      raise ValueError(f"repeats={self.repeats} and num_layers={self.num_layers} must be >= 1")
    return self


P, VALID, N, ITEMS, L = 2048, 2001, 512, 500, 20
LABELS = (9454, 2753)


def _forward(decoder, output: str):
  def fn(params, tokens, positions, layout, score_index, labels):
    h = runner_lib.packed_hidden(decoder, params, tokens, positions, layout, score_index)
    return runner_lib.OUTPUTS[output](decoder, params, h, labels)
  return jax.jit(fn)


def _slot_gemms(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH):
  """The slot path's QK and PV products alone (same chunks as the kernel), no mask/max/exp/sum."""
  b, _, nh, h = q_BxTxNxH.shape
  kh = k_BxTxKxH.shape[2]
  g = nh // kh
  pk, pv = sp._to_z(k_BxTxKxH[:, :P]), sp._to_z(v_BxTxKxH[:, :P])
  c = sp._chunk_size(N, 4 * b * kh * L * g * P, L * g)
  q = q_BxTxNxH[:, P:].reshape(b, N // c, c * L, kh, g, h)
  one = lambda q_c: sp._bmm("ZMP,ZPH->ZMH", sp._bmm("ZMH,ZPH->ZMP", sp._to_z(q_c, g), pk), pv)
  return jax.lax.map(one, jnp.moveaxis(q, 1, 0))


def _former_kernel(fn):
  """`fn` traced with the shared_prefix settings before cache-sized steps: 1024-token slot steps
  (32 slots here, an ~84 MiB score tile) and the padding mask as a select."""
  def traced(*args):
    saved = sp._TILE_BYTES, sp._BIAS_COLUMN
    sp._TILE_BYTES, sp._BIAS_COLUMN = 90 << 20, False
    try:
      return fn.__wrapped__(*args)
    finally:
      sp._TILE_BYTES, sp._BIAS_COLUMN = saved
  return jax.jit(traced)


def parts(num_layers: int) -> dict:
  """name -> (jitted fn, args) for every timed part."""
  scorer = Scorer.from_config(bench_config(BenchOptions(num_layers=num_layers)))
  run, m = scorer.runner, scorer.config.model
  t = P + N * L
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, m.vocab_size, (1, t)), jnp.int32)
  layout = SegmentLayout(jnp.asarray([VALID], jnp.int32), jnp.asarray([[L] * ITEMS + [0] * (N - ITEMS)], jnp.int32),
                         P, L, N)
  score_index = jnp.asarray(P + np.arange(N) * L + L - 1, jnp.int32)[None]
  fwd_args = (run.params, tokens, layout.serial_positions(), layout, score_index, jnp.asarray(LABELS, jnp.int32))
  dec = run.decoder("shared_prefix")
  identity = Decoder(m, lambda q, *a, **kw: q, dtype=run.dtype, param_dtype=run.dtype, precision=run.precision)
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  qkv = (jax.random.normal(keys[0], (1, t, m.num_heads, m.head_dim)),
         jax.random.normal(keys[1], (1, t, m.num_kv_heads, m.head_dim)),
         jax.random.normal(keys[2], (1, t, m.num_kv_heads, m.head_dim)))
  attend = get_kernel("shared_prefix")
  per_layer = lambda f: jax.jit(lambda q, k, v: [f(q * (1 + 1e-3 * i), k, v) for i in range(num_layers)])
  rows = (run.params, jax.random.normal(keys[3], (1, ITEMS, m.hidden_size)), jnp.asarray(LABELS, jnp.int32))
  return {
      "forward, full-vocabulary lm_head (apply_softmax=false)": (_forward(dec, "logprobs"), fwd_args),
      "forward, label-row lm_head (apply_softmax=true)": (_forward(dec, "logits"), fwd_args),
      "forward, apply_softmax=false, former shared_prefix steps": (_former_kernel(_forward(dec, "logprobs")), fwd_args),
      "dense only (attention = identity, no lm_head)": (_forward(identity, "hidden"), fwd_args),
      "attention kernel (shared_prefix), all layers": (per_layer(lambda q, k, v: attend(q, k, v, layout)), qkv),
      "  of which slot QK + PV products only": (per_layer(_slot_gemms), qkv),
      "lm_head [D, V] + log-sum-exp, 500 rows": (jax.jit(lambda *a: runner_lib.label_logprobs(dec, *a)), rows),
      "lm_head label rows only, 500 rows": (jax.jit(lambda *a: runner_lib.label_logits(dec, *a)), rows),
  }


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
