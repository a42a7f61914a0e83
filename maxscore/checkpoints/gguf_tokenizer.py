"""A Hugging Face tokenizer.json (+ tokenizer_config.json, chat_template.jinja) from a GGUF's tokenizer metadata.

Two kinds of vocabulary are rebuilt as a `tokenizers` pipeline, control tokens as special tokens and
user-defined tokens as added tokens (so neither is split); the files are what maxscore's HFTokenizer
and the `chat` prompt template read:
  - byte-level BPE (`tokenizer.ggml.model=gpt2`): token strings, merges and the name of the
    pre-tokenizer the merges were learned with (`tokenizer.ggml.pre`);
  - sentencepiece BPE (`tokenizer.ggml.model=llama`, as Gemma's): token strings, scores and types
    only. The merges are implied by the vocabulary: sentencepiece joins two adjacent pieces when
    their concatenation is a piece, best-scored piece first (section "sentencepiece" below).
Any other kind, and the sentencepiece options this has not been checked against, are refused by
name. A GGUF without tokenizer metadata converts without a tokenizer (it scores token ids).
"""

import collections
import json
import pathlib
from typing import Optional

from maxscore.checkpoints.gguf_reader import GGUFError, GGUFFile

_GPT2_BYTE_LEVEL = "gpt2"
# Split patterns of the pre-tokenizers llama.cpp names (llama-vocab.cpp), as the models' own tokenizer.json spell them.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
SPECIAL_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                "pad_token": "padding_token_id"}


def _pre_tokenizer(pre: str, add_prefix_space: bool):
  """The pre-tokenizer llama.cpp applies for `tokenizer.ggml.pre`, as a `tokenizers` pipeline."""
  from tokenizers import Regex, pre_tokenizers  # pylint: disable=import-outside-toplevel
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
  split = lambda pattern: pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)])
  builders = {
      "default": lambda: byte_level,  # GPT-2's own split
      "gpt2": lambda: byte_level,
      # SmolLM's tokenizer.json: every digit on its own, then GPT-2's split
      "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]),
      "qwen2": lambda: split(_QWEN2_SPLIT),
      "llama-bpe": lambda: split(_LLAMA3_SPLIT),
  }
  if pre not in builders:
    raise GGUFError(f"tokenizer.ggml.pre={pre!r} is not supported; supported: {sorted(builders)}")
  return builders[pre]()


def _byte_alphabet() -> dict[int, str]:
  """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the rest from U+0100."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  extra = iter(range(256, 512))
  return {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}


def _byte_level_bpe(f: GGUFFile, tokens: list[str], types: list[int]):
  """(tokenizer, control tokens, user-defined tokens) of a `gpt2` vocabulary."""
  from tokenizers import Tokenizer, decoders, models  # pylint: disable=import-outside-toplevel
  merges = f.get("tokenizer.ggml.merges")
  if merges is None:
    raise GGUFError(f"{f.path}: tokenizer.ggml.model=gpt2 needs tokenizer.ggml.tokens and tokenizer.ggml.merges")
  alphabet = _byte_alphabet()
  spelled = set(alphabet.values())
  # A token outside the byte alphabet (a mislabelled control token) is respelled byte by byte, as transformers does.
  vocab = {t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8")): i
           for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False))
  add_prefix_space = bool(f.get("tokenizer.ggml.add_space_prefix", False))
  tok.pre_tokenizer = _pre_tokenizer(f.get("tokenizer.ggml.pre", "default"), add_prefix_space)
  tok.decoder = decoders.ByteLevel()
  control = [t for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= spelled]
  return tok, control, [t for t, k in zip(tokens, types) if k == _USER_DEFINED]


# --- sentencepiece -----------------------------------------------------------------------------------
# A sentencepiece BPE model encodes a text by replacing its spaces with U+2581 and then joining, over and
# over, the adjacent pair of pieces whose concatenation is the best-ranked piece of the vocabulary, down to
# single characters (bytes, as <0xNN> pieces, for characters it lacks: byte fallback). A `tokenizers` BPE
# model does the same given, for each piece, its splits into two pieces as merges in the pieces' rank order.
#
# The rank. llama.cpp writes each piece's sentencepiece score, and the normal pieces' scores fall with their
# id (the file's order is sentencepiece's merge order; checked on reading). User-defined pieces carry a
# placeholder score of -1000 instead; their place in the order is their id as well, which puts Gemma's
# whitespace runs (ids 138-167) ahead of every normal piece: a run of up to 31 spaces is joined into one
# piece before any of its spaces joins a word, as sentencepiece matches a user-defined piece whole (a
# longer run may split otherwise than by sentencepiece's longest match). So the rank is the id; of two
# splits of one piece the one with the longer left part comes first. transformers derives the same order.
#
# llama.cpp writes a user-defined piece's U+2581 as a space (Gemma's runs of 2 to 31 spaces); they are
# spelled back, since the text the merges see has its spaces replaced. The other user-defined pieces
# (newlines, tabs, [multimodal]), the control pieces and <unk> are matched whole in the raw text.
_NORMAL, _UNKNOWN, _BYTE = 1, 2, 6
_SPACE = "\u2581"


def _check_sentencepiece(f: GGUFFile, tokens: list[str], types: list[int]) -> None:
  """Refuses, by name, what a sentencepiece vocabulary can state that this builder does not reproduce."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  prefix = f.get("tokenizer.ggml.add_space_prefix")
  if prefix is None or prefix:  # llama.cpp prepends a space to a sentencepiece text unless the file says false
    raise GGUFError(f"{f.path}: tokenizer.ggml.add_space_prefix={'absent' if prefix is None else prefix} "
                    "(sentencepiece's dummy prefix) is not "
                    "supported for tokenizer.ggml.model=llama; supported: false (as Gemma's)")
  if f.get("tokenizer.ggml.merges") is not None:
    raise GGUFError(f"{f.path}: tokenizer.ggml.merges with tokenizer.ggml.model=llama is not supported "
                    "(a sentencepiece vocabulary's merges follow from its pieces)")
  scores = f.get("tokenizer.ggml.scores")
  if scores is None or len(scores) != len(tokens) or len(types) != len(tokens):
    raise GGUFError(f"{f.path}: tokenizer.ggml.model=llama needs tokenizer.ggml.scores and "
                    "tokenizer.ggml.token_type, one per token")
  normal = np.asarray(scores, np.float64)[np.asarray(types) == _NORMAL]
  if np.any(np.diff(normal) >= 0):
    raise GGUFError(f"{f.path}: tokenizer.ggml.scores of the normal pieces do not fall with the token id; only a "
                    "vocabulary stored in sentencepiece's merge order (scores falling with the id) is supported")
  byte_pieces = {t for t, k in zip(tokens, types) if k == _BYTE}
  missing = [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in byte_pieces]
  if missing:
    raise GGUFError(f"{f.path}: tokenizer.ggml.model=llama without the byte pieces {missing[0]}... (byte fallback) "
                    "is not supported")


