"""Resume identity by content: what a score depends on, as one JSON-able dict, and the check that
refuses to mix two runs' results.

A checkpoint's parameter digest is computed once, when conversion or export writes it, and stored
in its maxscore.json with the size of every parameter file; loading compares the sizes (cheap)
so weights replaced in place are caught, and a re-conversion changes the stored digest.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Iterable, Mapping, Optional

import jax
import numpy as np

from maxscore.errors import ResumeError

_CHUNK = 1 << 20


def _files(directory: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in directory.rglob("*") if p.is_file())


def dir_manifest(directory: os.PathLike) -> dict[str, int]:
  """{relative path: size in bytes} of every file under `directory`."""
  directory = pathlib.Path(directory)
  return {p.relative_to(directory).as_posix(): p.stat().st_size for p in _files(directory)}


def files_digest(paths: Iterable[os.PathLike], root: Optional[os.PathLike] = None) -> str:
  """sha256 (hex, 16 chars) over the bytes of `paths` in order, and their names relative to `root` when
  given (without `root` a file's content is its identity, wherever it lies)."""
  h = hashlib.sha256()
  for p in paths:
    p = pathlib.Path(p)
    if root is not None:
      h.update(p.relative_to(root).as_posix().encode() + b"\0")
    with open(p, "rb") as f:
      while chunk := f.read(_CHUNK):
        h.update(chunk)
    h.update(b"\0")
  return h.hexdigest()[:16]


def dir_digest(directory: os.PathLike) -> str:
  """files_digest of every file under `directory` (paths relative to it)."""
  directory = pathlib.Path(directory)
  return files_digest(_files(directory), root=directory)


def tree_digest(tree: Any) -> str:
  """sha256 (16 hex chars) of a pytree of arrays: leaf paths, dtypes, shapes and bytes."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]:
    x = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}:{x.dtype}:{x.shape}\0".encode())
    h.update(x.tobytes())
  return h.hexdigest()[:16]


def tokenizer_digest(tokenizer: Any) -> Optional[str]:
  """Digest of the tokenizer file and, beside an HF tokenizer.json, its tokenizer_config.json."""
  if tokenizer is None:
    return None
  path = pathlib.Path(tokenizer.path)
  files = [path] + [p for p in (path.parent / "tokenizer_config.json",) if p.is_file() and p != path]
  return files_digest(files)


# Config fields that cannot change a score: request defaults a run passes explicitly, cache and
# request-size limits, where compilations are cached, and how many warps and pipelining stages run pallas_gpu's
# tiles (the same tiles, summed in the same order). Leaving them out also keeps the identities of runs made before
# they were keys.
_NOT_SCORES = frozenset({"label_token_ids", "apply_softmax", "prefix_cache_bytes", "max_request_tokens",
                         "gpu_num_warps", "gpu_num_stages"})


def _section(section: Any) -> dict[str, Any]:
  return {k: v for k, v in dataclasses.asdict(section).items() if k not in _NOT_SCORES}


def scorer_identity(scorer: Any) -> dict[str, Any]:
  """Everything about a scorer that changes a score: model, parameter and tokenizer content, dtypes,
  the scoring, kernel and bucket config (algorithms and padding agree to 1e-5, not bit for bit),
  and the score head (when it has one). The mesh is left out: data-parallel runs are bit-identical."""
  rt, cfg = scorer.config.runtime, scorer.config
  # Quantization is named only when on, so the identities of float scorers stay what they were; so is the
  # group size of per-group weight scales (the runner's: a checkpoint stored per group keeps its own).
  quantized = {} if rt.quantization == "none" else {"quantization": rt.quantization}
  group = getattr(getattr(scorer, "runner", None), "quantization_group", 0)
  if group:
    quantized["quantization_group_size"] = group
  return {
      **quantized,
      "model": dataclasses.asdict(cfg.model),
      "params_sha256": scorer.params_digest,
      "tokenizer_sha256": tokenizer_digest(scorer.tokenizer),
      "dtype": [rt.dtype, rt.weight_dtype, rt.matmul_precision],
      "scoring": _section(cfg.scoring),
      "kernel": _section(cfg.kernel),
      "buckets": _section(cfg.buckets),
      "head": scorer.head_fingerprint,
  }


def _plain(obj: Any) -> Any:
  return json.loads(json.dumps(obj, sort_keys=True))


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(obj, dict) and obj:
    out = {}
    for k, v in obj.items():
      out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out
  return {prefix: obj}


def changed_keys(stored: Any, current: Mapping[str, Any]) -> list[str]:
  """Dotted names of the fields that differ (["everything"] when `stored` is not a dict)."""
  if not isinstance(stored, dict):
    return ["everything (no readable identity stored)"]
  old, new = _flat(_plain(stored)), _flat(_plain(current))
  return sorted(k for k in set(old) | set(new) if old.get(k, "<absent>") != new.get(k, "<absent>"))


def check_same(stored: Any, current: Mapping[str, Any], where: os.PathLike, restart: str) -> None:
  """Raises ResumeError (one line: what changed, how to start over) unless `stored` equals `current`."""
  diff = changed_keys(stored, current)
  if diff:
    shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
    raise ResumeError(f"{where} holds results of a different run (changed: {shown}); refusing to mix them: "
                      f"{restart}")
