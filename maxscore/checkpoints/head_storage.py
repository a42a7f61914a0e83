"""A score head's files, stored in a checkpoint directory next to the backbone:

  <ckpt>/head/head.json   {"format_version", "config": HeadConfig fields, "info": provenance}
  <ckpt>/head/params/     Orbax StandardCheckpointer tree of the head params

`export_checkpoint` writes a whole scorer checkpoint with its head (what training exports).
"""

import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Mapping, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from maxscore.checkpoints import storage as checkpointing
from maxscore.errors import UnsafeOutputError
from maxscore.files import safety
from maxscore.heads.head import HeadConfig, init_head

FORMAT_VERSION = 1
HEAD_DIR = "head"
HEAD_JSON = "head.json"


def has_head(checkpoint_dir: os.PathLike) -> bool:
  return (pathlib.Path(checkpoint_dir) / HEAD_DIR / HEAD_JSON).is_file()


def save_head(checkpoint_dir: os.PathLike, cfg: HeadConfig, params: Mapping,
              info: Optional[Mapping[str, Any]] = None) -> pathlib.Path:
  """Writes (replaces) `<checkpoint_dir>/head/`: head.json and the Orbax params, built beside it and
  renamed into place. An existing head/ without head.json is not maxscore's and is refused."""
  out = pathlib.Path(checkpoint_dir).resolve() / HEAD_DIR
  if out.exists() and not (out / HEAD_JSON).is_file():
    raise UnsafeOutputError(f"{out} exists but holds no {HEAD_JSON}: it is not a maxscore score head; "
                            f"left untouched")
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=".head.", suffix=".tmp", dir=out.parent))
  try:
    checkpointer = checkpointing.local_checkpointer()
    checkpointer.save(tmp / "params", jax.tree_util.tree_map(np.asarray, dict(params)))
    checkpointer.wait_until_finished()
    meta = {"format_version": FORMAT_VERSION, "config": cfg.to_dict(), "info": dict(info or {})}
    (tmp / HEAD_JSON).write_text(json.dumps(meta, indent=2) + "\n")
    safety.swap_dir(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out


def load_head(checkpoint_dir: os.PathLike) -> tuple[HeadConfig, dict, dict]:
  """(config, params, info) of `<checkpoint_dir>/head/`; CheckpointError when missing or corrupt."""
  d = pathlib.Path(checkpoint_dir).resolve() / HEAD_DIR
  try:
    meta = json.loads((d / HEAD_JSON).read_text())
    cfg = HeadConfig.from_dict(meta["config"])
  except FileNotFoundError:
    raise checkpointing.CheckpointError(f"{d} has no {HEAD_JSON}") from None
  except (OSError, KeyError, TypeError, ValueError, RecursionError) as e:
    raise checkpointing.CheckpointError(f"{d / HEAD_JSON} is corrupt: {e}") from None
  want = jax.eval_shape(lambda: init_head(cfg, jax.random.PRNGKey(0)))
  checkpointer = ocp.StandardCheckpointer()
  try:
    stored = checkpointer.metadata(d / "params").item_metadata.tree
    shapes = {k: tuple(v.shape) for k, v in stored.items()}
  except Exception as e:  # orbax raises several types for unreadable metadata
    raise checkpointing.CheckpointError(f"cannot read Orbax metadata in {d / 'params'}: {str(e)[:300]}") from None
  if shapes != {k: tuple(v.shape) for k, v in want.items()}:
    raise checkpointing.CheckpointError(f"{d / 'params'} holds {shapes}, the head config needs "
                                        f"{ {k: tuple(v.shape) for k, v in want.items()} }")
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # each process loads its own copy
  target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for k, v in want.items()}
  try:
    params = checkpointer.restore(d / "params", target)
  except Exception as e:  # orbax raises several types for unreadable or truncated data
    raise checkpointing.CheckpointError(f"cannot restore {d / 'params'}: {type(e).__name__}: {str(e)[:300]}") from None
  return cfg, dict(params), dict(meta.get("info", {}))


def export_checkpoint(base_dir: os.PathLike, out_dir: os.PathLike, cfg: HeadConfig, params: Mapping,
                      info: Optional[Mapping[str, Any]] = None, backbone_params: Any = None,
                      overwrite: bool = False, **marker_info: Any) -> pathlib.Path:
  """A scorer checkpoint with the head: a copy of `base_dir` (or `base_dir` itself when out_dir is
  it) plus head/. With `backbone_params` (a backbone that trained), those replace the copied params.

  The checkpoint is built beside `out_dir` and renamed into place; an existing `out_dir` is replaced
  only with `overwrite` and only when maxscore wrote it (maxscore/files/safety.py)."""
  base, out = pathlib.Path(base_dir).resolve(), pathlib.Path(out_dir).resolve()
  model, tok_path = checkpointing.read_metadata(base)
  if out == base and backbone_params is None:
    save_head(out, cfg, params, info)
    return out
  inputs = () if out == base else (base,)
  with safety.replace_dir(out, "checkpoint", overwrite or out == base, inputs, "export directory",
                          **marker_info) as tmp:
    if backbone_params is None:
      shutil.copytree(base, tmp, ignore=shutil.ignore_patterns(HEAD_DIR, safety.MARKER), dirs_exist_ok=True)
    else:
      tok_dir = base / "tokenizer"
      main = tok_path.name if tok_path else None  # the file maxscore.json names comes first
      tok_files = tuple(sorted(tok_dir.iterdir(), key=lambda p: (p.name != main, p.name))) if tok_dir.is_dir() else ()
      checkpointing.write_checkpoint_files(tmp, backbone_params, model, tok_files)
    save_head(tmp, cfg, params, info)
  return out
