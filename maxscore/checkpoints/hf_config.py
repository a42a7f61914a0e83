"""A Hugging Face config.json (or a GGUF file's metadata presented as one) -> ModelConfig.

Each supported family's keys map onto the Decoder's ModelConfig; a key the file leaves out takes the default
of transformers' config class for that family (HF_DEFAULTS, checked against the installed transformers by
tests/test_convert_exact.py), and anything unsupported (activation, RoPE type, biases, bidirectional
attention, a malformed number) is a ConversionError naming the key. Conversion never guesses.
"""

import pathlib
from typing import Any, Optional

from layers.config import ModelConfig
from maxscore.checkpoints.storage import read_json_object

# config.json model_type -> ModelConfig.family
FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
            "gemma2": "gemma2", "gemma3_text": "gemma3"}
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")

# What transformers' config class of each family takes for a key config.json leaves out (transformers 5;
# tests/test_convert_exact.py checks each against the installed transformers). Conversion never guesses.
_COMMON = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "max_position_embeddings": 2048},
    "mistral": {**_COMMON, "max_position_embeddings": 131072, "sliding_window": 4096, "num_key_value_heads": 8},
    "qwen2": {**_COMMON, "max_position_embeddings": 32768, "num_key_value_heads": 32, "sliding_window": None,
              "use_sliding_window": False, "max_window_layers": 28},
    "qwen3": {**_COMMON, "max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128,
              "sliding_window": None, "use_sliding_window": False, "max_window_layers": 28},
    "gemma": {**_COMMON, "tie_word_embeddings": True, "max_position_embeddings": 8192, "head_dim": 256,
              "num_key_value_heads": 16},
    "gemma2": {**_COMMON, "tie_word_embeddings": True, "max_position_embeddings": 8192, "head_dim": 256,
               "num_key_value_heads": 4, "sliding_window": 4096, "query_pre_attn_scalar": 256,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma3_text": {**_COMMON, "tie_word_embeddings": True, "max_position_embeddings": 131072, "head_dim": 256,
                    "num_key_value_heads": 4, "sliding_window": 4096, "query_pre_attn_scalar": 256,
                    "attn_logit_softcapping": None, "final_logit_softcapping": None, "rope_theta": 1_000_000.0,
                    "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6},
}
# config.json keys read as numbers: integers, and (int or float) reals; those in _NULLABLE may be null.
_INT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window", "max_window_layers",
             "sliding_window_pattern")
_REAL_KEYS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar", "attn_logit_softcapping",
              "final_logit_softcapping")
_NULLABLE = ("num_key_value_heads", "head_dim", "sliding_window", "attn_logit_softcapping", "final_logit_softcapping")


class ConversionError(ValueError):
  """The Hugging Face directory cannot be converted; the message names the file or key."""


def _pattern(uses_window: list[bool]) -> str:
  """The shortest layer_pattern (G: global attention, L: sliding window) that, cycled, gives `uses_window`."""
  letters = "".join("L" if x else "G" for x in uses_window) or "G"
  for p in range(1, len(letters) + 1):
    if all(letters[i] == letters[i % p] for i in range(len(letters))):
      return letters[:p]
  return letters


def _layer_uses_window(hf: dict[str, Any], model_type: str, layers: int) -> list[bool]:
  """Per layer: sliding-window attention? From `layer_types`, else each family's default rule."""
  types = hf.get("layer_types")
  if types is not None:
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown or len(types) != layers:
      raise ConversionError(f"config.json layer_types={types!r}: need {layers} entries of sliding_attention / "
                            "full_attention")
    return [t == "sliding_attention" for t in types]
  if hf.get("sliding_window") is None:
    return [False] * layers
  if model_type == "gemma2":
    return [(i + 1) % 2 == 1 for i in range(layers)]
  if model_type == "gemma3_text":
    period = int(hf["sliding_window_pattern"])
    return [(i + 1) % period != 0 for i in range(layers)]
  if model_type == "mistral":
    return [True] * layers
  if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
    return [i >= int(hf["max_window_layers"]) for i in range(layers)]
  return [False] * layers


def _rope(hf: dict[str, Any], model_type: str) -> tuple[dict, Optional[float]]:
  """(global RoPE parameters with rope_theta and rope_type, the local layers' base or None)."""
  params = dict(hf.get("rope_parameters") or {})
  local_theta = None
  if "full_attention" in params or "sliding_attention" in params:  # per layer type (Gemma 3)
    local = params.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
      raise ConversionError(f"config.json rope_parameters.sliding_attention.rope_type={local['rope_type']!r} "
                            "is not supported; supported: default")
    local_theta = local.get("rope_theta", hf.get("rope_local_base_freq"))
    params = dict(params.get("full_attention") or {})
  elif model_type == "gemma3_text":
    local_theta = hf["rope_local_base_freq"]
  scaling = hf.get("rope_scaling") or {}
  params.update({k: v for k, v in scaling.items() if k not in params})
  params.setdefault("rope_theta", hf["rope_theta"])
  params["rope_type"] = params.get("rope_type", params.get("type", "default"))
  return params, (None if local_theta is None else float(local_theta))


