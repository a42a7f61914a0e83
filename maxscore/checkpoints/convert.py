"""Hugging Face (Llama / Qwen3) safetensors -> maxscore Orbax checkpoint, without torch.

Reads `config.json` (old top-level `rope_theta`/`rope_scaling` keys and the newer
`rope_parameters`), single or sharded safetensors, maps each tensor onto the Decoder's
param tree (layers stacked on a leading axis for `nn.scan`) and copies the tokenizer.
"""

import json
import logging
import os
import pathlib
from typing import Any, Callable, Iterator, Optional

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from layers.config import ModelConfig
from maxscore.checkpoints.storage import save_checkpoint
from maxscore.checkpoints.tokenizer import find_tokenizer_file
from maxscore.errors import UnsafeOutputError
from maxscore.files import safety

FAMILIES = {"llama": "llama", "qwen3": "qwen3"}
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


class ConversionError(ValueError):
  """The Hugging Face directory cannot be converted; the message names the file or key."""


def model_config_from_hf(hf: dict[str, Any]) -> ModelConfig:
  """ModelConfig from a Hugging Face config.json dict."""
  model_type = hf.get("model_type")
  if model_type not in FAMILIES:
    raise ConversionError(f"config.json model_type={model_type!r} is not supported; supported: {sorted(FAMILIES)}")
  if hf.get("mlp_bias"):
    raise ConversionError("config.json mlp_bias=true is not supported (no Llama-3/Qwen3 checkpoint uses it)")
  if hf.get("use_sliding_window"):
    raise ConversionError("config.json use_sliding_window=true is not supported")
  rope = dict(hf.get("rope_parameters") or {})
  scaling = hf.get("rope_scaling") or {}
  rope.update({k: v for k, v in scaling.items() if k not in rope})
  theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type not in ("default", "llama3"):
    raise ConversionError(f"config.json rope_type={rope_type!r} is not supported; supported: default, llama3")
  heads = hf["num_attention_heads"]
  kw = dict(
      family=FAMILIES[model_type], vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, mlp_dim=hf["intermediate_size"],
      rope_theta=float(theta), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      attention_bias=bool(hf.get("attention_bias", False)),
      max_position_embeddings=int(hf.get("max_position_embeddings", 4096)))
  if rope_type == "llama3":
    kw.update(rope_scaling_type="llama3", rope_scaling_factor=float(rope["factor"]),
              rope_low_freq_factor=float(rope["low_freq_factor"]),
              rope_high_freq_factor=float(rope["high_freq_factor"]),
              rope_original_max_position=int(rope["original_max_position_embeddings"]))
  return ModelConfig(**kw).validate()


class _TensorReader:
  """Lazy access to tensors across one or many safetensors files, as numpy arrays."""

  def __init__(self, hf_dir: pathlib.Path):
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
      weight_map = json.loads(index.read_text())["weight_map"]
      self._files = {name: hf_dir / f for name, f in weight_map.items()}
    elif (hf_dir / "model.safetensors").is_file():
      f = hf_dir / "model.safetensors"
      with safe_open(f, framework="flax") as h:
        self._files = {name: f for name in h.keys()}
    else:
      raise ConversionError(f"{hf_dir} has neither model.safetensors nor model.safetensors.index.json")
    self._handles: dict[pathlib.Path, Any] = {}

  def __contains__(self, name: str) -> bool:
    return name in self._files

  def get(self, name: str, dtype) -> np.ndarray:
    if name not in self._files:
      raise ConversionError(f"tensor {name!r} is missing from the safetensors files")
    f = self._files[name]
    if f not in self._handles:
      if not f.is_file():
        raise ConversionError(f"safetensors shard {f} named in the index does not exist")
      self._handles[f] = safe_open(f, framework="flax")
    return np.asarray(self._handles[f].get_tensor(name)).astype(dtype)