def _sentencepiece_merges(pieces: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
  """Every split of a piece into two pieces, in the pieces' rank (id) order, longer left part first."""
  merges = []
  for piece in pieces:
    merges.extend((piece[:i], piece[i:]) for i in range(len(piece) - 1, 0, -1)
                  if piece[:i] in vocab and piece[i:] in vocab)
  return merges


def _sentencepiece_bpe(f: GGUFFile, tokens: list[str], types: list[int]):
  """(tokenizer, control tokens, user-defined tokens) of a `llama` (sentencepiece BPE) vocabulary."""
  from tokenizers import Tokenizer, decoders, models, normalizers  # pylint: disable=import-outside-toplevel
  _check_sentencepiece(f, tokens, types)
  spelled = [t.replace(" ", _SPACE) if k == _USER_DEFINED else t for t, k in zip(tokens, types)]
  vocab = {t: i for i, t in enumerate(spelled)}
  if len(vocab) != len(spelled):  # one string, two ids: the vocabulary cannot say which a text gives
    twice = sorted(t for t, n in collections.Counter(spelled).items() if n > 1)
    raise GGUFError(f"{f.path}: tokenizer.ggml.tokens spells {len(twice)} token(s) twice ({twice[:3]}); not supported")
  unk = f.get("tokenizer.ggml.unknown_token_id")
  if unk is not None and not 0 <= unk < len(tokens):
    raise GGUFError(f"{f.path}: tokenizer.ggml.unknown_token_id={unk} is not a token id (0 to {len(tokens) - 1})")
  tok = Tokenizer(models.BPE(vocab=vocab, merges=_sentencepiece_merges(spelled, vocab), byte_fallback=True,
                             unk_token=tokens[unk] if unk is not None else None, fuse_unk=True))
  tok.normalizer = normalizers.Replace(" ", _SPACE)
  tok.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
  control = [t for t, k in zip(tokens, types) if k in (_UNKNOWN, _CONTROL)]  # <unk> is whole, as transformers has it
  return tok, control, [t for t, k in zip(tokens, types) if k == _USER_DEFINED and " " not in t]


_BUILDERS = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}


def build_tokenizer(f: GGUFFile, directory: pathlib.Path) -> Optional[tuple[pathlib.Path, ...]]:
  """Writes tokenizer.json, tokenizer_config.json and (when the GGUF has one) chat_template.jinja into
  `directory`; returns their paths, tokenizer.json first, or None when the GGUF holds no tokenizer."""
  from tokenizers import AddedToken  # pylint: disable=import-outside-toplevel
  kind = f.get("tokenizer.ggml.model")
  if kind is None:
    return None
  if kind not in _BUILDERS:
    raise GGUFError(f"{f.path}: tokenizer.ggml.model={kind!r} is not supported; supported: "
                    "gpt2 (byte-level BPE), llama (sentencepiece BPE)")
  if f.get("tokenizer.ggml.add_sep_token"):
    raise GGUFError(f"{f.path}: tokenizer.ggml.add_sep_token=True is not supported (maxscore adds no separator "
                    "when it encodes)")
  tokens, types = f.get("tokenizer.ggml.tokens") or [], f.get("tokenizer.ggml.token_type") or []
  if not tokens:
    raise GGUFError(f"{f.path}: tokenizer.ggml.model={kind} needs tokenizer.ggml.tokens")
  tok, control, user_defined = _BUILDERS[kind](f, tokens, types)
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
  tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user_defined])
  directory.mkdir(parents=True, exist_ok=True)
  tok.save(str(directory / "tokenizer.json"))
  config = {name: (tokens[i] if (i := f.get(f"tokenizer.ggml.{key}")) is not None and i < len(tokens) else None)
            for name, key in SPECIAL_KEYS.items()}
  config.update(add_bos_token=bool(f.get("tokenizer.ggml.add_bos_token", False)),
                add_eos_token=bool(f.get("tokenizer.ggml.add_eos_token", False)))
  (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
  files = (directory / "tokenizer.json", directory / "tokenizer_config.json")
  template = f.get("tokenizer.chat_template")
  if template is not None:
    (directory / "chat_template.jinja").write_text(template, encoding="utf-8")
    files += (directory / "chat_template.jinja",)
  return files
