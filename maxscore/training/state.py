"""The trainer's state: one flax struct that crosses `jit`, and its checkpoint form."""

from typing import Any

import flax
import jax
import numpy as np


@flax.struct.dataclass
class TrainState:
  """params, optimizer state, steps taken, the data position (epoch, index in the epoch's order) and
  the data-order PRNG key."""
  params: Any
  opt_state: Any
  step: Any
  epoch: Any
  index: Any
  rng: Any

  def to_dict(self) -> dict[str, Any]:
    """The checkpoint form (a plain dict: the layout runs written before TrainState existed resume from)."""
    return {"params": self.params, "opt_state": self.opt_state, "step": self.step, "epoch": self.epoch,
            "index": self.index, "rng": self.rng}

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "TrainState":
    return cls(**{k: d[k] for k in ("params", "opt_state", "step", "epoch", "index", "rng")})

  def position(self) -> tuple[int, int, int]:
    """(step, epoch, index) as Python ints."""
    return int(self.step), int(self.epoch), int(self.index)


def fresh(params: Any, opt_state: Any, data_key: jax.Array) -> TrainState:
  """Step 0 at the start of epoch 0."""
  return TrainState(params, opt_state, np.int32(0), np.int32(0), np.int32(0), np.asarray(data_key))
