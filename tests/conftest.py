"""Shared fixtures: random tiny Hugging Face models (the parity oracle), their converted checkpoints, tokenizers."""

import os
import pathlib

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import pytest

from maxscore.checkpoints.convert import convert_hf_checkpoint
from maxscore.lm.tokenizer_training import sample_texts, train_sentencepiece
from maxscore.testing import hf_models, tokenizers

# name -> (family, overrides): GQA with 1 and 2 kv heads, tied and untied, biases, Llama-3 rope scaling.
HF_VARIANTS = {
    "qwen3_kv2_tied": ("qwen3", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3_kv1_untied": ("qwen3", dict(num_key_value_heads=1, tie_word_embeddings=False)),
    "llama_kv2_untied_scaled_bias": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=False,
                                                   attention_bias=True)),
    "llama_kv1_tied": ("llama", dict(num_key_value_heads=1, tie_word_embeddings=True, rope_scaling=None)),
}

# One tiny model per further family (tests/test_families.py): windows 5-6 tokens, soft-caps, patterns.
FAMILY_VARIANTS = {name: (name, {}) for name in ("gemma", "gemma2", "gemma3", "qwen2", "mistral")}


@pytest.fixture(scope="session")
def sp_tokenizer_path(tmp_path_factory) -> pathlib.Path:
  return train_sentencepiece(tmp_path_factory.mktemp("sp") / "tok", sample_texts(), 512)


@pytest.fixture(scope="session")
def hf_tokenizer_path(tmp_path_factory) -> pathlib.Path:
  return tokenizers.train_hf_bpe(tmp_path_factory.mktemp("hf_tok") / "tokenizer.json", sample_texts(), 512)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
  """Builds each variant lazily: name -> (hf_model, hf_dir, maxscore checkpoint dir)."""
  root = tmp_path_factory.mktemp("hf")
  cache = {}

  def get(name: str, tokenizer_file=None):
    if name not in cache:
      family, overrides = {**HF_VARIANTS, **FAMILY_VARIANTS}[name]
      model = hf_models.make_hf_model(family, vocab_size=520, **overrides)
      hf_dir = hf_models.save_hf_model(model, root / name, tokenizer_file=tokenizer_file)
      cache[name] = (model, hf_dir, convert_hf_checkpoint(hf_dir, root / f"{name}_ckpt"))
    return cache[name]
  return get
