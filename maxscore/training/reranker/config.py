"""The reranker recipe's settings: the head, loss, optional backbone, optimizer and loop (TrainConfig, in
sections) and where a run reads and writes (TrainRun); configs/train.yml documents every key."""

import dataclasses
import functools
import os
import types
import typing
from typing import Any, Literal, Mapping, Optional, Sequence

from layers.lora import TARGETS, LoraConfig
from maxscore.errors import TrainError
from maxscore.heads.head import HEADS, HeadConfig
from maxscore.training.reranker.losses import LOSSES
from maxscore.training.optimizer import OptimizerConfig, check_finite


LORA_TARGETS = TARGETS  # the projections LoRA can adapt (layers/lora.py)
REMAT = ("full", "per_layer", "none")  # full: the whole forward recomputed; per_layer: each layer; none: nothing
COVERAGE_ON = ("probe", "score")  # what the match losses' coverage ranking trains (MatchConfig.coverage_on)


@dataclasses.dataclass(frozen=True)
class WindowConfig:
  """loss=first_listwise: FIRST's training windows, one window prompt per query."""
  size: int = 20                   # passages per training window (positives first picked)
  identifiers: str = "letters"     # letters (A..Z) or numbers (1..100), each one token
  passage_tokens: int = 128        # each passage in a window cut to this many tokens
  window_tokens: int = 4096        # a window prompt's token budget; 0 = no limit
  chat: Optional[bool] = None      # the window prompt is a chat user turn; None: when the tokenizer has a template


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The ranking loss and its own parameters."""
  kind: Literal["listwise", "pairwise", "pointwise", "distill", "first_listwise"] = "listwise"  # distill: KL to a
                                   # teacher's scores; first_listwise: FIRST's loss on a window's identifier logits
  distill_temperature: float = 1.0  # distill (or listwise with distill_weight): both score lists are divided by it
  distill_weight: float = 0.0      # listwise: (1 - w) * LCE on the grades + w * distillation toward the groups'
                                   # teacher scores (at distill_temperature); 0 = LCE, 1 = distill alone
  window: Optional[WindowConfig] = None  # first_listwise: its windows (None for every other loss)


@dataclasses.dataclass(frozen=True)
class MatchConfig:
  """The auxiliary match losses of a training backbone: two probes, not exported, that find the query's tokens in
  each candidate (train.py)."""
  weight: float                    # their weight in the loss (> 0)
  coverage_on: Literal["probe", "score"] = "probe"  # the coverage ranking trains a probe, or the exported ranking
                                   # score itself (weak supervision from lexical overlap)


@dataclasses.dataclass(frozen=True)
class BackboneConfig:
  """A training backbone: the decoder fine-tuned with the head (no feature cache then)."""
  lora: Optional[LoraConfig] = None  # adapters of this rank train, the base stays frozen; None = full fine-tuning
  compute_dtype: Optional[Literal["float32", "bfloat16"]] = None  # activations; None = the scorer's
  param_dtype: Optional[Literal["float32", "bfloat16"]] = None    # master weights and Adam state; None = as the
                                   # scorer holds them
  remat: Literal["full", "per_layer", "none"] = "per_layer"  # what the backward pass recomputes
  match: Optional[MatchConfig] = None  # the auxiliary match losses; None = off


# The recipe's keys (configs/train.yml, each also a flag), in the order runs record them, and where each lives: a
# field of TrainConfig or of one of its sections. A path that ends at an optional section is a switch (on: the
# section exists); a key whose section is absent reports its value when off (its field's default, or OFF's).
KEYS = {
    "head": "head.kind", "delta": "head.delta", "rank": "head.rank", "use_bias": "head.use_bias",
    "num_outputs": "head.num_outputs", "mlp_hidden": "head.mlp_hidden",
    "loss": "loss.kind", "listwise_window": "loss.window.size", "listwise_identifiers": "loss.window.identifiers",
    "listwise_passage_tokens": "loss.window.passage_tokens", "listwise_window_tokens": "loss.window.window_tokens",
    "listwise_chat": "loss.window.chat", "distill_temperature": "loss.distill_temperature",
    "distill_weight": "loss.distill_weight",
    "select_metric": "select_metric", "patience": "patience", "group_size": "group_size",
    "learning_rate": "learning_rate", "end_learning_rate": "end_learning_rate", "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay", "clip_norm": "clip_norm", "batch_size": "batch_size", "num_epochs": "num_epochs",
    "num_steps": "num_steps", "seed": "seed", "log_every": "log_every", "eval_every": "eval_every",
    "save_every": "save_every", "keep_checkpoints": "keep_checkpoints",
    "train_backbone": "backbone", "match_loss_weight": "backbone.match.weight",
    "coverage_on": "backbone.match.coverage_on", "algorithm": "algorithm", "lora_rank": "backbone.lora.rank",
    "lora_alpha": "backbone.lora.alpha", "lora_targets": "backbone.lora.targets",
    "grad_accum_steps": "grad_accum_steps", "compute_dtype": "backbone.compute_dtype",
    "param_dtype": "backbone.param_dtype", "remat": "backbone.remat",
}
# A key's value while its section is absent, where that is not its field's default: a switch off (no backbone, no
# LoRA, no match losses), LoRA's scale (LoraConfig leaves it to its caller), and, with no window prompts, the chat
# form runs recorded then (it had no effect).
OFF = {"train_backbone": False, "lora_rank": 0, "lora_alpha": 16.0, "match_loss_weight": 0.0, "listwise_chat": True}
# Keys added after runs were written: a run's identity names one only when it differs from its value when off,
# the behaviour before it existed, so those runs still resume.
LATER = ("coverage_on", "lora_rank", "lora_alpha", "lora_targets", "grad_accum_steps", "compute_dtype", "param_dtype",
         "remat", "group_size", "distill_temperature", "distill_weight", "select_metric", "patience", "listwise_window",
         "listwise_identifiers", "listwise_passage_tokens", "listwise_window_tokens", "listwise_chat")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The recipe's settings in sections: the head (its own HeadConfig, label ids and width filled in by prepare),
  the loss with its parameters, and an optional backbone section (a training backbone: LoRA, dtypes, remat, the
  match losses); the optimizer and the loop are flat. `TrainConfig.of(**keys)` builds one from configs/train.yml's
  flat keys (the flags), refusing a setting that needs another; `flat()` gives them back."""
  head: HeadConfig = dataclasses.field(default_factory=HeadConfig)
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  backbone: Optional[BackboneConfig] = None
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
  algorithm: Optional[str] = None  # scorer algorithm for the frozen features; None = the scorer's choice
  grad_accum_steps: int = 1        # micro-batches per step whose gradients are averaged

  # --- the flat keys -------------------------------------------------------------------------------
  @classmethod
  def entry_fields(cls) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """Each key's type and field metadata (maxscore/config.py reads the keys of a section through this when it
    has it): a switch is a bool, every other key has its field's."""
    out = {}
    for key, path in KEYS.items():
      field, hint = _field(path)
      out[key] = (bool if key in SWITCHES else hint, field.metadata)
    return out

  @classmethod
  def from_entry(cls, values: Mapping[str, Any]) -> "TrainConfig":
    """maxscore/config.py's loader builds the section through this (the values typed by entry_fields)."""
    return cls.of(**values)

  @classmethod
  def of(cls, **keys: Any) -> "TrainConfig":
    """The settings of flat keys (any subset; the rest at their defaults), checked, in sections: a section the run
    does not have is not built (no window without loss=first_listwise, no backbone section without
    train_backbone, no LoRA without lora_rank, no match losses without match_loss_weight)."""
    unknown = sorted(set(keys) - set(KEYS))
    if unknown:
      raise TypeError(f"TrainConfig.of: unknown keys {unknown}")
    k = {key: keys.get(key, _default(key)) for key in KEYS}
    _check(k)
    window = None
    if k["loss"] == "first_listwise":
      window = WindowConfig(k["listwise_window"], k["listwise_identifiers"], k["listwise_passage_tokens"],
                            k["listwise_window_tokens"], k["listwise_chat"])
    backbone = None
    if k["train_backbone"]:
      lora = LoraConfig(k["lora_rank"], k["lora_alpha"], tuple(k["lora_targets"])) if k["lora_rank"] else None
      match = MatchConfig(k["match_loss_weight"], k["coverage_on"]) if k["match_loss_weight"] else None
      backbone = BackboneConfig(lora, k["compute_dtype"], k["param_dtype"], k["remat"], match)
    head = HeadConfig(kind=k["head"], delta=k["delta"], rank=k["rank"], use_bias=k["use_bias"],
                      num_outputs=k["num_outputs"], mlp_hidden=k["mlp_hidden"])
    loss = LossConfig(k["loss"], k["distill_temperature"], k["distill_weight"], window)
    top = {key: k[key] for key, path in KEYS.items() if "." not in path and key not in SWITCHES}
    return cls(head=head, loss=loss, backbone=backbone, **top)

  def flat(self) -> dict[str, Any]:
    """The flat keys of these settings (what `of` takes), in KEYS' order; a key whose section is absent has its
    value when off."""
    out = {}
    for key, path in KEYS.items():
      *sections, name = path.split(".")
      owner = self
      for part in sections:
        owner = getattr(owner, part)
        if owner is None:
          break
      if owner is None:
        out[key] = _off(key)
      elif key in SWITCHES:
        out[key] = getattr(owner, name) is not None
      else:
        out[key] = getattr(owner, name)
    return out

  def identity(self) -> dict[str, Any]:
    """The settings a resumed run must match: every key, except a later one (LATER) at its value when off, which
    runs written before it existed did not name."""
    return {k: v for k, v in self.flat().items() if not (k in LATER and v == _off(k))}

  def validate(self) -> "TrainConfig":
    """Refuses these settings where `of` would (TrainError, one line)."""
    _check(self.flat())
    return self

  @property
  def lora(self) -> Optional[LoraConfig]:
    """The run's LoRA settings (None: full fine-tuning, or the backbone frozen)."""
    return None if self.backbone is None else self.backbone.lora

  def with_chat(self, chat: Optional[bool]) -> "TrainConfig":
    """The window prompts' chat form as prepare resolved it for the tokenizer (None, or no windows: as they are)."""
    if self.loss.window is None or chat is None:
      return self
    window = dataclasses.replace(self.loss.window, chat=chat)
    return dataclasses.replace(self, loss=dataclasses.replace(self.loss, window=window))

  def check_adapters_dir(self, adapters_dir: Optional[os.PathLike]) -> None:
    """Refuses an adapters directory to write when no LoRA adapters train."""
    if adapters_dir and self.lora is None:
      raise TrainError(f"--adapters_dir={adapters_dir} writes LoRA adapters: it needs --train_backbone and "
                       f"--lora_rank > 0 (--export_dir writes the trained model as a checkpoint)")

  def check_init_from(self, init_from: Optional[os.PathLike]) -> None:
    """Refuses a warm start when no LoRA adapters train (it starts adapters and head from an earlier run's)."""
    if init_from and self.lora is None:
      raise TrainError(f"--init_from={init_from} starts LoRA adapters from an earlier run's: it needs "
                       f"--train_backbone and --lora_rank > 0")

  def head_config(self, label_ids: Sequence[int], hidden_size: int) -> HeadConfig:
    """The head with its labels and the backbone's width; a setting of another kind of head is left at its
    default (delta and use_bias are lm_labels', num_outputs linear's and mlp's)."""
    h = self.head
    lm = h.kind == "lm_labels"
    try:
      return dataclasses.replace(h, label_token_ids=tuple(label_ids), hidden_size=hidden_size,
                                 delta=h.delta if lm else "full", use_bias=h.use_bias if lm else True,
                                 num_outputs=0 if lm else h.num_outputs).validate()
    except ValueError as e:
      raise TrainError(str(e)) from None


