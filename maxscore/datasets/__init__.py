"""Rerank data sets: BEIR directories with a first-stage run, or one JSONL record per query (`data`), the corpus
document store that reads a large corpus by offset (`docstore`), BM25 over a corpus (`bm25`), and the record
helpers both readers share (`records`)."""

from maxscore.datasets.data import DataError, RerankSet, load_rerank_set

__all__ = ["DataError", "RerankSet", "load_rerank_set"]
