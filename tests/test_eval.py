"""The eval pipeline end to end: scripts' main, outputs checked against metrics, resume, errors, score.py."""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from maxscore import console, interrupt
from maxscore.datasets import data
from maxscore.distributed import processes
from maxscore.errors import ResumeError
from maxscore.lm.tokenizer_training import sample_texts
from maxscore.rerank import eval as eval_lib, eval_outputs, fusion, metrics, prompts
from maxscore.scoring import loading
from maxscore.testing import scripts

REPO = pathlib.Path(__file__).resolve().parent.parent
# Every test query has the same geometry (one packed shape): a query cut to 4 tokens, 8 candidates
# cut to 24 tokens.
EVAL_FLAGS = ["--max_query_tokens=4", "--max_item_tokens=24", "--noprogress"]
CFG = eval_lib.EvalConfig(max_query_tokens=4, max_item_tokens=24)
eval_rerank = scripts.load_script("eval_rerank")
score_script = scripts.load_script("score")


def _dataset(path, num_queries, seed=0):
  """JSONL queries over pydoc paragraphs: a short query from one paragraph, 8 long candidates,
  graded qrels (some queries with no relevant candidate)."""
  rng = np.random.default_rng(seed)
  paras = [p for p in sample_texts() if len(p.split()) >= 40 and not p.startswith(" ")]
  lines = []
  for q in range(num_queries):
    picks = rng.choice(len(paras), 8, replace=False)
    words = paras[picks[0]].split()
    cands = [{"docid": f"p{j}", "text": paras[j]} for j in rng.permutation(picks)]
    qrels = {f"p{picks[0]}": 2, f"p{picks[1]}": 1} if q % 5 else {f"p{picks[1]}": 0}
    lines.append(json.dumps({"qid": f"q{q:03d}", "query": " ".join(words[:5]), "candidates": cands,
                             "qrels": qrels}))
  path.write_text("\n".join(lines) + "\n")
  return path


@pytest.fixture(scope="module")
def scorer():
  return loading.build_scorer()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  return _dataset(tmp_path_factory.mktemp("data") / "small.jsonl", 6)


def _outputs(out):
  return {n: (out / n).read_bytes() for n in ("run.trec", "metrics_per_query.jsonl", "metrics.json")}


def _check_outputs(out, dataset, metric_names=prompts.DEFAULT_METRICS):
  """run.trec is a well-formed TREC run and every metric file equals metrics.evaluate on it."""
  run = data.read_trec_run(out / "run.trec")
  by_qid = {}
  for line in (out / "run.trec").read_text().splitlines():
    qid, q0, docid, rank, score, tag = line.split(" ")
    assert q0 == "Q0" and tag == "maxscore"
    by_qid.setdefault(qid, []).append((int(rank), float(score), docid))
  for q in dataset.queries:
    rows = by_qid[q.qid]
    assert [r for r, _, _ in rows] == list(range(1, len(q.candidates) + 1))
    assert sorted(d for _, _, d in rows) == sorted(d for d, _ in q.candidates)
    assert [(s, d) for _, s, d in rows] == sorted(((s, d) for _, s, d in rows), reverse=True)
  expected = metrics.evaluate(dataset.qrels, run, metric_names)
  per_query = [json.loads(l) for l in (out / "metrics_per_query.jsonl").read_text().splitlines()]
  assert [r["qid"] for r in per_query] == [q.qid for q in dataset.queries if q.qid in expected]
  for r in per_query:
    assert {k: v for k, v in r.items() if k != "qid"} == pytest.approx(expected[r["qid"]], abs=1e-12)
  agg = json.loads((out / "metrics.json").read_text())
  assert agg["num_queries"] == len(expected)
  assert agg["metrics"] == pytest.approx(metrics.aggregate(expected), abs=1e-12)
  # The first stage: each query's candidates in the given order, the same queries as the reranked run.
  given = {q.qid: {d: -float(i) for i, (d, _) in enumerate(q.candidates)} for q in dataset.queries}
  base = metrics.aggregate(metrics.evaluate(dataset.qrels, given, metric_names))
  assert agg["first_stage"] == pytest.approx(base, abs=1e-12)
  assert agg["delta"] == pytest.approx({n: agg["metrics"][n] - base[n] for n in base}, abs=1e-12)
  first = data.read_trec_run(out / "first_stage.trec")
  assert {q: sorted(r, key=r.get, reverse=True) for q, r in first.items()} == {
      q: list(r) for q, r in given.items()}
  return agg["metrics"]


