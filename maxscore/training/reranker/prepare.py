"""A reranker training run's inputs, built once before the loop from the backbone's scorer: its labels and head,
each split's examples, and the source of the head's inputs (sources.py): the frozen backbone's features, or the
training backbone with each split's packed geometry. Which of the two a run has is decided here, once.
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
from maxscore.training.reranker import first_listwise, sources
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.features import Examples, Features, load_or_extract, make_examples, packed_geometry
from maxscore.training.reranker.sources import Source


@dataclasses.dataclass
class Prepared:
  """Everything a run trains on, built once from the backbone's scorer: its labels and head, each split's examples,
  and the source of the head's inputs (sources.py: each split's frozen features, or the training backbone with
  each split's packed geometry)."""
  label_ids: tuple[int, ...]
  head_cfg: head.HeadConfig
  examples: dict[str, Examples]
  grids: dict[str, tuple[np.ndarray, np.ndarray]]
  source: Source                     # where the head's inputs come from: frozen features, or the training backbone
  teacher: Optional[np.ndarray] = None  # the train split's teacher scores [Q, N] (loss=distill, distill_weight)
  window_grades: Optional[dict] = None  # loss=first_listwise: per split (grades [Q, K], mask [Q, K]) per identifier
  listwise_chat: Optional[bool] = None  # loss=first_listwise: the window prompts are a chat user turn (None: none)

  @property
  def num_train(self) -> int:
    return len(self.examples["train"].requests)


def uses_teacher(cfg: TrainConfig) -> bool:
  """Whether the loss reads the groups' teacher scores (distillation alone or mixed with LCE)."""
  return cfg.loss.kind == "distill" or cfg.loss.distill_weight > 0


def prepare(cfg: TrainConfig, prompt: PromptConfig, scorer: Scorer, train_set: RerankSet,
            dev_set: Optional[RerankSet], feature_cache: Optional[os.PathLike] = None,
            progress: bool = True) -> Prepared:
  """The labels and head, each split's prompts built as the eval builds them (with `scorer`'s tokenizer), and
  the features training reads: the frozen backbone's, or the packed geometry when it trains."""
  quantization = scorer.config.runtime.quantization
  if cfg.backbone is not None and cfg.lora is None and quantization != "none":
    raise TrainError(f"quantization={quantization!r} is for scoring only, and train_backbone trains the whole "
                     "backbone; use quantization=none, or train LoRA adapters on the quantized base (--lora_rank > 0 "
                     "with quantization=int8_weights: QLoRA), or a head alone on the quantized backbone's features")
  if cfg.lora is not None:  # QLoRA: the int8 base stays frozen, the float adapters train
    quant.refuse_qlora(quantization, TrainError)
  splits = {"train": train_set, **({"dev": dev_set} if dev_set is not None else {})}
  builder = None
  window = cfg.loss.window
  if window is not None:  # loss=first_listwise: one FIRST window per query; its identifiers are the labels
    builder = first_listwise.window_prompts(scorer.tokenizer, window.size, window.identifiers, window.passage_tokens,
                                            window.window_tokens, window.chat)
    label_ids = builder.label_ids[:window.size]
    listwise_chat = builder.chat
    logging.info("train: the window prompts are %s%s", listwise.prompt_form(builder.chat),
                 " (listwise_chat unset)" if window.chat is None else "")
  else:
    label_ids = prompts.resolve_labels(scorer.tokenizer,
                                       prompt.labels or prompts.TEMPLATES[prompt.template].default_labels)
    listwise_chat = None  # no window prompts
  head_cfg = cfg.head_config(label_ids, scorer.config.model.hidden_size)
  window_grades = None
  if builder is not None:
    built = {s: first_listwise.window_examples(scorer, ds, builder, window.size)
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
    raise TrainError(f"loss=distill (or distill_weight={cfg.loss.distill_weight}) trains toward a teacher's scores: "
                     "give --groups_file with pos_scores and neg_scores in every group (scripts/score_teacher.py writes "
                     "them)")
  if cfg.backbone is not None:
    source = backbone_source(cfg, scorer, {s: packed_geometry(scorer, ex) for s, ex in examples.items()})
  else:
    source = sources.Frozen(load_or_extract(scorer, examples, feature_cache, cfg.algorithm, progress))
  return Prepared(tuple(label_ids), head_cfg, examples, {s: ex.grid() for s, ex in examples.items()}, source,
                  teacher=examples["train"].teacher_grid() if uses_teacher(cfg) else None,
                  window_grades=window_grades, listwise_chat=listwise_chat)


def backbone_source(cfg: TrainConfig, scorer: Scorer, geometry: dict[str, tuple[int, int, int]]) -> sources.Backbone:
  """The training backbone of `cfg` on `scorer`, packing each split at its geometry (P, L, N); with group_size
  (and no match losses, whose targets need every item) a train row packs only the group drawn, so its N is the
  group's bucket."""
  group_rows = bool(cfg.group_size) and cfg.backbone.match is None
  if group_rows and "train" in geometry:
    p, l, n = geometry["train"]
    geometry = {**geometry, "train": (p, l, min(n, bucket(cfg.group_size, scorer.config.buckets.item_count_buckets,
                                                          "group size")))}
  return sources.Backbone(scorer, geometry, cfg.backbone, group_rows)


def synthetic_source(cfg: TrainConfig, scorer: Scorer, geometry: Optional[tuple[int, int, int]] = None,
                     frozen_shape: Optional[tuple[int, int, int]] = None) -> Source:
  """The source of a synthetic train split (the fit report's and the training bench's): the backbone packing it at
  `geometry` (P, L, N) when it trains, else zero frozen features of `frozen_shape` (queries, items, labels); with
  neither, a source for the run's params alone (model.program)."""
  if cfg.backbone is not None:
    return backbone_source(cfg, scorer, {} if geometry is None else {"train": geometry})
  if frozen_shape is None:
    return sources.Frozen({}, scorer.abstract)
  q, n, k = frozen_shape
  return sources.Frozen({"train": Features(np.zeros((q, n, scorer.config.model.hidden_size), np.float32),
                                           np.zeros((q, n, k), np.float32))}, scorer.abstract)
