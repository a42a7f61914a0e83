"""int8 post-training quantization of the projection einsums: per-output-channel symmetric weight scales
(docs/ARCHITECTURE.md section 15).

Modes (`quantization:` in the config):
- `none`: the float weights, as trained.
- `int8_weights`: each projection weight W is stored as int8 Wq with a float32 scale per output channel,
  s = max|W| / 127 over the contracting dims, Wq = round(W / s); the einsum reads Wq cast to the compute
  dtype and multiplies its output by s (the same as dequantizing W first, since s is constant along the
  contracted dims). Weight memory is a quarter of float32's, half of bfloat16's.
- `int8`: w8a8. The activations are quantized too, per token (symmetric, dynamic: s_x = max|x| / 127 over
  the contracting dims of each token, computed in the forward), the dot runs in int8 with int32
  accumulation and its output is rescaled by s_x * s.

The quantized weights live beside the einsums that read them (Attention's q/k/v/o, MLP's gate/up/down, the
separate lm_head), as params `<name>` (int8) and `<name>_scale` (float32, the weight's output dims), created
by `weight`; inside the scanned layer stack both gain the leading `layers` axis. Embeddings, norms and biases
stay float, and so does a tied lm_head (it is the embedding table).

Qwix (0.1.8) was tried first for the post-training quantization and does not fit this model: its PTQ provider
replaces each weight by a wrapper that `w.astype(dtype)` (which every projection here does) refuses
(qwix flax_util.update_boxed: "Unsupported type QArray"), its rules match module paths only while q/k/v/o
share one module (`attn`) and gate/up/down another (`mlp`), and the lm_head rows that scores gather
(`jnp.take` of columns) are no einsum it intercepts.
"""

from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

QUANTIZATIONS = ("none", "int8_weights", "int8")
INT8_MAX = 127.0

# The quantized weights: param name -> number of leading contracting dims (the rest are output channels).
# A path in the params tree ends in one of these names under `attn`, `mlp` or at the top (lm_head).
_CONTRACTING = {"attn": {"q": 1, "k": 1, "v": 1, "o": 2}, "mlp": {"gate": 1, "up": 1, "down": 1}}
_TOP = {"lm_head": 1}


def check(mode: str) -> str:
  """`mode` if it is a known quantization, else a ValueError naming the allowed ones."""
  if mode not in QUANTIZATIONS:
    raise ValueError(f"quantization={mode!r} is not one of {list(QUANTIZATIONS)}")
  return mode


def refuse_training(mode: str, what: str, error: type[Exception] = ValueError) -> None:
  """Raises `error` when `mode` quantizes: the int8 weights are integers, so nothing trains them; only LoRA
  adapters train beside a frozen int8_weights base (QLoRA, `refuse_qlora`)."""
  if check(mode) != "none":
    raise error(f"quantization={mode!r} is for scoring only, and {what} trains the model; use quantization=none")


def refuse_qlora(mode: str, error: type[Exception] = ValueError) -> None:
  """Raises `error` unless `mode` is a base LoRA adapters can train on: none or int8_weights. w8a8 (`int8`)
  rounds the activations in the forward, and a rounding has zero gradient, so nothing below a w8a8 projection
  would learn (no straight-through estimator here)."""
  if check(mode) == "int8":
    raise error("quantization='int8' (w8a8) rounds the activations, which passes no gradient to the adapters "
                "below; train LoRA adapters on quantization=int8_weights (QLoRA), or on quantization=none")