@functools.cache
def _field(path: str) -> tuple[dataclasses.Field, Any]:
  """The field a key's path names (from TrainConfig down through its sections) and its type (kept: the flags,
  the loader, `of` and `flat` ask for every key's)."""
  owner = TrainConfig
  *sections, name = path.split(".")
  for part in sections:
    owner = _section_type(typing.get_type_hints(owner)[part])
  return next(f for f in dataclasses.fields(owner) if f.name == name), typing.get_type_hints(owner)[name]


def _section_type(hint: Any) -> Optional[type]:
  """The section dataclass a field's type names (through Optional), or None for a plain setting."""
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    hint = args[0] if len(args) == 1 else None
  return hint if dataclasses.is_dataclass(hint) else None


SWITCHES = tuple(k for k, p in KEYS.items() if _section_type(_field(p)[1]) is not None)  # train_backbone


def _default(key: str) -> Any:
  """A key's default: its field's, or its value when off (a switch, a field without a default)."""
  field, _ = _field(KEYS[key])
  if key in SWITCHES or field.default is dataclasses.MISSING:
    return OFF[key]
  return field.default


def _off(key: str) -> Any:
  """A key's value while its section is absent."""
  return OFF[key] if key in OFF else _default(key)


def _check(k: Mapping[str, Any]) -> None:
  """Refuses (TrainError) invalid flat keys, a setting of a section absent included, and settings that need
  another: LoRA and the match losses a training backbone, FIRST's loss an lm_labels head and one window a query."""
  s = types.SimpleNamespace(**k)
  if s.loss not in LOSSES:
    raise TrainError(f"loss={s.loss!r} is not one of {sorted(LOSSES)}")
  if s.head not in HEADS:
    raise TrainError(f"head={s.head!r} is not one of {sorted(HEADS)}")
  for name in ("batch_size", "num_epochs", "keep_checkpoints", "log_every"):
    if getattr(s, name) < 1:
      raise TrainError(f"{name}={getattr(s, name)} must be >= 1")
  OptimizerConfig.of(s).validate()
  check_finite(s, "distill_temperature", 0.0, above=True)
  if not 0.0 <= s.distill_weight <= 1.0 or (s.distill_weight and s.loss != "listwise"):
    raise TrainError(f"distill_weight={s.distill_weight} must be in [0, 1], and 0 unless loss=listwise (it "
                     f"mixes LCE on the grades with distillation; loss={s.loss!r})")
  if s.patience < 0 or (s.patience and not s.select_metric):
    raise TrainError(f"patience={s.patience} must be >= 0, and 0 without select_metric (it counts dev evals "
                     f"without a gain on that metric)")
  if s.group_size == 1 or s.group_size < 0:
    raise TrainError(f"group_size={s.group_size} must be 0 (every candidate) or >= 2 (a positive and negatives)")
  for name in ("num_steps", "warmup_steps", "eval_every", "save_every", "rank"):
    if getattr(s, name) < 0:
      raise TrainError(f"{name}={getattr(s, name)} must be >= 0")
  check_finite(s, "match_loss_weight", 0.0)
  if s.match_loss_weight and not s.train_backbone:
    raise TrainError(f"match_loss_weight={s.match_loss_weight} must be >= 0, and 0 without train_backbone "
                     "(it trains the decoder)")
  if s.grad_accum_steps < 1 or s.batch_size % s.grad_accum_steps:
    raise TrainError(f"grad_accum_steps={s.grad_accum_steps} must be >= 1 and divide batch_size={s.batch_size}")
  if s.remat not in REMAT:
    raise TrainError(f"remat={s.remat!r} is not one of {list(REMAT)}")
  if s.coverage_on not in COVERAGE_ON:
    raise TrainError(f"coverage_on={s.coverage_on!r} is not one of {list(COVERAGE_ON)}")
  if s.lora_rank < 0:
    raise TrainError(f"lora_rank={s.lora_rank} must be >= 0 (0 = full fine-tuning, no adapters)")
  if s.lora_rank and not s.train_backbone:
    raise TrainError(f"lora_rank={s.lora_rank} trains adapters in the decoder: it needs train_backbone=true "
                     "(or lora_rank=0)")
  check_finite(s, "lora_alpha", 0.0, above=True)
  unknown = [t for t in s.lora_targets if t not in LORA_TARGETS]
  if unknown or not s.lora_targets or len(set(s.lora_targets)) != len(s.lora_targets):
    raise TrainError(f"lora_targets={list(s.lora_targets)} must name each target once, at least one, from "
                     f"the valid targets {list(LORA_TARGETS)}")
  if s.loss != "first_listwise":
    return
  if s.head != "lm_labels":
    raise TrainError(f"loss=first_listwise ranks a window by its identifier logits: it needs head=lm_labels, "
                     f"not {s.head!r}")
  if s.group_size or s.match_loss_weight:
    raise TrainError("loss=first_listwise trains one window per query: group_size and match_loss_weight must be 0")
  if s.listwise_window < 2:
    raise TrainError(f"listwise_window={s.listwise_window} must be >= 2")


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
  init_from: Optional[str] = None          # LoRA: adapters + head of an earlier run to start from (a warm start)
  export_only: bool = False                # export the stopped run in workdir instead of training on
  feature_cache: Optional[str] = None
  overwrite: bool = False
  progress: bool = True

  def validate(self) -> "TrainRun":
    for name in ("rerank_top_k", "max_train_queries", "max_dev_queries"):
      if getattr(self, name) < 0:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 0")
    return self

