"""Small sentencepiece tokenizers trained offline in seconds, and the text they are trained on.

    path = train_sentencepiece(directory / "tokenizer", sample_texts(), vocab_size=2048)  # <directory>/tokenizer.model

The tokenizer keeps "Yes", "No" and "<sep>" as single tokens, so label and separator ids exist as they
do in real reranker setups, and falls back to bytes so any text (emoji included) round-trips. The same
texts give the same file, whichever directory it is written to.
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


def train_sentencepiece(output_prefix: str | os.PathLike, texts: Iterable[str], vocab_size: int = 512) -> Path:
  """Trains a small BPE sentencepiece model into `<output_prefix>.model` (and `.vocab`); returns the model's path.

  Identity normalization and kept whitespace make decode(encode(text)) == text. The trainer records its
  `model_prefix` in the model; the model keeps the prefix's name alone, so it does not depend on the directory.
  """
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=import-outside-toplevel

  output_prefix = Path(output_prefix)
  output_prefix.parent.mkdir(parents=True, exist_ok=True)
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
  path = Path(f"{output_prefix}.model")
  model = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes())
  model.trainer_spec.model_prefix = output_prefix.name
  path.write_bytes(model.SerializeToString())
  return path
