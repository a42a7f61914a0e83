"""configs/models/: each real model's abstract parameter count is its published figure (within 1%)."""

import jax
import numpy as np
import pytest

from maxscore.checkpoints.storage import abstract_params
from maxscore.config import load_config

# name -> parameter count published on the model card / Hugging Face page (embeddings counted once).
PUBLISHED = {
    "gemma-2b": 2.51e9,
    "gemma-2-2b": 2.61e9,
    "gemma-2-9b": 9.24e9,
    "gemma-3-1b": 1.00e9,
    "qwen2-1.5b": 1.54e9,
    "mistral-7b": 7.24e9,
    "qwen3-4b": 4.0e9,
    "qwen3-8b": 8.2e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_published(name):
  model = load_config([f"model_name={name}"]).model
  count = sum(int(np.prod(s.shape)) for s in jax.tree_util.tree_leaves(abstract_params(model)))
  assert count == model.num_params()
  assert abs(count / PUBLISHED[name] - 1) < 0.01, (name, count)
