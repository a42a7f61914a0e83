"""Self-describing Orbax checkpoints: params + the model config (+ the tokenizer) in one directory.

    <dir>/params/          Orbax StandardCheckpointer tree (the Decoder's unboxed params)
    <dir>/maxscore.json    {"format_version", "model": ModelConfig fields, "tokenizer": relative path | null,
                            "params_sha256": digest of the parameter arrays, "params_files": {path: size},
                            "quantization": "int8" only when the params hold int8 weights and their scales}
    <dir>/tokenizer/       copy of the tokenizer file(s), when the source had one
    <dir>/.maxscore-owned  the marker that lets --overwrite replace the directory (maxscore/files)

A checkpoint is written into a temporary directory and renamed into place, so a killed
conversion leaves no half-written checkpoint and never the old one half-deleted.

Restore checks every parameter's shape against the model config before reading data, and
reads each array straight into its target sharding when shardings are given.
"""

import dataclasses
import json
import os
import pathlib
import shutil
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from layers import quantization as quant
from layers.config import ModelConfig
from layers.decoder import Decoder, init_params
from layers.kernels import get_kernel
from maxscore.config import model_config_from_dict, model_config_to_dict
from maxscore.files import identity, safety

FORMAT_VERSION = 1
METADATA_FILE = "maxscore.json"


class CheckpointError(ValueError):
  """A checkpoint is missing, corrupt, or does not match its model config."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """What a checkpoint directory holds, restored."""
  params: Any
  model: ModelConfig
  tokenizer_path: Optional[pathlib.Path]
  directory: pathlib.Path
  digest: str = ""  # params_sha256: digest of the parameter arrays (maxscore/files/identity.py)


@dataclasses.dataclass(frozen=True)
class CheckpointMetadata:
  """A checkpoint's maxscore.json, read once and checked against the files beside it: all that restoring its params,
  and choosing where they go, needs to know first."""
  directory: pathlib.Path  # resolved
  model: ModelConfig
  tokenizer_path: Optional[pathlib.Path]
  quantization: str  # what the params hold: "none" or "int8" (stored_quantization)
  quantization_group_size: int  # the int8 scales' group size, 0 per output channel (stored_group_size)
  digest: str  # params_sha256, the stored params' file sizes checked against their manifest (params_digest)


def abstract_params(model: ModelConfig, dtype: Any = jnp.float32, quantization: str = "none",
                    quantization_group: int = 0) -> Any:
  """ShapeDtypeStructs of the (unboxed) params for `model`, without allocating them (quantized: int8 weights
  and their float32 scales, per channel or per group of `quantization_group`, layers/quantization.py)."""
  layout = "none" if quantization == "none" else "int8_weights"  # both int8 modes store the same arrays
  decoder = Decoder(model, get_kernel("reference"), param_dtype=dtype, quantization=layout,
                    quantization_group=quantization_group)
  boxed = jax.eval_shape(lambda: init_params(decoder, jax.random.PRNGKey(0)))
  return nn.unbox(boxed)


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in path)


def _flatten(tree) -> dict[str, Any]:
  return {_path_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_params(params: Any, model: ModelConfig, where: str = "params") -> None:
  """Raises CheckpointError naming each missing, unexpected or mis-shaped parameter. Params that hold int8
  weights are checked against the quantized layout (each weight with its `_scale`)."""
  quantization = "int8" if quant.holds_int8(params) else "none"
  try:
    group = quant.params_group_size(params)
  except ValueError as e:
    raise CheckpointError(f"{where}: {e}") from None
  want, got = _flatten(abstract_params(model, quantization=quantization, quantization_group=group)), _flatten(params)
  problems = [f"missing {k} {tuple(want[k].shape)}" for k in sorted(set(want) - set(got))]
  problems += [f"unexpected {k} {tuple(got[k].shape)}" for k in sorted(set(got) - set(want))]
  problems += [f"{k} has shape {tuple(got[k].shape)}, the model config needs {tuple(want[k].shape)}"
               for k in sorted(set(want) & set(got)) if tuple(got[k].shape) != tuple(want[k].shape)]
  if problems:
    raise CheckpointError(f"{where} do not match the model config: " + "; ".join(problems[:8])
                          + (f"; and {len(problems) - 8} more" if len(problems) > 8 else ""))


def save_checkpoint(directory: os.PathLike, params: Any, model: ModelConfig,
                    tokenizer_files: tuple[os.PathLike, ...] = (), overwrite: bool = False,
                    inputs: tuple[Optional[os.PathLike], ...] = (), **marker_info: Any) -> pathlib.Path:
  """Writes params, the model config and optional tokenizer files; returns the directory.

  An existing `directory` is replaced only with `overwrite` and only when maxscore wrote it (its
  marker); `directory` may not be or lie inside any of `inputs` (nor the tokenizer files' folders)."""
  params = nn.unbox(params)
  check_params(params, model)
  inputs = tuple(inputs) + tuple(pathlib.Path(f).parent for f in tokenizer_files)
  with safety.replace_dir(directory, "checkpoint", overwrite, inputs, "checkpoint directory",
                          **marker_info) as tmp:
    write_checkpoint_files(tmp, params, model, tokenizer_files)
  return safety.resolve(directory)


def local_checkpointer() -> ocp.StandardCheckpointer:
  """A checkpointer for host values that this process writes alone (process 0's export in a multi-process
  run, where the other processes take no part and must not be waited for)."""
  if jax.process_count() == 1:
    return ocp.StandardCheckpointer()
  me = jax.process_index()
  return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
      primary_host=me, active_processes={me}))