def _check_activation(hf: dict[str, Any], family: str) -> None:
  if family.startswith("gemma"):
    # Gemma 2/3 read hidden_activation; Gemma reads hidden_act, where the legacy "gelu" means the tanh GELU.
    act = hf.get("hidden_act") if family == "gemma" else hf.get("hidden_activation")
    if act not in GELU_TANH + (("gelu",) if family == "gemma" else ()):
      raise ConversionError(f"config.json hidden_activation={act!r} is not supported for {family}; "
                            f"supported: {list(GELU_TANH)}")
  elif hf.get("hidden_act", "silu") != "silu":
    raise ConversionError(f"config.json hidden_act={hf['hidden_act']!r} is not supported; supported: silu")


def _check_numbers(hf: dict[str, Any]) -> None:
  """Every numeric key present has a number of the right kind; each bad one is named."""
  bad = []
  for key in _INT_KEYS + _REAL_KEYS:
    if key not in hf or (hf[key] is None and key in _NULLABLE):
      continue
    kinds = (int,) if key in _INT_KEYS else (int, float)
    if isinstance(hf[key], bool) or not isinstance(hf[key], kinds):
      bad.append(f"{key}={hf[key]!r} (need {'an integer' if key in _INT_KEYS else 'a number'})")
  if bad:
    raise ConversionError(f"config.json: {'; '.join(bad)}")


def model_config_from_hf(hf: dict[str, Any]) -> ModelConfig:
  """ModelConfig from a Hugging Face config.json dict; a key it lacks takes transformers' default."""
  model_type = hf.get("model_type")
  if model_type not in FAMILIES:
    raise ConversionError(f"config.json model_type={model_type!r} is not supported; supported: {sorted(FAMILIES)}")
  family = FAMILIES[model_type]
  hf = {**HF_DEFAULTS[model_type], **hf}
  _check_numbers(hf)
  if hf.get("mlp_bias"):
    raise ConversionError("config.json mlp_bias=true is not supported (no supported family's checkpoint uses it)")
  if hf.get("use_bidirectional_attention"):
    raise ConversionError("config.json use_bidirectional_attention=true is not supported (a decoder scores causally)")
  if family == "qwen2" and hf.get("attention_bias") is False:
    raise ConversionError("config.json attention_bias=false is not supported for qwen2 (q/k/v biases expected)")
  _check_activation(hf, family)
  rope, local_theta = _rope(hf, model_type)
  if rope["rope_type"] not in ("default", "llama3", "linear"):
    raise ConversionError(f"config.json rope_type={rope['rope_type']!r} is not supported; supported: default, "
                          "linear, llama3")
  heads, layers = hf["num_attention_heads"], hf["num_hidden_layers"]
  pattern = _pattern(_layer_uses_window(hf, model_type, layers))
  kw = dict(
      family=family, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=layers, num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, mlp_dim=hf["intermediate_size"],
      rope_theta=float(rope["rope_theta"]), rms_norm_eps=float(hf["rms_norm_eps"]),
      tie_word_embeddings=bool(hf["tie_word_embeddings"]),
      attention_bias=bool(hf.get("attention_bias", False)) and family != "qwen2",
      max_position_embeddings=int(hf["max_position_embeddings"]),
      layer_pattern=pattern, sliding_window=hf.get("sliding_window") if "L" in pattern else None,
      rope_local_theta=local_theta)
  if family in ("gemma2", "gemma3"):
    kw.update(query_pre_attn_scalar=hf["query_pre_attn_scalar"], attn_logit_softcap=hf["attn_logit_softcapping"],
              final_logit_softcap=hf["final_logit_softcapping"])
  if rope["rope_type"] == "llama3":
    kw.update(rope_scaling_type="llama3", rope_scaling_factor=float(rope["factor"]),
              rope_low_freq_factor=float(rope["low_freq_factor"]),
              rope_high_freq_factor=float(rope["high_freq_factor"]),
              rope_original_max_position=int(rope["original_max_position_embeddings"]))
  elif rope["rope_type"] == "linear":
    kw.update(rope_scaling_type="linear", rope_scaling_factor=float(rope["factor"]))
  try:
    return ModelConfig(**kw).validate()
  except ValueError as e:
    raise ConversionError(f"config.json: {e}") from None


def read_hf_config(config_path: pathlib.Path) -> ModelConfig:
  """ModelConfig from config.json; a missing, unreadable or malformed file is a ConversionError naming it."""
  if not config_path.is_file():
    raise ConversionError(f"{config_path} does not exist or is not a file")
  hf = read_json_object(config_path, ConversionError, "is not valid JSON")
  try:
    return model_config_from_hf(hf)
  except KeyError as e:
    raise ConversionError(f"{config_path} lacks the key {e}") from None
  except (TypeError, ValueError) as e:
    if isinstance(e, ConversionError):
      raise
    raise ConversionError(f"{config_path}: {' '.join(str(e).split())}") from None
