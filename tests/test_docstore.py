"""The document store (maxscore/datasets/docstore.py): it returns exactly the corpus.jsonl records, a changed corpus
is indexed again, problems are reported as reading the whole file reports them, and (slow) reading a run's
documents from a larger corpus costs time and memory of the run, not of the corpus."""

import json
import os
import subprocess
import sys

import pytest

from maxscore.datasets import data, docstore
from maxscore.distributed.processes import REPO, subprocess_env
from maxscore.errors import DataError
from maxscore.testing.at_once import run_at_once


def _corpus(path, n=300):
  recs = [{"_id": f"d{i}", "title": f"t{i}" if i % 3 else "", "text": f"text of document {i} " * (1 + i % 7)}
          for i in range(n)]
  path.write_text("".join(json.dumps(r) + "\n" for r in recs) + "\n")  # a trailing blank line
  return recs


def test_records_are_the_corpus_records_with_their_lines(tmp_path):
  recs = _corpus(tmp_path / "corpus.jsonl")
  store = docstore.DocStore.open(tmp_path / "corpus.jsonl", tmp_path / "index")
  assert store.built_seconds is not None and len(store) == 300 and store.problems == []
  wanted = {f"d{i}" for i in range(0, 300, 7)} | {"missing"}
  got = store.get(wanted)
  assert set(got) == wanted - {"missing"}
  for docid, (line, rec) in got.items():
    assert rec == recs[int(docid[1:])] and line == int(docid[1:]) + 1
  again = docstore.DocStore.open(tmp_path / "corpus.jsonl", tmp_path / "index")
  assert again.built_seconds is None and again.get(wanted) == got  # the index is reused


def test_a_changed_corpus_is_indexed_again(tmp_path):
  path = tmp_path / "corpus.jsonl"
  _corpus(path)
  docstore.DocStore.open(path, tmp_path / "index")
  text = path.read_text().replace("text of document 5 ", "TEXT OF DOCUMENT 5 ")  # same size, other bytes
  stat = path.stat()
  path.write_text(text)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old modification time
  store = docstore.DocStore.open(path, tmp_path / "index")
  assert store.built_seconds is not None and store.get({"d5"})["d5"][1]["text"].startswith("TEXT OF")


def test_problems_are_reported_as_the_whole_file_reports_them(tmp_path):
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True)
  (d / "queries.jsonl").write_text('{"_id": "q1", "text": "a query"}\n')
  (d / "qrels" / "test.tsv").write_text("q1\td1\t1\n")
  (d / "run.trec").write_text("q1 Q0 d1 1 2.0 x\nq1 Q0 d2 2 1.0 x\n")
  lines = ['{"_id": "d1", "text": "one"}', '{"_id": "d2", "text": "two"', '{"_id": "d3", "text": "a"}',
           '{"_id": "d3", "text": "b"}', '{"_id": "d2", "text": "two"}']
  (d / "corpus.jsonl").write_text("\n".join(lines) + "\n")
  with pytest.raises(DataError, match=r"corpus.jsonl:2: invalid JSON"):  # a truncated line: the first problem
    data.load_beir(d, d / "run.trec")
  ds = data.load_beir(d, d / "run.trec", skip_bad=True)
  # d3's repeat with other text is not counted: the run does not need d3 (as before the store)
  assert ds.skipped == {"bad_json_lines": 1} and [c[0] for c in ds.queries[0].candidates] == ["d1", "d2"]
  (d / "corpus.jsonl").write_bytes(b'{"_id": "d1", "text": "one"}\n\xff\xfe\n')
  with pytest.raises(DataError, match=r"corpus.jsonl:2: not UTF-8 text"):
    data.load_beir(d, d / "run.trec", skip_bad=True)


@pytest.mark.slow
def test_reading_a_run_from_a_larger_corpus_costs_the_run_not_the_corpus(tmp_path):
  """A 200k-document corpus against a 4k-document one, 200 queries x 100 candidates, in fresh processes once the
  indexes exist: the lookups take seconds and the peak RSS grows by far less than the corpus (CI-sized; the
  2M-document figures are in BENCHMARKS.md)."""
  def bench(n):
    code = ("import json,sys; from maxscore.bench import corpus_bench as b; "
            f"r = b.run(b.CorpusBenchOptions(num_docs={n}, num_queries=200, full_parse=False, "
            f"workdir={str(tmp_path / str(n))!r})); print(json.dumps(r))")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(1), cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
  small, large = bench(4000), bench(200_000)
  print(f"open + lookups: {small['open_and_lookup_s']:.2f} s (4k docs), {large['open_and_lookup_s']:.2f} s (200k); "
        f"peak RSS after lookups {small['rss_mb_after_lookup']:.0f} / {large['rss_mb_after_lookup']:.0f} MB; "
        f"corpus {large['corpus_mb']:.0f} MB")
  assert large["open_and_lookup_s"] < 10
  # the process's peak includes the build; the lookups must not add the corpus to it
  assert large["rss_mb_after_lookup"] - large["rss_mb_after_build"] < 50
  assert large["rss_mb_after_build"] - small["rss_mb_after_build"] < large["corpus_mb"] / 2


# Each child opens the corpus's document store and BM25 index (both built in the per-user cache on first use) and
# checks a lookup in each, all of them at the same moment.
_OPEN_AT_ONCE = """
store = docstore.DocStore.open(corpus)
assert store.get({"d7"})["d7"][1]["text"].startswith("text of document 7 "), "store"
index, docids = bm25.BM25Index.for_corpus(corpus)
assert docids[index.top_k("fgzz", 1)[0][0]] == "d56", "bm25"
print("ok")
"""


@pytest.mark.slow
def test_processes_building_the_same_indexes_at_once_each_read_them_whole(tmp_path):
  """The processes of a multi-process job on one host share the user cache: 8 opening a new corpus at the same
  moment each build or read the document store and the BM25 index, and none fails or reads half a file (each
  builder's files move in whole, the key file last; with shared temporary names, or the old index removed
  first, some of them failed)."""
  word = lambda i: "".join(chr(97 + int(c)) for c in str(i)) + "zz"  # d56 alone holds "fgzz"
  path = tmp_path / "corpus.jsonl"
  path.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"text of document {i} {word(i)} " * 3}) + "\n"
                          for i in range(20_000)))
  env = dict(subprocess_env(1), MAXSCORE_CACHE_DIR=str(tmp_path / "cache"))
  imports = "import pathlib, sys\nfrom maxscore.datasets import bm25, docstore\n"
  done = run_at_once(imports, "corpus = pathlib.Path(sys.argv[2])\n" + _OPEN_AT_ONCE, [path], 8, env, tmp_path)
  assert [(code, out.strip().splitlines()[-1:]) for code, out, _ in done] == [(0, ["ok"])] * 8, \
      [err[-1500:] for _, _, err in done]
  assert not [p.name for p in (tmp_path / "cache").rglob("*.building")]  # no builder's directory left behind