def write_checkpoint_files(directory: pathlib.Path, params: Any, model: ModelConfig,
                           tokenizer_files: tuple[os.PathLike, ...] = ()) -> None:
  """params/, tokenizer/ and maxscore.json (with the params digest) into an empty `directory`.

  The digest is of the arrays (names, dtypes, shapes, bytes), so converting the same weights again
  gives the same digest; the file manifest lets a load notice files replaced behind its back."""
  params = nn.unbox(params)
  digest = identity.tree_digest(params)
  checkpointer = local_checkpointer()
  checkpointer.save(safety.resolve(directory) / "params", params)  # Orbax refuses a relative path
  checkpointer.wait_until_finished()
  tokenizer = None
  for i, f in enumerate(tokenizer_files):
    (directory / "tokenizer").mkdir(exist_ok=True)
    shutil.copy2(f, directory / "tokenizer" / pathlib.Path(f).name)
    if i == 0:
      tokenizer = f"tokenizer/{pathlib.Path(f).name}"
  meta = {"format_version": FORMAT_VERSION, "model": model_config_to_dict(model), "tokenizer": tokenizer,
          "params_sha256": digest,
          "params_files": identity.dir_manifest(directory / "params")}
  if quant.holds_int8(params):  # what the params are: int8 projection weights with float32 scales
    meta["quantization"] = "int8"
    group = quant.params_group_size(params)
    if group:  # scales per group along the contracting dim, not per channel
      meta["quantization_group_size"] = group
  (directory / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def params_digest(directory: os.PathLike) -> str:
  """The stored params_sha256 of a checkpoint, after checking each parameter file's size against the
  stored manifest (cheap); a checkpoint whose maxscore.json holds no digest or manifest has its params hashed
  now."""
  directory = pathlib.Path(directory)
  return _digest(directory, _read_meta(directory))


def _digest(directory: pathlib.Path, meta: dict) -> str:
  params_dir = directory / "params"
  if "params_sha256" not in meta or "params_files" not in meta:
    return identity.dir_digest(params_dir)
  if not isinstance(meta["params_files"], dict):
    raise CheckpointError(f"{directory / METADATA_FILE} is corrupt: params_files must be an object")
  try:
    found = identity.dir_manifest(params_dir)
  except OSError as e:
    raise CheckpointError(f"cannot list {params_dir}: {e}") from None
  if found != meta["params_files"]:
    diff = sorted(k for k in set(found) | set(meta["params_files"]) if found.get(k) != meta["params_files"].get(k))
    raise CheckpointError(f"{params_dir} is not what was written with {directory / METADATA_FILE} (files "
                          f"changed, added or missing: {', '.join(diff[:4])}); convert or export the "
                          f"checkpoint again")
  return str(meta["params_sha256"])


def stored_quantization(directory: os.PathLike) -> str:
  """What a checkpoint's params hold: "none" (float weights) or "int8" (int8 projection weights and float32
  per-output-channel scales, written by a conversion with quantize=int8)."""
  directory = pathlib.Path(directory)
  return _quantization(directory, _read_meta(directory))


def _quantization(directory: pathlib.Path, meta: dict) -> str:
  value = meta.get("quantization", "none")
  if value not in ("none", "int8"):
    raise CheckpointError(f"{directory / METADATA_FILE} is corrupt: quantization={value!r} is not "
                          "one of ['none', 'int8']")
  return value


def stored_group_size(directory: os.PathLike) -> int:
  """The group size of a quantized checkpoint's weight scales: 0 (per output channel, and float checkpoints),
  or G (one scale per G weights along the contracting dim; layers/quantization.py)."""
  directory = pathlib.Path(directory)
  return _group_size(directory, _read_meta(directory))


def _group_size(directory: pathlib.Path, meta: dict) -> int:
  value = meta.get("quantization_group_size", 0)
  if not isinstance(value, int) or isinstance(value, bool) or value < 0:
    raise CheckpointError(f"{directory / METADATA_FILE} is corrupt: quantization_group_size={value!r} "
                          "is not a non-negative integer")
  return value


def _stored_tree(params_dir: pathlib.Path, checkpointer: ocp.StandardCheckpointer) -> Any:
  """The tree of Orbax's metadata of a checkpoint's `params/` (shapes and dtypes; no array is read), from its
  absolute path (Orbax reads a relative one as nothing)."""
  try:
    return checkpointer.metadata(safety.resolve(params_dir)).item_metadata.tree
  except Exception as e:  # orbax raises several types for unreadable metadata
    raise CheckpointError(f"cannot read Orbax metadata in {params_dir}: {type(e).__name__}: {str(e)[:300]}") from None


def stored_dtypes(directory: os.PathLike) -> set[str]:
  """The dtype names ("float32", "bfloat16", "int8") of a checkpoint's stored params, from Orbax's metadata."""
  stored = _stored_tree(pathlib.Path(directory) / "params", ocp.StandardCheckpointer())
  return {jnp.dtype(m.dtype).name for m in jax.tree_util.tree_leaves(stored)}


def read_metadata(directory: os.PathLike) -> tuple[ModelConfig, Optional[pathlib.Path]]:
  """The model config and tokenizer path stored in a checkpoint directory."""
  directory = pathlib.Path(directory)
  return _model_and_tokenizer(directory, _read_meta(directory))


def _model_and_tokenizer(directory: pathlib.Path, meta: dict) -> tuple[ModelConfig, Optional[pathlib.Path]]:
  meta_path = directory / METADATA_FILE
  try:
    model = model_config_from_dict(meta["model"], where=str(meta_path))
    tokenizer = directory / meta["tokenizer"] if meta.get("tokenizer") else None
  except (KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"{meta_path} is corrupt: {' '.join(str(e).split())}") from None
  return model, tokenizer


def read_checkpoint_metadata(directory: os.PathLike) -> CheckpointMetadata:
  """Everything a checkpoint's maxscore.json says, from one read of it (read_metadata, stored_quantization,
  stored_group_size and params_digest each read it again). Errors name `directory` as given."""
  directory = pathlib.Path(directory)
  meta = _read_meta(directory)
  model, tokenizer = _model_and_tokenizer(directory, meta)
  resolved = directory.resolve()
  return CheckpointMetadata(resolved, model, resolved / meta["tokenizer"] if tokenizer else None,
                            _quantization(directory, meta), _group_size(directory, meta), _digest(directory, meta))


def _read_meta(directory: pathlib.Path) -> dict:
  meta_path = directory / METADATA_FILE
  if not directory.is_dir():
    raise CheckpointError(f"checkpoint directory {directory} does not exist or is not a directory")
  if not meta_path.is_file():
    raise CheckpointError(f"{directory} is not a maxscore checkpoint: {METADATA_FILE} is missing")
  return read_json_object(meta_path, CheckpointError, "is corrupt")


def read_json_object(path: pathlib.Path, error: type[Exception], unparsable: str) -> dict:
  """The JSON object in the file `path`. A file that cannot be read or parsed raises `error` saying
  f"{path} {unparsable}: <why>"; a JSON value other than an object, that it must hold one."""
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
    raise error(f"{path} {unparsable}: {e}") from None
  if not isinstance(value, dict):
    raise error(f"{path} must hold a JSON object, got {type(value).__name__}")
  return value


def restore_checkpoint(directory: os.PathLike, shardings: Any = None, dtype: Any = None) -> Checkpoint:
  """Restores a checkpoint, into `shardings` (a pytree matching params) when given, cast to `dtype`."""
  directory = pathlib.Path(directory).resolve()
  if not directory.is_dir():
    raise CheckpointError(f"checkpoint directory {directory} does not exist")
  metadata = read_checkpoint_metadata(directory)
  params = restore_params(metadata, shardings, dtype)
  return Checkpoint(params, metadata.model, metadata.tokenizer_path, metadata.directory, metadata.digest)


def restore_params(metadata: CheckpointMetadata, shardings: Any = None, dtype: Any = None) -> Any:
  """The params of the checkpoint `metadata` describes, into `shardings` (a pytree matching them; None: this
  process's first device), cast to `dtype`. Every parameter's shape is checked against the model config first."""
  params_dir = metadata.directory / "params"
  checkpointer = ocp.StandardCheckpointer()
  stored = _stored_tree(params_dir, checkpointer)
  check_params(stored, metadata.model, where=f"parameters in {params_dir}")
  if shardings is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree_util.tree_map(lambda _: device, stored)
  target = jax.tree_util.tree_map(lambda m, s: jax.ShapeDtypeStruct(m.shape, dtype or m.dtype, sharding=s),
                                  stored, shardings)
  try:
    return checkpointer.restore(params_dir, target)
  except Exception as e:
    raise CheckpointError(f"cannot restore {params_dir} (truncated or corrupt files?): {type(e).__name__}: "
                          f"{str(e)[:300]}") from None
