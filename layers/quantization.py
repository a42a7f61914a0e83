"""int8 post-training quantization of the projection einsums: per-output-channel symmetric weight scales
(docs/ARCHITECTURE.md section 15).

Modes (`quantization:` in the config):
- `none`: the float weights, as trained.
- `int8_weights`: each projection weight W is stored as int8 Wq with a float32 scale per output channel,
  s = max|W| / 127 over the contracting dims, Wq = round(W / s); the einsum reads Wq cast to the compute
  dtype and multiplies its output by s (the same as dequantizing W first, since s is constant along the
  contracted dims). Weight memory is a quarter of float32's, half of bfloat16's.
  With `quantization_group_size: G` (> 0) the scales are finer: one per output channel and per group of G
  consecutive weights along the last contracting dim (llama.cpp's Q8_0 layout for G = 32), so a GGUF Q8_0
  checkpoint loads its codes and block scales as they are stored. The einsum then reads Wq * s dequantized
  in float32 (one scale no longer factors out of the contraction), then cast to the compute dtype.
- `int8`: w8a8. The activations are quantized too, per token (symmetric, dynamic: s_x = max|x| / 127 over
  the contracting dims of each token, computed in the forward), the dot runs in int8 with int32
  accumulation and its output is rescaled by s_x * s. Per-channel scales only: one int32 dot per output
  channel leaves one place to apply a weight scale, so `quantize_params` regroups per-group int8 weights per
  channel for it.

The quantized weights live beside the einsums that read them (Attention's q/k/v/o, MLP's gate/up/down, the
separate lm_head), as params `<name>` (int8) and `<name>_scale` (float32), created by `weight`; inside the
scanned layer stack both gain the leading `layers` axis. A per-channel scale has the weight's output dims; a
per-group one has the weight's dims with the last contracting dim divided by G. Embeddings, norms and biases
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


def quantize(w: jax.Array, contracting_axes: Sequence[int], group_size: int = 0) -> tuple[jax.Array, jax.Array]:
  """(int8 Wq, float32 scale) with W ~= Wq * scale, one scale per output channel (the axes not contracted), or
  with `group_size` G > 0 one per output channel and per group of G consecutive weights along the last
  contracting axis (the scale keeps W's dims, that one divided by G).

  Symmetric, round to nearest: |W - Wq * scale| <= scale / 2 elementwise. An all-zero channel (or group) gets
  scale 1 (and Wq 0), so no division by zero and the round trip stays exact. One compiled program per weight
  shape (called on host params, eagerly, its six elementwise steps would compile a program each)."""
  return _quantize_jit(w, tuple(contracting_axes), group_size)


def _quantize(w: jax.Array, contracting_axes: tuple[int, ...], group_size: int) -> tuple[jax.Array, jax.Array]:
  w32 = jnp.asarray(w, jnp.float32)
  if group_size:
    axis = _group_axis(w32.shape, contracting_axes, group_size)
    grouped = w32.reshape(w32.shape[:axis] + (w32.shape[axis] // group_size, group_size) + w32.shape[axis + 1:])
    wq, scale = _quantize(grouped, (axis + 1,), 0)
    return wq.reshape(w32.shape), scale
  amax = jnp.max(jnp.abs(w32), axis=tuple(contracting_axes), keepdims=True)
  scale = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
  wq = jnp.clip(jnp.round(w32 / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
  return wq, jnp.squeeze(scale, axis=tuple(contracting_axes))


_quantize_jit = jax.jit(_quantize, static_argnums=(1, 2))


def _group_axis(shape: Sequence[int], contracting_axes: Sequence[int], group_size: int) -> int:
  """The axis per-group scales divide (the last contracting one), after checking G divides it."""
  axis = contracting_axes[-1]
  if group_size < 0 or shape[axis] % group_size:
    raise ValueError(f"quantization_group_size={group_size} must divide the contracting dim {shape[axis]} of "
                     f"a weight of shape {tuple(shape)} (0: one scale per output channel)")
  return axis


def group_size_problem(name: str, group_size: int, model: Any) -> Optional[str]:
  """Why `group_size` cannot serve `model` (a ModelConfig) as the `name` setting, or None: per-group scales
  divide the last contracting dim of every projection (hidden_size, mlp_dim, head_dim)."""
  dims = {"hidden_size": model.hidden_size, "mlp_dim": model.mlp_dim, "head_dim": model.head_dim}
  if group_size and any(d % group_size for d in dims.values()):
    return (f"{name}={group_size} must divide each contracting dim of the projections "
            f"({', '.join(f'{k} {v}' for k, v in dims.items())})")
  return None


def group_size_of(wq: Any, scale: Any, contracting_axes: Sequence[int]) -> int:
  """The G of a quantized weight's scale: 0 for one scale per output channel (the scale lacks the contracting
  dims), else the last contracting dim over the scale's size there."""
  if len(scale.shape) < len(wq.shape):
    return 0
  axis = contracting_axes[-1]
  return wq.shape[axis] // scale.shape[axis]


def dequantize(wq: jax.Array, scale: jax.Array, contracting_axes: Sequence[int]) -> jax.Array:
  """Wq * scale in float32: the inverse of `quantize` up to its rounding (a per-channel scale broadcast over
  the contracting axes, a per-group one repeated G times along the last); one compiled program per shape."""
  return _dequantize_jit(wq, scale, tuple(contracting_axes))


def _dequantize(wq: jax.Array, scale: jax.Array, contracting_axes: tuple[int, ...]) -> jax.Array:
  group = group_size_of(wq, scale, contracting_axes)
  if group:
    return wq.astype(jnp.float32) * jnp.repeat(scale, group, axis=contracting_axes[-1])
  return wq.astype(jnp.float32) * jnp.expand_dims(scale, tuple(contracting_axes))


