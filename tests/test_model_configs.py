"""configs/models/: each real model's abstract parameter count is its published figure (within 1%), and the
exact counts (total and non-embedding) where they were checked to the parameter."""

import dataclasses
from typing import Optional

import jax
import numpy as np
import pytest

from maxscore.checkpoints.storage import abstract_params
from maxscore.config import load_config


@dataclasses.dataclass(frozen=True)
class ParamCount:
  published: float                     # on the model card / Hugging Face page (embeddings counted once)
  exact: Optional[int] = None          # the count to the parameter, where checked
  non_embedding: Optional[int] = None  # the same without the embedding table


PARAM_COUNTS = {
    "gemma-2b": ParamCount(2.51e9),
    "gemma-2-2b": ParamCount(2.61e9),
    "gemma-2-9b": ParamCount(9.24e9),
    "gemma-3-1b": ParamCount(1.00e9),
    # Gemma 3 270M: 170M embedding + 100M transformer parameters; exact: the tensors of its GGUF (tests/test_gemma3.py)
    "gemma-3-270m": ParamCount(0.27e9, 268_098_176, 100_326_016),
    "llama3.2-1b": ParamCount(1.24e9, 1_235_814_400, 973_146_112),  # Llama-3.2-1B: 1.24B
    "mistral-7b": ParamCount(7.24e9),
    "qwen2-1.5b": ParamCount(1.54e9),
    "qwen3-0.6b": ParamCount(0.6e9, 596_049_920, 440_467_456),  # Qwen3-0.6B: 0.6B total, 0.44B non-embedding
    "qwen3-4b": ParamCount(4.0e9),
    "qwen3-8b": ParamCount(8.2e9),
    "smollm2-135m": ParamCount(134.5e6, 134_515_008, 106_203_456),  # SmolLM2-135M: tied 49,152 x 576 embeddings
}
EXACT = sorted(name for name, count in PARAM_COUNTS.items() if count.exact is not None)


def _abstract_count(model) -> int:
  return sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(abstract_params(model)))


@pytest.mark.parametrize("name", sorted(PARAM_COUNTS))
def test_param_count_matches_published(name):
  model = load_config([f"model_name={name}"]).model
  count = _abstract_count(model)
  assert count == model.num_params()
  assert abs(count / PARAM_COUNTS[name].published - 1) < 0.01, (name, count)


@pytest.mark.parametrize("name", EXACT)
def test_full_size_param_counts_match_published(name):
  model = load_config([f"model_name={name}"]).model
  expected = PARAM_COUNTS[name]
  assert _abstract_count(model) == expected.exact == model.num_params()
  assert model.non_embedding_params() == expected.non_embedding
