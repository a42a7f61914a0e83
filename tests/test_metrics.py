"""maxscore.rerank.metrics checked query by query against pytrec_eval (trec_eval)."""

import numpy as np
import pytest
import pytrec_eval

from maxscore.rerank import metrics

_ORACLE_MEASURES = {"ndcg_cut.1,3,5,10,20", "recall.5,10,100", "P.5,10", "map",
                    "map_cut.10", "recip_rank", "ndcg"}
_OURS = ["ndcg_cut_1", "ndcg_cut_3", "ndcg_cut_5", "ndcg_cut_10", "ndcg_cut_20",
         "recall_5", "recall_10", "recall_100", "P_5", "P_10", "map",
         "map_cut_10", "recip_rank", "ndcg"]


def _random_collection(seed: int, num_queries: int = 50):
  """Qrels/run with grades -1..3, unjudged docs, score ties and odd queries."""
  rng = np.random.default_rng(seed)
  # Docids of varying length so lexicographic order differs from numeric.
  pool = [f"d{i}" for i in range(200)]
  qrels, run = {}, {}
  for q in range(num_queries):
    qid = f"q{q}"
    judged = rng.choice(pool, size=rng.integers(1, 60), replace=False)
    grades = rng.choice([-1, 0, 1, 2, 3], size=judged.size,
                        p=[0.05, 0.45, 0.25, 0.15, 0.10])
    if q % 7 == 0:  # No relevant docs.
      grades = np.minimum(grades, 0)
    retrieved = rng.choice(pool, size=rng.integers(1, 150), replace=False)
    scores = np.round(rng.random(retrieved.size), 1)  # Many exact ties.
    qrels[qid] = {str(d): int(g) for d, g in zip(judged, grades)}
    run[qid] = {str(d): float(s) for d, s in zip(retrieved, scores)}
  run["single"] = {"d7": 0.5}
  qrels["single"] = {"d7": 2, "d8": 1}
  run["run_only"] = {"d1": 1.0}  # Not in qrels: excluded.
  qrels["qrels_only"] = {"d1": 1}  # Not in run: excluded.
  qrels["empty_judgments"], run["empty_judgments"] = {}, {"d1": 1.0}
  qrels["empty_run"], run["empty_run"] = {"d1": 1}, {}
  del run["q3"], qrels["q4"]
  return qrels, run


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_matches_pytrec_eval(seed):
  qrels, run = _random_collection(seed)
  expected = pytrec_eval.RelevanceEvaluator(qrels, _ORACLE_MEASURES).evaluate(run)
  got = metrics.evaluate(qrels, run, _OURS)
  assert set(got) == set(expected)
  for qid, values in expected.items():
    assert set(got[qid]) == set(values), qid
    for name, value in values.items():
      assert got[qid][name] == pytest.approx(value, abs=1e-9), (qid, name)
  means = metrics.aggregate(got)
  for name in _OURS:
    oracle = pytrec_eval.compute_aggregated_measure(
        name, [v[name] for v in expected.values()])
    assert means[name] == pytest.approx(oracle, abs=1e-9), name


@pytest.mark.parametrize("seed", [0, 1])
def test_evaluate_scores_equals_evaluate_of_the_run(seed):
  """A Judged query scored by an array is the same metrics, bit for bit, as `evaluate` of the same run (the
  ties, unjudged and negative grades of _random_collection included)."""
  qrels, run = _random_collection(seed)
  for qid, scores in run.items():
    if not qrels.get(qid) or not scores:
      continue
    docids = list(scores)
    judged = metrics.judge(qrels[qid], docids)
    got = metrics.evaluate_scores(judged, np.array([scores[d] for d in docids]), _OURS)
    assert got == metrics.evaluate(qrels, {qid: scores}, _OURS)[qid], qid


def test_ties_broken_by_docid_descending():
  qrels = {"q": {"d10": 1, "a": 0, "b": 0}}
  run = {"q": {"d9": 1.0, "d10": 1.0, "a": 2.0, "b": 2.0}}
  # Order: b, a (score 2, docid desc), then d9 > d10 as strings.
  got = metrics.evaluate(qrels, run, ["recip_rank", "P_3"])["q"]
  assert got == {"recip_rank": 0.25, "P_3": 0.0}


def test_mrr_cut():
  qrels = {"q": {"c": 1, "e": 2}, "none": {"a": 0}}
  run = {"q": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6, "e": 0.5},
         "none": {"a": 1.0}}
  got = metrics.evaluate(qrels, run, ["mrr@2", "mrr@3", "recip_rank_cut_10", "mrr"])
  assert got["q"] == {"recip_rank_cut_2": 0.0, "recip_rank_cut_3": 1 / 3,
                      "recip_rank_cut_10": 1 / 3, "recip_rank": 1 / 3}
  assert set(got["none"].values()) == {0.0}


def test_negative_grades_are_zero_gain():
  qrels = {"q": {"a": -1, "b": 2, "c": -2}}
  run = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
  got = metrics.evaluate(qrels, run, ["ndcg_cut_2", "map"])["q"]
  assert got["ndcg_cut_2"] == pytest.approx((2 / np.log2(3)) / 2)
  assert got["map"] == 0.5


def test_aliases_map_to_trec_eval_names():
  assert [metrics.canonical_name(n) for n in
          ["ndcg@10", "mrr@10", "recall@100", "p@10", "P@5", "map", "map@10", "mrr"]
          ] == ["ndcg_cut_10", "recip_rank_cut_10", "recall_100", "P_10", "P_5",
                "map", "map_cut_10", "recip_rank"]


@pytest.mark.parametrize("name", ["ndcg@x", "bleu", "recall", "P_0", "map_5x", "mrr@"])
def test_unknown_metric_raises(name):
  with pytest.raises(ValueError, match=f"'{name}'.*valid forms"):
    metrics.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, [name])


def test_metric_sums_merge_equals_aggregate():
  qrels, run = _random_collection(seed=7)
  per_query = metrics.evaluate(qrels, run)
  qids = sorted(per_query)
  halves = [{q: per_query[q] for q in qids[:20]}, {q: per_query[q] for q in qids[20:]}]
  merged = (metrics.MetricSums.from_per_query(halves[0])
            .merge(metrics.MetricSums.from_per_query(halves[1])))
  assert merged.count == len(per_query)
  assert merged.means() == pytest.approx(metrics.aggregate(per_query), abs=1e-12)
  assert metrics.MetricSums.from_per_query({}).merge(merged) == merged
