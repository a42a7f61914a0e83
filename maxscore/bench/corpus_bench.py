"""Reading a BEIR corpus at scale: a generated corpus, its document-store index (maxscore/datasets/docstore.py),
and the loader's cost for a many-query run, against parsing the whole corpus.jsonl as the loader did before
(beir_files.read_corpus: every line parsed and checked, the needed documents kept). An index already in the workdir is
reused, so a second run times a fresh process reading through an existing index.

    report = run(CorpusBenchOptions(num_docs=2_000_000, num_queries=1000))

Each phase is timed apart, and the peak RSS of the process (ru_maxrss) is read after it: generate the corpus,
parse it whole (the old start-up, with `full_parse`), build the index, then open the index and look up every
candidate of the run (the new start-up: what `data.load_beir` does for the corpus).
"""

import dataclasses
import json
import pathlib
import resource
import shutil
import tempfile
import time
from typing import Any, Optional

import numpy as np

from maxscore.datasets import beir_files, docstore

_WORDS = ("index", "query", "vector", "token", "model", "score", "passage", "corpus", "search", "rank", "python",
          "module", "object", "return", "value", "string", "number", "function", "class", "error")


@dataclasses.dataclass(frozen=True)
class CorpusBenchOptions:
  """scripts/bench_corpus.py's settings (configs/bench_corpus.yml documents each key)."""
  num_docs: int = 200_000
  words_per_doc: int = 60
  num_queries: int = 1000
  candidates: int = 100
  full_parse: bool = True
  workdir: Optional[str] = None
  seed: int = 0


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generate(path: pathlib.Path, num_docs: int, words_per_doc: int, seed: int) -> None:
  """A BEIR corpus.jsonl of `num_docs` documents of random words (title and text)."""
  rng = np.random.default_rng(seed)
  with open(path, "w", encoding="utf-8") as f:
    for start in range(0, num_docs, 10_000):
      n = min(10_000, num_docs - start)
      picks = rng.integers(0, len(_WORDS), size=(n, words_per_doc))
      f.write("".join(json.dumps({"_id": f"doc{start + i}", "title": _WORDS[row[0]],
                                  "text": " ".join(_WORDS[w] for w in row)}) + "\n" for i, row in enumerate(picks)))


def run(opts: CorpusBenchOptions) -> dict[str, Any]:
  root = pathlib.Path(opts.workdir or tempfile.mkdtemp(prefix="maxscore-corpus-bench-"))
  root.mkdir(parents=True, exist_ok=True)
  corpus, index = root / "corpus.jsonl", root / "index"
  report: dict[str, Any] = {"options": dataclasses.asdict(opts), "rss_mb_start": _rss_mb()}
  t = time.perf_counter()
  if not corpus.exists():
    generate(corpus, opts.num_docs, opts.words_per_doc, opts.seed)
  report["generate_s"] = time.perf_counter() - t
  report["corpus_mb"] = corpus.stat().st_size / 1e6
  rng = np.random.default_rng(opts.seed + 1)
  wanted = [f"doc{i}" for i in rng.integers(0, opts.num_docs, size=opts.num_queries * opts.candidates)]
  report["index_build_s"] = docstore.DocStore.open(corpus, index).built_seconds  # None: the index was there
  report["rss_mb_after_build"] = _rss_mb()
  t = time.perf_counter()
  store = docstore.DocStore.open(corpus, index)  # the index exists: checked and mapped
  records = store.get(wanted)
  report["open_and_lookup_s"] = time.perf_counter() - t
  report["lookups"] = len(wanted)
  report["distinct_documents"] = len(records)
  report["lookups_per_s"] = len(set(wanted)) / report["open_and_lookup_s"]
  report["rss_mb_after_lookup"] = _rss_mb()
  if opts.full_parse:
    t = time.perf_counter()
    beir_files.read_corpus(corpus, set(wanted))  # the loader before the store: every line parsed, the needed kept
    report["full_parse_s"] = time.perf_counter() - t
    report["rss_mb_after_full_parse"] = _rss_mb()
  if not opts.workdir:
    shutil.rmtree(root, ignore_errors=True)
  return report


def summary(report: dict[str, Any]) -> str:
  o = report["options"]
  lines = [f"corpus: {o['num_docs']:,} documents, {report['corpus_mb']:.0f} MB (generated in {report['generate_s']:.1f} s)",
           "index build (once): " + ("existed" if report["index_build_s"] is None else
                                     f"{report['index_build_s']:.1f} s"),
           f"open index + {report['lookups']:,} lookups ({o['num_queries']} queries x {o['candidates']}): "
           f"{report['open_and_lookup_s']:.2f} s, {report['lookups_per_s']:,.0f} documents/s",
           f"peak RSS: {report['rss_mb_start']:.0f} MB at start, {report['rss_mb_after_build']:.0f} MB after the build, "
           f"{report['rss_mb_after_lookup']:.0f} MB after the lookups"]
  if "full_parse_s" in report:
    lines.append(f"whole-corpus parse (the loader before the store): {report['full_parse_s']:.1f} s, peak RSS "
                 f"{report['rss_mb_after_full_parse']:.0f} MB")
  return "\n".join(lines) + "\n"