def saved_qids(out):
  return set(data.read_trec_run(out / "run.trec"))


@pytest.mark.slow
def test_the_defaults_run_the_embedded_test_set(scorer, tmp_path, monkeypatch, capsys):
  """Every flag at its default but the query count (the first 16 of the Perl FAQ test set; that the bare command
  reads make eval's data is test_no_arguments_evaluate_the_data_make_eval_evaluates)."""
  monkeypatch.chdir(tmp_path)
  eval_rerank.run(["eval_rerank.py", "--max_queries=16"])
  printed = capsys.readouterr().out
  out = tmp_path / "out" / "eval"
  dataset = data.load_beir(data.DEFAULT_EVAL_DIR, data.DEFAULT_EVAL_RUN, "test")  # the test set, as make eval
  dataset = dataclasses.replace(dataset, queries=dataset.queries[:16])
  means = _check_outputs(out, dataset)
  summary = json.loads((out / "summary.json").read_text())
  assert summary["model"] == data.DEFAULT_CHECKPOINT.name and summary["queries_evaluated"] == len(dataset.queries)
  assert sum(summary["algorithms"].values()) == summary["queries_scored"] == len(dataset.queries)
  assert summary["items"] == dataset.num_candidates and summary["items_per_s"] > 0 and summary["tokens_per_s"] > 0
  assert summary["truncation"] == {"max_query_tokens": 512, "queries_truncated": 0, "max_item_tokens": 512,
                                   "items_truncated": 0}
  assert summary["metrics"] == means and summary["label_ids"] == [
      scorer.tokenizer.label_id(l) for l in ("Yes", "No")]
  assert summary["first_stage_metrics"] == json.loads((out / "metrics.json").read_text())["first_stage"]
  assert (out / "delta_vs_first_stage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  for word in ("ndcg_cut_10", "first stage", "delta", "items/s", "algorithm packed" if "packed" in summary["algorithms"] else "algorithm"):
    assert word in printed
  # BM25 -> reranked -> fused (configs/eval.yml: rrf), each against BM25 with its delta and p-value.
  saved = json.loads((out / "metrics.json").read_text())
  assert saved["fusion"] == {"method": "rrf", "rrf_k": 60.0} and summary["dev_queries_scored"] == 0
  rows = [l.split() for l in printed.splitlines()]
  first, reranked, fused = (next(r for r in rows if r[:len(p)] == p)
                            for p in (["first", "stage", "(bm25)"], ["reranked"], ["fused", "(rrf", "k=60)"]))
  assert float(first[3]) == pytest.approx(saved["first_stage"]["ndcg_cut_10"], abs=5e-5)
  assert float(reranked[1]) == pytest.approx(saved["metrics"]["ndcg_cut_10"], abs=5e-5)
  assert float(fused[3]) == pytest.approx(saved["fused"]["ndcg_cut_10"], abs=5e-5)
  tests = {(t["run"], t["metric"]): t for t in saved["tests"]}
  assert set(tests) == {(r, m) for r in ("reranked", "fused") for m in saved["metrics"]}
  assert float(reranked[2]) == pytest.approx(tests["reranked", "ndcg_cut_10"]["delta"], abs=5e-5)
  assert reranked[3].rstrip("†") == f"p={tests['reranked', 'ndcg_cut_10']['p_randomization_holm']:.3f}"
  t = tests["reranked", "ndcg_cut_10"]  # the first metric's 95% bootstrap interval, around its delta
  assert reranked[4] == f"[{t['ci_low']:+.3f},{t['ci_high']:+.3f}]" and t["ci_low"] <= t["delta"] <= t["ci_high"]
  assert fused[5].rstrip("†") == f"p={tests['fused', 'ndcg_cut_10']['p_randomization_holm']:.3f}"
  # fusion.trec is RRF of run.trec and BM25's run at the same depth.
  bm25_run = {q: v for q, v in data.read_trec_run(data.DEFAULT_EVAL_RUN).items() if q in saved_qids(out)}
  expected = fusion.fuse(data.read_trec_run(out / "run.trec"), bm25_run, "rrf", rrf_k=60)
  on_disk = data.read_trec_run(out / "fusion.trec")
  assert on_disk.keys() == expected.keys() and all(on_disk[q] == pytest.approx(expected[q], rel=1e-6) for q in expected)


def _make_eval_data_flags() -> list[str]:
  """The data flags of the eval_rerank.py command `make eval` runs."""
  keys = ("--data_dir=", "--run_file=", "--jsonl=", "--split=")
  return [a for a in scripts.make_command("eval", "eval_rerank") if a.startswith(keys)]


@pytest.mark.slow
def test_no_arguments_evaluate_the_data_make_eval_evaluates(tmp_path, monkeypatch):
  """eval_rerank.py without arguments and `make eval` read the same dataset, first stage and split: their
  summary.json name the same data and their runs hold the same queries and candidates."""
  flags = _make_eval_data_flags()
  assert any(f.startswith("--data_dir=") for f in flags), flags
  monkeypatch.chdir(REPO)  # make's paths are relative to the repository
  common = ["--max_queries=3", "--fusion=none", "--plot=false", "--noprogress"]
  eval_rerank.run(["eval_rerank.py", *flags, *common, f"--output_dir={tmp_path / 'make'}"])
  eval_rerank.run(["eval_rerank.py", *common, f"--output_dir={tmp_path / 'bare'}"])
  summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("make", "bare")]
  norm = lambda source: {k: str(pathlib.Path(v).resolve()) if k in ("data_dir", "run_file", "path") else v
                         for k, v in source.items()}
  assert norm(summaries[0]["data"]) == norm(summaries[1]["data"])
  assert summaries[0]["data"]["data_dir"].rstrip("/").endswith("perlfaq_beir")
  runs = [data.read_trec_run(tmp_path / d / "run.trec") for d in ("make", "bare")]
  assert {q: set(v) for q, v in runs[0].items()} == {q: set(v) for q, v in runs[1].items()} and len(runs[0]) == 3


