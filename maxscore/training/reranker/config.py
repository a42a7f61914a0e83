"""Head-training settings: the head, loss, optimizer and loop (TrainConfig) and where a run reads and
writes (TrainRun); configs/train.yml documents every key."""

import dataclasses
import os
from typing import Literal, Optional, Sequence

from layers.lora import TARGETS, LoraConfig
from maxscore.errors import TrainError
from maxscore.heads.head import HEADS, HeadConfig
from maxscore.training.reranker.losses import LOSSES
from maxscore.training.optimizer import OptimizerConfig, check_finite


LORA_TARGETS = TARGETS  # the projections LoRA can adapt (layers/lora.py)
REMAT = ("full", "per_layer", "none")  # full: the whole forward recomputed; per_layer: each layer; none: nothing
COVERAGE_ON = ("probe", "score")  # what the match losses' coverage ranking trains (TrainConfig.coverage_on)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Head, loss, optimizer and loop settings (prompts and metrics come from a PromptConfig)."""
  head: Literal["lm_labels", "linear", "mlp"] = "lm_labels"
  delta: Literal["full", "low_rank", "none"] = "full"  # lm_labels: h @ W, h @ A @ B, or no hidden term
  rank: int = 8                    # lm_labels with delta=low_rank: rank of h @ A @ B
  use_bias: bool = True            # lm_labels: a trainable bias on the label logits
  num_outputs: int = 0             # linear/mlp: 1 = one relevance logit, 0 = one logit per label
  mlp_hidden: int = 256            # mlp: hidden width
  loss: Literal["listwise", "pairwise", "pointwise", "distill", "first_listwise"] = "listwise"  # distill: KL to a
                                   # teacher's scores; first_listwise: FIRST's loss on a window's identifier logits
  listwise_window: int = 20        # loss=first_listwise: passages per training window (positives first picked)
  listwise_identifiers: str = "letters"  # loss=first_listwise: letters (A..Z) or numbers (1..100), each one token
  listwise_passage_tokens: int = 128  # loss=first_listwise: each passage in a window cut to this many tokens
  listwise_window_tokens: int = 4096  # loss=first_listwise: a window prompt's token budget; 0 = no limit
  listwise_chat: Optional[bool] = None  # loss=first_listwise: the window prompt is a chat user turn; None: when the tokenizer has a template
  distill_temperature: float = 1.0  # loss=distill: both score lists are divided by it before the softmax
  distill_weight: float = 0.0      # loss=listwise: (1 - w) * LCE on the grades + w * distillation toward the
                                   # groups' teacher scores (at distill_temperature); 0 = LCE, 1 = distill alone
  select_metric: Optional[str] = None  # keep and export the params of the best dev eval on this metric; None = last
  patience: int = 0                # with select_metric: stop after this many dev evals without a gain; 0 = never
  group_size: int = 0              # items per query per step: one positive and group_size - 1 negatives drawn
                                   # per step (LCE); 0 = every candidate
  learning_rate: float = 1e-3      # peak of the warmup + cosine schedule
  end_learning_rate: float = 0.0   # value the cosine decays to at the last step
  warmup_steps: int = 10
  weight_decay: float = 1e-4       # AdamW decoupled weight decay
  clip_norm: float = 1.0           # clip_by_global_norm before AdamW
  batch_size: int = 8              # queries per step
  num_epochs: int = 20
  num_steps: int = 0               # total steps; 0 = num_epochs over the train queries
  seed: int = 0                    # head init and data order
  log_every: int = 1               # train-loss lines every N steps
  eval_every: int = 20             # dev eval every N steps (and at step 0 and the end); 0 = start and end only
  save_every: int = 20             # checkpoint every N steps (and at the end)
  keep_checkpoints: int = 3        # checkpoints kept (the latest ones)
  train_backbone: bool = False     # fine-tune the decoder too (with remat); no feature cache then
  match_loss_weight: float = 0.0   # train_backbone: weight of the auxiliary match losses (train.py: two probes,
                                   # not exported, that find the query's tokens in each candidate); 0 = off
  coverage_on: Literal["probe", "score"] = "probe"  # match losses: the coverage ranking trains a probe, or the
                                   # exported ranking score itself (weak supervision from lexical overlap)
  algorithm: Optional[str] = None  # scorer algorithm for the frozen features; None = the scorer's choice
  lora_rank: int = 0               # train_backbone: adapters of this rank train, the base stays frozen; 0 = full
  lora_alpha: float = 16.0         # LoRA scale numerator: the update is lora_alpha / lora_rank * A @ B
  lora_targets: tuple[str, ...] = LORA_TARGETS  # projections that get adapters (any of LORA_TARGETS)
  grad_accum_steps: int = 1        # micro-batches per step whose gradients are averaged
  compute_dtype: Optional[Literal["float32", "bfloat16"]] = None  # train_backbone: activations; None = the scorer's
  param_dtype: Optional[Literal["float32", "bfloat16"]] = None    # train_backbone: master weights and Adam state;
                                   # None = as the scorer holds them
  remat: Literal["full", "per_layer", "none"] = "per_layer"  # train_backbone: what the backward pass recomputes

  def validate(self) -> "TrainConfig":
    if self.loss not in LOSSES:
      raise TrainError(f"loss={self.loss!r} is not one of {sorted(LOSSES)}")
    if self.head not in HEADS:
      raise TrainError(f"head={self.head!r} is not one of {sorted(HEADS)}")
    for name in ("batch_size", "num_epochs", "keep_checkpoints", "log_every"):
      if getattr(self, name) < 1:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 1")
    OptimizerConfig.of(self).validate()
    check_finite(self, "distill_temperature", 0.0, above=True)
    if not 0.0 <= self.distill_weight <= 1.0 or (self.distill_weight and self.loss != "listwise"):
      raise TrainError(f"distill_weight={self.distill_weight} must be in [0, 1], and 0 unless loss=listwise (it "
                       f"mixes LCE on the grades with distillation; loss={self.loss!r})")
    if self.patience < 0 or (self.patience and not self.select_metric):
      raise TrainError(f"patience={self.patience} must be >= 0, and 0 without select_metric (it counts dev evals "
                       f"without a gain on that metric)")
    if self.group_size == 1 or self.group_size < 0:
      raise TrainError(f"group_size={self.group_size} must be 0 (every candidate) or >= 2 (a positive and negatives)")
    for name in ("num_steps", "warmup_steps", "eval_every", "save_every", "rank"):
      if getattr(self, name) < 0:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 0")
    check_finite(self, "match_loss_weight", 0.0)
    if self.match_loss_weight and not self.train_backbone:
      raise TrainError(f"match_loss_weight={self.match_loss_weight} must be >= 0, and 0 without train_backbone "
                       "(it trains the decoder)")
    if self.grad_accum_steps < 1 or self.batch_size % self.grad_accum_steps:
      raise TrainError(f"grad_accum_steps={self.grad_accum_steps} must be >= 1 and divide batch_size={self.batch_size}")
    if self.remat not in REMAT:
      raise TrainError(f"remat={self.remat!r} is not one of {list(REMAT)}")
    if self.coverage_on not in COVERAGE_ON:
      raise TrainError(f"coverage_on={self.coverage_on!r} is not one of {list(COVERAGE_ON)}")
    self._validate_lora()
    self._validate_first_listwise()
    return self

  def _validate_first_listwise(self) -> None:
    if self.loss != "first_listwise":
      return
    if self.head != "lm_labels":
      raise TrainError(f"loss=first_listwise ranks a window by its identifier logits: it needs head=lm_labels, "
                       f"not {self.head!r}")
    if self.group_size or self.match_loss_weight:
      raise TrainError("loss=first_listwise trains one window per query: group_size and match_loss_weight must be 0")
    if self.listwise_window < 2:
      raise TrainError(f"listwise_window={self.listwise_window} must be >= 2")

  def _validate_lora(self) -> None:
    if self.lora_rank < 0:
      raise TrainError(f"lora_rank={self.lora_rank} must be >= 0 (0 = full fine-tuning, no adapters)")
    if self.lora_rank and not self.train_backbone:
      raise TrainError(f"lora_rank={self.lora_rank} trains adapters in the decoder: it needs train_backbone=true "
                       "(or lora_rank=0)")
    check_finite(self, "lora_alpha", 0.0, above=True)
    unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
    if unknown or not self.lora_targets or len(set(self.lora_targets)) != len(self.lora_targets):
      raise TrainError(f"lora_targets={list(self.lora_targets)} must name each target once, at least one, from "
                       f"the valid targets {list(LORA_TARGETS)}")

  def check_adapters_dir(self, adapters_dir: Optional[os.PathLike]) -> None:
    """Refuses an adapters directory to write when no LoRA adapters train."""
    if adapters_dir and self.lora is None:
      raise TrainError(f"--adapters_dir={adapters_dir} writes LoRA adapters: it needs --train_backbone and "
                       f"--lora_rank > 0 (--export_dir writes the trained model as a checkpoint)")

  @property
  def lora(self) -> Optional[LoraConfig]:
    """The run's LoRA settings, checked by validate (None: full fine-tuning, or the backbone frozen)."""
    if not (self.train_backbone and self.lora_rank):
      return None
    return LoraConfig(self.lora_rank, self.lora_alpha, self.lora_targets)

  def head_config(self, label_ids: Sequence[int], hidden_size: int) -> HeadConfig:
    try:
      return self._head_config(label_ids, hidden_size)
    except ValueError as e:
      raise TrainError(str(e)) from None

  def _head_config(self, label_ids: Sequence[int], hidden_size: int) -> HeadConfig:
    return HeadConfig(kind=self.head, label_token_ids=tuple(label_ids), hidden_size=hidden_size,
                      delta=self.delta if self.head == "lm_labels" else "full", rank=self.rank,
                      use_bias=self.use_bias if self.head == "lm_labels" else True,
                      num_outputs=self.num_outputs if self.head != "lm_labels" else 0,
                      mlp_hidden=self.mlp_hidden).validate()


