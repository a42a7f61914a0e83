"""One tokenizer interface over sentencepiece `.model` files and Hugging Face `tokenizer.json`.

Scoring needs plain token ids (no BOS/EOS added behind the caller's back), exact decode,
and single ids for label words and separators; `label_id` is the one place that rule lives.
"""

from __future__ import annotations

import abc
import difflib
import json
import os
from pathlib import Path
from typing import Container, Iterable, Sequence

from maxscore.errors import ScoreInputError

_HF_FILE = "tokenizer.json"
_SP_FILE = "tokenizer.model"
# Used for bos/eos/pad only when no tokenizer_config.json sits next to tokenizer.json.
_HF_SPECIAL_NAMES = {
  "bos_token": ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>"),
  "eos_token": ("</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>"),
  "pad_token": ("<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>"),
}


class Tokenizer(abc.ABC):
  """Text <-> ids for one model; subclasses wrap one backend library."""

  kind: str  # "sentencepiece" or "hf"
  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int | None = None

  def __init__(self, path: Path):
    self._path = path

  @property
  def path(self) -> Path:
    return self._path

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, with no BOS/EOS added."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; special tokens are kept so nothing is silently dropped."""

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids (one more than the largest), added tokens included."""

  @abc.abstractmethod
  def special_tokens(self) -> dict[str, int]:
    """Pieces never split from text: control, unknown and user-defined/added tokens."""

  @abc.abstractmethod
  def _piece_id(self, token: str) -> int | None:
    """Id of an exact vocabulary piece, or None."""

  @abc.abstractmethod
  def _pieces(self) -> Iterable[str]:
    """Every vocabulary piece, for suggestions in error messages."""

  def token_to_id(self, token: str) -> int:
    """Id of the exact vocabulary piece `token` (e.g. "Yes" or "▁Yes")."""
    token_id = self._piece_id(token)
    if token_id is None:
      close = difflib.get_close_matches(token, list(self._pieces()), n=5, cutoff=0.6)
      hint = f"; close pieces: {close}" if close else ""
      raise ScoreInputError(f"token {token!r} is not in the vocabulary of {self.path}{hint}")
    return token_id

  def label_id(self, label: str) -> int:
    """The one id a label maps to: its vocabulary piece, else its encoding if that is one token."""
    token_id = self._piece_id(label)
    if token_id is not None:
      return token_id
    ids = self.encode(label)
    if len(ids) != 1:
      raise ScoreInputError(
        f"label {label!r} encodes to {len(ids)} tokens {ids}; a label must be exactly 1 token"
      )
    return ids[0]

  def __repr__(self) -> str:
    return f"{type(self).__name__}(path={str(self.path)!r}, vocab_size={self.vocab_size})"


class SentencePieceTokenizer(Tokenizer):
  """A sentencepiece `.model`; its normalizer may add a leading "▁" to encoded text."""

  kind = "sentencepiece"

  def __init__(self, path: Path):
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel

    super().__init__(path)
    self._sp = spm.SentencePieceProcessor(model_file=str(path))
    self.bos_id, self.eos_id, self.pad_id = (
      i if i >= 0 else None for i in (self._sp.bos_id(), self._sp.eos_id(), self._sp.pad_id())
    )

  def encode(self, text: str) -> list[int]:
    return list(self._sp.encode(text))

  def decode(self, ids: Sequence[int]) -> str:
    return self._sp.decode([int(i) for i in ids])

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def special_tokens(self) -> dict[str, int]:
    # The processor has no is_user_defined(), so piece types come from the model proto.
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=import-outside-toplevel

    proto = sentencepiece_model_pb2.ModelProto.FromString(self._sp.serialized_model_proto())
    types = sentencepiece_model_pb2.ModelProto.SentencePiece.Type
    wanted = {types.UNKNOWN, types.CONTROL, types.USER_DEFINED}
    return {piece.piece: i for i, piece in enumerate(proto.pieces) if piece.type in wanted}

  def _piece_id(self, token: str) -> int | None:
    token_id = self._sp.piece_to_id(token)  # an absent piece comes back as unk_id
    return token_id if self._sp.id_to_piece(token_id) == token else None

  def _pieces(self) -> Iterable[str]:
    return (self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size()))


class HFTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json` read with the `tokenizers` library."""

  kind = "hf"

  def __init__(self, path: Path):
    import tokenizers  # pylint: disable=import-outside-toplevel

    super().__init__(path)
    self._tok = tokenizers.Tokenizer.from_file(str(path))
    names = _hf_special_names(path, self._tok.get_vocab(with_added_tokens=True))
    self.bos_id, self.eos_id, self.pad_id = (
      self._piece_id(names[key]) if names[key] else None
      for key in ("bos_token", "eos_token", "pad_token")
    )

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def special_tokens(self) -> dict[str, int]:
    return {tok.content: i for i, tok in self._tok.get_added_tokens_decoder().items()}

  def _piece_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def _pieces(self) -> Iterable[str]:
    return self._tok.get_vocab(with_added_tokens=True).keys()


def _hf_special_names(path: Path, vocab: Container[str]) -> dict[str, str | None]:
  """bos/eos/pad token strings from a sibling tokenizer_config.json, else by common names."""
  config_path = path.with_name("tokenizer_config.json")
  config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
  names = {}
  for key, candidates in _HF_SPECIAL_NAMES.items():
    if key in config:  # may be null (no BOS, as in Qwen) or {"content": ...}
      value = config[key]
      names[key] = value.get("content") if isinstance(value, dict) else value
    else:
      names[key] = next((c for c in candidates if c in vocab), None)
  return names


_BACKENDS = {".model": SentencePieceTokenizer, ".json": HFTokenizer}


def find_tokenizer_file(directory: str | os.PathLike) -> Path | None:
  """The tokenizer file in `directory`: tokenizer.json, else tokenizer.model, else a *.model.

  Used to find the file to copy into a converted checkpoint; None when there is none.
  """
  directory = Path(directory)
  for name in (_HF_FILE, _SP_FILE):
    if (directory / name).is_file():
      return directory / name
  models = sorted(p for p in directory.glob("*.model") if p.is_file())
  return models[0] if models else None


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """Loads a `.model` file, a `tokenizer.json` file, or a directory holding one of them."""
  path = Path(path)
  wanted = f"{_HF_FILE} or a sentencepiece *.model file"
  if path.is_dir():
    found = find_tokenizer_file(path)
    if found is None:
      raise FileNotFoundError(f"no tokenizer in directory {str(path)!r}: looked for {wanted}")
    path = found
  elif not path.is_file():
    raise FileNotFoundError(
      f"tokenizer path {str(path)!r} does not exist: expected {wanted}, or a directory holding one"
    )
  backend = _BACKENDS.get(path.suffix)
  if backend is None:
    raise TokenizerError(
      f"tokenizer file {str(path)!r} has suffix {path.suffix!r}; expected one of {sorted(_BACKENDS)}"
    )
  try:
    return backend(path)
  except Exception as e:  # the sentencepiece and tokenizers libraries raise their own types for corrupt files
    if isinstance(e, (OSError, TokenizerError)):
      raise
    raise TokenizerError(f"tokenizer file {str(path)!r} is corrupt or unreadable: "
                         f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None


class TokenizerError(ValueError):
  """A tokenizer file that cannot be read (wrong suffix, corrupt content); the message names it."""
