"""Hugging Face safetensors or GGUF -> maxscore Orbax checkpoint, without torch.

Families: Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 (text). Reads `config.json`
(old top-level `rope_theta`/`rope_scaling` keys, the newer `rope_parameters`, and Gemma 3's
per-layer-type `rope_parameters`), single or sharded safetensors, maps each tensor onto the
Decoder's param tree (layers stacked on a leading axis for `nn.scan`) and copies the tokenizer.

Conversion is exact: before anything is read or written, every tensor's shape and dtype is
checked against the config, and every tensor in the files must be consumed by the mapping or be
in `UNUSED_TENSORS`; anything else is an error naming the tensors (e.g. weights of a layer
beyond `num_hidden_layers`, which would otherwise be dropped silently).

One converter, two readers: a GGUF file (maxscore/checkpoints/gguf_reader.py) presents its metadata as a
config.json dict and its tensors under HF names, so the mapping, the checks and the writer here serve both.
The config.json -> ModelConfig mapping is maxscore/checkpoints/hf_config.py.
"""

import dataclasses
import functools
import json
import logging
import os
import pathlib
import re
import tempfile
from typing import Any, Iterator, Optional

import jax
import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open

from layers import quantization as quant
from layers.config import ModelConfig
from maxscore.checkpoints.hf_config import ConversionError, model_config_from_hf, read_hf_config
from maxscore.checkpoints.storage import save_checkpoint
from maxscore.checkpoints.tokenizer import find_tokenizer_file
from maxscore.errors import UnsafeOutputError
from maxscore.files import safety

DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}
STORED_QUANTIZATIONS = ("none", "int8")  # int8: int8 projection weights and float32 scales
SOURCE_DTYPES = ("F32", "BF16", "F16")  # safetensors dtypes of floating-point weights

# Tensors known to be unused, as regular expressions over HF names (each with why):
UNUSED_TENSORS = {
    # Rotary inverse frequencies some older checkpoints saved as buffers; recomputed from the config.
    r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq": "RoPE buffer, recomputed from rope_theta",
}
# With tied embeddings a saved lm_head must equal the embedding matrix (checked: one that differs is refused,
# as transformers would score with one of the two and the other is lost).
TIED_UNUSED = {r"lm_head\.weight": "tie_word_embeddings=true: the lm_head is the embedding matrix"}


class _TensorReader:
  """Lazy access to tensors across one or many safetensors files: names, shapes, dtypes, numpy arrays."""

  dtypes = SOURCE_DTYPES  # the storage dtypes conversion reads
  config_name = "config.json"  # where the config came from, and where the tensors are (for error messages)
  files_name = "the safetensors files"

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

  def names(self) -> set[str]:
    return set(self._files)

  def __contains__(self, name: str) -> bool:
    return name in self._files

  def _handle(self, name: str):
    if name not in self._files:
      raise ConversionError(f"tensor {name!r} is missing from the safetensors files")
    f = self._files[name]
    if f not in self._handles:
      if not f.is_file():
        raise ConversionError(f"safetensors shard {f} named in the index does not exist")
      self._handles[f] = safe_open(f, framework="flax")
    return self._handles[f]

  def shape_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
    """(shape, safetensors dtype string) from the file header, without reading the data."""
    sl = self._handle(name).get_slice(name)
    return tuple(sl.get_shape()), sl.get_dtype()

  def get(self, name: str, dtype) -> np.ndarray:
    return np.asarray(self._handle(name).get_tensor(name)).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Rearrange:
  """An HF tensor -> our param: transposed (2-D Linear weights are [out, in] in HF, [in, out] here) when
  `transpose`, then reshaped to `shape` (None: kept). A pure rearrangement, so `inverse` undoes it exactly:
  the same table maps both directions (convert here, maxscore/checkpoints/export.py back)."""
  transpose: bool = False
  shape: Optional[tuple[int, ...]] = None

  def __call__(self, w: np.ndarray) -> np.ndarray:
    w = w.T if self.transpose else w
    return w if self.shape is None else w.reshape(self.shape)

  def inverse(self, w: np.ndarray, hf_shape: tuple[int, ...]) -> np.ndarray:
    """Our param -> the HF tensor of shape `hf_shape`."""
    if not self.transpose:
      return w.reshape(hf_shape)
    return w.reshape(hf_shape[::-1]).T


