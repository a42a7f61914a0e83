"""A scorer from what is on disk: a checkpoint, with its trained score head (checkpoints/head_storage.py) and
LoRA adapters trained on it (checkpoints/adapters.py), merged on load. Every entry point that scores (the eval,
the trainer's teacher and baselines, serving, the benchmarks, scripts/score.py) loads its model here.

    scorer = build_scorer(None, [])                      # the embedded default model
    scorer = build_scorer("ckpt/", ["dtype=bfloat16"], adapters_dir="adapters/")
"""

import os
import pathlib
from typing import Any, Optional, Sequence

from maxscore import errors
from maxscore.checkpoints import adapters as adapters_lib
from maxscore.checkpoints import head_storage, storage
from maxscore.config import load_config, parse_override
from maxscore.datasets import data
from maxscore.scoring import head_scorer, runner
from maxscore.scoring import scorer as scorer_lib
from maxscore.scoring.scorer import Scorer


def build_scorer(checkpoint_dir: Optional[str] = None, overrides: Sequence[str] = (),
                 use_head: bool = True, adapters_dir: Optional[str] = None) -> Scorer:
  """The scorer a script asked for: a checkpoint (default: the embedded default model), or
  `checkpoint_dir="none"` for the config's random-init model; overrides are `key=value`.
  A checkpoint with a trained score head (head/) scores through it unless use_head=False.
  `adapters_dir`: LoRA adapters trained on that checkpoint (maxscore/checkpoints/adapters.py), merged on load; a
  head stored with them (train_reranker.py --adapters_dir) is used instead of the checkpoint's."""
  over = dict(parse_override(a) for a in overrides)  # parsed here only: everything below takes these values
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


def load_adapted(checkpoint_dir: os.PathLike, adapters_dir: os.PathLike, mesh: Any = "auto",
                 **overrides: Any) -> Scorer:
  """A Scorer of the base checkpoint plus the adapters, merged on load (so it scores as a merged export).

  Refuses adapters trained on another base (their stored base digest differs). Adapters trained on a quantized
  base (QLoRA, lora.json's base_quantization) are merged into that base quantized as in training and
  dequantized (as is a base stored int8), so the merged model is float and scores as the QLoRA model did. It
  scores with quantization=none unless the overrides name another (which quantizes the merged float weights).

  The base and the adapters are read once, the adapters merged into the base's params as a scorer of the base
  would hold them (runner.held_params), and one Scorer is built of the merged params."""
  config, mesh, loaded = scorer_lib.load_for_scoring(checkpoint_dir, mesh, overrides, adapters_dir,
                                                    overrides_for=_base_quantization)
  adapters = loaded.adapters
  tokenizer = scorer_lib.checkpoint_tokenizer(config, loaded.metadata)
  scorer_lib.use_compilation_cache(config.runtime.compilation_cache_dir)  # JAX settles it at the first compile
  base = runner.held_params(loaded.params, config.model, config.runtime, mesh)
  merged = adapters_lib.merge(adapters_lib.add_adapters(base, adapters.params), adapters.lora)
  config = config.replace(quantization=overrides.get("quantization", "none"),
                          quantization_group_size=overrides.get("quantization_group_size", 0))
  return Scorer(config, merged, tokenizer, model_name=pathlib.Path(checkpoint_dir).name, mesh=mesh,
                adapters=adapters.info)


def _base_quantization(metadata: storage.CheckpointMetadata, adapters: adapters_lib.Adapters) -> dict[str, Any]:
  """How load_adapted loads the base before merging: quantized as in training (lora.json's base_quantization,
  with its group size), else int8 as stored (int8_weights); the merge dequantizes either."""
  load_as = adapters.meta["base_quantization"]
  if load_as == "none" and metadata.quantization != "none":
    load_as = "int8_weights"  # int8 as stored; merge dequantizes it
  return {"quantization": load_as, "quantization_group_size": adapters.meta["base_quantization_group_size"]}
