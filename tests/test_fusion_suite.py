"""The IR-style eval: the embedded default's BEIR layout with its BM25 first stage, fusion with the first
stage, alpha tuned on dev only, and the multi-dataset suite table (BM25 itself: tests/test_bm25.py; the fusion's
arithmetic against ranx: tests/test_fusion_ranx.py)."""

import dataclasses
import json
import math
import pathlib
import tempfile
from unittest import mock

import numpy as np
import pytest

from maxscore import config as config_lib
from maxscore.datasets import data
from maxscore.errors import DataError
from maxscore.lm import assets
from maxscore.lm.tokenizer_training import sample_texts
from maxscore.rerank import eval as eval_lib, fusion, metrics, stages
from maxscore.scoring import loading

CFG = eval_lib.EvalConfig(max_query_tokens=4, max_item_tokens=24)




@pytest.mark.slow
def test_shipped_default_data_equals_a_rebuild(load_script):
  build = load_script("build_default_assets")
  opts = config_lib.load_entry(build.ENTRY, build.SECTIONS)["assets"]
  with tempfile.TemporaryDirectory() as tmp:
    built = assets.rerank_data(opts, assets.layout_tokenizer(tmp, opts))
  shipped = [json.loads(l) for l in data.DEFAULT_JSONL.read_text(encoding="utf-8").splitlines()]
  assert built.records == shipped
  files = {p.relative_to(data.DEFAULT_BEIR_DIR).as_posix() for p in data.DEFAULT_BEIR_DIR.rglob("*") if p.is_file()}
  assert files == set(built.beir)
  for name, text in built.beir.items():
    assert (data.DEFAULT_BEIR_DIR / name).read_text(encoding="utf-8") == text, name
  # The BEIR form holds the JSONL form's queries, judges every candidate it judged, and ranks BM25's top k.
  test = data.load_beir(data.DEFAULT_BEIR_DIR, data.DEFAULT_RUN, "test", 0)
  jsonl = data.load_jsonl(data.DEFAULT_JSONL, "test")
  assert sorted(q.qid for q in test.queries) == sorted(q.qid for q in jsonl.queries)
  for qid, judged in jsonl.qrels.items():
    assert {d: test.qrels[qid][d] for d in judged} == judged
  assert all(1 <= len(q.candidates) <= opts.bm25_top_k and list(q.scores) == sorted(q.scores, reverse=True)
             for q in test.queries)


# --- fusion -------------------------------------------------------------------------------------
RERANKED = {"q1": {"a": 0.9, "b": 0.5, "c": 0.1, "d": 0.3}, "q2": {"a": 0.2, "b": 0.7, "c": 0.4}}
FIRST = {"q1": {"a": 10.0, "b": 14.0, "c": 12.0, "d": 11.0}, "q2": {"a": 3.0, "b": 1.0, "c": 2.0}}


def _minmax(scores):
  lo, hi = min(scores.values()), max(scores.values())
  return {d: (s - lo) / (hi - lo) for d, s in scores.items()}


def _ranks(scores):
  return {d: r for r, d in enumerate(sorted(scores, key=scores.get, reverse=True), 1)}


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_interpolation_equals_a_by_hand_computation(alpha):
  fused = fusion.fuse(RERANKED, FIRST, "interpolate", alpha)
  for q in RERANKED:
    r, f = _minmax(RERANKED[q]), _minmax(FIRST[q])
    assert fused[q] == pytest.approx({d: alpha * r[d] + (1 - alpha) * f[d] for d in r}, abs=1e-12)


def test_rrf_equals_a_by_hand_computation():
  fused = fusion.fuse(RERANKED, FIRST, "rrf", rrf_k=10)
  for q in RERANKED:
    r, f = _ranks(RERANKED[q]), _ranks(FIRST[q])
    assert fused[q] == pytest.approx({d: 1 / (10 + r[d]) + 1 / (10 + f[d]) for d in r}, abs=1e-12)


def test_fusion_settings_are_checked():
  with pytest.raises(fusion.FusionError, match="fusion_alpha='1.5'"):
    fusion.check("interpolate", "1.5", 60)
  with pytest.raises(fusion.FusionError, match="rrf_k=0"):
    fusion.check("rrf", "dev", 0)
  with pytest.raises(fusion.FusionError, match="infinite"):
    fusion.fuse({"q": {"a": -math.inf, "b": 0.0}}, {"q": {"a": 1.0, "b": 2.0}}, "interpolate", 0.5)
  assert fusion.parse_alpha("dev") is None and fusion.parse_alpha("0.25") == 0.25


