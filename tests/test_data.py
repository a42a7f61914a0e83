"""Rerank datasets (BEIR + run, JSONL), TREC run files, prompt templates and the embedded default."""

import json
import logging
import re

import numpy as np
import pytest

from maxscore.checkpoints import storage as checkpointing
from maxscore.checkpoints.tokenizer import load_tokenizer
from maxscore.datasets import beir_files, data
from maxscore.errors import DataError
from maxscore.rerank import prompts


def _write_jsonl(path, records):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
  return path


def _rec(qid, split=None, n=3, **kw):
  r = {"qid": qid, "query": f"query {qid}", "candidates": [{"docid": f"{qid}-d{i}", "text": f"text {i}"}
                                                          for i in range(n)], "qrels": {f"{qid}-d0": 2}}
  if split:
    r["split"] = split
  r.update(kw)
  return r


@pytest.fixture
def beir(tmp_path):
  """A BEIR directory with 3 queries and a run whose lines are not in rank order."""
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True)
  _write_jsonl(d / "corpus.jsonl", [{"_id": f"d{i}", "title": "T" if i == 1 else "", "text": f"doc {i}"}
                                    for i in range(6)])
  _write_jsonl(d / "queries.jsonl", [{"_id": f"q{i}", "text": f"query {i}"} for i in range(3)])
  (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\nq0\td2\t2\nq1\td3\t1\n")
  run = tmp_path / "run.trec"
  run.write_text("q1 Q0 d3 2 0.5 bm25\nq1 Q0 d4 1 0.9 bm25\nq0 Q0 d2 3 0.1 bm25\nq0 Q0 d1 1 0.7 bm25\n"
                 "q0 Q0 d0 2 0.4 bm25\n")
  return d, run


def _append(path, text):
  with open(path, "a") as f:
    f.write(text)


# --- BEIR -----------------------------------------------------------------------------------------
def test_beir_loads_in_run_order_top_k_by_rank(beir):
  d, run = beir
  ds = data.load_beir(d, run, "test", top_k=2)
  assert [q.qid for q in ds.queries] == ["q1", "q0"]
  assert ds.queries[0].candidates == (("d4", "doc 4"), ("d3", "doc 3"))
  assert ds.queries[1].candidates == (("d1", "T doc 1"), ("d0", "doc 0"))  # title joined, d2 (rank 3) cut
  assert ds.qrels == {"q1": {"d3": 1}, "q0": {"d1": 1, "d2": 2}}
  assert data.load_beir(d, run, "test", top_k=0).num_candidates == 5


def test_a_judged_document_missing_from_the_corpus_is_named_and_counted(beir, caplog):
  """A judged docid the corpus does not hold can never be ranked: the load warns with an example and the counts
  reach summary.json (the dataset's source); a query left with no relevant document is counted apart."""
  d, run = beir
  clean = data.load_beir(d, run, "test")
  assert clean.source["judged_docids_not_in_corpus"] == 0
  assert clean.source["queries_whose_relevant_documents_are_not_in_corpus"] == 0
  _append(d / "qrels" / "test.tsv", "q0\tgone\t1\nq1\tlost\t2\nq1\td4\t0\n")
  (d / "qrels" / "test.tsv").write_text((d / "qrels" / "test.tsv").read_text().replace("q1\td3\t1\n", ""))
  with caplog.at_level(logging.WARNING):
    ds = data.load_beir(d, run, "test")
  assert ds.source["judged_docids_not_in_corpus"] == 2
  assert ds.source["queries_whose_relevant_documents_are_not_in_corpus"] == 1  # q1: its one relevant doc is lost
  assert "2 judged documents of the evaluated queries are not in" in caplog.text
  assert "1 queries have no relevant document there" in caplog.text
  assert ds.qrels["q1"] == {"lost": 2, "d4": 0}  # the judgments are kept: a query scores 0, as trec_eval scores it


@pytest.mark.parametrize("case, fragment", [
    ("bad_json_corpus", "corpus.jsonl:4: invalid JSON"),
    ("qid_not_in_qrels", "run.trec:6: query 'q2' has no judgments"),
    ("qrels_missing_qid", "test.tsv:5: missing query-id"),
    ("qrels_unknown_qid", "test.tsv:5: query-id 'q9' is not in queries.jsonl"),
    ("empty_corpus_text", "corpus.jsonl:7: document 'd6' has empty title and text"),
    ("unknown_docid", "run.trec:6: docid 'nope' is not in"),
    ("empty_queries_file", "queries.jsonl is empty: it must hold the queries"),
])
def test_beir_malformed_inputs_name_file_and_line(beir, case, fragment):
  d, run = beir
  if case == "bad_json_corpus":
    (d / "corpus.jsonl").write_text('{"_id": "d0", "text": "a"}\n\n{"_id": "d1", "text": "b"}\n{"_id": "d2",\n')
  elif case == "qid_not_in_qrels":
    _append(run, "q2 Q0 d0 1 1.0 bm25\n")
  elif case == "qrels_missing_qid":
    _append(d / "qrels" / "test.tsv", "\td0\t1\n")
  elif case == "qrels_unknown_qid":
    _append(d / "qrels" / "test.tsv", "q9\td0\t1\n")
  elif case == "empty_corpus_text":
    _append(d / "corpus.jsonl", json.dumps({"_id": "d6", "title": "", "text": "  "}) + "\n")
    _append(run, "q1 Q0 d6 3 0.1 bm25\n")
  elif case == "unknown_docid":
    _append(run, "q1 Q0 nope 3 0.1 bm25\n")
  elif case == "empty_queries_file":  # not "query-id 'q1' is not in queries.jsonl" from the qrels
    (d / "queries.jsonl").write_text("\n")
    with pytest.raises(DataError, match=re.escape(fragment)):
      beir_files.read_queries(d / "queries.jsonl")
  with pytest.raises(DataError, match=re.escape(fragment)) as e:
    data.load_beir(d, run, "test")
  assert "\n" not in str(e.value)


def test_beir_run_covering_several_splits(beir):
  """One run over train/dev/test queries: each split takes its own; a query judged nowhere stays an error."""
  d, run = beir
  (d / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq2\td5\t1\n")
  _append(run, "q2 Q0 d5 1 1.0 bm25\nq2 Q0 d0 2 0.5 bm25\n")
  test = data.load_beir(d, run, "test")
  assert [q.qid for q in test.queries] == ["q1", "q0"] and test.source["run_lines_of_other_splits"] == 2
  assert test.skipped == {}
  dev = data.load_beir(d, run, "dev")
  assert [q.qid for q in dev.queries] == ["q2"] and dev.qrels == {"q2": {"d5": 1}}
  assert dev.source["run_lines_of_other_splits"] == 5
  (d / "qrels" / "dev.tsv").unlink()
  with pytest.raises(DataError, match="query 'q2' has no judgments"):
    data.load_beir(d, run, "test")


def test_beir_skip_bad_counts(beir):
  d, run = beir
  _append(run, "q2 Q0 d0 1 1.0 bm25\nq1 Q0 nope 3 0.1 bm25\nq1 Q0 d6 4 0.1 bm25\nbroken line\n")
  _append(d / "corpus.jsonl", "{oops\n" + json.dumps({"_id": "d6", "text": ""}) + "\n")
  _append(d / "qrels" / "test.tsv", "\td0\t1\n")
  ds = data.load_beir(d, run, "test", skip_bad=True)
  assert ds.skipped == {"bad_qrels": 1, "qids_not_in_qrels": 1, "bad_run_lines": 1, "bad_json_lines": 1,
                        "empty_texts": 1, "unknown_docids": 1}
  assert [d for d, _ in ds.queries[0].candidates] == ["d4", "d3"]  # d6 (empty) and nope dropped


def test_beir_duplicate_corpus_id_with_other_text_is_refused_or_skipped(beir):
  """A corpus _id given twice with different text: which was meant is unknown, so it is an error naming
  the line (or skipped and counted with skip_bad); the same text twice is harmless."""
  d, run = beir
  _append(d / "corpus.jsonl", json.dumps({"_id": "d3", "text": "doc 3"}) + "\n")  # identical: fine
  assert data.load_beir(d, run, "test").skipped == {}
  _append(d / "corpus.jsonl", json.dumps({"_id": "d3", "text": "another doc"}) + "\n")
  with pytest.raises(DataError, match=re.escape("corpus.jsonl:8")) as e:
    data.load_beir(d, run, "test")
  assert "d3" in str(e.value) and "\n" not in str(e.value)
  ds = data.load_beir(d, run, "test", skip_bad=True)
  assert ds.skipped == {"duplicate_docids": 1}
  assert dict(ds.queries[0].candidates)["d3"] == "doc 3"


# --- JSONL ----------------------------------------------------------------------------------------
def test_jsonl_split_filter_and_top_k(tmp_path):
  path = _write_jsonl(tmp_path / "s.jsonl", [_rec("a", "train"), _rec("b", "test"), _rec("c")])
  assert [q.qid for q in data.load_jsonl(path, "test").queries] == ["b", "c"]  # no split field: every split
  assert [q.qid for q in data.load_jsonl(path, "all").queries] == ["a", "b", "c"]
  ds = data.load_jsonl(path, "train", top_k=2)
  assert ds.queries[0].candidates == (("a-d0", "text 0"), ("a-d1", "text 1"))
  assert ds.qrels == {"a": {"a-d0": 2}, "c": {"c-d0": 2}}


@pytest.mark.parametrize("bad, fragment, reason", [
    ('{"qid": "x", "query": ', "s.jsonl:2: invalid JSON", "bad_json_lines"),
    (json.dumps(_rec("x", candidates=[{"docid": "d", "text": ""}])), "s.jsonl:2: candidates[0] of qid 'x'",
     "empty_texts"),
    (json.dumps({"qid": "x", "query": "q", "candidates": []}), "s.jsonl:2: missing field(s) ['qrels']",
     "bad_records"),
    (json.dumps(_rec("a")), "s.jsonl:2: qid 'a' already appeared at", "duplicate_qids"),
    (json.dumps(_rec("x", qrels={"d": "high"})), "s.jsonl:2: qrels['d']='high'", "bad_qrels"),
])
def test_jsonl_malformed_line_errors_or_is_skipped(tmp_path, bad, fragment, reason):
  path = _write_jsonl(tmp_path / "s.jsonl", [_rec("a"), bad, _rec("b")])
  with pytest.raises(DataError, match=re.escape(fragment)):
    data.load_jsonl(path, "all")
  ds = data.load_jsonl(path, "all", skip_bad=True)
  assert ds.skipped == {reason: 1}
  assert {"a", "b"} <= {q.qid for q in ds.queries}


def test_no_queries_is_an_error(tmp_path):
  path = _write_jsonl(tmp_path / "s.jsonl", [_rec("a", "train")])
  with pytest.raises(DataError, match="no queries to rerank"):
    data.load_jsonl(path, "test")
  with pytest.raises(DataError, match="either --jsonl or --data_dir"):
    data.load_rerank_set(jsonl=path, data_dir=tmp_path)


# --- TREC run lines ---------------------------------------------------------------------------------
def test_trec_lines_rank_like_trec_eval_and_read_back(tmp_path):
  scores = np.float32([0.5, 0.25, 0.5, 1 / 3])
  lines = data.trec_lines("q", ["a", "b", "c", "d"], [float(s) for s in scores], "tag")
  assert [l.split()[2] for l in lines] == ["c", "a", "d", "b"]  # ties: docid descending
  assert [l.split()[3] for l in lines] == ["1", "2", "3", "4"]
  (tmp_path / "r.trec").write_text("\n".join(lines) + "\n")
  back = data.read_trec_run(tmp_path / "r.trec")["q"]
  assert np.float32(back["d"]) == scores[3]  # the float32 survives the text form


# --- prompts --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(data.DEFAULT_CHECKPOINT / "tokenizer")


def test_prompt_sides_and_counted_truncation(tok):
  b = prompts.PromptBuilder(tok, prompts.TEMPLATES["plain"], max_query_tokens=3, max_item_tokens=5)
  q, q_cut = b.query("what does the assert statement do")
  assert q_cut and tok.decode(q).startswith("Query: ") and tok.decode(q).endswith("\nDocument:")
  item, cut = b.item("short")
  assert not cut and item == tuple(tok.encode(" short\nRelevant:"))
  doc = "one two three four five six seven eight nine ten"
  long_item, cut = b.item(doc)
  assert cut and long_item == tuple(tok.encode(f" {tok.decode(tok.encode(doc)[:5])}\nRelevant:"))


def test_qwen3_template_segments(tok):
  t = prompts.TEMPLATES["qwen3_reranker"]
  joined = "".join(t.query_segments).format(query="Q", instruction="I") + "".join(t.item_segments).format(doc="D")
  assert joined == ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and '
                    'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
                    '<|im_start|>user\n<Instruct>: I\n<Query>: Q\n<Document>: D<|im_end|>\n'
                    '<|im_start|>assistant\n<think>\n\n</think>\n\n')
  assert t.default_labels == ("yes", "no")


def test_labels_by_string_or_id(tok):
  assert prompts.resolve_labels(tok, ["Yes", "No"]) == (tok.label_id("Yes"), tok.label_id("No"))
  assert prompts.resolve_labels(tok, ["17", 3]) == (17, 3)
  with pytest.raises(ValueError, match="exactly 1 token"):
    prompts.resolve_labels(tok, ["definitely not"])


# --- the embedded default --------------------------------------------------------------------------
def test_default_assets_are_small_consistent_and_split():
  files = [p for p in data.DEFAULT_DIR.rglob("*") if p.is_file()]
  # ~25.7 MB: a 1.2M-parameter float32 model and the first set (~6 MB), the held-out python-docs set (~9.6 MB:
  # 9,000 paragraphs, graded qrels of 1,278 keyword and 145 question queries, their BM25 top 30), the Perl FAQ
  # test set (~8.5 MB: 22,581 passages, 301 questions, BM25's top 30 and the teacher's scores of its top 20) and
  # the R FAQ test set (~1.8 MB: 4,592 passages, 75 questions, the same runs)
  assert sum(p.stat().st_size for p in files) < 26.5e6
  model, tok_path = checkpointing.read_metadata(data.DEFAULT_CHECKPOINT)
  tok = load_tokenizer(tok_path)
  assert model.vocab_size == tok.vocab_size and model.family == "qwen3"
  assert tok.label_id("Yes") != tok.label_id("No")  # single tokens, else label_id raises
  full = data.load_jsonl(data.DEFAULT_JSONL, "all")
  splits = {s: data.load_jsonl(data.DEFAULT_JSONL, s) for s in ("train", "dev", "test")}
  assert sum(len(s.queries) for s in splits.values()) == len(full.queries) >= 50
  for q in full.queries:
    assert 20 <= len(q.candidates) <= 50
    assert any(full.qrels[q.qid].get(d, 0) > 0 for d, _ in q.candidates)
