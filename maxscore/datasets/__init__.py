"""Rerank data sets: BEIR directories with a first-stage run, or one JSONL record per query (`data`), a BEIR
directory's files one at a time (`beir_files`), the corpus document store that reads a large corpus by offset
(`docstore`), BM25 over a corpus (`bm25`), and the reading helpers they share (`records`). A malformed file is
maxscore.errors.DataError."""

from maxscore.datasets.data import RerankSet, load_rerank_set

__all__ = ["RerankSet", "load_rerank_set"]