Spec = tuple[tuple[str, ...], str, tuple[int, ...], Rearrange]  # (our path, HF name, HF shape, HF -> ours)


def _layer_specs(cfg: ModelConfig) -> Iterator[Spec]:
  """(our param path, HF tensor name template, HF shape, transform) for each per-layer tensor."""
  d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
  same = Rearrange()
  yield ("input_norm", "scale"), "input_layernorm.weight", (d,), same
  if cfg.sandwich_norm:  # Gemma 2/3: HF's post_attention_layernorm normalizes the attention output
    yield ("attn_out_norm", "scale"), "post_attention_layernorm.weight", (d,), same
    yield ("post_attn_norm", "scale"), "pre_feedforward_layernorm.weight", (d,), same
    yield ("mlp_out_norm", "scale"), "post_feedforward_layernorm.weight", (d,), same
  else:
    yield ("post_attn_norm", "scale"), "post_attention_layernorm.weight", (d,), same
  for name, heads in (("q", n), ("k", k), ("v", k)):
    yield ("attn", name), f"self_attn.{name}_proj.weight", (heads * h, d), Rearrange(True, (d, heads, h))
    if cfg.qkv_bias:
      yield ("attn", f"{name}_bias"), f"self_attn.{name}_proj.bias", (heads * h,), Rearrange(False, (heads, h))
  yield ("attn", "o"), "self_attn.o_proj.weight", (d, n * h), Rearrange(True, (n, h, d))
  if cfg.attention_bias:
    yield ("attn", "o_bias"), "self_attn.o_proj.bias", (d,), same
  if cfg.qk_norm:
    yield ("attn", "q_norm", "scale"), "self_attn.q_norm.weight", (h,), same
    yield ("attn", "k_norm", "scale"), "self_attn.k_norm.weight", (h,), same
  for name, shape in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f))):
    yield ("mlp", name), f"mlp.{name}_proj.weight", shape, Rearrange(transpose=True)


def _global_specs(cfg: ModelConfig) -> Iterator[Spec]:
  yield ("embed", "embedding"), "model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size), Rearrange()
  yield ("final_norm", "scale"), "model.norm.weight", (cfg.hidden_size,), Rearrange()
  if not cfg.tie_word_embeddings:
    yield ("lm_head",), "lm_head.weight", (cfg.vocab_size, cfg.hidden_size), Rearrange(transpose=True)


def _shorten(names: list[str], limit: int = 8) -> str:
  more = f" and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def check_tensors(reader: _TensorReader, cfg: ModelConfig, source_layers: Optional[int] = None) -> None:
  """Every expected tensor present with the config's shape and a float dtype; no tensor left unused, except
  the layers from cfg.num_layers to `source_layers` of a checkpoint cut to its first layers (`keep_layers`)."""
  expected = {name: shape for _, name, shape, _ in _global_specs(cfg)}
  for _, template, shape, _ in _layer_specs(cfg):
    expected.update({f"model.layers.{i}.{template}": shape for i in range(cfg.num_layers)})
  missing = sorted(n for n in expected if n not in reader)
  if missing:
    raise ConversionError(f"tensors missing from {reader.files_name} ({reader.config_name} expects them): "
                          f"{_shorten(missing)}")
  bad = []
  for name, shape in expected.items():
    got, dtype = reader.shape_dtype(name)
    if got != shape or dtype not in reader.dtypes:
      bad.append(f"{name} is {dtype}{list(got)}, {reader.config_name} implies {list(shape)} in one of "
                 f"{list(reader.dtypes)}")
  if bad:
    raise ConversionError(f"tensors do not match {reader.config_name}: " + "; ".join(bad[:8]) +
                          (f" and {len(bad) - 8} more" if len(bad) > 8 else ""))
  allowed = dict(UNUSED_TENSORS, **(TIED_UNUSED if cfg.tie_word_embeddings else {}))
  unused = sorted(n for n in reader.names() - set(expected) if not any(re.fullmatch(p, n) for p in allowed))
  if source_layers:
    cut = re.compile(r"model\.layers\.(\d+)\.")
    unused = [n for n in unused if not ((m := cut.match(n)) and cfg.num_layers <= int(m.group(1)) < source_layers)]
  if unused:
    raise ConversionError(f"tensors in {reader.files_name} that {reader.config_name} does not use (a conversion "
                          f"would drop them): {_shorten(unused)}")


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _check_tied_lm_head(reader: _TensorReader, cfg: ModelConfig) -> None:
  """With tied embeddings, a saved lm_head must be the embedding matrix: one that differs would be lost."""
  if not cfg.tie_word_embeddings or "lm_head.weight" not in reader:
    return
  head, embed = reader.get("lm_head.weight", np.float32), reader.get("model.embed_tokens.weight", np.float32)
  if head.shape != embed.shape or not np.array_equal(head, embed):
    raise ConversionError("config.json tie_word_embeddings=true, but the saved lm_head.weight differs from "
                          "model.embed_tokens.weight; conversion would drop one of them: set tie_word_embeddings "
                          "to what the checkpoint was trained with")


