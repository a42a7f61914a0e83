"""A BM25 index over a small corpus (lowercase [a-z] words, as the head study's BM25 reference):
a first-stage ranker for mining hard negatives, not a scoring path of maxscore.

    index = BM25Index(["the import statement ...", "assignment ..."])
    index.top_k("import statement", 5)        # [(doc index, score), ...] best first, score > 0
"""

import collections
import math
import re
from typing import Sequence

import numpy as np

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
  return _WORD.findall(text.lower())


class BM25Index:
  """Okapi BM25 (k1, b) with idf log(1 + (n - df + 0.5) / (df + 0.5)) over the documents given."""

  def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75):
    self.n = len(docs)
    postings: dict[str, tuple[list[int], list[int]]] = collections.defaultdict(lambda: ([], []))
    lengths = np.zeros(self.n, np.float64)
    for i, text in enumerate(docs):
      counts = collections.Counter(words(text))
      lengths[i] = sum(counts.values())
      for w, c in counts.items():
        postings[w][0].append(i)
        postings[w][1].append(c)
    avg = lengths.mean() if self.n else 1.0
    norm = k1 * (1 - b + b * lengths / max(avg, 1e-9))
    self._terms: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    self.doc_freq: dict[str, int] = {}  # word -> number of documents holding it
    for w, (ids, tfs) in postings.items():
      ids_a, tf = np.asarray(ids, np.int64), np.asarray(tfs, np.float64)
      self.doc_freq[w] = len(ids)
      self._terms[w] = (ids_a, self.idf(w) * tf * (k1 + 1) / (tf + norm[ids_a]))

  def idf(self, word: str) -> float:
    """log(1 + (n - df + 0.5) / (df + 0.5)); an unseen word has df 0."""
    df = self.doc_freq.get(word, 0)
    return math.log(1 + (self.n - df + 0.5) / (df + 0.5))

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every document for `query` (each query word counted once per occurrence)."""
    out = np.zeros(self.n, np.float64)
    for w in words(query):
      if w in self._terms:
        ids, contrib = self._terms[w]
        out[ids] += contrib
    return out

  def top_k(self, query: str, k: int) -> list[tuple[int, float]]:
    """The `k` best documents with a positive score, best first (ties: lower index first)."""
    s = self.scores(query)
    hits = np.nonzero(s > 0)[0]
    order = hits[np.lexsort((hits, -s[hits]))][:k]
    return [(int(i), float(s[i])) for i in order]
