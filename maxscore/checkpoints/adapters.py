"""LoRA adapters of the decoder: which params train, and the two exports eval can load.

The adapters themselves are layers' (layers/lora.py: `<weight>_lora_a` / `<weight>_lora_b` beside
each targeted projection, B initialised to zero so step 0 is the base model exactly). Here:

- `adapt` gives the Decoder with adapters; `init_adapters` their initial values; `add_adapters` /
  `split_adapters` join and separate them from a base tree;
- `trainable_mask` is True on adapter leaves only: the optimizer freezes the rest;
- `merge` folds W + alpha / rank * A @ B into a plain base tree (an ordinary checkpoint);
- `save_adapters` writes the adapters beside a base checkpoint (and the base's digest);
  `load_adapters_for` reads them back for their base; `load_checkpoint` reads a checkpoint once (its metadata and
  params) with, given their directory, the adapters trained on it: what maxscore/scoring/'s `Scorer.from_checkpoint`
  and `loading.load_adapted` (base + adapters as one Scorer, merged on load) read (scripts/export_hf_checkpoint.py
  merges them the same way into a transformers directory).

    <adapters_dir>/adapters/   Orbax tree of the adapter params only
    <adapters_dir>/lora.json   {"format_version", "rank", "alpha", "targets", "model",
                                "base_params_sha256", "adapters_sha256",
                                "base_quantization" (only for QLoRA: int8_weights),
                                "base_quantization_group_size" (only for a QLoRA base quantized per group)}
"""

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from layers import quantization as quant
from layers import sharding
from layers.decoder import Decoder, init_params
from layers.kernels import get_kernel
from layers.lora import TARGETS, LoraConfig
from maxscore.checkpoints import storage
from maxscore.config import model_config_from_dict, model_config_to_dict
from maxscore.files import identity, safety

__all__ = ["TARGETS", "Adapters", "LoadedCheckpoint", "LoraConfig", "LoraError", "adapt", "add_adapters",
           "adapter_shardings", "init_adapters", "is_adapter", "load_adapters", "load_adapters_for", "load_checkpoint",
           "lora_config", "merge", "save_adapters", "save_merged", "split_adapters", "trainable_mask"]

FORMAT_VERSION = 1
METADATA_FILE = "lora.json"
ADAPTER_SUFFIXES = ("_lora_a", "_lora_b")


class LoraError(ValueError):
  """Adapters that do not fit their base, or a bad adapter directory."""


def lora_config(rank: int, alpha: float, targets: Sequence[str] = TARGETS) -> Optional[LoraConfig]:
  """The validated LoraConfig of `lora_rank` / `lora_alpha` / `lora_targets`; None for rank 0 (no adapters)."""
  if rank < 0:
    raise LoraError(f"lora_rank={rank} must be >= 0 (0 = full fine-tuning, no adapters)")
  if rank == 0:
    return None
  try:
    return LoraConfig(rank, alpha, tuple(targets)).validate()
  except ValueError as e:
    raise LoraError(str(e)) from None


def adapt(decoder: Decoder, lora: Optional[LoraConfig]) -> Decoder:
  """`decoder` with adapters on the targets of `lora` (None: the decoder unchanged)."""
  return decoder if lora is None else decoder.clone(lora=lora)


def is_adapter(path: Sequence[Any]) -> bool:
  """True for a param path (keys or tree_util path entries) that names an adapter leaf."""
  last = path[-1] if path else ""
  return str(getattr(last, "key", last)).endswith(ADAPTER_SUFFIXES)


