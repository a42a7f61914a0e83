"""Random tiny Hugging Face models of every supported family: the external parity oracle for tests (needs torch).

One builder for all families: `HF_CONFIGS` holds each family's tiny config (with the options
that make the family differ: head_dim != hidden/heads, soft-capping with small caps so the tanh
bends, sliding windows shorter than a test query, a local/global layer pattern, two RoPE bases).
"""

import pathlib
from typing import Any

_BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=4096)

HF_CONFIGS = {
    "qwen3": dict(_BASE, model_type="qwen3", rope_theta=1000000.0, tie_word_embeddings=True),
    "llama": dict(_BASE, model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=64)),
    "qwen2": dict(_BASE, model_type="qwen2", rope_theta=1000000.0, tie_word_embeddings=False),
    "mistral": dict(_BASE, model_type="mistral", rope_theta=10000.0, tie_word_embeddings=False, sliding_window=6),
    "gemma": dict(_BASE, model_type="gemma", head_dim=24, num_key_value_heads=1, rope_theta=10000.0,
                  hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True),
    "gemma2": dict(_BASE, model_type="gemma2", head_dim=24, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=20, sliding_window=6, attn_logit_softcapping=3.0,
                   final_logit_softcapping=4.0, tie_word_embeddings=True),
    "gemma3": dict(_BASE, model_type="gemma3_text", num_hidden_layers=3, head_dim=24, query_pre_attn_scalar=24,
                   hidden_activation="gelu_pytorch_tanh", sliding_window=5, tie_word_embeddings=True,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                   rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0, rope_theta=1000000.0),
                                    "sliding_attention": dict(rope_type="default", rope_theta=10000.0)}),
}


def _classes(model_type: str):
  import transformers
  return {"qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
          "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
          "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
          "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
          "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
          "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM),
          "gemma3_text": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM)}[model_type]


def make_hf_model(family: str, vocab_size: int = 512, seed: int = 0, init_std: float = 0.25, **overrides: Any):
  """A random float32 HF causal LM with weights scaled so its next-token distributions are far from uniform."""
  import torch
  kw = dict(HF_CONFIGS[family], vocab_size=vocab_size, initializer_range=init_std, **overrides)
  config_cls, model_cls = _classes(kw.pop("model_type"))
  torch.manual_seed(seed)
  config = config_cls(**kw)
  config._attn_implementation = "eager"
  model = model_cls(config).eval()
  gemma = family.startswith("gemma")
  with torch.no_grad():  # non-trivial norm scales and biases so those code paths matter
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):  # Gemma stores the (1 + w) offset w
        p.copy_((0.0 if gemma else 1.0) + 0.3 * torch.randn_like(p))
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


_BERT_WORDS = ("the", "a", "of", "to", "is", "list", "dict", "sort", "python", "assignment", "statement", "value")


def save_tiny_bert(directory: pathlib.Path, seed: int = 0, max_position_embeddings: int = 64) -> pathlib.Path:
  """A random tiny BertModel (float32 safetensors) and a WordPiece tokenizer over letters, digits, punctuation and a
  few words, saved as a transformers directory: the encoder of the bi-encoder teacher's tests."""
  import string
  import torch
  import transformers
  directory = pathlib.Path(directory)
  chars = string.ascii_lowercase + string.digits
  vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(chars + string.punctuation)
           + [f"##{c}" for c in chars] + list(_BERT_WORDS))
  tokenizer = transformers.BertTokenizer(vocab={t: i for i, t in enumerate(vocab)})
  config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=max_position_embeddings)
  torch.manual_seed(seed)
  model = transformers.BertModel(config).eval()
  model.save_pretrained(directory, safe_serialization=True)
  tokenizer.save_pretrained(directory)
  return directory
