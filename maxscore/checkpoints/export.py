"""maxscore checkpoint -> Hugging Face transformers directory, without torch: convert.py run backwards
(docs/ARCHITECTURE.md section 9).

The directory holds `config.json` (the family's `model_type` and `architectures`, every key transformers needs),
`model.safetensors` (written with safetensors' numpy API) and the checkpoint's tokenizer files as they are, so
`transformers.AutoModelForCausalLM.from_pretrained` loads it, and vLLM, TEI or sglang can serve it.

One table, two directions: the tensors are mapped by convert.py's `_global_specs` / `_layer_specs`, each
transform undone by its `Rearrange.inverse`; the config.json written is read back by `model_config_from_hf`
before anything is written, and must give the checkpoint's model config again, or the export is refused
naming the fields that would change (a model config no transformers config expresses, e.g. a Mistral with
mixed local and global layers).

LoRA adapters (`adapters_dir`, maxscore/checkpoints/adapters.py) are merged into the base as eval_rerank.py
`--adapters_dir` merges them. A trained score head (`head/`) is no part of a causal LM: a checkpoint or adapter
directory holding one is refused unless `drop_head`, and then only the backbone is exported (it scores as the
checkpoint without its head).
"""

import dataclasses
import json
import logging
import os
import pathlib
import shutil
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from layers import quantization as quant
from layers.config import ModelConfig
from maxscore.checkpoints import storage
from maxscore.checkpoints.convert import DTYPES, _check_output_dir, _global_specs, _layer_specs, _shorten
from maxscore.checkpoints.hf_config import FAMILIES, ConversionError, _pattern, model_config_from_hf
from maxscore.errors import UnsafeOutputError
from maxscore.files import safety

MODEL_TYPES = {family: model_type for model_type, family in FAMILIES.items()}  # ModelConfig.family -> model_type
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3": "Gemma3ForCausalLM"}
# Families whose transformers config reads `layer_types` (transformers >= 4.53; older releases ignore the key and
# apply the family's rule from the legacy keys, which are written too).
_LAYER_TYPES = ("qwen2", "qwen3", "gemma2", "gemma3")
KIND = "hf_model"  # the ownership marker's kind (maxscore/files/safety.py)
HEAD_DIR, HEAD_JSON = "head", "head.json"  # a trained score head (maxscore/checkpoints/head_storage.py)


class ExportError(ValueError):
  """The checkpoint cannot be exported as a transformers directory; the message names what and why."""


def _real(x: Optional[float]) -> Optional[float]:
  """A float for a real-valued key (transformers 5's strict configs refuse an int there), None kept."""
  return None if x is None else float(x)


def _rope_scaling(model: ModelConfig) -> Optional[dict[str, Any]]:
  if model.rope_scaling_type == "llama3":
    return {"rope_type": "llama3", "factor": _real(model.rope_scaling_factor),
            "low_freq_factor": _real(model.rope_low_freq_factor),
            "high_freq_factor": _real(model.rope_high_freq_factor),
            "original_max_position_embeddings": model.rope_original_max_position}
  if model.rope_scaling_type == "linear":
    return {"rope_type": "linear", "factor": _real(model.rope_scaling_factor)}
  return None


def _window_keys(model: ModelConfig) -> dict[str, Any]:
  """The sliding-window keys of the family: `layer_types` where transformers reads it, and the legacy keys
  that give the same layers where the family has them."""
  local = list(model.layer_uses_window)
  window = model.sliding_window if any(local) else None
  keys: dict[str, Any] = {"sliding_window": window}
  if model.family in _LAYER_TYPES:
    keys["layer_types"] = ["sliding_attention" if x else "full_attention" for x in local]
  if model.family in ("qwen2", "qwen3"):
    keys.update(use_sliding_window=any(local), max_window_layers=local.index(True) if any(local) else len(local))
  elif model.family == "gemma3":
    keys["sliding_window_pattern"] = len(model.layer_pattern)
  return keys


