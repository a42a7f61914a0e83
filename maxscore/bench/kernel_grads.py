"""Gradient parity of an attention kernel against the dense reference: a scalar loss over the real query
positions (callers ignore padded outputs) and its dq, dk and dv."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from layers.kernels import reference


def loss_and_grads_fn(attend, q_shape, layout, prefix_kv, window=None, softcap=None):
  """The jitted (q, k, v) -> (loss, (dq, dk, dv)) of sum(attend(...) * w) over real queries, w fixed random
  weights of `q_shape`."""
  real_BxT = (layout.segment_ids(include_prefix=prefix_kv is None) >= 0)[:, :, None, None]
  weight = jnp.asarray(np.random.default_rng(0).standard_normal(q_shape, np.float32))

  def loss(q, k, v):
    out = attend(q, k, v, layout, prefix_kv, window=window, softcap=softcap)
    return jnp.sum(jnp.where(real_BxT, out.astype(jnp.float32) * weight, 0.0))
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def loss_and_grads(attend, q, k, v, layout, prefix_kv, window=None, softcap=None):
  """(loss, (dq, dk, dv)) of loss_and_grads_fn at (q, k, v)."""
  return loss_and_grads_fn(attend, q.shape, layout, prefix_kv, window, softcap)(q, k, v)


def assert_gradients_match_reference(kernel_attend, q, k, v, layout, prefix_kv, options, window=None, softcap=None,
                                     atol=1e-5):
  """Loss, dq, dk and dv of `kernel_attend` equal reference.attend's within atol."""
  got = loss_and_grads(functools.partial(kernel_attend, options=options), q, k, v, layout, prefix_kv, window,
                       softcap)
  want = loss_and_grads(functools.partial(reference.attend, options=options), q, k, v, layout, prefix_kv, window,
                        softcap)
  np.testing.assert_allclose(float(got[0]), float(want[0]), atol=atol, rtol=1e-6, err_msg="loss")
  for name, g, w in zip(("dq", "dk", "dv"), got[1], want[1]):
    assert g.shape == w.shape and g.dtype == w.dtype, name
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol, rtol=0, err_msg=name)