def test_eval_scores_are_one_score_call_per_query(scorer, small, tmp_path):
  dataset = data.load_jsonl(small, "all")
  cfg = CFG
  report = eval_lib.run_eval(scorer, dataset, cfg, tmp_path / "p", progress=False)
  _check_outputs(tmp_path / "p", dataset)
  builder = prompts.PromptBuilder(scorer.tokenizer, prompts.TEMPLATES["plain"], max_query_tokens=4,
                                  max_item_tokens=24)
  labels = prompts.resolve_labels(scorer.tokenizer, ["Yes", "No"])
  results = {r["qid"]: r for r in map(json.loads, (tmp_path / "p" / "results.jsonl").read_text().splitlines()[1:])}
  for q in dataset.queries:
    direct = scorer.score(builder.query(q.query)[0], [builder.item(t)[0] for _, t in q.candidates], labels,
                          apply_softmax=True)
    np.testing.assert_array_equal(np.float32(results[q.qid]["scores"]), direct.scores[:, 0])
  assert report.summary["truncation"]["items_truncated"] == dataset.num_candidates  # all > 24 tokens
  # log-odds is a monotone function of p(first label): the same ranking.
  eval_lib.run_eval(scorer, dataset, dataclasses.replace(CFG, score_mode="log_odds"),
                    tmp_path / "lo", progress=False)
  ranked = lambda p: [l.split()[:4] for l in (p / "run.trec").read_text().splitlines()]
  assert ranked(tmp_path / "lo") == ranked(tmp_path / "p")