def quantize(w: jax.Array, contracting_axes: Sequence[int]) -> tuple[jax.Array, jax.Array]:
  """(int8 Wq, float32 scale) with W ~= Wq * scale, one scale per output channel (the axes not contracted).

  Symmetric, round to nearest: |W - Wq * scale| <= scale / 2 elementwise. An all-zero channel gets scale 1
  (and Wq 0), so no division by zero and the round trip stays exact."""
  w32 = jnp.asarray(w, jnp.float32)
  amax = jnp.max(jnp.abs(w32), axis=tuple(contracting_axes), keepdims=True)
  scale = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
  wq = jnp.clip(jnp.round(w32 / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
  return wq, jnp.squeeze(scale, axis=tuple(contracting_axes))


def dequantize(wq: jax.Array, scale: jax.Array, contracting_axes: Sequence[int]) -> jax.Array:
  """Wq * scale in float32: the inverse of `quantize` up to its rounding (scale broadcast over the
  contracting axes)."""
  return wq.astype(jnp.float32) * jnp.expand_dims(scale, tuple(contracting_axes))


def _map_projections(params: Any, fn: Callable[[Mapping, str, tuple], dict]) -> dict:
  """`params` with each projection weight `key` (and its `<key>_scale` sibling, if any) replaced by what
  `fn(tree, key, contracting_axes)` returns; `tree` is the weight's module dict, and the axes follow the layer
  axis of scanned weights. Every other leaf is kept."""

  def walk(tree, module: Optional[str], scanned: bool):
    table = _TOP if module is None else _CONTRACTING.get(module, {})
    out = {}
    for key, value in tree.items():
      if isinstance(value, Mapping):
        out[key] = walk(value, key, scanned or key == "layers")
      elif key in table:
        lead = 1 if scanned else 0
        out.update(fn(tree, key, tuple(range(lead, lead + table[key]))))
      elif not (key.endswith("_scale") and key.removesuffix("_scale") in table):
        out[key] = value
    return out
  return walk(dict(params), None, False)


def quantize_params(params: Any, mode: str) -> Any:
  """The Decoder's unboxed float params with every projection (and a separate lm_head) quantized for `mode`:
  each such weight becomes int8 and gains a `<name>_scale` sibling. `none` returns `params` unchanged.

  Scanned layer weights [layers, contracting..., output...] get a scale per layer and output channel. Params
  quantized already (int8 weights with their scales: both modes read the same) are returned as they are."""
  if check(mode) == "none" or holds_int8(params):
    return params

  def one(tree, key, axes):
    wq, scale = quantize(tree[key], axes)
    return {key: wq, f"{key}_scale": scale}
  return _map_projections(params, one)


def dequantize_params(params: Any) -> Any:
  """The inverse of `quantize_params` up to its rounding: every int8 weight with its `<name>_scale` sibling
  becomes the float32 Wq * scale, the scales are dropped and every other leaf is kept as it is (float params,
  and adapters beside the weights, pass through). A QLoRA model merges its adapters into these weights."""

  def one(tree, key, axes):
    if jnp.dtype(tree[key].dtype) != jnp.int8:
      return {k: tree[k] for k in (key, f"{key}_scale") if k in tree}
    return {key: dequantize(tree[key], tree[f"{key}_scale"], axes)}
  return _map_projections(params, one)


def holds_int8(params: Any) -> bool:
  """Whether `params` (arrays or ShapeDtypeStructs) hold int8 weights, i.e. were quantized already."""
  return any(jnp.dtype(x.dtype) == jnp.int8 for x in jax.tree_util.tree_leaves(params))


def is_quantized_leaf(path: Sequence[Any]) -> bool:
  """Whether the param at `path` (a tree_flatten_with_path path) is an int8 weight or its scale: leaves that
  keep their dtype when the other params are cast to weight_dtype."""
  names = [str(getattr(k, "key", k)) for k in path]
  name = names[-1].removesuffix("_scale")
  module = names[-2] if len(names) > 1 else None
  return name in _TOP or name in _CONTRACTING.get(module, {})


def weight(module: nn.Module, name: str, axes: tuple[Optional[str], ...], shape: tuple[int, ...],
           num_contracting: int, mode: str):
  """Creates the weight `name` in `module`: the float param as before for `none` (normal(0.02)), else (int8
  `name`, float32 `name_scale`), whose values come from `quantize_params` (init gives zeros and ones)."""
  if mode == "none":
    init = nn.initializers.normal(stddev=0.02)
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, module.param_dtype)
  zeros = lambda key, s, dtype: jnp.zeros(s, dtype)
  wq = module.param(name, nn.with_logical_partitioning(zeros, axes), shape, jnp.int8)
  scale = module.param(f"{name}_scale", nn.with_logical_partitioning(nn.initializers.ones, axes[num_contracting:]),
                       shape[num_contracting:], jnp.float32)
  return wq, scale


def einsum(equation: str, x: jax.Array, w: Any, num_contracting: int, mode: str, dtype: Any,
           precision: Optional[jax.lax.Precision] = None) -> jax.Array:
  """`jnp.einsum(equation, x, W)` in `dtype` for a weight from `weight` (a float array, or (Wq, scale)).

  The weight operand lists its contracting dims first and the output ends in W's output dims (every
  projection here: "BTD,DNH->BTNH", "BTNH,NHD->BTD", "BTD,DF->BTF"), so the per-channel scale multiplies the
  output's trailing dims and a per-token activation scale its leading (batch) dims."""
  if mode == "none":
    return jnp.einsum(equation, x, w.astype(dtype), precision=precision)
  wq, scale = w
  if mode == "int8_weights":
    y = jnp.einsum(equation, x, wq.astype(dtype), precision=precision)
    return (y.astype(jnp.float32) * scale).astype(dtype)
  xq, x_scale = quantize_activations(x, num_contracting)
  y_int32 = jnp.einsum(equation, xq, wq, preferred_element_type=jnp.int32)
  out_rest = y_int32.ndim - (x.ndim - num_contracting)  # the output's weight dims after its batch dims
  x_scale = x_scale.reshape(x_scale.shape[:x.ndim - num_contracting] + (1,) * out_rest)
  return (y_int32.astype(jnp.float32) * x_scale * scale).astype(dtype)


def quantize_activations(x: jax.Array, num_contracting: int) -> tuple[jax.Array, jax.Array]:
  """Per-token symmetric int8 activations: (int8 xq, float32 scale with the contracted trailing dims kept as 1)."""
  xq, scale = quantize(x, tuple(range(x.ndim - num_contracting, x.ndim)))
  return xq, scale.reshape(scale.shape + (1,) * num_contracting)