def convert_params(reader: _TensorReader, cfg: ModelConfig, dtype, source_layers: Optional[int] = None) -> dict:
  """The Decoder param tree (numpy) from HF tensors; layers stacked on axis 0. Checks come first;
  a tensor holding NaN or Inf is refused, naming it."""
  check_tensors(reader, cfg, source_layers)
  _check_tied_lm_head(reader, cfg)
  params: dict = {}
  non_finite: list[str] = []

  def read(name: str) -> np.ndarray:
    w = reader.get(name, dtype)
    if not np.isfinite(w.astype(np.float32)).all():
      non_finite.append(name)
    return w

  for path, name, _, fn in _global_specs(cfg):
    _set(params, path, fn(read(name)))
  for path, template, _, fn in _layer_specs(cfg):
    stacked = np.stack([fn(read(f"model.layers.{i}.{template}")) for i in range(cfg.num_layers)])
    _set(params, ("layers",) + path, stacked)
  if non_finite:
    raise ConversionError(f"tensors holding NaN or Inf values (a model with them scores nothing): "
                          f"{_shorten(non_finite)}")
  return params


def _check_output_dir(output_dir: os.PathLike, source: pathlib.Path, overwrite: bool,
                      more_sources: tuple[Optional[os.PathLike], ...] = ()) -> None:
  """Refuses, before minutes of reading tensors, an output_dir that is, holds or lies in `source` (or one of
  `more_sources`), one maxscore did not write, or an existing one without `overwrite`."""
  safety.refuse_overlap([output_dir], [source, *more_sources], "output_dir")
  out = pathlib.Path(output_dir)
  if out.exists() and not (out.is_dir() and safety.is_owned(out)):
    raise UnsafeOutputError(f"output_dir {output_dir} exists and was not written by maxscore (it has no "
                            f"{safety.MARKER} marker); it is left untouched: choose a new path")
  if out.exists() and not overwrite:
    raise UnsafeOutputError(f"output_dir {output_dir} already exists; pass --overwrite to replace it")


def keep_first_layers(cfg: ModelConfig, keep_layers: int) -> tuple[ModelConfig, Optional[int]]:
  """(the config of the model's first `keep_layers` decoder layers, the source's layer count) for a layerwise
  backbone, as bge-reranker-v2-minicpm-layerwise reads an early layer; 0 keeps every layer: (cfg, None). A
  cycled layer_pattern describes the first layers as it does the whole stack."""
  if not keep_layers:
    return cfg, None
  if not 1 <= keep_layers <= cfg.num_layers:
    raise ConversionError(f"keep_layers={keep_layers} must be between 1 and the model's {cfg.num_layers} layers "
                          "(0 keeps them all)")
  return dataclasses.replace(cfg, num_layers=keep_layers), cfg.num_layers