def _layer_specs(cfg: ModelConfig) -> Iterator[tuple[tuple[str, ...], str, Callable[[np.ndarray], np.ndarray]]]:
  """(our param path, HF tensor name template, transform) for each per-layer tensor."""
  d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  yield ("input_norm", "scale"), "input_layernorm.weight", lambda w: w
  yield ("post_attn_norm", "scale"), "post_attention_layernorm.weight", lambda w: w
  for name, heads in (("q", n), ("k", k), ("v", k)):
    yield ("attn", name), f"self_attn.{name}_proj.weight", lambda w, heads=heads: w.T.reshape(d, heads, h)
    if cfg.attention_bias:
      yield ("attn", f"{name}_bias"), f"self_attn.{name}_proj.bias", lambda w, heads=heads: w.reshape(heads, h)
  yield ("attn", "o"), "self_attn.o_proj.weight", lambda w: w.T.reshape(n, h, d)
  if cfg.attention_bias:
    yield ("attn", "o_bias"), "self_attn.o_proj.bias", lambda w: w
  if cfg.qk_norm:
    yield ("attn", "q_norm", "scale"), "self_attn.q_norm.weight", lambda w: w
    yield ("attn", "k_norm", "scale"), "self_attn.k_norm.weight", lambda w: w
  for name in ("gate", "up", "down"):
    yield ("mlp", name), f"mlp.{name}_proj.weight", lambda w: w.T


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def convert_params(reader: _TensorReader, cfg: ModelConfig, dtype) -> dict:
  """The Decoder param tree (numpy) from HF tensors; layers stacked on axis 0."""
  params: dict = {}
  _set(params, ("embed", "embedding"), reader.get("model.embed_tokens.weight", dtype))
  _set(params, ("final_norm", "scale"), reader.get("model.norm.weight", dtype))
  for path, template, fn in _layer_specs(cfg):
    stacked = np.stack([fn(reader.get(f"model.layers.{i}.{template}", dtype)) for i in range(cfg.num_layers)])
    _set(params, ("layers",) + path, stacked)
  if not cfg.tie_word_embeddings:
    _set(params, ("lm_head",), reader.get("lm_head.weight", dtype).T)
  return params


def _read_hf_config(config_path: pathlib.Path) -> ModelConfig:
  """ModelConfig from config.json; a missing, unreadable or malformed file is a ConversionError naming it."""
  if not config_path.is_file():
    raise ConversionError(f"{config_path} does not exist or is not a file")
  try:
    hf = json.loads(config_path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
    raise ConversionError(f"{config_path} is not valid JSON: {e}") from None
  if not isinstance(hf, dict):
    raise ConversionError(f"{config_path} must hold a JSON object, got {type(hf).__name__}")
  try:
    return model_config_from_hf(hf)
  except KeyError as e:
    raise ConversionError(f"{config_path} lacks the key {e}") from None
  except (TypeError, ValueError) as e:
    if isinstance(e, ConversionError):
      raise
    raise ConversionError(f"{config_path}: {' '.join(str(e).split())}") from None


def convert_hf_checkpoint(hf_dir: os.PathLike, output_dir: os.PathLike, dtype: str = "float32",
                          overwrite: bool = False) -> pathlib.Path:
  """Converts a Hugging Face Llama/Qwen3 directory into a self-describing maxscore checkpoint.

  `output_dir` may not be (or lie inside) `hf_dir`; an existing one is replaced only with `overwrite`
  and only when maxscore wrote it (maxscore/files/safety.py)."""
  hf_dir = pathlib.Path(hf_dir)
  if dtype not in DTYPES:
    raise ConversionError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
  if not hf_dir.is_dir():
    raise ConversionError(f"--hf_dir {hf_dir} does not exist or is not a directory")
  safety.refuse_overlap([output_dir], [hf_dir], "output_dir")
  if pathlib.Path(output_dir).exists() and not overwrite:  # before minutes of reading tensors
    raise UnsafeOutputError(f"output_dir {output_dir} already exists; pass --overwrite to replace it")
  cfg = _read_hf_config(hf_dir / "config.json")
  logging.info("converting %s (%s, %d layers, %.1fM params) to %s", hf_dir, cfg.family, cfg.num_layers,
               cfg.num_params() / 1e6, output_dir)
  try:
    params = convert_params(_TensorReader(hf_dir), cfg, DTYPES[dtype])
  except (SafetensorError, OSError, ValueError) as e:
    if isinstance(e, ConversionError):
      raise
    raise ConversionError(f"{hf_dir}: cannot read the safetensors weights: {' '.join(str(e).split())}") from None
  tokenizer: Optional[pathlib.Path] = find_tokenizer_file(hf_dir)
  files = (tokenizer,) if tokenizer else ()
  if tokenizer and (hf_dir / "tokenizer_config.json").is_file():
    files += (hf_dir / "tokenizer_config.json",)
  return save_checkpoint(output_dir, params, cfg, tokenizer_files=files, overwrite=overwrite, inputs=(hf_dir,))
