"""Small GGUF files written from tiny Hugging Face models the way llama.cpp's converter writes them (tests only).

llama.cpp's convert_hf_to_gguf.py renames tensors (`blk.N.attn_q.weight`), permutes llama q/k rows per head,
stores Gemma norms as `1 + w`, keeps 1-D tensors in F32 and quantizes the rest to the requested type, and
writes the config as `{arch}.*` metadata keys. This does the same with gguf's GGUFWriter, so a GGUF reader
can be checked against the HF model it came from and against transformers loading the same file.
"""

import json
import pathlib
from typing import Any, Callable, Optional

import numpy as np

from maxscore.checkpoints import gguf_reader

HF_TO_GGUF_ARCH = {v: k for k, v in gguf_reader.ARCHITECTURES.items()}


def _gguf_name(hf_name: str, arch: str) -> str:
  inverse_global = {v: k for k, v in gguf_reader._GLOBAL_NAMES.items()}  # pylint: disable=protected-access
  if hf_name in inverse_global:
    return inverse_global[hf_name]
  table = dict(gguf_reader._LAYER_NAMES)  # pylint: disable=protected-access
  if arch in ("gemma2", "gemma3"):
    table.update(gguf_reader._SANDWICH_NAMES)  # pylint: disable=protected-access
  inverse = {v: k for k, v in table.items()}
  _, _, layer, rest = hf_name.split(".", 3)
  module, suffix = rest.rsplit(".", 1)
  return f"blk.{layer}.{inverse[module]}.{suffix}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's LlamaModel.permute: rows [h, 2, d/2] stored as [h, d/2, 2]."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model) -> dict[str, np.ndarray]:
  """GGUF name -> float32 array, in llama.cpp's layout, from an HF causal LM."""
  cfg = model.config
  arch = HF_TO_GGUF_ARCH[cfg.model_type]
  out = {}
  for hf_name, p in model.state_dict().items():
    if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
      continue
    w = p.detach().float().numpy().copy()
    if arch == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):
      w = _permute(w, cfg.num_attention_heads if ".q_proj." in hf_name else cfg.num_key_value_heads)
    if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
      w = w + np.float32(1.0)
    out[_gguf_name(hf_name, arch)] = w
  return out


def _metadata(cfg) -> dict[str, Any]:
  """`{arch}.*` keys (without the prefix) as llama.cpp writes them for this config."""
  rope = cfg.rope_parameters or {}
  rope = rope.get("full_attention", rope)
  meta = {"context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
          "block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
          "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
          "attention.layer_norm_rms_epsilon": cfg.rms_norm_eps, "rope.freq_base": rope["rope_theta"],
          "vocab_size": cfg.vocab_size}
  head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
  meta.update({"attention.key_length": head_dim, "attention.value_length": head_dim})
  if cfg.model_type == "llama":
    meta["rope.dimension_count"] = head_dim
  if rope.get("rope_type", "default") == "linear":
    meta.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(rope["factor"])})
  if cfg.model_type in ("gemma2", "gemma3_text"):
    meta["attention.sliding_window"] = cfg.sliding_window
  if cfg.model_type == "gemma2":
    meta.update(attn_logit_softcapping=cfg.attn_logit_softcapping, final_logit_softcapping=cfg.final_logit_softcapping)
  return meta


def write_gguf(model, path: pathlib.Path, tensor_type: str = "F32", metadata: Optional[dict[str, Any]] = None,
               architecture: Optional[str] = None, tokenizer: Optional[dict[str, Any]] = None,
               edit: Optional[Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] = None) -> pathlib.Path:
  """Writes `model` as a GGUF file: 2-D weights in `tensor_type` (F32, F16, BF16 or a block type gguf can
  quantize to), 1-D in F32. `metadata` adds or replaces `{arch}.*` keys (a value of None drops one);
  `architecture` overrides general.architecture; `tokenizer` adds raw tokenizer.* keys; `edit` changes the
  GGUF-named float arrays before they are written (a float64 one is stored as F64)."""
  import gguf  # pylint: disable=import-outside-toplevel
  arch = HF_TO_GGUF_ARCH[model.config.model_type]
  writer = gguf.GGUFWriter(str(path), architecture or arch)
  meta = dict(_metadata(model.config), **(metadata or {}))
  for key, value in meta.items():
    if value is None:
      continue
    full = f"{architecture or arch}.{key}"
    if isinstance(value, bool):
      writer.add_bool(full, value)
    elif isinstance(value, int):
      writer.add_uint32(full, value)
    elif isinstance(value, float):
      writer.add_float32(full, value)
    else:
      writer.add_string(full, value)
  for key, value in (tokenizer or {}).items():
    if isinstance(value, list):
      writer.add_array(key, value)
    elif isinstance(value, bool):
      writer.add_bool(key, value)
    elif isinstance(value, int):
      writer.add_uint32(key, value)
    else:
      writer.add_string(key, value)
  qtype = gguf.GGMLQuantizationType[tensor_type]
  tensors = gguf_tensors(model)
  for name, w in (edit(tensors) if edit else tensors).items():
    if w.ndim == 1 or tensor_type == "F32" or w.dtype != np.float32:
      writer.add_tensor(name, w)
    else:
      writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return pathlib.Path(path)


def bpe_tokenizer_metadata(tokenizer_json: pathlib.Path, chat_template: Optional[str] = None) -> dict[str, Any]:
  """tokenizer.* keys for a byte-level BPE tokenizer.json, as llama.cpp writes them."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
  spec = json.loads(tokenizer_json.read_text())
  vocab = tok.get_vocab(with_added_tokens=True)
  tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
  added = {a["content"]: a for a in spec["added_tokens"]}
  types = [3 if t in added and added[t]["special"] else 4 if t in added else 1 for t in tokens]
  merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
  return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
          "tokenizer.ggml.bos_token_id": vocab["<s>"], "tokenizer.ggml.eos_token_id": vocab["</s>"],
          **({"tokenizer.chat_template": chat_template} if chat_template else {})}


def sentencepiece_metadata(model_file: pathlib.Path) -> dict[str, Any]:
  """tokenizer.* keys for a sentencepiece model, as llama.cpp's converter writes them: pieces, scores and types
  (sentencepiece's piece types are llama.cpp's token types), a user-defined piece's U+2581 written as a space."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=import-outside-toplevel
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(pathlib.Path(model_file).read_bytes())
  user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
  pieces = proto.pieces
  ids = {p.piece: i for i, p in enumerate(pieces)}
  return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
          "tokenizer.ggml.tokens": [p.piece.replace("\u2581", " ") if p.type == user_defined else p.piece
                                    for p in pieces],
          "tokenizer.ggml.scores": [float(p.score) for p in pieces],
          "tokenizer.ggml.token_type": [int(p.type) for p in pieces],
          "tokenizer.ggml.bos_token_id": proto.trainer_spec.bos_id, "tokenizer.ggml.eos_token_id": proto.trainer_spec.eos_id,
          "tokenizer.ggml.unknown_token_id": ids["<unk>"], "tokenizer.ggml.padding_token_id": proto.trainer_spec.pad_id,
          "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
          "tokenizer.ggml.add_space_prefix": bool(proto.normalizer_spec.add_dummy_prefix)}