def convert_hf_checkpoint(hf_dir: os.PathLike, output_dir: os.PathLike, dtype: str = "float32",
                          overwrite: bool = False, quantize: str = "none", keep_layers: int = 0,
                          quantize_group_size: int = 0) -> pathlib.Path:
  """Converts a Hugging Face directory of a supported family into a self-describing maxscore checkpoint.

  Args:
    hf_dir: the Hugging Face model directory (config.json, safetensors weights, tokenizer files).
    output_dir: the new checkpoint directory; it may not be (or lie inside) `hf_dir`.
    dtype: float32 or bfloat16, the stored weights' dtype.
    overwrite: replace an existing `output_dir`, only when maxscore wrote it (maxscore/files/safety.py).
    keep_layers: keep only the first this many decoder layers (then the final norm and the head, as the whole
      model has them); 0 keeps every layer.
    quantize: none, or int8: store the projections (and a separate lm_head) as int8 weights with float32
      per-output-channel scales, as a scorer quantizes them at load (layers/quantization.py); maxscore.json
      then says `"quantization": "int8"`, and the checkpoint scores with quantization=int8_weights or int8.
    quantize_group_size: with quantize=int8, 0 (one scale per output channel) or G: one scale per G weights
      along the contracting dim (layers/quantization.py; maxscore.json records it).

  Returns:
    The checkpoint directory: params/, maxscore.json (model config and params digest) and, when `hf_dir` has
    a tokenizer, tokenizer/.

  Raises:
    ConversionError: an unsupported family or setting, a missing or unreadable file, or a tensor with NaN/Inf.
    UnsafeOutputError: `output_dir` exists and was not written by maxscore, or exists without `overwrite`.
  """
  hf_dir = pathlib.Path(hf_dir)
  if dtype not in DTYPES:
    raise ConversionError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
  _check_quantize(quantize, quantize_group_size)
  if not hf_dir.is_dir():
    raise ConversionError(f"--hf_dir {hf_dir} does not exist or is not a directory")
  _check_output_dir(output_dir, hf_dir, overwrite)
  cfg, source_layers = keep_first_layers(read_hf_config(hf_dir / "config.json"), keep_layers)
  _check_group_for(cfg, quantize_group_size)
  logging.info("converting %s (%s, %d layers, %.1fM params) to %s", hf_dir, cfg.family, cfg.num_layers,
               cfg.num_params() / 1e6, output_dir)
  try:
    params = convert_params(_TensorReader(hf_dir), cfg, DTYPES[dtype], source_layers)
  except (SafetensorError, OSError, ValueError) as e:
    if isinstance(e, ConversionError):
      raise
    raise ConversionError(f"{hf_dir}: cannot read the safetensors weights: {' '.join(str(e).split())}") from None
  tokenizer: Optional[pathlib.Path] = find_tokenizer_file(hf_dir)
  files = (tokenizer,) if tokenizer else ()
  for name in ("tokenizer_config.json", "chat_template.jinja"):  # special tokens; the chat template
    if tokenizer and (hf_dir / name).is_file():
      files += (hf_dir / name,)
  if quantize == "int8":  # both int8 modes read the same int8 weights and scales
    params = jax.tree_util.tree_map(np.asarray, quant.quantize_params(params, "int8_weights", quantize_group_size))
  return save_checkpoint(output_dir, params, cfg, tokenizer_files=files, overwrite=overwrite, inputs=(hf_dir,))


