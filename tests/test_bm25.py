"""BM25 (maxscore/datasets/bm25.py, computed by bm25s): scores equal the Okapi formula worked by hand on a
toy corpus, the library's own Lucene variant up to its (k1 + 1) factor; the first stage and the head
study's reference ranking read those scores."""

import math

import bm25s
import numpy as np
import pytest

from maxscore.datasets import bm25, data
from maxscore.lm.tokenizer_training import sample_texts
from maxscore.studies import head_study

# The toy corpus: lowercase [a-z] words per document "apple banana" (2), "apple cherry cherry cherry" (4),
# "date" (1); n = 3 documents, average length 7 / 3.
DOCS = ["Apple banana.", "apple cherry cherry cherry", "date"]
K1, B = 1.2, 0.75


def _idf(df, n=3):
  """Lucene's idf: log(1 + (n - df + 0.5) / (df + 0.5))."""
  return math.log(1 + (n - df + 0.5) / (df + 0.5))


def _tf_part(tf, length, avg_length=7 / 3):
  """Okapi's term-frequency saturation with the length normalization."""
  return tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg_length))


def test_bm25_equals_a_hand_computed_case():
  expected = [_idf(2) * _tf_part(1, 2),
              _idf(2) * _tf_part(1, 4) + _idf(1) * _tf_part(3, 4),
              0.0]
  index = bm25.BM25Index(DOCS, K1, B)
  assert index.scores("apple cherry") == pytest.approx(expected, rel=1e-12)
  assert index.scores("APPLE, cherry!") == pytest.approx(expected, rel=1e-12)   # words: lowercase [a-z]
  assert index.scores("apple apple") == pytest.approx([2 * _idf(2) * _tf_part(1, 2), 2 * _idf(2) * _tf_part(1, 4), 0])
  assert list(index.scores("unseen words")) == [0, 0, 0]
  assert index.doc_freq == {"apple": 2, "banana": 1, "cherry": 1, "date": 1}
  assert index.top_k("apple cherry", 5) == [(1, pytest.approx(expected[1])), (0, pytest.approx(expected[0]))]


def test_bm25_equals_the_librarys_lucene_scores_times_k1_plus_1():
  """bm25s's Lucene variant drops the (k1 + 1) factor of the term weight; the rankings are the same."""
  docs = [p for p in sample_texts()[:60] if bm25.words(p)]
  k1, b = 1.5, 0.6
  lucene = bm25s.BM25(k1=k1, b=b, method="lucene", dtype="float64")
  lucene.index([bm25.words(d) for d in docs], show_progress=False)
  index = bm25.BM25Index(docs, k1, b)
  for query in ("the import statement", "class attribute lookup", "expression value"):
    ours = index.scores(query)
    ref = lucene.get_scores([w for w in bm25.words(query) if w in lucene.vocab_dict])
    np.testing.assert_allclose(ours, (k1 + 1) * ref, rtol=1e-12, atol=1e-12)
    assert ours.max() > 0


def test_first_stage_run_is_the_top_k_over_the_whole_corpus():
  corpus = {f"d{i}": t for i, t in enumerate(sample_texts()[:40])}
  run = bm25.first_stage_run(corpus, {"q": "the statement of a module"}, top_k=5)
  scores = bm25.BM25Index(list(corpus.values())).scores("the statement of a module")
  assert list(run["q"]) == [f"d{i}" for i in np.argsort(-scores, kind="stable")[:5]]
  assert list(run["q"].values()) == pytest.approx(sorted(scores, reverse=True)[:5])


def test_head_study_reference_is_bm25_over_the_distinct_candidates_of_the_set():
  """idf and the average length come from every distinct candidate of the set (here the toy corpus, "b"
  a candidate of both queries), not from one query's candidates."""
  s = data.RerankSet([data.RerankQuery("q1", "apple cherry", (("a", DOCS[0]), ("b", DOCS[1]))),
                      data.RerankQuery("q2", "Date", (("b", DOCS[1]), ("c", DOCS[2])))], {}, {})
  run = head_study.bm25_run(s, K1, B)
  assert run["q1"] == pytest.approx({"a": _idf(2) * _tf_part(1, 2),
                                     "b": _idf(2) * _tf_part(1, 4) + _idf(1) * _tf_part(3, 4)}, rel=1e-12)
  assert run["q2"] == pytest.approx({"b": 0.0, "c": _idf(1) * _tf_part(1, 1)}, rel=1e-12)


def test_bm25_reference_ranks_matching_documents_first():
  s = data.RerankSet([data.RerankQuery("q", "for loops", (("a", "while statements loop"), ("b", "the for loops"),
                                                            ("c", "nothing here")))], {"q": {"b": 1}}, {})
  run = head_study.bm25_run(s)["q"]
  assert run["b"] > run["a"] == run["c"] == 0.0


def test_a_corpus_index_is_saved_once_and_memory_mapped_after(tmp_path):
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  from maxscore.datasets.bm25 import BM25Index  # pylint: disable=import-outside-toplevel
  docs = {f"d{i}": f"the import statement {i} " + "binds names " * (i % 4) for i in range(50)}
  path = tmp_path / "corpus.jsonl"
  path.write_text("".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in docs.items()))
  built, ids = BM25Index.for_corpus(path)
  assert ids == list(docs)
  loaded, ids_again = BM25Index.for_corpus(path)
  assert ids_again == ids and loaded is not built
  in_memory = BM25Index(list(docs.values()))
  for query in ("import statement", "binds names", "nothing"):
    assert list(loaded.scores(query)) == list(in_memory.scores(query)) == list(built.scores(query))
    assert loaded.top_k(query, 5) == in_memory.top_k(query, 5)
  stat = path.stat()
  path.write_text(path.read_text().replace("statement 7 ", "statemenX 7 "))  # same size
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  changed, _ = BM25Index.for_corpus(path)
  assert changed.scores("statemenx")[7] > 0  # indexed again: the new word is there
