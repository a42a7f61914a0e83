"""Self-describing Orbax checkpoints: params + the model config (+ the tokenizer) in one directory.

    <dir>/params/          Orbax StandardCheckpointer tree (the Decoder's unboxed params)
    <dir>/maxscore.json    {"format_version", "model": ModelConfig fields, "tokenizer": relative path | null}
    <dir>/tokenizer/       copy of the tokenizer file(s), when the source had one

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

from layers.config import ModelConfig
from layers.decoder import Decoder, init_params
from layers.kernels import get_kernel
from maxscore.config import model_config_from_dict, model_config_to_dict

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


def abstract_params(model: ModelConfig, dtype: Any = jnp.float32) -> Any:
  """ShapeDtypeStructs of the (unboxed) params for `model`, without allocating them."""
  decoder = Decoder(model, get_kernel("reference"), param_dtype=dtype)
  boxed = jax.eval_shape(lambda: init_params(decoder, jax.random.PRNGKey(0)))
  return nn.unbox(boxed)


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in path)


def _flatten(tree) -> dict[str, Any]:
  return {_path_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_params(params: Any, model: ModelConfig, where: str = "params") -> None:
  """Raises CheckpointError naming each missing, unexpected or mis-shaped parameter."""
  want, got = _flatten(abstract_params(model)), _flatten(params)
  problems = [f"missing {k} {tuple(want[k].shape)}" for k in sorted(set(want) - set(got))]
  problems += [f"unexpected {k} {tuple(got[k].shape)}" for k in sorted(set(got) - set(want))]
  problems += [f"{k} has shape {tuple(got[k].shape)}, the model config needs {tuple(want[k].shape)}"
               for k in sorted(set(want) & set(got)) if tuple(got[k].shape) != tuple(want[k].shape)]
  if problems:
    raise CheckpointError(f"{where} do not match the model config: " + "; ".join(problems[:8])
                          + (f"; and {len(problems) - 8} more" if len(problems) > 8 else ""))


def save_checkpoint(directory: os.PathLike, params: Any, model: ModelConfig,
                    tokenizer_files: tuple[os.PathLike, ...] = (), overwrite: bool = False) -> pathlib.Path:
  """Writes params, the model config and optional tokenizer files; returns the directory."""
  directory = pathlib.Path(directory).resolve()
  params = nn.unbox(params)
  check_params(params, model)
  if directory.exists():
    if not overwrite:
      raise CheckpointError(f"checkpoint directory {directory} already exists (pass overwrite=True)")
    shutil.rmtree(directory)
  directory.mkdir(parents=True)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(directory / "params", params)
  checkpointer.wait_until_finished()
  tokenizer = None
  for i, f in enumerate(tokenizer_files):
    (directory / "tokenizer").mkdir(exist_ok=True)
    shutil.copy2(f, directory / "tokenizer" / pathlib.Path(f).name)
    if i == 0:
      tokenizer = f"tokenizer/{pathlib.Path(f).name}"
  meta = {"format_version": FORMAT_VERSION, "model": model_config_to_dict(model), "tokenizer": tokenizer}
  (directory / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
  return directory


def read_metadata(directory: os.PathLike) -> tuple[ModelConfig, Optional[pathlib.Path]]:
  """The model config and tokenizer path stored in a checkpoint directory."""
  directory = pathlib.Path(directory)
  meta_path = directory / METADATA_FILE
  if not meta_path.is_file():
    raise CheckpointError(f"{directory} is not a maxscore checkpoint: {METADATA_FILE} is missing")
  try:
    meta = json.loads(meta_path.read_text())
    model = model_config_from_dict(meta["model"], where=str(meta_path))
  except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
    raise CheckpointError(f"{meta_path} is corrupt: {e}") from None
  tokenizer = directory / meta["tokenizer"] if meta.get("tokenizer") else None
  return model, tokenizer


def restore_checkpoint(directory: os.PathLike, shardings: Any = None, dtype: Any = None) -> Checkpoint:
  """Restores a checkpoint, into `shardings` (a pytree matching params) when given, cast to `dtype`."""
  directory = pathlib.Path(directory).resolve()
  if not directory.is_dir():
    raise CheckpointError(f"checkpoint directory {directory} does not exist")
  model, tokenizer = read_metadata(directory)
  params_dir = directory / "params"
  checkpointer = ocp.StandardCheckpointer()
  try:
    stored = checkpointer.metadata(params_dir).item_metadata.tree
  except Exception as e:  # orbax raises several types for unreadable metadata
    raise CheckpointError(f"cannot read Orbax metadata in {params_dir}: {type(e).__name__}: {e}") from None
  check_params(stored, model, where=f"parameters in {params_dir}")
  if shardings is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree_util.tree_map(lambda _: device, stored)
  target = jax.tree_util.tree_map(lambda m, s: jax.ShapeDtypeStruct(m.shape, dtype or m.dtype, sharding=s),
                                  stored, shardings)
  try:
    params = checkpointer.restore(params_dir, target)
  except Exception as e:
    raise CheckpointError(f"cannot restore {params_dir}: {type(e).__name__}: {e}") from None
  return Checkpoint(params, model, tokenizer, directory)
