"""Random tiny Hugging Face Llama/Qwen3 models: the external parity oracle for tests (needs torch)."""

import pathlib
from typing import Any

HF_CONFIGS = {
    "qwen3": dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, max_position_embeddings=4096, tie_word_embeddings=True),
    "llama": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                  rope_theta=500000.0, max_position_embeddings=4096, tie_word_embeddings=False,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=64)),
}


def make_hf_model(family: str, vocab_size: int = 512, seed: int = 0, init_std: float = 0.25, **overrides: Any):
  """A random float32 HF causal LM with weights scaled so its next-token distributions are far from uniform."""
  import torch
  import transformers
  kw = dict(HF_CONFIGS[family], vocab_size=vocab_size, initializer_range=init_std, **overrides)
  model_type = kw.pop("model_type")
  cls = {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
         "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM)}[model_type]
  torch.manual_seed(seed)
  config = cls[0](**kw)
  config._attn_implementation = "eager"
  model = cls[1](config).eval()
  with torch.no_grad():  # non-trivial norm scales and biases so those code paths matter
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.3 * torch.randn_like(p))
  return model


def save_hf_model(model, directory: pathlib.Path, tokenizer_file: pathlib.Path | None = None,
                  max_shard_size: str | None = None) -> pathlib.Path:
  """save_pretrained as safetensors (sharded when max_shard_size is given), plus an optional tokenizer."""
  import shutil
  directory = pathlib.Path(directory)
  kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
  model.save_pretrained(directory, safe_serialization=True, **kw)
  if tokenizer_file is not None:
    shutil.copy2(tokenizer_file, directory / pathlib.Path(tokenizer_file).name)
  return directory


def hf_logits(model, token_ids) -> Any:
  """float32 logits [T, V] of one sequence from the HF model."""
  import torch
  with torch.no_grad():
    return model(torch.tensor([list(token_ids)])).logits[0].float().numpy()