def _int8_params(params: dict, reader, cfg: ModelConfig, dtype, group_size: int = 0) -> dict:
  """`params` (float32) stored as int8 (layers/quantization.py's layout): each projection and a separate lm_head
  as int8 codes with float32 scales (per output channel, or per `group_size` weights along the contracting
  dim), the rest cast to `dtype`. A projection stored as Q8_0 keeps its codes and block scales as stored with
  group_size=32 (exact: no float round trip, no rounding); per channel it keeps them where every block of a
  channel shares one scale, else is requantized per channel from its exact float values
  (gguf_quants.q8_0_per_channel says why, and bounds the extra rounding). Every other tensor is quantized from
  its float values, as at load."""
  out = jax.tree_util.tree_map(np.asarray, quant.quantize_params(params, "int8_weights", group_size))
  get_int8 = getattr(reader, "get_int8", None)
  exact = total = 0
  specs = [(("layers",) + p, [f"model.layers.{i}.{t}" for i in range(cfg.num_layers)], f)
           for p, t, _, f in _layer_specs(cfg)] + [(p, [t], f) for p, t, _, f in _global_specs(cfg)]
  blocks = group_size == 32  # Q8_0's block: the stored layout
  for path, names, fn in specs:
    tree = functools.reduce(lambda t, key: t[key], path[:-1], out)
    name = path[-1]
    if get_int8 is None or f"{name}_scale" not in tree or (group_size and not blocks):
      continue  # not a quantized weight, or a group size no GGUF block has: quantized from the float values
    loaded = [get_int8(n, blocks=blocks) for n in names]
    if any(x is None for x in loaded):  # not Q8_0: quantized from the float values above
      continue
    stacked = path[0] == "layers"
    scale_shape = tree[f"{name}_scale"].shape[1:] if stacked else tree[f"{name}_scale"].shape
    codes = np.stack([fn(c) for c, *_ in loaded])
    if blocks:
      scales = np.stack([_block_scales(fn, s, codes.shape[1:], scale_shape) for _, s in loaded])
      total += len(loaded)
    else:
      scales = np.stack([s.reshape(scale_shape) for _, s, _ in loaded])
      exact += sum(int(e.sum()) for _, _, e in loaded)
      total += sum(e.size for _, _, e in loaded)
    tree[name] = (codes if stacked else codes[0]).astype(np.int8)
    tree[f"{name}_scale"] = (scales if stacked else scales[0]).astype(np.float32)
  if total and not blocks:
    logging.info("Q8_0 projections: %d of %d output channels loaded exactly (one block scale per channel), the "
                 "rest requantized per channel", exact, total)
  elif total:
    logging.info("Q8_0 projections: %d tensors loaded as stored (codes and block scales, group size 32)", total)
  cast = lambda path, x: x if quant.is_quantized_leaf(path) else np.asarray(x, dtype)
  return jax.tree_util.tree_map_with_path(cast, out)


def _check_quantize(quantize: str, group_size: int) -> None:
  if quantize not in STORED_QUANTIZATIONS:
    raise ConversionError(f"quantize={quantize!r} is not one of {list(STORED_QUANTIZATIONS)}")
  if group_size < 0 or (group_size and quantize != "int8"):
    raise ConversionError(f"quantize_group_size={group_size} must be 0, or a group size with quantize=int8")


def _check_group_for(cfg: ModelConfig, group_size: int) -> None:
  problem = quant.group_size_problem("quantize_group_size", group_size, cfg)
  if problem:
    raise ConversionError(problem)


def _block_scales(fn, scale_OxB: np.ndarray, weight_shape: tuple, scale_shape: tuple) -> np.ndarray:
  """Q8_0 block scales [out, in / 32] in our per-group layout `scale_shape`: each scale is repeated over its 32
  weights, put through the weight's own rearrangement `fn`, and read once per group along the axis the groups
  divide. Every group must then hold one scale (blocks never straddle a group: 32 divides the contracting dims)."""
  full = fn(np.repeat(scale_OxB, 32, axis=1))
  axis = next(i for i, (w, s) in enumerate(zip(weight_shape, scale_shape)) if w != s)
  out = np.take(full, np.arange(0, weight_shape[axis], 32), axis=axis)
  if not np.array_equal(np.repeat(out, 32, axis=axis), full):
    raise ConversionError(f"Q8_0 blocks of a weight of shape {weight_shape} straddle its scale groups")
  return out.reshape(scale_shape)


def _gguf_model_config(f, hf: dict) -> ModelConfig:
  """The model config of a parsed GGUF file `f` from its config.json dict `hf` (gguf_reader.hf_config)."""
  from maxscore.checkpoints import gguf_reader  # pylint: disable=import-outside-toplevel
  try:
    return model_config_from_hf(hf)
  except ConversionError as e:
    raise ConversionError(f"{f.path}: its metadata, read as {e}") from None
  except KeyError as e:
    raise ConversionError(f"{f.path}: the metadata lacks {gguf_reader.gguf_key(f, e.args[0])}") from None


