"""A GGUF file seen as a Hugging Face checkpoint: its config.json dict and its tensors under HF names.

One converter, two readers (docs/ARCHITECTURE.md section 6): `convert.py` maps HF tensor names onto
the Decoder's params and checks them; this reader presents a GGUF file through the same interface as
the safetensors reader, so those specs, checks and the writer are shared. What it undoes of
llama.cpp's converter (convert_hf_to_gguf.py):
  - tensor names: llama.cpp's `blk.N.attn_q.weight` scheme back to `model.layers.N.self_attn.q_proj.weight`;
  - the llama architecture's q/k rows, which llama.cpp permutes per head (interleaved RoPE halves);
  - Gemma's RMSNorm weights, which llama.cpp stores as `1 + w` (subtracted back in float32, as transformers does);
  - block quantization (maxscore/checkpoints/gguf_quants.py).

The file is read with the `gguf` package (llama.cpp's own reader), memory-mapped; a tensor is
dequantized only when it is read. Every metadata key must be known: one this reader does not map,
use or list as descriptive is an error naming it, so nothing in the file is silently dropped.
"""

import pathlib
from typing import Any, Optional

import numpy as np

from maxscore.checkpoints import gguf_quants

# general.architecture -> config.json model_type
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2",
                 "gemma3": "gemma3_text"}
_GEMMA = ("gemma", "gemma2", "gemma3")

# "{arch}.<key>" -> config.json key
_ARCH_KEYS = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
    "rope.freq_base_swa": "rope_local_base_freq",
    "vocab_size": "vocab_size",
    "attention.sliding_window": "sliding_window",
    "attn_logit_softcapping": "attn_logit_softcapping",
    "final_logit_softcapping": "final_logit_softcapping",
}
# "{arch}.<key>" read by this reader itself (checked against the config, or RoPE scaling)
_ARCH_CHECKED = ("attention.value_length", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor",
                 "attention.sliding_window_pattern")
# tokenizer.* keys: used to build tokenizer.json (maxscore/checkpoints/gguf_tokenizer.py) or naming special tokens
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.add_bos_token",
                  "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token", "tokenizer.ggml.add_space_prefix",
                  "tokenizer.chat_template")

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "ffn_norm": "post_attention_layernorm"}
# Gemma 2/3 put norms around both blocks: llama.cpp's ffn_norm is HF's pre_feedforward_layernorm there.
_SANDWICH_NAMES = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
                   "post_ffw_norm": "post_feedforward_layernorm"}
# What llama.cpp (llama-model.cpp) uses for Gemma 2/3 where the file states nothing: 1/sqrt(head_dim) as the
# attention scale, except for the 27B models (46 and 62 layers), which scale by 1/sqrt(hidden / heads).
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


class GGUFError(ValueError):
  """A GGUF file this reader cannot present as a checkpoint; the message names the key, tensor or file."""


def _gguf():
  try:
    import gguf  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise GGUFError("reading GGUF files needs the gguf package: pip install gguf") from None
  return gguf


class _Truncated(Exception):
  """The parse needs bytes up to `end` of a file of `size` bytes."""

  def __init__(self, end: int, size: int):
    super().__init__(end, size)
    self.end, self.size = end, size


def plain_get(reader, offset, dtype, count=1, override_order=None):
  """GGUFReader._get (gguf 0.10-0.19: `count` values of `dtype` at byte `offset`) on a plain ndarray view of the
  reader's memory map, made once.

  The stock method slices the np.memmap itself, and each slice of a memmap builds a new memmap object; it
  slices twice per metadata value, so a 262,144-token vocabulary (Gemma 3) took about 15 s to parse, most of
  it in np.memmap's __getitem__ and __array_finalize__. The plain view holds the same bytes (and keeps the map
  alive); tensors are still read from the map only when used."""
  plain = reader.__dict__.get("_plain")
  if plain is None:
    plain = reader._plain = reader.data.view(np.ndarray)
  count = int(count)
  end = offset + np.dtype(dtype).itemsize * count
  if end > len(plain):  # a cut file: say so, rather than an IndexError from the short slice further in
    raise _Truncated(end, len(plain))
  arr = plain[offset:end].view(dtype=dtype)[:count]
  return arr.view(arr.dtype.newbyteorder(reader.byte_order if override_order is None else override_order))


def _reader(path: pathlib.Path):
  """gguf's GGUFReader for `path`, parsed through `plain_get`."""
  reader_class = type("Reader", (_gguf().GGUFReader,), {"_get": plain_get})
  return reader_class(path)


