"""A Hugging Face tokenizer.json (+ tokenizer_config.json, chat_template.jinja) from a GGUF's tokenizer metadata.

GGUF stores a byte-level BPE vocabulary (`tokenizer.ggml.model=gpt2`) as its token strings, merges
and token types, and names the pre-tokenizer its merges were learned with (`tokenizer.ggml.pre`).
This rebuilds the `tokenizers` pipeline from them: BPE over the byte alphabet, the pre-tokenizer of
that name, control tokens as special tokens and user-defined tokens as added tokens (so neither is
split). The files are what maxscore's HFTokenizer and the `chat` prompt template read.

Only byte-level BPE is supported; a GGUF with a sentencepiece vocabulary (`llama`, as Gemma's) is
refused by name. A GGUF without tokenizer metadata converts without a tokenizer (it scores token ids).
"""

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


def build_tokenizer(f: GGUFFile, directory: pathlib.Path) -> Optional[tuple[pathlib.Path, ...]]:
  """Writes tokenizer.json, tokenizer_config.json and (when the GGUF has one) chat_template.jinja into
  `directory`; returns their paths, tokenizer.json first, or None when the GGUF holds no tokenizer."""
  from tokenizers import AddedToken, Tokenizer, decoders, models  # pylint: disable=import-outside-toplevel
  kind = f.get("tokenizer.ggml.model")
  if kind is None:
    return None
  if kind != _GPT2_BYTE_LEVEL:
    raise GGUFError(f"{f.path}: tokenizer.ggml.model={kind!r} is not supported; supported: "
                    f"{_GPT2_BYTE_LEVEL} (byte-level BPE)")
  tokens, types = f.get("tokenizer.ggml.tokens") or [], f.get("tokenizer.ggml.token_type") or []
  merges = f.get("tokenizer.ggml.merges")
  if not tokens or merges is None:
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
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
                          if k == _CONTROL and set(t) <= spelled])
  tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types)
                  if k == _USER_DEFINED])
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
