"""A scorer from what is on disk: a checkpoint, with its trained score head (checkpoints/head_storage.py) and
LoRA adapters trained on it (checkpoints/adapters.py), merged on load. Every entry point that scores (the eval,
the trainer's teacher and baselines, serving, the benchmarks, scripts/score.py) loads its model here.

    scorer = build_scorer(None, [])                      # the embedded default model
    scorer = build_scorer("ckpt/", ["dtype=bfloat16"], adapters_dir="adapters/")
"""

import os
from typing import Any, Optional, Sequence

from maxscore import errors
from maxscore.checkpoints import adapters as adapters_lib
from maxscore.checkpoints import head_storage, storage
from maxscore.config import load_config, parse_override
from maxscore.datasets import data
from maxscore.scoring import head_scorer
from maxscore.scoring.scorer import Scorer


def build_scorer(checkpoint_dir: Optional[str] = None, overrides: Sequence[str] = (),
                 use_head: bool = True, adapters_dir: Optional[str] = None) -> Scorer:
  """The scorer a script asked for: a checkpoint (default: the embedded default model), or
  `checkpoint_dir="none"` for the config's random-init model; overrides are `key=value`.
  A checkpoint with a trained score head (head/) scores through it unless use_head=False.
  `adapters_dir`: LoRA adapters trained on that checkpoint (maxscore/checkpoints/adapters.py), merged on load; a
  head stored with them (train_reranker.py --adapters_dir) is used instead of the checkpoint's."""
  over = dict(parse_override(a) for a in overrides)
  if checkpoint_dir is None:
    checkpoint_dir = over.pop("checkpoint_dir", None) or str(data.DEFAULT_CHECKPOINT)
  over.pop("checkpoint_dir", None)
  if checkpoint_dir.lower() == "none":
    if adapters_dir:
      raise errors.ScoreInputError(f"adapters_dir={adapters_dir} needs the checkpoint it was trained on, not "
                                   "checkpoint_dir=none")
    return Scorer.from_config(load_config(over))
  if not adapters_dir:
    return head_scorer.load_scorer(checkpoint_dir, use_head=use_head, **over)
  scorer = load_adapted(checkpoint_dir, adapters_dir, **over)
  head_dir = next((d for d in (adapters_dir, checkpoint_dir) if head_storage.has_head(d)), None)
  if use_head and head_dir is not None:  # the head trained with the adapters, else the base's
    return head_scorer.HeadScorer(scorer, *head_storage.load_head(head_dir))
  return scorer


def load_adapted(checkpoint_dir: os.PathLike, adapters_dir: os.PathLike, mesh: Any = "auto", **overrides: Any):
  """A Scorer of the base checkpoint plus the adapters, merged on load (so it scores as a merged export).

  Refuses adapters trained on another base (their stored base digest differs). Adapters trained on a quantized
  base (QLoRA, lora.json's base_quantization) are merged into that base quantized as in training and
  dequantized (as is a base stored int8), so the merged model is float and scores as the QLoRA model did. It
  scores with quantization=none unless the overrides name another (which quantizes the merged float weights)."""
  adapters, lora, meta = adapters_lib.load_adapters_for(checkpoint_dir, adapters_dir)
  load_as = meta["base_quantization"]
  if load_as == "none" and storage.stored_quantization(checkpoint_dir) != "none":
    load_as = "int8_weights"  # int8 as stored; merge dequantizes it
  group = meta["base_quantization_group_size"]
  base = Scorer.from_checkpoint(checkpoint_dir, mesh=mesh, **{**overrides, "quantization": load_as,
                                                             "quantization_group_size": group})
  merged = adapters_lib.merge(adapters_lib.add_adapters(base.runner.params, adapters), lora)
  config = base.config.replace(quantization=overrides.get("quantization", "none"),
                               quantization_group_size=overrides.get("quantization_group_size", 0))
  scorer = Scorer(config, merged, base.tokenizer, model_name=base.model_name, mesh=base.mesh)
  scorer.adapters = {"dir": str(adapters_dir), "rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets),
                     "base_quantization": meta["base_quantization"]}
  return scorer