def test_beir_and_jsonl_forms_of_the_same_data_give_the_same_outputs(scorer, small, tmp_path):
  dataset = data.load_jsonl(small, "all")
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True)
  docs = {docid: text for q in dataset.queries for docid, text in q.candidates}
  (d / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n"
                                          for k, v in docs.items()))
  (d / "queries.jsonl").write_text("".join(json.dumps({"_id": q.qid, "text": q.query}) + "\n"
                                           for q in dataset.queries))
  (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"{qid}\t{doc}\t{g}\n" for qid, judged in dataset.qrels.items() for doc, g in judged.items()))
  run = tmp_path / "bm25.trec"
  run.write_text("".join(f"{q.qid} Q0 {doc} {r} {-r} bm25\n" for q in dataset.queries
                         for r, (doc, _) in enumerate(q.candidates, 1)))
  eval_lib.run_eval(scorer, data.load_beir(d, run, "test"), CFG, tmp_path / "b", progress=False)
  eval_lib.run_eval(scorer, dataset, CFG, tmp_path / "j", progress=False)
  assert _outputs(tmp_path / "b") == _outputs(tmp_path / "j")


def test_resume_reuses_results_and_refuses_other_settings(scorer, small, tmp_path):
  dataset = data.load_jsonl(small, "all")
  cfg = CFG
  eval_lib.run_eval(scorer, dataset, cfg, tmp_path / "full", progress=False)
  part = tmp_path / "part"
  eval_lib.run_eval(scorer, dataset, dataclasses.replace(CFG, max_queries=2), part, progress=False)
  with open(part / "results.jsonl", "a") as f:
    f.write('{"qid": "q002", "scor')  # killed mid-write
  report = eval_lib.run_eval(scorer, dataset, cfg, part, progress=False)
  assert report.summary["queries_resumed"] == 2
  assert _outputs(part) == _outputs(tmp_path / "full")
  with pytest.raises(ResumeError, match="label_ids"):
    eval_lib.run_eval(scorer, dataset, dataclasses.replace(CFG, labels=("No", "Yes")), part,
                      progress=False)
  eval_lib.run_eval(scorer, dataset, dataclasses.replace(CFG, labels=("No", "Yes")), part,
                    progress=False, overwrite=True)


def test_kill_and_resume_gives_identical_outputs(scorer, tmp_path):
  path = _dataset(tmp_path / "big.jsonl", 60, seed=1)
  dataset = data.load_jsonl(path, "all")
  eval_lib.run_eval(scorer, dataset, CFG, tmp_path / "ref", progress=False)
  out = tmp_path / "killed"
  cmd = [sys.executable, str(REPO / "scripts" / "eval_rerank.py"), f"--jsonl={path}", "--split=all",
         f"--output_dir={out}", *EVAL_FLAGS]
  env = dict(os.environ, PYTHONPATH=str(REPO))
  with open(tmp_path / "log1", "w") as log:
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    deadline = time.time() + 60
    results = out / "results.jsonl"
    while time.time() < deadline and proc.poll() is None:
      if results.exists() and results.read_bytes().count(b"\n") >= 4:  # header + 3 queries
        break
      time.sleep(0.005)
    assert proc.poll() is None, "the eval finished (or died) before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  done_before = results.read_bytes().count(b"\n") - 1
  assert 3 <= done_before < 60 and not (out / "run.trec").exists()
  resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["queries_resumed"] == done_before and summary["queries_scored"] == 60
  assert _outputs(out) == _outputs(tmp_path / "ref")
  assert "ndcg_cut_10" in resumed.stdout