def test_tune_alpha_picks_the_best_alpha_on_dev():
  qrels = {"q1": {"a": 1}, "q2": {"c": 2, "b": 1}}
  alpha, grid = fusion.tune_alpha(qrels, RERANKED, FIRST, "ndcg@10")
  for a in fusion.ALPHA_GRID:  # every grid point is the metric of that alpha's fused run
    by_hand = {q: {d: a * _minmax(RERANKED[q])[d] + (1 - a) * _minmax(FIRST[q])[d] for d in RERANKED[q]}
               for q in RERANKED}
    assert grid[a] == pytest.approx(metrics.aggregate(metrics.evaluate(qrels, by_hand, ["ndcg@10"]))["ndcg_cut_10"])
  assert grid[alpha] == max(grid.values()) and all(grid[a] < grid[alpha] for a in grid if a < alpha)
  assert max(grid.values()) > min(grid.values())  # the fixture can tell the alphas apart


# --- the eval with fusion, and the suite ---------------------------------------------------------
def _beir(root: pathlib.Path, seed: int, splits=("dev", "test"), per_split=3) -> pathlib.Path:
  """A tiny BEIR dataset (8 candidates per query, graded qrels per split) and its first-stage run."""
  rng = np.random.default_rng(seed)
  paras = [p for p in sample_texts() if len(p.split()) >= 40 and not p.startswith(" ")]
  (root / "qrels").mkdir(parents=True)
  (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"p{i}", "text": p}) + "\n"
                                             for i, p in enumerate(paras)))
  queries, run, qrels = [], [], {s: ["query-id\tcorpus-id\tscore"] for s in splits}
  for n in range(per_split * len(splits)):
    picks = rng.choice(len(paras), 8, replace=False)
    qid = f"q{n}"
    queries.append(json.dumps({"_id": qid, "text": " ".join(paras[picks[0]].split()[:5])}))
    qrels[splits[n % len(splits)]] += [f"{qid}\tp{picks[0]}\t2", f"{qid}\tp{picks[1]}\t1"]
    run += [f"{qid} Q0 p{j} {r} {20 - r + rng.random():.4f} bm25" for r, j in enumerate(rng.permutation(picks), 1)]
  (root / "queries.jsonl").write_text("\n".join(queries) + "\n")
  for s, lines in qrels.items():
    (root / "qrels" / f"{s}.tsv").write_text("\n".join(lines) + "\n")
  (root / "bm25.trec").write_text("\n".join(run) + "\n")
  return root


@pytest.fixture(scope="module")
def scorer():
  return loading.build_scorer()


def _run_eval(scorer, d, out, cfg):
  run = eval_lib.EvalRun(data_dir=str(d), run_file=str(d / "bm25.trec"), output_dir=str(out))
  dataset, dev = eval_lib.load_data(run, cfg)
  return eval_lib.run_eval(scorer, dataset, cfg, out, progress=False, dev=dev)


@pytest.mark.slow
def test_alpha_tuned_on_dev_never_reads_test(scorer, tmp_path):
  cfg = dataclasses.replace(CFG, fusion="interpolate", fusion_alpha="dev")
  d = _beir(tmp_path / "d", seed=3)
  first = _run_eval(scorer, d, tmp_path / "a", cfg)
  tuned = first.comparison.fusion
  assert tuned["alpha_from"] == "dev" and tuned["dev_queries"] == 3
  assert tuned["alpha"] == min(float(a) for a, v in tuned["dev_grid"].items() if v == max(tuned["dev_grid"].values()))
  # Poisoned test judgments (every other candidate relevant) change the test metrics, not the alpha.
  poisoned = tmp_path / "poisoned"
  _beir(poisoned, seed=3)
  ranked = data.read_trec_run(poisoned / "bm25.trec")
  test_qids = {l.split("\t")[0] for l in (d / "qrels" / "test.tsv").read_text().splitlines()[1:]}
  (poisoned / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"{q}\t{doc}\t2\n" for q in sorted(test_qids) for doc in list(ranked[q])[::2]))
  second = _run_eval(scorer, poisoned, tmp_path / "b", cfg)
  assert second.comparison.fusion == tuned
  assert second.metrics != first.metrics
  # The fused run on disk is the interpolation of the reranked run and the first stage's own scores.
  # run.trec's scores read back as the float32 values the eval fused (data.format_score), not as the float64
  # nearest their shortest decimal text: min-max normalization would magnify that difference.
  reranked = {q: {doc: float(np.float32(v)) for doc, v in scores.items()}
              for q, scores in data.read_trec_run(tmp_path / "a" / "run.trec").items()}
  given = {q: v for q, v in data.read_trec_run(d / "bm25.trec").items() if q in reranked}
  expected = fusion.fuse(reranked, given, "interpolate", tuned["alpha"])
  on_disk = data.read_trec_run(tmp_path / "a" / "fusion.trec")
  assert on_disk.keys() == expected.keys()
  for q in expected:
    assert on_disk[q] == pytest.approx(expected[q], rel=1e-6)
  saved = json.loads((tmp_path / "a" / "metrics.json").read_text())
  assert saved["fusion"] == tuned and {t["run"] for t in saved["tests"]} == {"reranked", "fused"}