def gguf_model_config(gguf_path: os.PathLike) -> ModelConfig:
  """The model config of a GGUF file (every layer), from its metadata alone: no tensor is read. ConversionError
  as convert_gguf_checkpoint's."""
  from maxscore.checkpoints import gguf_reader  # pylint: disable=import-outside-toplevel
  try:
    f = gguf_reader.GGUFFile(pathlib.Path(gguf_path))
    return _gguf_model_config(f, gguf_reader.hf_config(f))
  except gguf_reader.GGUFError as e:
    raise ConversionError(str(e)) from None


def convert_gguf_checkpoint(gguf_path: os.PathLike, output_dir: os.PathLike, dtype: str = "float32",
                            overwrite: bool = False, quantize: str = "none", keep_layers: int = 0,
                            quantize_group_size: int = 0) -> pathlib.Path:
  """Converts a GGUF file (llama.cpp's format) of a supported architecture into a self-describing checkpoint.

  The metadata becomes the model config (as the config.json it stands for), the tensors are dequantized to
  float32 exactly as llama.cpp's reference dequantizers do and mapped by the same specs and checks as a
  Hugging Face directory's; the tokenizer metadata becomes tokenizer.json with its chat template.

  Args:
    gguf_path: the .gguf file (one file; split GGUFs are refused by their split.* keys).
    output_dir: the new checkpoint directory; it may not be the GGUF file nor hold it.
    dtype: float32 or bfloat16, the stored weights' dtype.
    overwrite: replace an existing `output_dir`, only when maxscore wrote it.
    quantize: none, or int8: store the projections (and a separate lm_head) as int8 with float32 per-output-channel
      scales, as convert_hf_checkpoint does; Q8_0 tensors keep their codes where that is exact (`_int8_params`).
    quantize_group_size: as convert_hf_checkpoint's; 32 (Q8_0's block) loads Q8_0 tensors as stored, exactly.
    keep_layers: keep only the first this many decoder layers, as convert_hf_checkpoint; 0 keeps every layer.

  Returns:
    The checkpoint directory (params/, maxscore.json and, when the GGUF has tokenizer metadata, tokenizer/).

  Raises:
    ConversionError: an unknown architecture, metadata key or tensor type, a truncated file, a tensor that does not
      match the metadata, or a tensor with NaN/Inf; nothing is written.
    UnsafeOutputError: as convert_hf_checkpoint.
  """
  from maxscore.checkpoints import gguf_reader, gguf_tokenizer  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(gguf_path)
  if dtype not in DTYPES:
    raise ConversionError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
  _check_quantize(quantize, quantize_group_size)
  if not path.is_file():
    raise ConversionError(f"--gguf {path} does not exist or is not a file")
  _check_output_dir(output_dir, path, overwrite)
  try:
    f = gguf_reader.GGUFFile(path)
    hf = gguf_reader.hf_config(f)
    cfg, source_layers = keep_first_layers(_gguf_model_config(f, hf), keep_layers)
    _check_group_for(cfg, quantize_group_size)
    logging.info("converting %s (%s, %d layers, %.1fM params) to %s", path, cfg.family, cfg.num_layers,
                 cfg.num_params() / 1e6, output_dir)
    with tempfile.TemporaryDirectory(prefix="maxscore-gguf-tokenizer-") as tmp:
      files = gguf_tokenizer.build_tokenizer(f, pathlib.Path(tmp)) or ()
      reader = gguf_reader.GGUFTensorReader(f, hf)
      if quantize == "int8":
        params = _int8_params(convert_params(reader, cfg, np.float32, source_layers), reader, cfg, DTYPES[dtype],
                              quantize_group_size)
      else:
        params = convert_params(reader, cfg, DTYPES[dtype], source_layers)
      return save_checkpoint(output_dir, params, cfg, tokenizer_files=files, overwrite=overwrite, inputs=(path,))
  except gguf_reader.GGUFError as e:
    raise ConversionError(str(e)) from None