_dequantize_jit = jax.jit(_dequantize, static_argnums=(2,))


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


def quantize_params(params: Any, mode: str, group_size: int = 0) -> Any:
  """The Decoder's unboxed float params with every projection (and a separate lm_head) quantized for `mode`:
  each such weight becomes int8 and gains a `<name>_scale` sibling. `none` returns `params` unchanged.

  Scanned layer weights [layers, contracting..., output...] get a scale per layer and output channel (and per
  group of `group_size` along the last contracting dim: int8_weights only). Params quantized already (int8
  weights with their scales: both modes read the same) are returned as they are, except that `int8` (w8a8)
  regroups per-group weights per channel (from their float values Wq * s); a `group_size` other than 0 must
  then be the stored one."""
  if check(mode) == "none":
    return params
  if group_size and mode != "int8_weights":
    raise ValueError(f"quantization_group_size={group_size} is for quantization=int8_weights; int8 (w8a8) keeps "
                     "one weight scale per output channel (set quantization_group_size=0)")
  if holds_int8(params):
    stored = params_group_size(params)
    if group_size and group_size != stored:
      raise ValueError(f"these params hold int8 weights with quantization_group_size={stored}; score them with "
                       f"that (or 0: as stored), not {group_size}")
    if mode != "int8" or not stored:
      return params
    return _map_projections(params, lambda tree, key, axes: _one(
        dequantize(tree[key], tree[f"{key}_scale"], axes), key, axes, 0))
  return _map_projections(params, lambda tree, key, axes: _one(tree[key], key, axes, group_size))


def _one(w, key: str, axes: tuple, group_size: int) -> dict:
  wq, scale = quantize(w, axes, group_size)
  return {key: wq, f"{key}_scale": scale}


def params_group_size(params: Any) -> int:
  """The group size G of quantized params' scales (0: per output channel); a ValueError when their weights
  disagree. Float params give 0."""
  sizes: set[int] = set()

  def one(tree, key, axes):
    if f"{key}_scale" in tree and jnp.dtype(tree[key].dtype) == jnp.int8:
      sizes.add(group_size_of(tree[key], tree[f"{key}_scale"], axes))
    return {}
  _map_projections(params, one)
  if len(sizes) > 1:
    raise ValueError(f"these params mix int8 weights of quantization_group_size {sorted(sizes)}: one layout only")
  return sizes.pop() if sizes else 0


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
           num_contracting: int, mode: str, group_size: int = 0):
  """Creates the weight `name` in `module`: the float param as before for `none` (normal(0.02)), else (int8
  `name`, float32 `name_scale`), whose values come from `quantize_params` (init gives zeros and ones). The
  scale has the weight's output dims, or with `group_size` G its dims with the last contracting one / G (and
  the weight's logical axes, so it shards as the weight does)."""
  if mode == "none":
    init = nn.initializers.normal(stddev=0.02)
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, module.param_dtype)
  zeros = lambda key, s, dtype: jnp.zeros(s, dtype)
  wq = module.param(name, nn.with_logical_partitioning(zeros, axes), shape, jnp.int8)
  if group_size:
    axis = _group_axis(shape, range(num_contracting), group_size)
    scale_shape, scale_axes = shape[:axis] + (shape[axis] // group_size,) + shape[axis + 1:], axes
  else:
    scale_shape, scale_axes = shape[num_contracting:], axes[num_contracting:]
  scale = module.param(f"{name}_scale", nn.with_logical_partitioning(nn.initializers.ones, scale_axes),
                       scale_shape, jnp.float32)
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
  grouped = group_size_of(wq, scale, tuple(range(num_contracting))) > 0
  if mode == "int8_weights" and grouped:  # Wq * s formed in float32 first: no one scale factors out
    w = dequantize(wq, scale, tuple(range(num_contracting)))
    return jnp.einsum(equation, x, w.astype(dtype), precision=precision)
  if mode == "int8_weights":
    y = jnp.einsum(equation, x, wq.astype(dtype), precision=precision)
    return (y.astype(jnp.float32) * scale).astype(dtype)
  if grouped:
    raise ValueError("quantization=int8 (w8a8) needs per-channel weight scales: quantize_params regroups "
                     "per-group int8 weights for it")
  xq, x_scale = quantize_activations(x, num_contracting)
  return dequantize_output(int8_dot(equation, xq, wq), x_scale, scale, num_contracting, dtype)


def quantize_activations(x: jax.Array, num_contracting: int) -> tuple[jax.Array, jax.Array]:
  """Per-token symmetric int8 activations: (int8 xq, float32 scale with the contracted trailing dims kept as 1)."""
  xq, scale = quantize(x, tuple(range(x.ndim - num_contracting, x.ndim)))
  return xq, scale.reshape(scale.shape + (1,) * num_contracting)


def int8_dot(equation: str, xq: jax.Array, wq: jax.Array) -> jax.Array:
  """w8a8's contraction: int8 x int8 with int32 accumulation (exact: no rounding inside the dot)."""
  return jnp.einsum(equation, xq, wq, preferred_element_type=jnp.int32)


def dequantize_output(y_int32: jax.Array, x_scale: jax.Array, scale: jax.Array, num_contracting: int,
                      dtype: Any) -> jax.Array:
  """w8a8's rescale of the int32 dot output by the per-token scale (`quantize_activations`' second output,
  whose leading dims are the output's batch dims) and the per-output-channel weight scale, in `dtype`."""
  batch = x_scale.ndim - num_contracting
  x_scale = x_scale.reshape(x_scale.shape[:batch] + (1,) * (y_int32.ndim - batch))
  return (y_int32.astype(jnp.float32) * x_scale * scale).astype(dtype)