def test_lexical_features_and_idf_by_hand():
  idf, unseen = fusion.idf_table({"a": "the cat sat", "b": "the dog", "c": "a cat and a dog"})
  by_hand = lambda df: math.log(1 + (3 - df + 0.5) / (df + 0.5))  # noqa: E731
  assert idf == {"the": by_hand(2), "cat": by_hand(2), "sat": by_hand(1), "dog": by_hand(2), "a": by_hand(1),
                 "and": by_hand(1)} and unseen == by_hand(0)
  cov, weighted = fusion.lexical_features("The cat, the zebra!", "a cat sat", idf, unseen)
  assert cov == 1 / 3  # distinct query words: the, cat, zebra
  assert weighted == pytest.approx(idf["cat"] / (idf["the"] + idf["cat"] + unseen))
  assert fusion.lexical_features("!!", "anything", idf, unseen) == (0.0, 0.0)


def test_learned_fusion_finds_the_feature_that_ranks_dev():
  """Dev where only query-word coverage finds the relevant document: the tuned weights lean on the lexical
  features and rank dev perfectly; the run it fuses is the weighted sum of the features."""
  texts = fusion.Texts({"q1": "red apple", "q2": "blue sky"},
                       {"a": "red apple pie", "b": "green pear", "c": "plain text", "d": "blue sky today",
                        "e": "grey sea", "f": "nothing here"})
  reranked = {"q1": {"a": 0.1, "b": 0.9, "c": 0.5}, "q2": {"d": 0.2, "e": 0.8, "f": 0.4}}
  first = {"q1": {"a": 1.0, "b": 3.0, "c": 2.0}, "q2": {"d": 1.0, "e": 2.0, "f": 3.0}}
  qrels = {"q1": {"a": 1}, "q2": {"d": 1}}
  learned = fusion.tune_learned(qrels, reranked, first, texts, "ndcg@10")
  assert learned.dev_value == 1.0 and sum(learned.weights) == pytest.approx(1.0)
  assert learned.weights[2] + learned.weights[3] > 0.5
  fused = fusion.fuse_learned(reranked, first, texts, learned)
  for q in fused:
    for d, score in fused[q].items():
      r, f = fusion._min_max(reranked[q])[d], fusion._min_max(first[q])[d]  # pylint: disable=protected-access
      feats = (r, f, *fusion.lexical_features(texts.queries[q], texts.docs[d], learned.idf, learned.idf_unseen))
      assert score == pytest.approx(sum(w * x for w, x in zip(learned.weights, feats)))
  without = fusion.tune_learned(qrels, reranked, first, texts, "ndcg@10", use_reranker=False)
  assert without.weights[0] == 0.0


