"""Invariants of the decoder itself: causality, scan stacking, kernels agree inside the model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.decoder import Decoder, init_params
from layers.kernels import SegmentLayout, get_kernel
from maxscore.config import load_config


@pytest.fixture(scope="module", params=["tiny-qwen3", "tiny-llama"])
def model_and_params(request):
  cfg = load_config([f"model_name={request.param}"]).model
  decoder = Decoder(cfg, get_kernel("reference"))
  params = nn.unbox(init_params(decoder, jax.random.PRNGKey(1)))
  params = jax.tree_util.tree_map(lambda x: x * 5 if x.ndim > 1 else x, params)  # far from uniform
  return cfg, decoder, params


def test_layers_are_stacked_for_scan(model_and_params):
  cfg, _, params = model_and_params
  for leaf in jax.tree_util.tree_leaves(params["layers"]):
    assert leaf.shape[0] == cfg.num_layers


def test_every_param_has_logical_axis_names():
  cfg = load_config(["model_name=tiny-llama"]).model
  boxed = init_params(Decoder(cfg, get_kernel("reference")), jax.random.PRNGKey(0))
  specs = nn.get_partition_spec(boxed)
  for path, spec in jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))[0]:
    assert all(name is not None for name in spec), path
  assert specs["layers"]["attn"]["q"] == jax.sharding.PartitionSpec("layers", "embed", "heads", "head_dim")


def test_causality_gradient_wrt_later_positions_is_zero(model_and_params):
  """Output at position 5 has zero gradient w.r.t. the embeddings of positions 6.. (nanodo-style)."""
  cfg, decoder, params = model_and_params
  t = 12
  tokens = jnp.arange(t)[None] % cfg.vocab_size
  positions = jnp.arange(t)[None]
  layout = SegmentLayout.causal(jnp.array([t]), t)
  x_BxTxD = decoder.apply({"params": params}, tokens, method=lambda m, tok: m.embed(tok))

  def out_at_5(x):
    h = decoder.apply({"params": params}, x, positions, layout,
                      method=lambda m, x, pos, lay: m.final_norm(m.run_layers(x, pos, lay)[0]))
    return h[0, 5].sum()
  jac = np.asarray(jax.grad(out_at_5)(x_BxTxD))
  assert np.all(jac[0, 6:] == 0)
  assert np.all(np.abs(jac[0, :6]).sum(-1) > 0)


def test_padding_does_not_change_real_tokens(model_and_params):
  cfg, decoder, params = model_and_params
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 20)), jnp.int32)
  positions = jnp.arange(20)[None]
  h_full, _ = decoder.apply({"params": params}, tokens[:, :13], positions[:, :13], SegmentLayout.causal(jnp.array([13]), 13))
  h_pad, _ = decoder.apply({"params": params}, tokens, positions, SegmentLayout.causal(jnp.array([13]), 20))
  np.testing.assert_allclose(h_full[0], h_pad[0, :13], atol=1e-5)


@pytest.mark.parametrize("kernel", ["shared_prefix"])
def test_kernels_agree_inside_the_model(model_and_params, kernel):
  cfg, _, params = model_and_params
  p, l, n = 9, 5, 4
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, p + n * l)), jnp.int32)
  layout = SegmentLayout(jnp.array([7, 9]), jnp.array([[5, 0, 3, 1], [2, 5, 5, 0]]), p, l, n)
  positions = jnp.concatenate([jnp.broadcast_to(jnp.arange(p), (2, p)),
                               jnp.array([[7], [9]]) + jnp.tile(jnp.arange(l), n)[None]], axis=1)
  outs = [Decoder(cfg, get_kernel(k)).apply({"params": params}, tokens, positions, layout)[0]
          for k in ("reference", kernel)]
  valid = np.asarray(layout.segment_ids()) >= 0
  np.testing.assert_allclose(np.asarray(outs[0])[valid], np.asarray(outs[1])[valid], atol=2e-5)
