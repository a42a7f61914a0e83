"""Tiny tokenizers trained offline in seconds, for tests and demos.

Both kinds keep "Yes", "No" and "<sep>" as single tokens, so label and separator ids
exist as they do in real reranker setups, and both fall back to bytes so any text
(emoji included) round-trips.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

LABELS = ("Yes", "No")
SEPARATOR = "<sep>"

_EXTRA_TEXTS = (
  "naïve café — Zürich, São Paulo, Kraków, Ærøskøbing",
  "排序模型为候选文档打分。",
  "نموذج الترتيب يقيّم المستندات",
  "Ранжирование документов по запросу",
  "ranking 🚀🔥 results ✅ 👍🏽",
  "Is this document relevant to the query? Yes. No.",
)


def sample_texts() -> list[str]:
  """English paragraphs from CPython's bundled pydoc topics plus a few unicode lines."""
  import pydoc_data.topics  # pylint: disable=import-outside-toplevel

  paragraphs = []
  for _, doc in sorted(pydoc_data.topics.topics.items()):
    paragraphs.extend(p.strip() for p in doc.split("\n\n") if p.strip())
  return paragraphs + list(_EXTRA_TEXTS)


def train_sentencepiece(
  output_prefix: str | os.PathLike, texts: Iterable[str], vocab_size: int = 512
) -> Path:
  """Trains a small BPE sentencepiece model and returns the `<output_prefix>.model` path.

  Identity normalization and kept whitespace make decode(encode(text)) == text.
  """
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel

  Path(output_prefix).parent.mkdir(parents=True, exist_ok=True)
  with open(os.devnull, "w", encoding="utf-8") as devnull:  # the trainer's log is noise
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(list(texts)),
      model_prefix=str(output_prefix),
      model_type="bpe",
      vocab_size=vocab_size,
      hard_vocab_limit=False,
      character_coverage=1.0,
      byte_fallback=True,
      normalization_rule_name="identity",
      remove_extra_whitespaces=False,
      max_sentence_length=1 << 16,
      unk_id=0,
      bos_id=1,
      eos_id=2,
      pad_id=3,
      user_defined_symbols=[*LABELS, SEPARATOR],
      num_threads=4,
      logstream=devnull,
    )
  return Path(f"{output_prefix}.model")


def train_hf_bpe(
  output_path: str | os.PathLike, texts: Iterable[str], vocab_size: int = 512
) -> Path:
  """Trains a small byte-level BPE with `tokenizers` and saves it as a tokenizer.json.

  `output_path` is the json file, or a directory to hold `tokenizer.json`.
  """
  # pylint: disable-next=import-outside-toplevel
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  path = Path(output_path)
  if path.suffix != ".json":
    path = path / "tokenizer.json"
  path.parent.mkdir(parents=True, exist_ok=True)

  tokenizer = Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=["<pad>", "<s>", "</s>", SEPARATOR],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is unknown
    show_progress=False,
  )
  tokenizer.train_from_iterator(list(texts), trainer=trainer)
  tokenizer.add_tokens(list(LABELS))
  tokenizer.save(str(path))
  return path