def test_tune_learned_equals_evaluating_each_fused_run():
  """The weight search scores each dev query in place (metrics.evaluate_scores); it picks what evaluating
  every weight's fused run with metrics.evaluate picks, with the same dev value, on ties included."""
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "eps", "zeta"]
  docs = {f"d{i}": " ".join(rng.choice(words, 4)) for i in range(40)}
  queries = {f"q{i}": " ".join(rng.choice(words, 2)) for i in range(12)}
  pick = lambda: rng.choice(list(docs), 10, replace=False)
  reranked = {q: {d: float(np.round(rng.random(), 1)) for d in pick()} for q in queries}
  first = {q: {d: float(rng.integers(0, 3)) for d in reranked[q]} for q in queries}
  qrels = {q: {d: int(rng.integers(-1, 3)) for d in list(reranked[q])[:5]} for q in list(queries)[:10]}
  texts = fusion.Texts(queries, docs)
  for use_reranker in (True, False):
    learned = fusion.tune_learned(qrels, reranked, first, texts, "ndcg@10", use_reranker)
    idf, unseen = fusion.idf_table({d: docs[d] for q in reranked for d in reranked[q]})
    feats = fusion.feature_matrix(reranked, first, texts, idf, unseen)
    best, best_value = None, -math.inf
    for weights in fusion._weight_grid(use_reranker):  # pylint: disable=protected-access
      value = metrics.aggregate(metrics.evaluate(qrels, fusion._score(feats, weights), ["ndcg_cut_10"]))  # pylint: disable=protected-access
      if value["ndcg_cut_10"] > best_value:
        best, best_value = weights, value["ndcg_cut_10"]
    assert (learned.weights, learned.dev_value, learned.dev_queries) == (best, best_value, 12)


def test_a_saved_learned_fusion_loads_as_it_was_and_bad_files_are_clear_errors(tmp_path):
  learned = (fusion.Learned((0.3, 0.5, 0.2, 0.0), {"apple": 1.5, "pie": 0.25}, 2.0, 0.61, "ndcg_cut_10", 12),
             fusion.Learned((0.0, 0.7, 0.1, 0.2), {"apple": 1.5, "pie": 0.25}, 2.0, 0.55, "ndcg_cut_10", 12))
  path = tmp_path / fusion.LEARNED_FILE
  fusion.save_learned(path, learned)
  assert fusion.load_learned(path) == learned
  assert json.loads(path.read_text())["idf"] == {"apple": 1.5, "pie": 0.25}  # one table for both
  other = (learned[0], dataclasses.replace(learned[1], idf={"sky": 0.5}))
  fusion.save_learned(path, other)
  assert fusion.load_learned(path) == other
  for text, message in [("{", "cannot read a learned fusion"), ('{"format": "x"}', "is not a learned fusion"),
                        (json.dumps({**json.loads(path.read_text()), "without_reranker": {}}), "missing or malformed")]:
    path.write_text(text)
    with pytest.raises(fusion.FusionError, match=message):
      fusion.load_learned(path)
  with pytest.raises(DataError, match="is read by fusion=learned only"):
    eval_lib.EvalConfig(fusion="rrf", fusion_learned=str(path)).validate()
  with pytest.raises(DataError, match="cannot read a learned fusion"):
    eval_lib.EvalConfig(fusion="learned", fusion_learned=str(tmp_path / "none.json")).validate()
  assert not fusion.needs_dev("learned", "dev", str(path)) and fusion.needs_dev("learned", "dev")


# make eval's settings (the Makefile's EVAL_BUCKETS), with which the shipped learned fusion was tuned.
_EVAL_BUCKETS = ["item_buckets=[128,256,512]", "prefix_buckets=[32,512]", "item_count_buckets=[32]",
                 "length_group_ratio=4"]


@pytest.mark.slow
def test_the_shipped_learned_fusion_is_the_one_the_shipped_dev_split_tunes(tmp_path):
  """make eval reads learned_fusion.json instead of scoring dev: it holds what tuning on the shipped dev split
  with the default model gives (make learned-fusion), and fusing with it equals fusing with a fresh tuning."""
  scorer = loading.build_scorer(None, _EVAL_BUCKETS)
  dev = data.load_beir(data.DEFAULT_DOCS_DIR, data.DEFAULT_DOCS_RUN, split="dev")
  cfg = eval_lib.EvalConfig(fusion="none", metrics=("ndcg_cut_10",))
  eval_lib.run_eval(scorer, dev, cfg, tmp_path / "dev", progress=False)
  reranked = data.read_trec_run(tmp_path / "dev" / "run.trec")
  texts, first = stages.texts_of(dev.queries), stages.first_stage_scores(dev.queries, reranked)
  tuned = tuple(fusion.tune_learned(dev.qrels, reranked, first, texts, "ndcg_cut_10", use_reranker=u)
                for u in (True, False))
  shipped = fusion.load_learned(data.DEFAULT_DOCS_DIR / fusion.LEARNED_FILE)
  assert [l.weights for l in shipped] == [l.weights for l in tuned]
  assert [l.dev_queries for l in shipped] == [len(dev.queries)] * 2 == [100, 100]
  for s, t in zip(shipped, tuned):
    assert s.dev_value == pytest.approx(t.dev_value, abs=1e-9) and s.idf == t.idf