def test_ctrl_c_stops_after_the_query_in_flight_with_one_line_and_resumes(scorer, tmp_path):
  """Ctrl-C (planted once 3 queries are done): exit 130, one line naming results.jsonl, no traceback; the same
  command then finishes with the outputs of an uninterrupted run, byte for byte."""
  path = _dataset(tmp_path / "q.jsonl", 8, seed=2)
  eval_lib.run_eval(scorer, data.load_jsonl(path, "all"), CFG, tmp_path / "ref", progress=False)
  out = tmp_path / "stopped"
  cmd = [sys.executable, str(REPO / "scripts" / "eval_rerank.py"), f"--jsonl={path}", "--split=all",
         f"--output_dir={out}", *EVAL_FLAGS]
  env = dict(os.environ, PYTHONPATH=str(REPO))
  stopped = subprocess.run(processes.with_sigint(cmd), env={**env, interrupt.TEST_SIGNAL_AT_ENV: "eval:3"},
                           capture_output=True, text=True, timeout=300)
  assert stopped.returncode == 130, stopped.stderr[-3000:]
  assert stopped.stderr == (f"stopped (Ctrl-C) after 3 of 8 queries; {out / 'results.jsonl'} keeps every query "
                            f"scored: run the same command to resume\n")
  assert (out / "results.jsonl").read_bytes().count(b"\n") == 4 and not (out / "run.trec").exists()
  resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert json.loads((out / "summary.json").read_text())["queries_resumed"] == 3
  assert _outputs(out) == _outputs(tmp_path / "ref")


def test_the_console_and_the_summary_name_quantization_and_adapters(small, tmp_path):
  """An eval of int8 weights, or of a base with adapters merged, is not the base model's: its first console line
  and summary.json say so."""
  scorer = loading.build_scorer(None, ["quantization=int8"])
  report = eval_lib.run_eval(scorer, data.load_jsonl(small, "all"), dataclasses.replace(CFG, max_queries=1),
                             tmp_path / "o", progress=False)
  assert report.summary["quantization"] == "int8" and report.summary["adapters"] is None
  head = "lm_labels"  # the embedded default's trained score head
  assert eval_lib.format_report(report).splitlines()[0].startswith(
      f"model {scorer.model_name} + trained {head} score head, int8 quantized on ")
  slow = dataclasses.replace(report, summary={**report.summary, "items_per_s": 0.42, "queries_that_compiled": 1})
  assert "  items/s 0.4 (warm " in eval_lib.format_report(slow)  # a slow CPU's rate is not printed as 0
  assert ", 1 query compiled" in eval_lib.format_report(slow)
  assert console.rate(None) == "n/a" and console.rate(12345.6) == "12,346" and console.rate(7.04) == "7.0"
  assert console.count(1, "query", "queries") == "1 query" and console.count(0, "query", "queries") == "0 queries"
  adapters = {"dir": "out/lora/adapters", "rank": 8, "alpha": 16.0, "targets": ["q"], "base_quantization": "none"}
  line = eval_outputs.model_line({**report.summary, "adapters": adapters, "quantization": "none"})
  assert line == f"{scorer.model_name} + LoRA adapters out/lora/adapters (rank 8) + trained {head} score head"


