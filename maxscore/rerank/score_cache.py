"""A persistent score cache: the eval's ranking score of each (query, document) pair, on disk, shared by every
run that points at it (`--score_cache=DIR`), so a second eval, suite or ablation over the same pairs does no
model work for them and writes the same numbers.

    cache = ScoreCache.open("cache/", eval.score_fingerprint(scorer, cfg, label_ids))   # loads what is there
    scores = cache.get(query_text, doc_texts)                    # a float or None per document
    cache.put(query_text, doc_texts, scores)                     # appended to this process's own file

Layout: `DIR/<scorer key>/<host>-<pid>-<random>.jsonl`, one line per pair, `{"k": pair key, "s": score}`.
- The scorer key digests the eval's score fingerprint (eval.score_fingerprint, the one a resumed eval must
  match): the scorer's identity (model, parameter, tokenizer and head digests, dtypes, scoring, kernel and
  bucket config: maxscore/files/identity.py), the template, instruction, label ids, score mode, truncation and
  passage settings. A changed model or prompt reads another directory, so an entry is never trusted across a
  change.
- The pair key digests the query text and the document text.
- Every process appends to a file of its own, line by line, so processes writing at once never touch the
  same file; a torn or corrupt line (a killed writer, a bad disk) is skipped and counted, and its pair is
  scored again.
- A run loads the directory once, at its start (every process of a multi-process run before any writes, so all
  decide alike); entries written during the run serve later runs.

Scores are kept as the eval writes them (float32 values as JSON numbers), so a cached pair's score is the score
the run that cached it wrote, bit for bit.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import socket
import uuid
from typing import Any, Mapping, Optional, Sequence

from absl import logging

FORMAT_VERSION = 1


def scorer_key(fingerprint: Mapping[str, Any]) -> str:
  """The digest of a score fingerprint (what a ranking score depends on besides the query and document texts)."""
  what = {"format_version": FORMAT_VERSION, "fingerprint": fingerprint}
  return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def pair_key(query: str, doc: str) -> str:
  return hashlib.sha256(json.dumps([query, doc]).encode()).hexdigest()[:32]


@dataclasses.dataclass
class ScoreCache:
  directory: pathlib.Path
  entries: dict[str, float] = dataclasses.field(default_factory=dict)
  hits: int = 0
  misses: int = 0
  corrupt: int = 0
  written: int = 0
  _file: Any = None

  @classmethod
  def open(cls, root: os.PathLike, fingerprint: Mapping[str, Any]) -> "ScoreCache":
    """The cache of this score fingerprint (eval.score_fingerprint) under `root`, every readable entry loaded."""
    return cls.load(pathlib.Path(root) / scorer_key(fingerprint))

  @classmethod
  def load(cls, directory: os.PathLike) -> "ScoreCache":
    """The cache in `directory` (one scorer key's), created if missing, with every readable entry loaded."""
    cache = cls(pathlib.Path(directory))
    cache.directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(cache.directory.glob("*.jsonl")):
      with open(path, "rb") as f:
        for raw in f:
          try:
            rec = json.loads(raw)
            key, score = rec["k"], rec["s"]
            if not isinstance(key, str) or isinstance(score, bool) or not isinstance(score, (int, float)):
              raise ValueError(rec)
          except (ValueError, KeyError, TypeError):
            cache.corrupt += 1
            continue
          cache.entries[key] = float(score)
    if cache.corrupt:
      logging.warning("score cache %s: %d unreadable lines skipped (their pairs are scored again)", cache.directory,
                      cache.corrupt)
    return cache

  def get(self, query: str, docs: Sequence[str]) -> list[Optional[float]]:
    """The cached score of each (query, doc), None where there is none; counts hits and misses."""
    out = [self.entries.get(pair_key(query, d)) for d in docs]
    found = sum(s is not None for s in out)
    self.hits, self.misses = self.hits + found, self.misses + len(out) - found
    return out

  def put(self, query: str, docs: Sequence[str], scores: Sequence[float]) -> None:
    """Appends the pairs to this process's own file (flushed line by line); they serve later runs."""
    if self._file is None:
      name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
      self._file = open(self.directory / name, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    self._file.write("".join(json.dumps({"k": pair_key(query, d), "s": float(s)}, allow_nan=False) + "\n"
                             for d, s in zip(docs, scores)))
    self._file.flush()
    self.written += len(docs)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None

  def report(self) -> dict[str, Any]:
    return {"dir": str(self.directory), "hits": self.hits, "misses": self.misses, "written": self.written,
            "corrupt_lines": self.corrupt}
