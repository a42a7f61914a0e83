"""layers/quantization.py's arithmetic against its bounds: the weight round trip (per channel and per group), each
projection's error within its rounding bound (int8_weights and w8a8), and per-group int8_weights as the einsum of
the dequantized weight. The scorer and the models quantized: tests/test_quantization.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers import quantization as quant

MODES = ("int8_weights", "int8")


@pytest.mark.parametrize("shape,axes", [((64, 4, 16), (0,)), ((4, 16, 64), (0, 1)), ((3, 64, 2, 8), (1,))])
def test_round_trip_is_within_half_a_scale_step(shape, axes):
  """round(W / s) * s is within s / 2 of W for every weight, s = max|W| / 127 per output channel (scanned
  layers: per layer too); an all-zero channel comes back exactly."""
  w = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * np.linspace(0.01, 3, shape[-1])
  w[..., 0] = 0.0
  wq, scale = quant.quantize(jnp.asarray(w), axes)
  assert wq.dtype == jnp.int8 and scale.dtype == jnp.float32
  assert scale.shape == tuple(n for i, n in enumerate(shape) if i not in axes)
  back = np.asarray(quant.dequantize(wq, scale, axes))
  step = np.asarray(jnp.expand_dims(scale, axes))
  assert np.all(np.abs(back - w) <= step / 2 * (1 + 1e-6)), np.max(np.abs(back - w) / step)
  assert np.array_equal(back[..., 0], w[..., 0])
  assert int(np.abs(np.asarray(wq)).max()) == 127  # the largest weight of each channel maps to +-127


@pytest.mark.parametrize("shape,axes,group", [((64, 4, 16), (0,), 16), ((4, 16, 64), (0, 1), 8),
                                               ((3, 64, 2, 8), (1,), 32)])
def test_grouped_round_trip_is_within_half_of_each_groups_scale_step(shape, axes, group):
  """Per-group scales: one per output channel and per `group` consecutive weights along the last contracting
  axis (the scale keeps the weight's dims, that one divided by the group); round(W / s) * s is within s / 2 of
  each weight, each group's largest weight maps to +-127, an all-zero group comes back exactly, and no weight
  is further from its value than with one scale per channel."""
  w = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * np.linspace(0.01, 3, shape[-1])
  w[..., 0] = 0.0
  wq, scale = quant.quantize(jnp.asarray(w), axes, group)
  axis = axes[-1]
  assert scale.shape == shape[:axis] + (shape[axis] // group,) + shape[axis + 1:]
  assert quant.group_size_of(wq, scale, axes) == group and quant.group_size_of(*quant.quantize(w, axes), axes) == 0
  back = np.asarray(quant.dequantize(wq, scale, axes))
  step = np.repeat(np.asarray(scale), group, axis=axis)
  assert np.all(np.abs(back - w) <= step / 2 * (1 + 1e-6)), np.max(np.abs(back - w) / step)
  assert np.array_equal(back[..., 0], w[..., 0])
  groups = np.abs(np.asarray(wq)).reshape(shape[:axis] + (shape[axis] // group, group) + shape[axis + 1:])
  assert np.all(groups.max(axis=axis + 1)[..., 1:] == 127)
  per_channel = np.asarray(quant.dequantize(*quant.quantize(w, axes), axes))
  assert np.abs(back - w).max() <= np.abs(per_channel - w).max()
  with pytest.raises(ValueError, match=r"quantization_group_size=5 must divide the contracting dim"):
    quant.quantize(jnp.asarray(w), axes, 5)


# Each projection's einsum (the weight's contracting dims first) with x [B, T, contracting...].
EINSUMS = [("BTD,DNH->BTNH", (2, 5, 64), (64, 4, 16), 1), ("BTNH,NHD->BTD", (2, 5, 4, 16), (4, 16, 64), 2),
           ("BTD,DF->BTF", (2, 5, 64), (64, 128), 1), ("...D,DV->...V", (3, 64), (64, 520), 1)]


@pytest.mark.parametrize("equation,x_shape,w_shape,nc", EINSUMS, ids=[e[0] for e in EINSUMS])
@pytest.mark.parametrize("mode", MODES)
def test_each_projection_is_within_its_rounding_bound(equation, x_shape, w_shape, nc, mode):
  """For output channel j of y = x . W, with Wq s_j = W + E (|E| <= s_j / 2) and, in int8, xq s_x = x + e
  (|e| <= s_x / 2 per token):
      |xq s_x . Wq s_j - x . W| = |e . (W + E) + x . E| <= s_x / 2 * ||Wq_j s_j||_1 + s_j / 2 * ||x||_1
  (int8_weights: the first term is 0). Held exactly (float32 rounding aside) on random weights and tokens."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
  w = jnp.asarray(rng.standard_normal(w_shape) * 0.3, jnp.float32)
  contract = tuple(range(nc))
  wq, scale = quant.quantize(w, contract)
  got = quant.einsum(equation, x, (wq, scale), nc, mode, jnp.float32, jax.lax.Precision.HIGHEST)
  want = jnp.einsum(equation, x, w, precision=jax.lax.Precision.HIGHEST)
  x_axes = tuple(range(x.ndim - nc, x.ndim))
  x_l1 = jnp.sum(jnp.abs(x), axis=x_axes)  # [batch...]
  out_w = w.ndim - nc
  expand = lambda a: a.reshape(a.shape + (1,) * out_w)
  bound = expand(x_l1) * scale / 2
  if mode == "int8":
    s_x = jnp.max(jnp.abs(x), axis=x_axes) / 127
    w_l1 = jnp.sum(jnp.abs(quant.dequantize(wq, scale, contract)), axis=contract)  # [output...]
    bound = bound + expand(s_x) / 2 * w_l1
  err = np.abs(np.asarray(got - want))
  assert np.all(err <= np.asarray(bound) * (1 + 1e-4) + 1e-5), np.max(err / np.asarray(bound))
  assert err.max() > 0  # it did quantize


@pytest.mark.parametrize("equation,x_shape,w_shape,nc", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_grouped_int8_weights_projection_is_the_einsum_of_its_dequantized_weight(equation, x_shape, w_shape, nc):
  """int8_weights with per-group scales forms Wq * s in float32 and runs the float einsum: exactly the einsum of
  the dequantized weight, within sum_i |x_i| s_g(i),j / 2 of the float weight's. w8a8 refuses per-group
  scales (one int32 dot per channel leaves one place for a weight scale)."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
  w = jnp.asarray(rng.standard_normal(w_shape) * 0.3, jnp.float32)
  contract, hi = tuple(range(nc)), jax.lax.Precision.HIGHEST
  wq, scale = quant.quantize(w, contract, 8)
  got = quant.einsum(equation, x, (wq, scale), nc, "int8_weights", jnp.float32, hi)
  np.testing.assert_array_equal(got, jnp.einsum(equation, x, quant.dequantize(wq, scale, contract), precision=hi))
  half_steps = jnp.repeat(scale, 8, axis=nc - 1) / 2
  bound = jnp.einsum(equation, jnp.abs(x), half_steps, precision=hi)
  err = np.abs(np.asarray(got - jnp.einsum(equation, x, w, precision=hi)))
  assert np.all(err <= np.asarray(bound) * (1 + 1e-4) + 1e-5) and err.max() > 0
  with pytest.raises(ValueError, match="per-channel weight scales"):
    quant.einsum(equation, x, (wq, scale), nc, "int8", jnp.float32, hi)