@dataclasses.dataclass(frozen=True)
class TrainRun:
  """Where a head-training run reads its data and writes its state (configs/train.yml documents each)."""
  checkpoint_dir: Optional[str] = None     # backbone checkpoint; None = the embedded default
  jsonl: Optional[str] = None              # rerank set in the JSONL form; None (and no data_dir) = the embedded one
  groups_file: Optional[str] = None        # training groups (scripts/mine_negatives.py's JSONL) instead of the train split
  data_dir: Optional[str] = None           # BEIR dataset directory
  run_file: Optional[str] = None           # first-stage TREC run (with data_dir)
  train_split: str = "train"
  dev_split: str = "dev"                   # "" = no dev split
  rerank_top_k: int = 100                  # candidates per query (by first-stage rank); 0 = all
  max_train_queries: int = 0               # 0 = all
  max_dev_queries: int = 0                 # 0 = all
  workdir: str = "out/train_head"
  export_dir: Optional[str] = None
  adapters_dir: Optional[str] = None       # LoRA: adapters + trained head, for eval_rerank.py --adapters_dir
  export_only: bool = False                # export the stopped run in workdir instead of training on
  feature_cache: Optional[str] = None
  overwrite: bool = False
  progress: bool = True

  def validate(self) -> "TrainRun":
    for name in ("rerank_top_k", "max_train_queries", "max_dev_queries"):
      if getattr(self, name) < 0:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 0")
    return self

