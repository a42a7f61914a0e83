"""BM25 over lowercase [a-z] words, computed by the `bm25s` library: the first stage of the embedded
default (a TREC run over its whole corpus) and the hard-negative miner of the fine-tuning pairs.

    index = BM25Index(["the import statement ...", "assignment ..."])
    index.top_k("import statement", 5)        # [(doc index, score), ...] best first, score > 0
    run = first_stage_run(corpus, queries, top_k=100)   # {qid: {docid: score}}

The scores are Okapi BM25: sum over query words (each occurrence) of
idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len)), idf = log(1 + (n - df + 0.5) / (df + 0.5)),
which is bm25s's ATIRE term weight with its Lucene idf, in float64.
"""

import hashlib
import json
import math
import os
import pathlib
import re
from typing import Collection, Mapping, Sequence

import bm25s
import bm25s.stopwords
import numpy as np

from maxscore.datasets import beir_files, docstore
from maxscore.files import cache

_INDEX_VERSION = 1  # of the saved index (BM25Index.for_corpus)

_WORD = re.compile(r"[a-z]+")
ENGLISH_STOPWORDS = frozenset(bm25s.stopwords.STOPWORDS_EN)  # bm25s's English list (33 words)


def words(text: str, stopwords: Collection[str] = ()) -> list[str]:
  """The lowercase [a-z] words of `text`, those in `stopwords` left out."""
  found = _WORD.findall(text.lower())
  return [w for w in found if w not in stopwords] if stopwords else found


class BM25Index:
  """Okapi BM25 (k1, b) over the documents given, indexed by bm25s; `stopwords` are left out of documents and
  queries alike (ENGLISH_STOPWORDS for questions in English; none by default)."""

  def __init__(self, docs: Sequence[str], k1: float = 1.2, b: float = 0.75, _loaded=None,
               stopwords: Collection[str] = ()):
    self.stopwords = frozenset(stopwords)
    if _loaded is not None:  # BM25Index.for_corpus: an index saved before, memory-mapped
      self._bm25, self.n = _loaded
    else:
      self.n = len(docs)
      tokens = [words(text, self.stopwords) for text in docs]
      self._bm25 = bm25s.BM25(k1=k1, b=b, method="atire", idf_method="lucene", dtype="float64")
      self._bm25.index(tokens, show_progress=False)
    indptr = np.asarray(self._bm25.scores["indptr"])
    # word -> number of documents holding it (bm25s stores one entry per (word, document) pair)
    # (its vocabulary may also hold a placeholder word past the index's columns, in no document)
    self.doc_freq: dict[str, int] = {w: int(indptr[i + 1] - indptr[i]) for w, i in self._bm25.vocab_dict.items()
                                     if i + 1 < len(indptr) and indptr[i + 1] > indptr[i]}

  def idf(self, word: str) -> float:
    """log(1 + (n - df + 0.5) / (df + 0.5)); an unseen word has df 0."""
    df = self.doc_freq.get(word, 0)
    return math.log(1 + (self.n - df + 0.5) / (df + 0.5))

  def scores(self, query: str) -> np.ndarray:
    """BM25 score of every document for `query` (each query word counted once per occurrence)."""
    ids = [i for i in self._bm25.get_tokens_ids(words(query, self.stopwords)) if i + 1 < len(self._bm25.scores["indptr"])]
    if not ids or not self.n:
      return np.zeros(self.n, np.float64)
    return np.asarray(self._bm25.get_scores_from_ids(ids), np.float64)

  def top_k(self, query: str, k: int) -> list[tuple[int, float]]:
    """The `k` best documents with a positive score, best first (ties: lower index first)."""
    s = self.scores(query)
    hits = np.nonzero(s > 0)[0]
    order = hits[np.lexsort((hits, -s[hits]))][:k]
    return [(int(i), float(s[i])) for i in order]


  @classmethod
  def for_corpus(cls, corpus: os.PathLike, k1: float = 1.2, b: float = 0.75) -> tuple["BM25Index", list[str]]:
    """(the BM25 index of a BEIR corpus.jsonl, its docids in index order), built once and saved by bm25s in the
    per-user cache (maxscore/files/cache.py: bm25/), then loaded memory-mapped by every later call. The saved index
    is used only while its corpus is the one indexed (the document store's signature: size, modification time,
    sampled blocks) with the same k1, b and tokenization."""
    corpus = pathlib.Path(corpus)
    key = {"version": _INDEX_VERSION, "corpus": str(corpus.resolve()), "k1": k1, "b": b,
           "signature": docstore.corpus_signature(corpus)}
    where = cache.user_cache_dir() / "bm25" / hashlib.sha256(str(corpus.resolve()).encode()).hexdigest()[:24]
    try:
      if json.loads((where / "key.json").read_text()) == key:
        docids = json.loads((where / "docids.json").read_text())
        loaded = bm25s.BM25.load(str(where / "bm25s"), mmap=True, show_progress=False)
        return cls((), k1, b, _loaded=(loaded, len(docids))), docids
    except (OSError, ValueError):
      pass
    texts = beir_files.read_corpus(corpus)
    docids = list(texts)
    index = cls([texts[d] for d in docids], k1, b)
    with cache.building(where, "key.json") as built:  # other processes may build it at once: each file moves whole
      index._bm25.save(str(built / "bm25s"), show_progress=False)  # pylint: disable=protected-access
      (built / "docids.json").write_text(json.dumps(docids))
      (built / "key.json").write_text(json.dumps(key))  # moved last: a half-saved index is never used
    return index, docids


def first_stage_run(corpus: Mapping[str, str], queries: Mapping[str, str], top_k: int = 100,
                    k1: float = 1.2, b: float = 0.75, stopwords: Collection[str] = ()) -> dict[str, dict[str, float]]:
  """{qid: {docid: score}}: each query's `top_k` best corpus documents with a positive BM25 score, best
  first (ties: corpus order), every document of `corpus` indexed (`stopwords` left out: BM25Index)."""
  docids = list(corpus)
  index = BM25Index([corpus[d] for d in docids], k1, b, stopwords=stopwords)
  return {qid: {docids[i]: s for i, s in index.top_k(text, top_k)} for qid, text in queries.items()}