def test_main_skip_bad_counts_and_flags(small, tmp_path, capsys):
  bad = tmp_path / "bad.jsonl"
  good = small.read_text().splitlines()
  bad.write_text("\n".join(good[:2] + ["{not json", '{"qid": "x"}'] + good[2:]) + "\n")
  eval_rerank.run(["eval_rerank.py", f"--jsonl={bad}", "--split=all", f"--output_dir={tmp_path / 'o'}",
                   "--skip_bad", "--score_mode=log_odds", "--metrics=ndcg@5,map", *EVAL_FLAGS])
  summary = json.loads((tmp_path / "o" / "summary.json").read_text())
  assert summary["skipped"] == {"bad_json_lines": 1, "bad_records": 1}
  assert summary["queries"] == 6 and summary["truncation"]["queries_truncated"] == 6
  assert summary["quantization"] == "none" and summary["adapters"] is None
  assert list(summary["metrics"]) == ["ndcg_cut_5", "map"]
  _check_outputs(tmp_path / "o", data.load_jsonl(small, "all"), ["ndcg@5", "map"])


@pytest.mark.parametrize("case", ["bad_json_line", "missing_qid_in_qrels", "empty_corpus_text", "unknown_docid",
                                  "bad_override"])
def test_malformed_input_is_one_line_and_exit_2(tmp_path, capsys, case):
  d = tmp_path / "beir"
  (d / "qrels").mkdir(parents=True)
  (d / "corpus.jsonl").write_text('{"_id": "d0", "text": "a doc"}\n{"_id": "d1", "text": "another"}\n')
  (d / "queries.jsonl").write_text('{"_id": "q0", "text": "a query"}\n')
  (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
  run = tmp_path / "run.trec"
  run.write_text("q0 Q0 d0 1 2.0 bm25\nq0 Q0 d1 2 1.0 bm25\n")
  args = [f"--data_dir={d}", f"--run_file={run}"]
  expected = {"bad_json_line": "corpus.jsonl:2: invalid JSON", "missing_qid_in_qrels": "run.trec:3: query 'q1'",
              "empty_corpus_text": "corpus.jsonl:2: document 'd1' has empty", "unknown_docid": "run.trec:3: docid",
              "bad_override": "unknown config key 'atention'"}[case]
  if case == "bad_json_line":
    (d / "corpus.jsonl").write_text('{"_id": "d0", "text": "a doc"}\n{"_id": "d1", "text": "anoth\n')
  elif case == "missing_qid_in_qrels":
    (d / "queries.jsonl").write_text('{"_id": "q0", "text": "a query"}\n{"_id": "q1", "text": "b"}\n')
    run.write_text(run.read_text() + "q1 Q0 d0 1 2.0 bm25\n")
  elif case == "empty_corpus_text":
    (d / "corpus.jsonl").write_text('{"_id": "d0", "text": "a doc"}\n{"_id": "d1", "title": "", "text": ""}\n')
  elif case == "unknown_docid":
    run.write_text(run.read_text() + "q0 Q0 d7 3 0.5 bm25\n")
  else:
    args.append("atention=reference")
  with pytest.raises(SystemExit) as e:
    eval_rerank.run(["eval_rerank.py", *args, f"--output_dir={tmp_path / 'o'}", "--noprogress"])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err


def test_malformed_input_subprocess_exit_code(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"qid": "a", "query": "q", "candidates": [], "qrels": {}}) + "\n{oops\n")
  proc = subprocess.run([sys.executable, str(REPO / "scripts" / "eval_rerank.py"), f"--jsonl={bad}",
                         f"--output_dir={tmp_path / 'o'}"], env=dict(os.environ, PYTHONPATH=str(REPO)),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == f"error: {bad}:2: invalid JSON (Expecting property name enclosed in double quotes " \
                                f"at column 2) (pass --skip_bad to skip and count such input)"


def test_score_script_good_and_bad_lines(scorer, tmp_path, capsys):
  requests = [
      {"query": "The assert statement", "items": ["Assert statements insert debugging assertions.", "Lambdas."],
       "label_token_ids": [4, 5], "apply_softmax": True},
      {"query": "x", "items": [[1, 2]], "label_token_ids": [99999]},
      "not json",
      {"query": [10, 11, 12], "items": [[13, 14], []], "label_token_ids": [4]},
      {"query": "q", "itemz": []},
      {"query": "q", "items": []},
  ]
  src = tmp_path / "req.jsonl"
  src.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in requests) + "\n")
  dst = tmp_path / "resp.jsonl"
  with pytest.raises(SystemExit) as e:  # some lines failed: their error lines are written, exit status 3
    score_script.run(["score.py", f"--input={src}", f"--output={dst}", "--batch_size=2"])
  assert e.value.code == score_script.SOME_FAILED != 0
  out = [json.loads(l) for l in dst.read_text().splitlines()]
  assert len(out) == len(requests)
  vocab = scorer.config.model.vocab_size
  assert out[1] == {"error": f"line 2: label_token_ids[0]=99999 is outside the vocabulary [0, {vocab})"}
  assert out[2]["error"].startswith("line 3: invalid JSON")
  assert out[4]["error"].startswith('line 5: unknown fields ["itemz"]; allowed: ["apply_softmax", ')
  assert "error: 4 of 6 requests failed (see their error lines in the output); the other 2 were scored" in (
      capsys.readouterr().err)
  src.write_text("not json\n[1]\n")
  with pytest.raises(SystemExit):
    score_script.run(["score.py", f"--input={src}", f"--output={dst}", "--overwrite"])
  assert "error: 2 of 2 requests failed (see their error lines in the output); none was scored" in (
      capsys.readouterr().err)
  assert out[5]["error"].startswith("line 6: label_token_ids is empty")
  for i in (0, 3):
    r = requests[i]
    want = scorer.score(r["query"], r["items"], r["label_token_ids"], r.get("apply_softmax", False))
    assert out[i]["object"] == "scoring" and out[i]["model"] == data.DEFAULT_CHECKPOINT.name
    np.testing.assert_allclose(out[i]["scores"], want.scores, rtol=1e-5, atol=1e-7)
    assert out[i]["usage"] == want.usage


