"""Where the training state and batches live on the mesh (docs/ARCHITECTURE.md sections 8 and 12).

Decoder params take their NamedShardings from the logical-axis rules of layers/sharding.py (the
ones scoring uses); every other param (a score head, probes) is replicated. Optimizer-state leaves
that mirror a param (Adam's moments) take that param's sharding, the rest are replicated. A batch
is split on its leading axis over data x fsdp: every process computes the same global batch
indices and builds only the rows its own devices hold, so the batch does not depend on the process
count.
"""

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from layers import sharding as sharding_lib
from maxscore.config import MeshConfig
from maxscore.distributed import mesh as mesh_lib
from maxscore.errors import TrainError


def train_mesh(cfg: MeshConfig) -> Mesh:
  """The ("data", "fsdp", "tensor") mesh over every device of every process (one device: a 1x1x1 mesh)."""
  return mesh_lib.create_mesh(cfg)


def batch_shards(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch(batch_size: int, mesh: Mesh, grad_accum_steps: int = 1) -> None:
  """Refuses a global batch whose micro-batches data x fsdp does not divide (names the numbers)."""
  shards = batch_shards(mesh)
  if batch_size % grad_accum_steps or (batch_size // grad_accum_steps) % shards:
    raise TrainError(f"batch_size={batch_size} must split into grad_accum_steps={grad_accum_steps} micro-batches "
                     f"that data x fsdp = {mesh.shape['data']} x {mesh.shape['fsdp']} = {shards} divides "
                     f"(batch_size a multiple of {grad_accum_steps * shards})")


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(sharding_lib.BATCH_AXES))


def _keys(path) -> tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def like_params(tree: Any, params: Any, param_shardings: Any, mesh: Mesh) -> Any:
  """Shardings for `tree` (an optimizer state): a leaf whose dict-key path ends with a param's path and
  whose shape is that param's gets the param's sharding; every other leaf is replicated."""
  by_path = {}
  for (path, p), s in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(param_shardings)):
    by_path[_keys(path)] = (np.shape(p), s)

  def pick(path, leaf):
    keys = _keys(path)
    for start in range(len(keys)):
      hit = by_path.get(keys[start:])
      if hit is not None and hit[0] == np.shape(leaf):
        return hit[1]
    return replicated(mesh)
  return jax.tree_util.tree_map_with_path(pick, tree)


def state_shardings(state: Any, param_shardings: Any, mesh: Mesh) -> Any:
  """A TrainState of shardings: params as given, opt_state mirroring them, the counters replicated."""
  rep = replicated(mesh)
  return state.replace(params=param_shardings,
                       opt_state=like_params(state.opt_state, state.params, param_shardings, mesh),
                       step=rep, epoch=rep, index=rep, rng=rep)


def place(tree: Any, shardings: Any) -> Any:
  """Puts host values or local arrays on their shardings; each process fills only its own shards."""
  return jax.tree_util.tree_map(sharding_lib.put, tree, shardings)


def local_rows(batch_size: int, mesh: Mesh) -> np.ndarray:
  """The rows of a global batch that this process's devices hold, ascending; each process builds only these rows.
  They need not be one block: with fsdp across processes and data within, a process holds one row block per
  data index."""
  index = batch_sharding(mesh).addressable_devices_indices_map((batch_size,))
  return np.asarray(sorted({r for s in index.values() for r in range(*s[0].indices(batch_size))}))


def place_batch(local_batch: Any, batch_size: int, mesh: Mesh) -> Any:
  """The global batch from each process's own rows (`local_rows`, in that order), split on its leading axis over
  data x fsdp."""
  sharding = batch_sharding(mesh)
  if jax.process_count() == 1:
    return jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x), sharding), local_batch)
  position = {r: i for i, r in enumerate(local_rows(batch_size, mesh))}

  def one(x):
    x = np.asarray(x)
    shape = (batch_size, *x.shape[1:])
    shards = [jax.device_put(x[[position[r] for r in range(*index[0].indices(batch_size))]], device)
              for device, index in sharding.addressable_devices_indices_map(shape).items()]
    return jax.make_array_from_single_device_arrays(shape, sharding, shards)
  return jax.tree_util.tree_map(one, local_batch)


def check_restorable(stored: Any, target: Any, what: str) -> None:
  """Refuses a checkpoint whose stored shapes the target shardings cannot hold: a shape that differs from
  the one the run expects, or a dimension that the new mesh does not divide."""
  for (path, meta), want in zip(jax.tree_util.tree_leaves_with_path(stored), jax.tree_util.tree_leaves(target)):
    shape, name = tuple(getattr(meta, "shape", ())), "/".join(_keys(path)) or "value"
    if shape != tuple(want.shape):
      raise TrainError(f"{what}: {name} is stored with shape {shape}, this run expects {tuple(want.shape)}")
    sh = want.sharding
    if isinstance(sh, NamedSharding):
      for dim, axes in zip(shape, tuple(sh.spec) + (None,) * (len(shape) - len(sh.spec))):
        axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
        n = math.prod(sh.mesh.shape[a] for a in axes)
        if dim % n:
          mesh_desc = ", ".join(f"{k}={v}" for k, v in sh.mesh.shape.items())
          raise TrainError(f"{what}: {name} of stored shape {shape} cannot be split over the mesh ({mesh_desc}): "
                           f"dimension {dim} is not divisible by {' x '.join(axes)} = {n}; choose "
                           f"ici_/dcn_*_parallelism values that divide it")


def host_copy(tree: Any) -> Any:
  """The full value of every leaf on this host (numpy): arrays split across processes are gathered
  (dev evals and exports; checkpoints never gather). Leaves already whole here are left as they are."""
  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return x
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree_util.tree_map(one, tree)


def model_shardings(model, mesh: Mesh) -> Any:
  """The decoder params' NamedShardings for `model` (after checking that its dimensions divide the mesh)."""
  sharding_lib.check_divisible(model, mesh)
  return sharding_lib.model_param_shardings(model, mesh)
