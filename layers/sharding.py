"""Logical axis names -> mesh axes: the one partitioning table (docs/ARCHITECTURE.md section 8).

Parameters carry logical names (`nn.with_logical_partitioning` in layers/*.py) and
activations are constrained with `nn.with_logical_constraint`; `RULES` maps both onto the
mesh axes ("data", "fsdp", "tensor"). Attention kernels run per shard inside `shard_map`
(batch over data/fsdp, heads over tensor), so Pallas kernels never see a global array.
With no mesh, or a one-device mesh, every helper here is a no-op.
"""

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterator, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from layers.config import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical name -> mesh axis (or axes, or None = replicated). The only partitioning table.
RULES: tuple[tuple[str, Any], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
)

# logical parameter axis -> the ModelConfig field that sizes it (for check_divisible).
_DIMS = {"vocab": "vocab_size", "embed": "hidden_size", "heads": "num_heads", "kv_heads": "num_kv_heads",
         "mlp": "mlp_dim", "head_dim": "head_dim", "layers": "num_layers"}


class ShardingError(ValueError):
  """A model dimension does not divide the mesh axis it is sharded over."""


def is_trivial(mesh: Optional[Mesh]) -> bool:
  return mesh is None or mesh.size == 1


def _mesh_axes(rule: Any) -> tuple[str, ...]:
  if rule is None:
    return ()
  return (rule,) if isinstance(rule, str) else tuple(rule)


def check_divisible(model: ModelConfig, mesh: Optional[Mesh], rules=RULES) -> None:
  """Raises ShardingError naming the model dimension and mesh axis that do not divide; call before compiling."""
  if is_trivial(mesh):
    return
  problems = []
  for logical_name, rule in rules:
    field = _DIMS.get(logical_name)
    axes = [a for a in _mesh_axes(rule) if mesh.shape.get(a, 1) > 1]
    if field is None or not axes:
      continue
    size, shards = getattr(model, field), math.prod(mesh.shape[a] for a in axes)
    if size % shards:
      where = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
      problems.append(f"{field}={size} is not divisible by {where} (logical axis {logical_name!r})")
  if problems:
    raise ShardingError("model does not fit the mesh " + _describe(mesh) + ": " + "; ".join(problems)
                        + "; choose ici_/dcn_*_parallelism values that divide these dimensions")


def _describe(mesh: Mesh) -> str:
  return "(" + ", ".join(f"{k}={v}" for k, v in mesh.shape.items()) + ")"


def param_shardings(boxed_params: Any, mesh: Mesh, rules=RULES) -> Any:
  """NamedShardings for boxed (nn.Partitioned) params, concrete or from jax.eval_shape."""
  specs = nn.get_partition_spec(boxed_params)
  specs = jax.tree_util.tree_map(lambda s: P() if s is None else s, specs,
                                 is_leaf=lambda x: x is None or isinstance(x, P))
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def model_param_shardings(model: ModelConfig, mesh: Mesh, rules=RULES, quantization: str = "none",
                          quantization_group: int = 0) -> Any:
  """NamedShardings matching the unboxed Decoder params of `model` (quantized: int8 weights and their scales,
  per channel or per group of `quantization_group`, layers/quantization.py), without allocating them."""
  from layers.decoder import Decoder, init_params  # pylint: disable=g-import-not-at-top  (decoder imports kernels)
  from layers.kernels import get_kernel
  layout = "none" if quantization == "none" else "int8_weights"  # both int8 modes hold the same arrays
  decoder = Decoder(model, get_kernel("reference"), quantization=layout, quantization_group=quantization_group)
  boxed = jax.eval_shape(lambda: init_params(decoder, jax.random.PRNGKey(0)))
  return param_shardings(boxed, mesh, rules)


def batch_axes(batch: int, mesh: Optional[Mesh]) -> Optional[tuple[str, ...]]:
  """The batch-parallel mesh axes a batch of `batch` rows can be split over (None = replicate).

  Takes "data" then "fsdp" while the row count still divides, so prefill and extend
  (one row) stay replicated and their work is split by heads only.
  """
  if is_trivial(mesh):
    return None
  axes, shards = [], 1
  for a in BATCH_AXES:
    if mesh.shape[a] > 1 and batch % (shards * mesh.shape[a]) == 0:
      axes.append(a)
      shards *= mesh.shape[a]
  return tuple(axes) or None


def rules_for_batch(batch: int, mesh: Optional[Mesh], rules=RULES) -> tuple[tuple[str, Any], ...]:
  """RULES with activation_batch narrowed to the axes that divide `batch` (a pure function of the shape)."""
  return tuple((name, batch_axes(batch, mesh) if name == "activation_batch" else rule) for name, rule in rules)


@contextlib.contextmanager
def activate(mesh: Optional[Mesh], rules=RULES) -> Iterator[None]:
  """Makes `mesh` and the logical rules current, so nn.with_logical_constraint applies while tracing."""
  if is_trivial(mesh):
    yield
    return
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def put(x: Any, sharding: NamedSharding) -> jax.Array:
  """Places a host value (numpy, scalar or a local jax.Array with the same value on every process) on `sharding`.

  Works when `sharding` spans several processes: each one fills only its own shards.
  """
  if isinstance(x, jax.Array) and x.sharding == sharding:
    return x
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return jax.jit(lambda a: a, out_shardings=sharding)(x)  # a global array: reshard on device
  value = np.asarray(x)
  return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])