def hf_config(model: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
  """The config.json of `model` for transformers (the legacy `rope_theta` / `rope_scaling` keys, which
  transformers 4 and 5 both read)."""
  family = model.family
  if family not in ARCHITECTURES:
    raise ExportError(f"model family {family!r} cannot be exported to transformers; supported: {sorted(ARCHITECTURES)}")
  hf: dict[str, Any] = {
      "architectures": [ARCHITECTURES[family]], "model_type": MODEL_TYPES[family], "vocab_size": model.vocab_size,
      "hidden_size": model.hidden_size, "intermediate_size": model.mlp_dim, "num_hidden_layers": model.num_layers,
      "num_attention_heads": model.num_heads, "num_key_value_heads": model.num_kv_heads, "head_dim": model.head_dim,
      "max_position_embeddings": model.max_position_embeddings, "rms_norm_eps": _real(model.rms_norm_eps),
      "rope_theta": _real(model.rope_theta), "rope_scaling": _rope_scaling(model),
      "tie_word_embeddings": model.tie_word_embeddings, "torch_dtype": dtype}
  if family not in ("qwen2", "mistral"):  # Qwen2: q/k/v biases, no o bias; Mistral: no biases (fixed in both)
    hf["attention_bias"] = model.attention_bias
  if family == "llama":
    hf["mlp_bias"] = False
  if family == "gemma":
    hf["hidden_act"] = "gelu_pytorch_tanh"
  elif family in ("gemma2", "gemma3"):
    hf["hidden_activation"] = "gelu_pytorch_tanh"
  else:
    hf["hidden_act"] = "silu"
  if family in ("gemma2", "gemma3"):
    scalar = model.query_pre_attn_scalar or model.head_dim
    hf.update(query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,  # transformers: an int
              attn_logit_softcapping=_real(model.attn_logit_softcap),
              final_logit_softcapping=_real(model.final_logit_softcap))
  if family == "gemma3":
    hf["rope_local_base_freq"] = _real(model.rope_theta if model.rope_local_theta is None else model.rope_local_theta)
  if family not in ("gemma", "llama"):  # no sliding windows
    hf.update(_window_keys(model))
  return hf


def _canonical(model: ModelConfig) -> ModelConfig:
  """`model` with the fields that do not change what it computes set as `model_config_from_hf` sets them (an
  unused sliding window or RoPE scaling factor, a pattern longer than its cycle, a default attention scale)."""
  kw: dict[str, Any] = {"layer_pattern": _pattern(list(model.layer_uses_window))}
  if "L" not in kw["layer_pattern"]:
    kw["sliding_window"] = None
  defaults = ModelConfig()
  unused = {None: ("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                   "rope_original_max_position"),
            "linear": ("rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_position")}
  kw.update({k: getattr(defaults, k) for k in unused.get(model.rope_scaling_type, ())})
  if model.family in ("gemma2", "gemma3") and model.query_pre_attn_scalar is None:
    kw["query_pre_attn_scalar"] = model.head_dim
  if model.family == "gemma3" and model.rope_local_theta is None and model.rope_scaling_type is None:
    kw["rope_local_theta"] = model.rope_theta
  return dataclasses.replace(model, **kw)


def check_config(model: ModelConfig, hf: dict[str, Any]) -> None:
  """Raises ExportError unless `hf` reads back (model_config_from_hf) as `model`; warns when the legacy keys
  alone (what transformers before 4.53 reads, without `layer_types`) would give other sliding-window layers."""
  try:
    back = model_config_from_hf(hf)
  except ConversionError as e:
    raise ExportError(f"the model config cannot be written as a {hf['model_type']} config.json: {e}") from None
  want = _canonical(model)
  diff = [f"{f.name}={getattr(want, f.name)!r} would read back as {getattr(back, f.name)!r}"
          for f in dataclasses.fields(ModelConfig) if getattr(want, f.name) != getattr(back, f.name)]
  if diff:
    raise ExportError(f"the model config cannot be written as a {hf['model_type']} config.json (transformers "
                      f"would build another model): {'; '.join(diff)}")
  if "layer_types" in hf:
    legacy = model_config_from_hf({k: v for k, v in hf.items() if k != "layer_types"})
    if legacy.layer_uses_window != back.layer_uses_window:
      logging.warning("the sliding-window layers are given by config.json's layer_types, which transformers "
                      "before 4.53 ignores; its %s rule would place them differently", hf["model_type"])


def hf_tensors(params: Any, model: ModelConfig, dtype: Any) -> dict[str, np.ndarray]:
  """The HF tensors (name -> contiguous numpy array in `dtype`) of the Decoder params, by convert.py's specs
  read backwards. A tensor holding NaN or Inf is refused, naming it."""
  params = jax.device_get(params)
  out: dict[str, np.ndarray] = {}

  def get(path: tuple[str, ...]) -> np.ndarray:
    tree = params
    for key in path:
      tree = tree[key]
    return np.asarray(tree)

  def put(name: str, w: np.ndarray) -> None:
    out[name] = np.ascontiguousarray(w.astype(dtype))  # safetensors writes the buffer as it lies

  for path, name, shape, fn in _global_specs(model):
    put(name, fn.inverse(get(path), shape))
  for path, template, shape, fn in _layer_specs(model):
    stacked = get(("layers",) + path)
    for i in range(model.num_layers):
      put(f"model.layers.{i}.{template}", fn.inverse(stacked[i], shape))
  non_finite = sorted(n for n, w in out.items() if not np.isfinite(w.astype(np.float32)).all())
  if non_finite:
    raise ExportError(f"tensors holding NaN or Inf values (a model with them scores nothing): {_shorten(non_finite)}")
  return out


def _head_dirs(*dirs: Optional[os.PathLike]) -> list[pathlib.Path]:
  return [pathlib.Path(d) / HEAD_DIR for d in dirs if d and (pathlib.Path(d) / HEAD_DIR / HEAD_JSON).is_file()]


def _check_output(output_dir: os.PathLike, inputs: tuple[Optional[os.PathLike], ...], overwrite: bool) -> None:
  """convert.py's output checks (no overlap with an input, only maxscore's directories replaced, --overwrite),
  and an existing output must be an earlier export, not another kind of maxscore output."""
  _check_output_dir(output_dir, pathlib.Path(inputs[0]), overwrite, inputs[1:])
  out = pathlib.Path(output_dir)
  if out.exists() and not safety.is_owned(out, KIND):
    raise UnsafeOutputError(f"output_dir {output_dir} holds a maxscore {safety.owner(out).get('kind')} output, not "
                            f"a transformers export; choose another path")


def export_hf_checkpoint(checkpoint_dir: os.PathLike, output_dir: os.PathLike, dtype: str = "float32",
                         adapters_dir: Optional[os.PathLike] = None, overwrite: bool = False,
                         drop_head: bool = False) -> pathlib.Path:
  """Writes a maxscore checkpoint (with its LoRA adapters merged, when given) as a transformers directory.

  Args:
    checkpoint_dir: a maxscore checkpoint (converted, trained, or a trainer's merged export).
    output_dir: the new directory; it may not be, hold or lie inside an input.
    dtype: float32 or bfloat16, the stored weights' dtype (and config.json's torch_dtype).
    adapters_dir: LoRA adapters trained on `checkpoint_dir` (train_reranker.py --adapters_dir), merged in float32
      as W + alpha / rank * A @ B.
    overwrite: replace an existing `output_dir`, only when it is an earlier export (its maxscore marker).
    drop_head: export the backbone of a checkpoint (or adapter directory) that holds a trained score head;
      without it such a checkpoint is refused, since the exported model would not score as the head does.

  Returns:
    The directory: config.json, model.safetensors and the checkpoint's tokenizer files.

  Raises:
    ExportError: a bad dtype, a score head without `drop_head`, a model config transformers cannot express, or
      a tensor with NaN/Inf. CheckpointError / LoraError: a missing or corrupt checkpoint or adapter directory,
      or adapters of another base. UnsafeOutputError: as convert_hf_checkpoint. Nothing is written on error.
  """
  if dtype not in DTYPES:
    raise ExportError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
  model, tokenizer = storage.read_metadata(checkpoint_dir)
  if storage.stored_quantization(checkpoint_dir) != "none":
    raise ExportError(f"{checkpoint_dir} holds int8 weights (converted with quantize=int8): export is conversion "
                      f"backwards and needs the float weights; export the checkpoint converted without quantize")
  adapters = None
  if adapters_dir:
    from maxscore.checkpoints import adapters as lora_lib  # pylint: disable=import-outside-toplevel  (heavy, optional)
    adapters = lora_lib.load_adapters_for(checkpoint_dir, adapters_dir)
  heads = _head_dirs(adapters_dir, checkpoint_dir)
  if heads and not drop_head:
    raise ExportError(f"{heads[0]} is a trained score head, which a causal LM has no place for: the exported model "
                      f"would score with the backbone's label probabilities, not the head's; pass --drop_head to "
                      f"export the backbone alone")
  _check_output(output_dir, (checkpoint_dir, adapters_dir), overwrite)
  hf = hf_config(model, dtype)
  check_config(model, hf)
  if heads:
    logging.warning("exporting the backbone only: the score head %s is dropped (the model scores without it)",
                    heads[0])
  params = storage.restore_checkpoint(checkpoint_dir, dtype=jnp.float32).params
  if adapters is not None:
    weights, lora, meta = adapters
    # QLoRA adapters were trained on the int8 base: quantize as in training; merge dequantizes it (float).
    params = quant.quantize_params(params, meta["base_quantization"], meta["base_quantization_group_size"])
    params = lora_lib.merge(lora_lib.add_adapters(params, weights), lora)
  tensors = hf_tensors(params, model, DTYPES[dtype])
  logging.info("exporting %s (%s, %d layers%s) to %s", checkpoint_dir, model.family, model.num_layers,
               f", adapters {adapters_dir} merged" if adapters_dir else "", output_dir)
  tok_files = sorted(p for p in tokenizer.parent.iterdir() if p.is_file()) if tokenizer else []
  _warn_about_tokenizer(tok_files)
  with safety.replace_dir(output_dir, KIND, overwrite, (checkpoint_dir, adapters_dir), "output_dir") as tmp:
    (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})  # "pt": what transformers expects
    os.chmod(tmp / "model.safetensors", (tmp / "config.json").stat().st_mode & 0o777)  # not save_file's 0600
    for f in tok_files:
      shutil.copy2(f, tmp / f.name)
  return safety.resolve(output_dir)


def _warn_about_tokenizer(files: list[pathlib.Path]) -> None:
  """A sentencepiece model alone (no tokenizer.json) is copied as is, but transformers' AutoTokenizer does not
  read it as sentencepiece does: it builds the family's BPE tokenizer from it, which encodes otherwise."""
  names = {f.name for f in files}
  if not files:
    logging.warning("the checkpoint has no tokenizer: the export holds none (serve it with the base model's)")
  elif "tokenizer.json" not in names and any(n.endswith(".model") for n in names):
    logging.warning("the checkpoint's tokenizer is a sentencepiece model without tokenizer.json: it is copied as "
                    "is, but transformers' AutoTokenizer builds the family's BPE tokenizer from it, which encodes text "
                    "otherwise than maxscore does: send the served model token ids, or add a tokenizer.json that "
                    "encodes as the .model does")
