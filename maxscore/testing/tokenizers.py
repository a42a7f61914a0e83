"""A tiny byte-level BPE tokenizer (Hugging Face `tokenizers`) trained offline in seconds, for tests.

Like the sentencepiece kind of maxscore/lm/tokenizer_training.py it keeps "Yes", "No" and "<sep>" as
single tokens and reads any text (emoji included): every byte is in its alphabet.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from maxscore.lm.tokenizer_training import LABELS, SEPARATOR


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
