"""The optimizer every training run uses: clip by global norm, then AdamW on warmup + cosine.

Frozen parameters (a LoRA base, a frozen backbone) are the optimizer's business: given a boolean
`trainable` pytree, the frozen leaves get zero updates and no Adam moments (optax.multi_transform
with set_to_zero), and the clipping norm counts the trainable gradients only.
"""

import dataclasses
import math
from typing import Any, Optional

import jax
import optax
from absl import logging

from maxscore.errors import TrainError


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The schedule and AdamW settings (each trainer's config carries these keys)."""
  learning_rate: float
  end_learning_rate: float
  warmup_steps: int
  weight_decay: float
  clip_norm: float

  @classmethod
  def of(cls, settings: Any) -> "OptimizerConfig":
    """The optimizer keys of a trainer's config (TrainConfig, PretrainConfig)."""
    return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)})

  def validate(self) -> "OptimizerConfig":
    """Refuses settings that train on nan or not at all: a nan or infinite rate gives a nan loss (and the run
    exits 0), a clip_norm <= 0 scales every update to 0 or turns it around, a negative weight decay grows the
    weights."""
    check_finite(self, "learning_rate", 0.0, above=True)
    check_finite(self, "end_learning_rate", 0.0)
    check_finite(self, "weight_decay", 0.0)
    check_finite(self, "clip_norm", 0.0, above=True)
    return self


def check_finite(settings: Any, name: str, low: float, above: bool = False) -> None:
  """Refuses (TrainError, one line) the float setting `name` of `settings` when it is nan, infinite, or below
  `low` (or equal to it, with `above`): the comparisons alone let nan through."""
  value = getattr(settings, name)
  if not (math.isfinite(value) and (value > low if above else value >= low)):
    raise TrainError(f"{name}={value} must be {'>' if above else '>='} {low:g} and finite")


def make_optimizer(settings: Any, total_steps: int,
                   trainable: Optional[Any] = None) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """clip_by_global_norm, then AdamW on linear warmup + cosine decay to end_learning_rate; with a
  `trainable` pytree of bools (the params' structure), frozen leaves are never updated.

  With a warmup the first step runs at learning_rate / warmup_steps (not 0: no update is spent on nothing), step
  warmup_steps at the peak, the last at end_learning_rate; without one the first step runs at the peak. The
  warmup takes at most half the run (a warning says when warmup_steps is cut), so a short run both reaches the
  peak and decays from it: warmup_steps=10 on a 4-step run would otherwise end at the peak rate."""
  cfg = OptimizerConfig.of(settings)
  warmup = min(cfg.warmup_steps, total_steps // 2)
  if warmup < cfg.warmup_steps:
    logging.warning("warmup_steps=%d is more than half of the run's %d steps: warming up for %d steps, then "
                    "decaying", cfg.warmup_steps, total_steps, warmup)
  # optax's warmup starts at 0: with a warmup the curve is read one step ahead, so the first update already
  # learns (at learning_rate / warmup), the last warmup step runs at the peak and the run's last step at
  # end_learning_rate. Without one the first step is the peak, as the curve starts.
  curve = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warmup, max(total_steps, warmup + 1),
                                             cfg.end_learning_rate)
  ahead = 1 if warmup else 0
  # Jitted: the loop logs schedule(step) from the host, and the schedule's jnp ops run eagerly would compile a
  # program each (8 compiles at a run's first log line, in every process) instead of one.
  schedule = jax.jit(lambda count: curve(count + ahead))
  opt = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adamw(schedule, weight_decay=cfg.weight_decay))
  if trainable is not None:
    labels = jax.tree_util.tree_map(lambda t: "train" if t else "frozen", trainable)
    opt = optax.multi_transform({"train": opt, "frozen": optax.set_to_zero()}, labels)
  return opt, schedule