class GGUFFile:
  """A parsed GGUF file: metadata values by key and tensors by GGUF name (data memory-mapped)."""

  def __init__(self, path: pathlib.Path):
    self.path = pathlib.Path(path)
    if not self.path.is_file():
      raise GGUFError(f"--gguf {self.path} does not exist or is not a file")
    try:
      reader = _reader(self.path)
    except GGUFError:
      raise
    except _Truncated as e:
      raise GGUFError(f"{self.path} is truncated: reading it needs {e.end} bytes, the file has {e.size} (an "
                      "interrupted download or copy?)") from None
    except Exception as e:  # gguf raises ValueError, KeyError, IndexError... for truncated or corrupt files
      raise GGUFError(f"{self.path} is not a readable GGUF file (truncated or corrupt?): {type(e).__name__}: "
                      f"{' '.join(str(e).split())[:200]}") from None
    self.fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    self.tensors = {t.name: t for t in reader.tensors}
    size = self.path.stat().st_size
    for t in reader.tensors:
      if t.data_offset + t.n_bytes > size:
        raise GGUFError(f"{self.path} is truncated: tensor {t.name} ends at byte {t.data_offset + t.n_bytes}, "
                        f"the file has {size}")

  def get(self, key: str, default: Any = None) -> Any:
    field = self.fields.get(key)
    return default if field is None else field.contents()

  def type_name(self, name: str) -> str:
    return self.tensors[name].tensor_type.name

  def shape(self, name: str) -> tuple[int, ...]:
    """Row-major shape (GGUF lists dims fastest-first, so reversed)."""
    return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

  def read(self, name: str) -> np.ndarray:
    """The tensor as float32 in its row-major shape."""
    return gguf_quants.dequantize(self.tensors[name].data, self.type_name(name), self.shape(name))


def _check_keys(f: GGUFFile, arch: str) -> None:
  """Every metadata key is mapped, read, or descriptive (general.*); anything else is named."""
  known = set(TOKENIZER_KEYS) | {f"{arch}.{k}" for k in tuple(_ARCH_KEYS) + _ARCH_CHECKED}
  unknown = sorted(k for k in f.fields if k not in known and not k.startswith("general.")
                   and not (k.startswith("tokenizer.ggml.") and k.endswith("_token_id")))
  if unknown:
    raise GGUFError(f"{f.path}: metadata keys this converter does not know (converting would ignore them): "
                    f"{', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}; known: general.*, "
                    f"tokenizer.ggml.*_token_id, {', '.join(TOKENIZER_KEYS)} and {arch}.<"
                    f"{'|'.join(sorted(tuple(_ARCH_KEYS) + _ARCH_CHECKED))}>")


def gguf_key(f: GGUFFile, hf_key: str) -> str:
  """The metadata key that gives config.json's `hf_key` (for an error naming what the file lacks)."""
  arch = f.get("general.architecture")
  names = [f"{arch}.{k}" for k, v in _ARCH_KEYS.items() if v == hf_key]
  return f"{names[0]} (config.json's {hf_key})" if names else f"config.json's {hf_key}"


def _rope_scaling(f: GGUFFile, arch: str) -> Optional[dict]:
  kind = f.get(f"{arch}.rope.scaling.type", "none")
  if kind == "none":
    return None
  if kind != "linear":
    raise GGUFError(f"{f.path}: {arch}.rope.scaling.type={kind!r} is not supported; supported: none, linear")
  factor = f.get(f"{arch}.rope.scaling.factor")
  if not isinstance(factor, (int, float)) or isinstance(factor, bool):
    raise GGUFError(f"{f.path}: {arch}.rope.scaling.type=linear needs a number in {arch}.rope.scaling.factor, "
                    f"got {factor!r}")
  return {"rope_type": "linear", "factor": float(factor)}


def _layer_types(f: GGUFFile, arch: str, layers: int) -> Optional[list[str]]:
  """Per-layer attention types from {arch}.attention.sliding_window_pattern (a period, or one bool per layer)."""
  pattern = f.get(f"{arch}.attention.sliding_window_pattern")
  if pattern is None:
    return None
  if isinstance(pattern, list):
    uses_window = [bool(x) for x in pattern]
  else:  # period: every pattern-th layer is global
    uses_window = [(i + 1) % int(pattern) != 0 for i in range(layers)]
  return ["sliding_attention" if w else "full_attention" for w in uses_window]