def trainable_mask(params: Any) -> Any:
  """A bool pytree like `params`: True on adapter leaves only (the base stays frozen)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: is_adapter(path), params)


def split_adapters(params: Any) -> tuple[dict, dict]:
  """(base params, adapter params) of an adapted params tree, both nested dicts."""
  flat = traverse_util.flatten_dict(nn.unbox(params))
  base = {k: v for k, v in flat.items() if not is_adapter(k)}
  adapters = {k: v for k, v in flat.items() if is_adapter(k)}
  return traverse_util.unflatten_dict(base), traverse_util.unflatten_dict(adapters)


def add_adapters(base_params: Any, adapters: Any) -> dict:
  """One params tree holding the base params and the adapters (which must not overlap)."""
  flat = traverse_util.flatten_dict(nn.unbox(base_params))
  extra = traverse_util.flatten_dict(nn.unbox(adapters))
  clash = sorted("/".join(k) for k in set(flat) & set(extra))
  if clash:
    raise LoraError(f"the base params already hold adapters ({', '.join(clash[:3])}); merge or split them first")
  return traverse_util.unflatten_dict({**flat, **extra})


def _abstract_adapted(model, lora: LoraConfig, dtype: Any = jnp.float32) -> Any:
  """Boxed ShapeDtypeStructs of the adapted Decoder's params (nothing allocated)."""
  decoder = adapt(Decoder(model, get_kernel("reference"), param_dtype=dtype), lora)
  return jax.eval_shape(lambda: init_params(decoder, jax.random.PRNGKey(0)))


def init_adapters(model, lora: LoraConfig, rng: jax.Array, dtype: Any = jnp.float32) -> dict:
  """Initial adapter params (A random, B zero) for `model`, in `dtype`; the base is not materialised."""
  decoder = adapt(Decoder(model, get_kernel("reference"), param_dtype=dtype), lora)
  return jax.jit(lambda key: split_adapters(init_params(decoder, key))[1])(rng)


def adapter_shardings(model, lora: LoraConfig, mesh: jax.sharding.Mesh, rules=sharding.RULES) -> dict:
  """NamedShardings of the adapter params on `mesh`, from the logical axes they share with their weights."""
  abstract = _abstract_adapted(model, lora)
  return split_adapters(sharding.param_shardings(abstract, mesh, rules))[1]


def merge(params: Any, lora: LoraConfig) -> dict:
  """The base tree with every adapted weight replaced by W + alpha / rank * A @ B (float32 sums, cast
  back to W's dtype); what `storage.save_checkpoint` writes as an ordinary checkpoint.

  A QLoRA base (int8 weights and their scales, layers/quantization.py) is dequantized first: every int8 weight,
  adapted or not, becomes the float32 Wq * scale the adapters were trained against, so the merged model is
  float and computes what the quantized base plus adapters computed, up to float rounding."""
  base, adapters = split_adapters(params)
  base = quant.dequantize_params(base)
  flat, flat_adapters = traverse_util.flatten_dict(base), traverse_util.flatten_dict(adapters)
  for key_a in [k for k in flat_adapters if k[-1].endswith("_lora_a")]:
    key_w = key_a[:-1] + (key_a[-1][:-len("_lora_a")],)
    key_b = key_w[:-1] + (key_w[-1] + "_lora_b",)
    if key_w not in flat or key_b not in flat_adapters:
      raise LoraError(f"adapter {'/'.join(key_a)} has no weight {'/'.join(key_w)} or no {key_b[-1]} beside it")
    flat[key_w] = _merged(flat[key_w], flat_adapters[key_a], flat_adapters[key_b], lora.scale, "/".join(key_w))
  return traverse_util.unflatten_dict(flat)


def _merged(w, a, b, scale: float, name: str) -> jax.Array:
  """W + scale * A @ B for stacked layers: W [L, *c, *m], A [L, *c, r], B [L, r, *m]."""
  layers, rank = a.shape[0], a.shape[-1]
  if tuple(w.shape) != (layers,) + tuple(a.shape[1:-1]) + tuple(b.shape[2:]) or b.shape[:2] != (layers, rank):
    raise LoraError(f"{name}: adapters {tuple(a.shape)} x {tuple(b.shape)} do not fit the weight {tuple(w.shape)}")
  a_LxCxR = jnp.reshape(jnp.asarray(a, jnp.float32), (layers, -1, rank))
  b_LxRxM = jnp.reshape(jnp.asarray(b, jnp.float32), (layers, rank, -1))
  delta = jnp.einsum("LCR,LRM->LCM", a_LxCxR, b_LxRxM, precision=jax.lax.Precision.HIGHEST)
  return (jnp.asarray(w, jnp.float32) + scale * delta.reshape(w.shape)).astype(w.dtype)


def save_merged(directory: os.PathLike, params: Any, lora: LoraConfig, model, tokenizer_files=(),
                overwrite: bool = False, inputs=()) -> pathlib.Path:
  """Writes `merge(params)` as an ordinary checkpoint (storage.save_checkpoint)."""
  return storage.save_checkpoint(directory, merge(params, lora), model, tokenizer_files, overwrite, inputs)


