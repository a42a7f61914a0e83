"""A LoRA run's warm start: the adapters and the head of an earlier run (its --adapters_dir, or a packaged
reranker, which holds the same files) instead of fresh ones, so that a run can go on training a reranker on a
schedule of its own.

    start = load(init_from, scorer, cfg.lora, head_cfg)   # checked against this run's base, LoRA and head
    params = start.apply(params)                          # the run's initial params, the base untouched

The optimizer state starts fresh (the earlier run's moments are not in its exports). What was loaded goes in the
run's fingerprint, so a workdir resumes only with the same warm start.
"""

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp

from layers.lora import LoraConfig
from maxscore.checkpoints import adapters as lora_lib
from maxscore.checkpoints import head_storage
from maxscore.checkpoints.storage import CheckpointError
from maxscore.errors import TrainError
from maxscore.files import identity
from maxscore.heads.head import HeadConfig
from maxscore.scoring.scorer import Scorer


@dataclasses.dataclass(frozen=True)
class WarmStart:
  """Adapters and head params read from `directory` (host arrays), and their digests."""
  directory: str
  adapters: dict
  head: dict
  adapters_sha256: str
  head_sha256: str

  @property
  def identity(self) -> dict[str, str]:
    """What a resumed run must match (its place in the run's fingerprint): the two digests, not the path."""
    return {"adapters_sha256": self.adapters_sha256, "head_sha256": self.head_sha256}

  def apply(self, params: dict[str, Any]) -> dict[str, Any]:
    """`params` (model.init_params' tree) with the backbone's adapters and the head replaced by these, each
    in the dtype of the leaf it replaces; the base params are the same arrays."""
    base, fresh = lora_lib.split_adapters(params["backbone"])
    adapters = _like(fresh, self.adapters, "adapters")
    head = _like(params["head"], self.head, "head")
    return {**params, "backbone": lora_lib.add_adapters(base, adapters), "head": head}


def _like(want: Any, got: Any, what: str) -> Any:
  """`got` cast leaf by leaf to `want`'s dtypes; TrainError when the two trees' structures or shapes differ."""
  if jax.tree_util.tree_structure(want) != jax.tree_util.tree_structure(got):
    raise TrainError(f"--init_from: the stored {what} have other params than this run's")
  def cast(w, g):
    if tuple(w.shape) != tuple(g.shape):
      raise TrainError(f"--init_from: a stored {what} param has shape {tuple(g.shape)}, this run's {tuple(w.shape)}")
    return jnp.asarray(g, w.dtype)
  return jax.tree_util.tree_map(cast, want, got)


def load(directory: os.PathLike, scorer: Scorer, lora: LoraConfig, head_cfg: HeadConfig) -> WarmStart:
  """The adapters and head in `directory`, refused (TrainError, saying which differs) unless they were trained on
  this scorer's base params, with the run's LoRA settings `lora` (rank, alpha and targets; a run without LoRA is
  refused before, by TrainConfig.check_init_from) and the run's head config."""
  try:
    adapters, stored, meta = lora_lib.load_adapters(directory)
    lora_lib.check_base(meta, directory, scorer.config.runtime.checkpoint_dir, scorer.params_digest)
    stored_head_cfg, head_params, _ = head_storage.load_head(directory)
  except (lora_lib.LoraError, CheckpointError) as e:
    raise TrainError(f"--init_from: {e}") from None
  if stored != lora:
    raise TrainError(f"--init_from={directory} holds LoRA rank {stored.rank}, alpha {stored.alpha:g}, targets "
                     f"{list(stored.targets)}; this run sets rank {lora.rank}, alpha {lora.alpha:g}, "
                     f"targets {list(lora.targets)}")
  if stored_head_cfg != head_cfg:
    differ = [f.name for f in dataclasses.fields(HeadConfig)
              if getattr(stored_head_cfg, f.name) != getattr(head_cfg, f.name)]
    raise TrainError(f"--init_from={directory} holds a head with other settings ({', '.join(differ)}) than this "
                     f"run's")
  head_params = jax.device_get(head_params)
  return WarmStart(str(directory), adapters, head_params, meta["adapters_sha256"], identity.tree_digest(head_params))