def hf_config(f: GGUFFile) -> dict:
  """The config.json dict that this GGUF file's metadata and tensors state (keys it leaves out take the
  family's transformers defaults in hf_config.model_config_from_hf)."""
  arch = f.get("general.architecture")
  if arch not in ARCHITECTURES:
    raise GGUFError(f"{f.path}: general.architecture={arch!r} is not supported; supported: "
                    f"{sorted(ARCHITECTURES)}")
  _check_keys(f, arch)
  hf: dict[str, Any] = {"model_type": ARCHITECTURES[arch]}
  for key, hf_key in _ARCH_KEYS.items():
    value = f.get(f"{arch}.{key}")
    if value is not None:
      hf[hf_key] = value
  if "token_embd.weight" not in f.tensors:
    raise GGUFError(f"{f.path} has no token_embd.weight tensor")
  hf.setdefault("vocab_size", f.shape("token_embd.weight")[0])
  heads, hidden = hf.get("num_attention_heads"), hf.get("hidden_size")
  if heads and hidden:
    head_dim = hf.setdefault("head_dim", hidden // heads)
    for key in ("attention.value_length", "rope.dimension_count"):
      value = f.get(f"{arch}.{key}")
      if value is not None and value != head_dim:
        raise GGUFError(f"{f.path}: {arch}.{key}={value} differs from the head dimension {head_dim} "
                        "(partial rotary or a different value size is not supported)")
  hf["tie_word_embeddings"] = "output.weight" not in f.tensors
  if "blk.0.attn_q.bias" in f.tensors and arch != "qwen2":
    hf["attention_bias"] = True
  if "blk.0.attn_output.bias" in f.tensors and arch == "qwen2":
    raise GGUFError(f"{f.path}: qwen2 with an attention output bias (blk.0.attn_output.bias) is not supported")
  scaling = _rope_scaling(f, arch)
  if scaling:
    hf["rope_scaling"] = scaling
  if arch in _GEMMA:
    hf["hidden_act" if arch == "gemma" else "hidden_activation"] = "gelu_pytorch_tanh"
  if arch in _GEMMA_27B_LAYERS and heads and hidden:
    is_27b = hf.get("num_hidden_layers") == _GEMMA_27B_LAYERS[arch]
    hf["query_pre_attn_scalar"] = hidden // heads if is_27b else hf["head_dim"]
  if arch == "gemma3":
    hf["final_logit_softcapping"] = None
    types = _layer_types(f, arch, hf.get("num_hidden_layers", 0))
    if types is not None:
      hf["layer_types"] = types
  return hf


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's per-head row permutation of llama q/k (rows [h, 2, d/2] were stored as [h, d/2, 2])."""
  return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFTensorReader:
  """The tensors of a GGUF file under Hugging Face names, dequantized to float32 on read: the interface of
  convert._TensorReader (names, shape_dtype, get)."""

  dtypes = gguf_quants.SUPPORTED_TYPES
  config_name = "the GGUF metadata"
  files_name = "the GGUF file"

  def __init__(self, f: GGUFFile, hf: dict):
    self._f = f
    self._arch = f.get("general.architecture")
    self._hf = hf
    self._names = {}  # HF name -> GGUF name
    if "rope_freqs.weight" in f.tensors:
      raise GGUFError(f"{f.path}: rope_freqs.weight (per-frequency RoPE factors, as llama.cpp stores Llama 3 "
                      "RoPE scaling) is not supported")
    for name in f.tensors:
      self._names[self._hf_name(name)] = name
    bad = sorted(f"{n} ({f.type_name(n)})" for n in f.tensors if f.type_name(n) not in self.dtypes)
    if bad:
      raise GGUFError(f"{f.path}: tensor types not supported: {', '.join(bad[:8])}; supported: "
                      f"{', '.join(self.dtypes)}")

  def _hf_name(self, name: str) -> str:
    if name in _GLOBAL_NAMES:
      return _GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit():
      table = dict(_LAYER_NAMES, **(_SANDWICH_NAMES if self._arch in ("gemma2", "gemma3") else {}))
      if parts[2] in table:
        return f"model.layers.{parts[1]}.{table[parts[2]]}.{parts[3]}"
    return name  # unmapped: reported by convert.check_tensors as unused, under its GGUF name

  def names(self) -> set[str]:
    return set(self._names)

  def __contains__(self, name: str) -> bool:
    return name in self._names

  def shape_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
    gguf_name = self._names[name]
    return self._f.shape(gguf_name), self._f.type_name(gguf_name)

  def get_int8(self, name: str, blocks: bool = False) -> Optional[tuple[np.ndarray, ...]]:
    """A Q8_0 2-D tensor as per-output-channel int8 (gguf_quants.q8_0_per_channel: codes [out, in], float32
    scale [out], which rows loaded exactly), or with `blocks` as stored (gguf_quants.q8_0_blocks: codes and
    float32 block scales [out, in / 32]); rows in the HF order; None for any other type."""
    gguf_name = self._names[name]
    shape = self._f.shape(gguf_name)
    if self._f.type_name(gguf_name) != "Q8_0" or len(shape) != 2:
      return None
    read = gguf_quants.q8_0_blocks if blocks else gguf_quants.q8_0_per_channel
    return self._hf_rows(gguf_name, *read(self._f.tensors[gguf_name].data, shape))

  def _hf_rows(self, gguf_name: str, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """`arrays` (each with the tensor's output rows first) in the HF row order: llama's q and k rows were
    permuted per head by llama.cpp's converter (undone as in `get`)."""
    if self._arch == "llama" and gguf_name.split(".")[-2] in ("attn_q", "attn_k"):
      heads = self._hf["num_attention_heads"]
      heads = heads if gguf_name.split(".")[-2] == "attn_q" else self._hf.get("num_key_value_heads") or heads
      return tuple(_unpermute(x, heads) for x in arrays)
    return arrays

  def get(self, name: str, dtype) -> np.ndarray:
    gguf_name = self._names[name]
    (w,) = self._hf_rows(gguf_name, self._f.read(gguf_name))
    if self._arch in _GEMMA and gguf_name.endswith("norm.weight"):
      w = w - np.float32(1.0)
    return w.astype(dtype)
