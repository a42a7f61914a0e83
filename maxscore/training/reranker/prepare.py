"""A reranker training run's inputs, built once before the loop from the backbone's scorer: its labels and head,
and each split's examples with their frozen features (or the packed geometry when the backbone trains too).
"""

import dataclasses
import os
from typing import Optional

import numpy as np
from absl import logging

from layers import quantization as quant
from maxscore.datasets.data import RerankSet
from maxscore.errors import DataError, TrainError
from maxscore.heads import head
from maxscore.rerank import listwise, prompts
from maxscore.rerank.prompts import PromptConfig
from maxscore.scoring.layout import bucket
from maxscore.scoring.scorer import Scorer
from maxscore.training.reranker import first_listwise
from maxscore.training.reranker.features import Examples, load_or_extract, make_examples, packed_geometry
from maxscore.training.reranker.config import TrainConfig


@dataclasses.dataclass
class Prepared:
  """Everything a run trains on, built once from the backbone's scorer: its labels and head, and each split's
  examples with their frozen features (or packed plans when the backbone trains too)."""
  label_ids: tuple[int, ...]
  head_cfg: head.HeadConfig
  examples: dict[str, Examples]
  grids: dict[str, tuple[np.ndarray, np.ndarray]]
  feats: Optional[dict] = None       # frozen features per split
  geometry: Optional[dict] = None    # train_backbone: packed geometry per split
  feature_seconds: float = 0.0
  cached: bool = False
  match_targets: bool = False        # batches carry the token-match targets (match_loss_weight > 0)
  teacher: Optional[np.ndarray] = None  # the train split's teacher scores [Q, N] (loss=distill, distill_weight)
  window_grades: Optional[dict] = None  # loss=first_listwise: per split (grades [Q, K], mask [Q, K]) per identifier
  group_rows: bool = False           # train_backbone with group_size: a train row packs only the group drawn
  listwise_chat: bool = True         # loss=first_listwise: the window prompts are a chat user turn

  @property
  def num_train(self) -> int:
    return len(self.examples["train"].requests)


def uses_teacher(cfg: TrainConfig) -> bool:
  """Whether the loss reads the groups' teacher scores (distillation alone or mixed with LCE)."""
  return cfg.loss == "distill" or cfg.distill_weight > 0


def prepare(cfg: TrainConfig, prompt: PromptConfig, scorer: Scorer, train_set: RerankSet,
            dev_set: Optional[RerankSet], feature_cache: Optional[os.PathLike] = None,
            progress: bool = True) -> Prepared:
  """The labels and head, each split's prompts built as the eval builds them (with `scorer`'s tokenizer), and
  the features training reads: the frozen backbone's, or the packed geometry when it trains."""
  quantization = scorer.config.runtime.quantization
  if cfg.train_backbone and cfg.lora is None and quantization != "none":
    raise TrainError(f"quantization={quantization!r} is for scoring only, and train_backbone trains the whole "
                     "backbone; use quantization=none, or train LoRA adapters on the quantized base (--lora_rank > 0 "
                     "with quantization=int8_weights: QLoRA), or a head alone on the quantized backbone's features")
  if cfg.lora is not None:  # QLoRA: the int8 base stays frozen, the float adapters train
    quant.refuse_qlora(quantization, TrainError)
  splits = {"train": train_set, **({"dev": dev_set} if dev_set is not None else {})}
  builder = None
  if cfg.loss == "first_listwise":  # one FIRST window per query; its identifiers are the labels
    builder = first_listwise.window_prompts(scorer.tokenizer, cfg.listwise_window, cfg.listwise_identifiers,
                                            cfg.listwise_passage_tokens, cfg.listwise_window_tokens, cfg.listwise_chat)
    label_ids = builder.label_ids[:cfg.listwise_window]
    listwise_chat = builder.chat
    logging.info("train: the window prompts are %s%s", listwise.prompt_form(builder.chat),
                 " (listwise_chat unset)" if cfg.listwise_chat is None else "")
  else:
    label_ids = prompts.resolve_labels(scorer.tokenizer,
                                       prompt.labels or prompts.TEMPLATES[prompt.template].default_labels)
    listwise_chat = True if cfg.listwise_chat is None else cfg.listwise_chat  # no window prompts: no effect
  head_cfg = cfg.head_config(label_ids, scorer.config.model.hidden_size)
  window_grades = None
  if builder is not None:
    built = {s: first_listwise.window_examples(scorer, ds, builder, cfg.listwise_window)
             for s, ds in splits.items()}
    examples = {s: b[0] for s, b in built.items()}
    window_grades = {s: b[1:] for s, b in built.items()}
  else:
    examples = {s: make_examples(scorer, ds, prompt, label_ids) for s, ds in splits.items()}
  if not examples["train"].requests:
    raise DataError("the train split has no queries with candidates")
  if cfg.group_size > examples["train"].max_items:
    raise TrainError(f"group_size={cfg.group_size} is more than any train query's candidates (at most "
                     f"{examples['train'].max_items}): every candidate would be kept, as group_size=0 keeps them; "
                     f"pass --group_size=0 or at most {examples['train'].max_items}")
  if uses_teacher(cfg) and examples["train"].teacher is None:
    raise TrainError(f"loss=distill (or distill_weight={cfg.distill_weight}) trains toward a teacher's scores: give "
                     "--groups_file with pos_scores and neg_scores in every group (scripts/score_teacher.py writes them)")
  prep = Prepared(tuple(label_ids), head_cfg, examples, {s: ex.grid() for s, ex in examples.items()},
                  teacher=examples["train"].teacher_grid() if uses_teacher(cfg) else None,
                  window_grades=window_grades, listwise_chat=listwise_chat)
  if cfg.train_backbone:
    prep.geometry = {s: packed_geometry(scorer, ex) for s, ex in examples.items()}
    prep.match_targets = cfg.match_loss_weight > 0
    prep.group_rows = bool(cfg.group_size) and not prep.match_targets  # match targets need every item
    if prep.group_rows:
      p, l, n = prep.geometry["train"]
      prep.geometry["train"] = (p, l, min(n, bucket(cfg.group_size, scorer.config.buckets.item_count_buckets,
                                                    "group size")))
  else:
    prep.feats = load_or_extract(scorer, examples, feature_cache, cfg.algorithm, progress)
    prep.feature_seconds = sum(f.seconds for f in prep.feats.values())
    prep.cached = all(f.cached for f in prep.feats.values())
  return prep