def _check_adapters(adapters: Any, model, lora: LoraConfig, where: str) -> None:
  """Raises LoraError naming each missing, unexpected or mis-shaped adapter for (model, lora)."""
  want = {"/".join(k): v.shape for k, v in traverse_util.flatten_dict(
      split_adapters(_abstract_adapted(model, lora))[1]).items()}
  got = {"/".join(k): tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(nn.unbox(adapters)).items()}
  problems = [f"missing {k}" for k in sorted(set(want) - set(got))]
  problems += [f"unexpected {k}" for k in sorted(set(got) - set(want))]
  problems += [f"{k} has shape {got[k]}, rank {lora.rank} needs {tuple(want[k])}"
               for k in sorted(set(want) & set(got)) if tuple(got[k]) != tuple(want[k])]
  if problems:
    raise LoraError(f"{where} do not fit the model and lora settings: " + "; ".join(problems[:6]))


def save_adapters(directory: os.PathLike, params: Any, lora: LoraConfig, base_checkpoint: os.PathLike,
                  overwrite: bool = False, base_quantization: str = "none", base_quantization_group: int = 0,
                  **owner_info: Any) -> pathlib.Path:
  """Writes the adapters of `params` beside the base checkpoint they were trained on (its digest kept).
  `base_quantization` is the quantization the base was trained under (QLoRA: int8_weights), kept so that
  `loading.load_adapted` merges the adapters into the same dequantized weights they were trained against (with the
  group size of its per-group scales, `base_quantization_group`, when it had them).
  `owner_info` goes into the directory's ownership marker (a trainer's workdir: its rerun may replace it)."""
  model, _ = storage.read_metadata(base_checkpoint)
  base_digest = storage.params_digest(base_checkpoint)
  adapters = jax.device_get(split_adapters(params)[1])
  _check_adapters(adapters, model, lora, "adapters")
  meta = {"format_version": FORMAT_VERSION, "rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets),
          "model": model_config_to_dict(model), "base_params_sha256": base_digest,
          "adapters_sha256": identity.tree_digest(adapters)}
  if quant.check(base_quantization) != "none":  # absent: a float base (adapter directories written before QLoRA)
    meta["base_quantization"] = base_quantization
    if base_quantization_group:
      meta["base_quantization_group_size"] = base_quantization_group
  with safety.replace_dir(directory, "lora_adapters", overwrite, (base_checkpoint,), "adapter directory",
                          **owner_info) as tmp:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp / "adapters", adapters)
    checkpointer.wait_until_finished()
    (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
  return safety.resolve(directory)


def check_adapter_dir(directory: os.PathLike) -> pathlib.Path:
  """The path of `directory`'s adapter metadata file; LoraError naming what `directory` is instead (missing, a
  checkpoint, something else) when it has none."""
  directory = pathlib.Path(directory)
  meta_path = directory / METADATA_FILE
  if not directory.is_dir():
    raise LoraError(f"{directory} does not exist or is not a directory (LoRA adapters: train_reranker.py "
                    f"--adapters_dir writes them)")
  if not meta_path.is_file():
    if (directory / storage.METADATA_FILE).is_file():  # a checkpoint, e.g. a trainer's merged export
      raise LoraError(f"{directory} is a checkpoint (it has {storage.METADATA_FILE}), not LoRA adapters "
                      f"({METADATA_FILE} is missing); a merged export is read as --checkpoint_dir={directory} "
                      f"without --adapters_dir")
    raise LoraError(f"{directory} is not a LoRA adapter directory: {METADATA_FILE} is missing (train_reranker.py "
                    f"--adapters_dir writes one)")
  return meta_path


def load_adapters(directory: os.PathLike) -> tuple[dict, LoraConfig, dict]:
  """(adapter params as host arrays, their LoraConfig, the metadata) from `save_adapters`' directory."""
  directory = pathlib.Path(directory)
  meta_path = check_adapter_dir(directory)
  try:
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    lora = LoraConfig(int(meta["rank"]), float(meta["alpha"]), tuple(meta["targets"])).validate()
    model = model_config_from_dict(meta["model"], where=str(meta_path))
    quant.refuse_qlora(meta.setdefault("base_quantization", "none"))
    group = meta.setdefault("base_quantization_group_size", 0)
    if not isinstance(group, int) or isinstance(group, bool) or group < 0:
      raise ValueError(f"base_quantization_group_size={group!r} is not a non-negative integer")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise LoraError(f"{meta_path} is corrupt: {' '.join(str(e).split())}") from None
  try:  # Orbax refuses a relative path (eval_rerank.py --adapters_dir=out/x): it is given the absolute one
    adapters = jax.device_get(ocp.StandardCheckpointer().restore(safety.resolve(directory) / "adapters"))
  except Exception as e:  # orbax raises several types for unreadable files
    raise LoraError(f"cannot restore {directory / 'adapters'}: {type(e).__name__}: {str(e)[:300]}") from None
  _check_adapters(adapters, model, lora, f"adapters in {directory}")
  if identity.tree_digest(adapters) != meta.get("adapters_sha256"):
    raise LoraError(f"{directory / 'adapters'} is not what was written with {meta_path} (digest differs)")
  return adapters, lora, meta


def load_adapters_for(checkpoint_dir: os.PathLike, adapters_dir: os.PathLike) -> tuple[dict, LoraConfig, dict]:
  """`load_adapters(adapters_dir)`, refusing adapters trained on another base than `checkpoint_dir` (their
  stored base digest differs)."""
  adapters, lora, meta = load_adapters(adapters_dir)
  check_base(meta, adapters_dir, checkpoint_dir, storage.params_digest(checkpoint_dir))
  return adapters, lora, meta


def check_base(meta: dict, adapters_dir: os.PathLike, checkpoint_dir: os.PathLike, base_digest: str) -> None:
  """Raises LoraError unless the adapters' lora.json `meta` names `base_digest` as the base they trained on."""
  if base_digest != meta["base_params_sha256"]:
    raise LoraError(f"adapters in {adapters_dir} were trained on base params {meta['base_params_sha256']}, but "
                    f"{checkpoint_dir} holds {base_digest}")


@dataclasses.dataclass(frozen=True)
class Adapters:
  """LoRA adapters read for their base: the adapter params (host arrays), their LoraConfig, and lora.json
  (`load_adapters`: base_quantization and base_quantization_group_size always present)."""
  params: dict
  lora: LoraConfig
  meta: dict
  directory: str  # as given

  @property
  def info(self) -> dict[str, Any]:
    """Their directory and settings, as a scorer that merged them reports them (Scorer.adapters, eval outputs)."""
    return {"dir": self.directory, "rank": self.lora.rank, "alpha": self.lora.alpha,
            "targets": list(self.lora.targets), "base_quantization": self.meta["base_quantization"]}


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
  """A checkpoint as `load_checkpoint` read it: its metadata, its params, and the adapters trained on it (or None)."""
  metadata: storage.CheckpointMetadata
  params: Any
  adapters: Optional[Adapters] = None


Shardings = Union[Any, Callable[[storage.CheckpointMetadata, Optional[Adapters]], Any]]


def load_checkpoint(checkpoint_dir: os.PathLike, adapters_dir: Optional[os.PathLike] = None,
                    shardings: Shardings = None) -> LoadedCheckpoint:
  """A checkpoint read once: its maxscore.json (checked against its files), its params and, given `adapters_dir`,
  the LoRA adapters trained on it, refused when they were trained on another base (their stored base digest
  differs from the checkpoint's, as in `load_adapters_for`). The adapters are read first.

  `shardings`: where the params are restored to: None = this process's first device, a pytree of shardings
  matching the stored params, or a function of (metadata, adapters) that returns either, called before any
  parameter is read (where a scorer places them follows from the config the metadata gives)."""
  adapters = None
  if adapters_dir is not None:
    weights, lora, meta = load_adapters(adapters_dir)
    adapters = Adapters(weights, lora, meta, str(adapters_dir))
  metadata = storage.read_checkpoint_metadata(checkpoint_dir)
  if adapters is not None:
    check_base(adapters.meta, adapters_dir, checkpoint_dir, metadata.digest)
  if callable(shardings):
    shardings = shardings(metadata, adapters)
  return LoadedCheckpoint(metadata, storage.restore_params(metadata, shardings), adapters)