def abstract_put(x: Any, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
  """`put` for programs that are only compiled: the value's shape and dtype, laid out on `sharding`.

  Works for devices that cannot hold data (a TPU topology described on a CPU host).
  """
  dtype = x.dtype if hasattr(x, "dtype") else np.result_type(x)
  return jax.ShapeDtypeStruct(np.shape(x), dtype, sharding=sharding)


def compile_deviceless(lowered: Any) -> Any:
  """`lowered.compile()` for devices that cannot run it (a TPU or GPU topology described on a CPU host), kept
  out of JAX's persistent compilation cache: such an executable is written there but cannot be read back (its
  deserialization needs a client with devices: "PjRtCompiler must be constructed with a Client"), so a later
  compile of the same program would warn instead of reusing it. No write, so later reads simply miss; the
  setting is put back afterwards, and programs that run keep the cache."""
  name = "jax_persistent_cache_min_compile_time_secs"
  saved = getattr(jax.config, name)
  jax.config.update(name, float("inf"))
  try:
    return lowered.compile()
  finally:
    jax.config.update(name, saved)


def place_params(params: Any, model: ModelConfig, mesh: Optional[Mesh], quantization: str = "none",
                 quantization_group: int = 0) -> Any:
  """Moves unboxed params onto their NamedShardings (a no-op without a mesh)."""
  if is_trivial(mesh):
    return params
  return jax.tree_util.tree_map(put, params, model_param_shardings(model, mesh, quantization=quantization,
                                                                   quantization_group=quantization_group))


def kv_sharding(mesh: Mesh) -> NamedSharding:
  """Stacked per-layer K/V [layers, B, P, kv_heads, head_dim]: kv heads over tensor, as attention reads them."""
  return NamedSharding(mesh, P(None, None, None, "tensor", None))


def place_kv(state: Any, mesh: Optional[Mesh], put_fn: Callable = put) -> Any:
  """A prefix state (a struct with `k` and `v` [layers, B, P, K, H]) with its K/V on kv_sharding(mesh).

  Real prefill outputs already are; warmup's placeholders are not, and an executable compiled
  for one layout refuses the other.
  """
  if is_trivial(mesh):
    return state
  kv = kv_sharding(mesh)
  return state.replace(k=put_fn(state.k, kv), v=put_fn(state.v, kv))


def _on(x: Any, mesh: Mesh) -> bool:
  """True for an array already laid out over exactly the mesh's devices (e.g. a prefill's K/V)."""
  return isinstance(x, jax.Array) and x.sharding.device_set == set(mesh.devices.flat)


def place_inputs(args: Sequence[Any], mesh: Optional[Mesh], batch_argnums: Sequence[int] = (),
                 put_fn: Callable = put) -> tuple[list, int]:
  """Puts a jitted function's array arguments on `mesh`; returns them and the batch size.

  Leaves of `batch_argnums` arguments are split on their leading (batch) dimension over the
  batch axes that divide it; other leaves are replicated. Arrays already laid out over the
  mesh (a prefill's K/V) are left alone. A no-op without a mesh. `put_fn`: `put`, or
  `abstract_put` to describe the arguments for a compile-only program instead of placing them.
  """
  firsts = [jax.tree_util.tree_leaves(args[i]) for i in batch_argnums]
  batch = next((np.shape(leaves[0])[0] for leaves in firsts if leaves), 1)
  if is_trivial(mesh):
    return list(args), batch
  shard, rep = NamedSharding(mesh, P(batch_axes(batch, mesh))), replicated(mesh)
  placed = [jax.tree_util.tree_map(
      lambda x, t=(shard if i in batch_argnums else rep): x if _on(x, mesh) else put_fn(x, t), a)
      for i, a in enumerate(args)]
  return placed, batch


@dataclasses.dataclass(frozen=True)
class ShardedKernel:
  """An attention kernel run per shard under shard_map: batch over data/fsdp, heads over tensor.

  GQA stays local: with num_heads and num_kv_heads both divisible by tensor, shard i holds
  query heads [i*N/t, (i+1)*N/t) and exactly the kv heads they read.
  """
  kernel: Callable
  mesh: Mesh

  def __call__(self, q, k, v, layout, prefix_kv=None, window=None, softcap=None):
    b = batch_axes(q.shape[0], self.mesh)
    heads_spec = P(b, None, "tensor", None)
    layout_spec = layout.replace(prefix_valid_B=P(b), slot_valid_BxN=P(b, None))
    args, specs = [q, k, v, layout], [heads_spec, heads_spec, heads_spec, layout_spec]
    if prefix_kv is not None:
      pb = b if prefix_kv.k.shape[0] == q.shape[0] else None  # a [1, P, K, H] prefix is broadcast to every row
      args.append(prefix_kv)
      specs.append(type(prefix_kv)(P(pb, None, "tensor", None), P(pb, None, "tensor", None)))
    kernel = self.kernel

    def local(q, k, v, layout, prefix_kv=None):
      return kernel(q, k, v, layout, prefix_kv, window=window, softcap=softcap)
    return jax.shard_map(local, mesh=self.mesh, in_specs=tuple(specs), out_specs=heads_spec,
                         check_vma=False)(*args)


def shard_kernel(kernel: Callable, mesh: Optional[Mesh]) -> Callable:
  """`kernel` itself without a mesh, else its ShardedKernel."""
  return kernel if is_trivial(mesh) else ShardedKernel(kernel, mesh)