@pytest.mark.slow
def test_learned_fusion_never_reads_test(scorer, tmp_path):
  """The weights of fusion=learned come from dev alone: a test split turned to nonsense (its query texts,
  judgments and first-stage scores) leaves them byte-identical; the report shows the run without the reranker."""
  cfg = dataclasses.replace(CFG, fusion="learned")
  d = _beir(tmp_path / "d", seed=5)
  first = _run_eval(scorer, d, tmp_path / "a", cfg)
  learned = first.comparison.fusion
  assert learned["method"] == "learned" and learned["dev_queries"] == 3
  assert learned["without_reranker"]["weights"]["reranker"] == 0.0
  nonsense = _beir(tmp_path / "nonsense", seed=5)
  test_qids = {l.split("\t")[0] for l in (d / "qrels" / "test.tsv").read_text().splitlines()[1:]}
  queries = [json.loads(l) for l in (nonsense / "queries.jsonl").read_text().splitlines()]
  (nonsense / "queries.jsonl").write_text("".join(
      json.dumps(dict(q, text="zzz qqq xxx") if q["_id"] in test_qids else q) + "\n" for q in queries))
  run = data.read_trec_run(nonsense / "bm25.trec")
  (nonsense / "bm25.trec").write_text("".join(
      f"{q} Q0 {doc} {r} {(-s if q in test_qids else s):.4f} bm25\n" for q, docs in run.items()
      for r, (doc, s) in enumerate(docs.items(), 1)))
  (nonsense / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
      f"{q}\t{doc}\t1\n" for q in sorted(test_qids) for doc in list(run[q])[1::3]))
  second = _run_eval(scorer, nonsense, tmp_path / "b", cfg)
  assert json.dumps(second.comparison.fusion, sort_keys=True) == json.dumps(learned, sort_keys=True)
  assert second.metrics != first.metrics
  assert {t["run"] for t in first.comparison.tests} == {"reranked", "fused", "fused, no reranker"}
  with pytest.raises(DataError, match="fusion=learned needs a dev split"):
    eval_lib.load_data(eval_lib.EvalRun(data_dir=str(_beir(tmp_path / "t", seed=1, splits=("test",))),
                                        run_file=str(tmp_path / "t" / "bm25.trec")), cfg)
  # The saved fusion, read back: the same fused run without scoring dev, and no warning for the same scorer.
  saved = tmp_path / "a" / fusion.LEARNED_FILE
  assert fusion.learned_scorer_key(saved) and fusion.load_learned(saved)[0].weights == tuple(
      learned["weights"][f] for f in fusion.FEATURES)
  reuse = dataclasses.replace(cfg, fusion_learned=str(saved))
  with mock.patch.object(eval_lib.logging, "warning") as warn:
    third = _run_eval(scorer, d, tmp_path / "c", reuse)
  assert not any("fusion_learned" in str(c) for c in warn.call_args_list)
  assert third.summary["dev_queries_scored"] == 0 and third.comparison.fused_per_query == first.comparison.fused_per_query
  assert (tmp_path / "c" / stages.RUN_FILE).read_bytes() == (tmp_path / "a" / stages.RUN_FILE).read_bytes()
  raw = json.loads(saved.read_text())
  (tmp_path / "other.json").write_text(json.dumps(dict(raw, scorer_key="another scorer")))
  with mock.patch.object(eval_lib.logging, "warning") as warn:
    _run_eval(scorer, d, tmp_path / "e", dataclasses.replace(cfg, fusion_learned=str(tmp_path / "other.json")))
  assert any("was tuned on the scores of another scorer" in str(c) for c in warn.call_args_list)