def test_the_opening_lines_warn_when_the_data_axis_replicates_each_query(caplog, tmp_path):
  """A data group whose data x fsdp devices are more than one computes each query's rows on each of them: the
  eval says so before it starts; a group of one such device does not."""
  import logging  # pylint: disable=import-outside-toplevel
  import types  # pylint: disable=import-outside-toplevel
  from maxscore.distributed import mesh as mesh_lib  # pylint: disable=import-outside-toplevel
  group = lambda shape: mesh_lib.DataGroup(0, 1, types.SimpleNamespace(shape=shape), (0,))
  for shape, warned in (({"data": 4, "fsdp": 1, "tensor": 2}, True), ({"data": 1, "fsdp": 1, "tensor": 2}, False)):
    caplog.clear()
    with caplog.at_level(logging.INFO):
      eval_lib._log_start([], 0, [], tmp_path, group(shape), [7, 9], CFG)  # pylint: disable=protected-access
    assert ("computed on each of those devices (up to 4x the work)" in caplog.text) == warned, caplog.text
    assert "eval: 0 queries (0 candidates)" in caplog.text


def test_the_pipelined_loop_writes_what_the_serial_loop_writes(scorer, small, tmp_path):
  """Tokenizing ahead and writing behind in threads changes no byte of the outputs but the timings."""
  dataset = data.load_jsonl(small, "all")
  for name, pipelined in (("pipelined", True), ("serial", False)):
    eval_lib.run_eval(scorer, dataset, CFG, tmp_path / name, progress=False, pipelined=pipelined)
  timing = ("seconds", "compiled")
  records = {name: [{k: v for k, v in json.loads(line).items() if k not in timing}
                    for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
             for name in ("pipelined", "serial")}
  assert records["pipelined"] == records["serial"]
  assert [r["qid"] for r in records["pipelined"][1:]] == [q.qid for q in dataset.queries]
  for f in ("run.trec", "metrics.json", "metrics_per_query.jsonl"):
    assert (tmp_path / "pipelined" / f).read_bytes() == (tmp_path / "serial" / f).read_bytes(), f