def test_alpha_dev_without_a_dev_split_is_a_clear_error(tmp_path):
  d = _beir(tmp_path / "d", seed=1, splits=("test",))
  run = eval_lib.EvalRun(data_dir=str(d), run_file=str(d / "bm25.trec"), output_dir=str(tmp_path / "o"))
  with pytest.raises(DataError, match="fusion_alpha=dev needs a dev split: .*dev.tsv"):
    eval_lib.load_data(run, eval_lib.EvalConfig(fusion="interpolate"))
  assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_suite_reports_the_good_dataset_and_the_broken_one(load_script, tmp_path, capsys):
  suite_script = load_script("eval_suite")
  good = _beir(tmp_path / "good", seed=5, splits=("test",), per_split=4)
  broken = _beir(tmp_path / "broken", seed=6, splits=("test",))
  (broken / "bm25.trec").write_text("q0 Q0 missing-doc 1 3.0 bm25\n")
  out = tmp_path / "suite"
  code = suite_script.run(["eval_suite.py", f"--datasets=good={good},broken={broken}", f"--output_dir={out}",
                           "--max_query_tokens=4", "--max_item_tokens=24", "--noprogress",
                           f"--output_json={tmp_path / 'suite.json'}", f"--output_latex={tmp_path / 'suite.tex'}"])
  printed = capsys.readouterr().out
  assert code == 1
  report = json.loads((tmp_path / "suite.json").read_text())
  assert report["failed"] == ["broken"] and "missing-doc" in report["datasets"]["broken"]["error"]
  assert "bm25.trec:1" in report["datasets"]["broken"]["error"]
  saved = json.loads((out / "good" / "metrics.json").read_text())
  good_means = report["datasets"]["good"]["means"]
  assert good_means["reranked"]["ndcg_cut_10"] == pytest.approx(saved["metrics"]["ndcg_cut_10"])
  assert good_means["first stage"]["ndcg_cut_10"] == pytest.approx(saved["first_stage"]["ndcg_cut_10"])
  assert good_means["fused"]["ndcg_cut_10"] == pytest.approx(saved["fused"]["ndcg_cut_10"])
  assert report["average"]["fused"] == pytest.approx(good_means["fused"])  # one dataset finished
  assert "| good (4 q) |" in printed and "| broken | failed: DataError:" in printed and "| average |" in printed
  assert "\\begin{tabular}" in (tmp_path / "suite.tex").read_text()
  assert not (out / "broken" / "run.trec").exists()


def test_a_dataset_with_a_broken_corpus_line_is_one_warning_line_not_a_traceback(tmp_path, caplog):
  from maxscore import cli
  from maxscore.rerank import suite
  broken = _beir(tmp_path / "broken", seed=6, splits=("test",))
  with open(broken / "corpus.jsonl", "a") as f:
    f.write("{not json\n")
  opts = suite.SuiteRun(datasets=(f"broken={broken}",), output_dir=str(tmp_path / "o"), progress=False)
  with caplog.at_level("WARNING"):
    result = suite.run_suite(None, opts, eval_lib.EvalConfig(), expected=cli.expected_errors())
  assert result.failed == ["broken"] and "corpus.jsonl" in result.datasets["broken"]["error"]
  records = [r for r in caplog.records if "broken" in r.getMessage()]
  assert len(records) == 1 and records[0].exc_info is None and "\n" not in records[0].getMessage()
  assert "DataError" in records[0].getMessage() and "corpus.jsonl" in records[0].getMessage()


def test_suite_holm_adjusts_across_datasets():
  from maxscore.rerank import suite
  tests = lambda p: [{"run": "reranked", "metric": "ndcg_cut_10", "p_randomization": p, "p_t": p}]
  out = {"a": {"tests": tests(0.01)}, "b": {"tests": tests(0.04)}, "c": {"error": "x"}}
  suite._holm_across_datasets(out, "randomization", 0.05)
  assert [out[n]["tests"][0]["p_holm_datasets"] for n in "ab"] == pytest.approx([0.02, 0.04])
  assert out["a"]["tests"][0]["significant"] and out["b"]["tests"][0]["significant"]


@pytest.mark.parametrize("args, field", [(["--fusion_alpha=1.5"], "fusion_alpha"), (["--rrf_k=0"], "rrf_k"),
                                         (["--datasets=nameless"], "datasets")])
def test_bad_settings_are_one_line_and_exit_2(load_script, tmp_path, capsys, args, field):
  script = load_script("eval_suite" if field == "datasets" else "eval_rerank")
  with pytest.raises(SystemExit) as e:
    script.run(["x.py", f"--output_dir={tmp_path / 'o'}", *args])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.count("\n") == 0 and field in err
  assert not (tmp_path / "o").exists()
