"""Evaluation reports: significance tests against scipy and exact enumeration, run comparison (pytrec_eval
as the metrics oracle), the compare script, PNG plots, and quiet script consoles."""

import fractions
import itertools
import json
import os
import pathlib
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import pytrec_eval
from scipy import stats

from maxscore import cli
from maxscore.rerank import compare, plots, significance

REPO = pathlib.Path(__file__).resolve().parent.parent


def _metric_like_pairs(seed, n):
  """Per-query values on a metric's grid (many ties, some equal pairs), system and baseline."""
  rng = np.random.default_rng(seed)
  a = rng.choice([0.0, 0.25, 1 / 3, 0.5, 1.0], size=n)
  b = np.where(rng.random(n) < 0.3, a, rng.choice([0.0, 0.2, 0.5, 1.0], size=n))
  return a, b


# --- significance tests ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed,n", [(0, 5), (1, 12), (2, 40), (3, 300)])
def test_paired_t_matches_scipy(seed, n):
  rng = np.random.default_rng(seed)
  a = rng.random(n)
  b = a + rng.normal(0.05, 0.2, n)
  t, p = significance.paired_t(a - b)
  ref = stats.ttest_rel(a, b)
  assert t == pytest.approx(ref.statistic, rel=1e-9)
  assert abs(p - ref.pvalue) < 1e-6


def test_paired_t_degenerate_differences():
  assert significance.paired_t([0.0, 0.0, 0.0]) == (0.0, 1.0)
  assert significance.paired_t([0.2, 0.2]) == (np.inf, 0.0)
  assert significance.paired_t([0.3]) == (None, 1.0)


def _exact_sign_flip(d):
  """The two-sided sign-flip p-value in exact rational arithmetic over all 2^n sign vectors."""
  d = [fractions.Fraction(x).limit_denominator(10_000) for x in d]
  observed = abs(sum(d))
  hits = sum(abs(sum(s * x for s, x in zip(signs, d))) >= observed
             for signs in itertools.product((1, -1), repeat=len(d)))
  return fractions.Fraction(hits, 2 ** len(d))


@pytest.mark.parametrize("seed,n", [(0, 6), (1, 9), (2, 11), (3, 2), (5, 3), (6, 14)])
def test_randomization_exact_matches_enumeration_and_scipy(seed, n):
  a, b = _metric_like_pairs(seed, n)
  p, method = significance.randomization(a - b)
  assert method == "exact"
  assert p == pytest.approx(float(_exact_sign_flip(a - b)), abs=1e-12)
  ref = stats.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                               permutation_type="samples", n_resamples=np.inf, alternative="two-sided")
  assert p == pytest.approx(ref.pvalue, abs=1e-12)


def test_randomization_exact_counts_ties_at_the_observed_sum():
  """Differences with exact ties (halves, zeros): the sign vectors whose |sum| equals the observed one count."""
  d = np.array([0.5, 0.5, 0.25, 0.25, 0.0, 0.5, -0.25, 0.125, 0.125])
  p, method = significance.randomization(d)
  assert method == "exact" and p == float(_exact_sign_flip(d))
  assert significance.randomization(np.array([0.3])) == (1.0, "exact")  # one query: both signs reach it


def test_randomization_monte_carlo_estimates_the_exact_value():
  a, b = _metric_like_pairs(4, 22)
  exact, method = significance.randomization(a - b, exact_max_queries=22)
  assert method == "exact"
  estimate, method = significance.randomization(a - b, num_samples=20_000, exact_max_queries=10)
  assert method == "monte_carlo" and 0 < estimate <= 1
  assert estimate == pytest.approx(exact, abs=0.015)  # ~4 standard errors of 20k samples
  assert significance.randomization(np.zeros(30), num_samples=100) == (1.0, "monte_carlo")


def test_holm_bonferroni():
  adjusted = significance.holm([0.01, 0.04, 0.03, 0.005])
  # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> monotone 0.06
  assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert significance.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
  p = np.random.default_rng(0).random(12)
  adj = np.array(significance.holm(p))
  assert np.all(adj >= p) and np.all(adj <= 1) and np.all(np.diff(adj[np.argsort(p)]) >= 0)


def test_paired_effect_size_and_wins():
  a, b = _metric_like_pairs(5, 15)
  r = significance.paired(a, b)
  d = a - b
  assert r.delta == pytest.approx(d.mean()) and r.effect_size == pytest.approx(d.mean() / d.std(ddof=1))
  assert (r.wins, r.ties, r.losses) == (np.sum(d > 0), np.sum(d == 0), np.sum(d < 0))
  assert r.wins + r.ties + r.losses == r.queries == 15


# --- comparing runs --------------------------------------------------------------------------------
def _collection(seed=0, num_queries=18, num_runs=3):
  rng = np.random.default_rng(seed)
  qrels, runs = {}, {f"r{i}": {} for i in range(num_runs)}
  for q in range(num_queries):
    docs = [f"d{j}" for j in range(12)]
    qrels[f"q{q}"] = {d: int(g) for d, g in zip(docs, rng.choice([0, 0, 1, 2], size=12))}
    for i, run in enumerate(runs.values()):
      run[f"q{q}"] = {d: float(rng.random() + 0.1 * i * qrels[f"q{q}"][d]) for d in docs}
  return qrels, runs


def test_compare_means_agree_with_pytrec_eval():
  qrels, runs = _collection()
  c = compare.compare(runs, qrels, ["ndcg@10", "mrr", "map"], baseline="r0")
  assert c.metrics == ["ndcg_cut_10", "recip_rank", "map"] and c.baseline == "r0"
  oracle = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recip_rank", "map"})
  for name, run in runs.items():
    ref = oracle.evaluate(run)
    for m in c.metrics:
      assert c.means[name][m] == pytest.approx(np.mean([ref[q][m] for q in ref]), abs=1e-12)
  assert [(t["run"], t["metric"]) for t in c.tests] == [(r, m) for r in ("r1", "r2") for m in c.metrics]
  for t in c.tests:
    d = [c.per_query[t["run"]][q][t["metric"]] - c.per_query["r0"][q][t["metric"]] for q in c.qids]
    assert t["p_t"] == pytest.approx(stats.ttest_rel(d, np.zeros(len(d))).pvalue, abs=1e-9)
    assert t["randomization_method"] == "exact" and t["p_randomization_holm"] >= t["p_randomization"]
    assert t["significant"] == (t["p_randomization_holm"] < 0.05)
  table = compare.markdown(c)
  assert "| r0 (baseline) |" in table and "wins/ties/losses" in table
  assert any(t["significant"] for t in c.tests) == (compare.MARK in table.split("\n\n")[1])
  assert "\\begin{tabular}{lrrr}" in compare.latex(c)


def test_compare_refuses_different_query_sets_unless_intersect():
  qrels, runs = _collection(num_runs=2)
  del runs["r1"]["q3"]
  with pytest.raises(compare.CompareError, match=r"r0 18, r1 17.*--intersect.*17"):
    compare.compare(runs, qrels)
  c = compare.compare(runs, qrels, intersect=True)
  assert len(c.qids) == 17 and c.coverage == {"r0": 18, "r1": 17} and c.intersected
  with pytest.raises(compare.CompareError, match="baseline 'nope'"):
    compare.compare(runs, qrels, baseline="nope")


def _write_run(path, run):
  path.write_text("".join(f"{q} Q0 {d} {i} {s} t\n" for q, docs in run.items()
                          for i, (d, s) in enumerate(sorted(docs.items(), key=lambda kv: -kv[1]), 1)))
  return path


def test_compare_script_outputs_and_one_line_refusal(load_script, tmp_path, capsys):
  qrels, runs = _collection(num_runs=2)
  (tmp_path / "qrels.txt").write_text("".join(f"{q} 0 {d} {g}\n" for q, docs in qrels.items()
                                              for d, g in docs.items()))
  a = _write_run(tmp_path / "a.trec", runs["r0"])
  eval_dir = tmp_path / "evalb"
  eval_dir.mkdir()
  _write_run(eval_dir / "run.trec", runs["r1"])
  script = load_script("compare_runs")
  script.run(["compare_runs.py", str(a), f"b={eval_dir}", f"--qrels={tmp_path / 'qrels.txt'}",
              f"--output_json={tmp_path / 'c.json'}", f"--plot_dir={tmp_path / 'plots'}", "--metrics=ndcg@10"])
  out = capsys.readouterr().out
  assert "| a (baseline) |" in out and "| b |" in out
  report = json.loads((tmp_path / "c.json").read_text())
  assert report["num_queries"] == 18 and report["baseline"] == "a" and len(report["tests"]) == 1
  assert report["inputs"] == {"a": str(a), "b": str(eval_dir)} and report["qrels"].endswith("qrels.txt")
  assert _png_size(tmp_path / "plots" / "delta_b.png") == (800, 450)
  del runs["r1"]["q5"]
  _write_run(eval_dir / "run.trec", runs["r1"])
  with pytest.raises(SystemExit) as e:
    script.run(["compare_runs.py", str(a), str(eval_dir), f"--qrels={tmp_path / 'qrels.txt'}"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1 and "a 18, evalb 17" in err and "--intersect" in err


# --- plots -----------------------------------------------------------------------------------------
def _png_size(path):
  raw = pathlib.Path(path).read_bytes()
  assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and raw.endswith(b"IEND\xaeB`\x82")
  return struct.unpack(">II", raw[16:24])


def test_plots_render_pngs_of_the_expected_size(tmp_path):
  deltas = {f"q{i}": v for i, v in enumerate([0.3, -0.1, 0.0, 0.25, -0.4, 0.05])}
  p = plots.per_query_delta(deltas, tmp_path / "delta.png", run="head", baseline="bm25", metric="ndcg_cut_10")
  assert _png_size(p) == (800, 450)
  p = plots.metric_vs_depth({"head": [(10, 0.3), (20, 0.34), (50, 0.36)], "first stage": [(10, 0.28), (50, 0.3)]},
                            tmp_path / "depth.png", metric="ndcg_cut_10", size=(6, 4), dpi=50)
  assert _png_size(p) == (300, 200)
  log = tmp_path / "metrics.jsonl"
  log.write_text("".join(json.dumps(r) + "\n" for r in
                         [{"kind": "eval", "step": 0, "split": "dev", "ndcg_cut_10": 0.3}] +
                         [{"kind": "train", "step": s, "loss": 1 / s} for s in range(1, 9)] +
                         [{"kind": "eval", "step": 8, "split": "dev", "ndcg_cut_10": 0.4}]) + '{"kind": "tr')
  p = plots.training_curves(plots.read_metrics_jsonl(log), tmp_path / "train.png")
  assert _png_size(p) == (800, 450)


# --- consoles --------------------------------------------------------------------------------------
def test_console_logging_sends_info_to_the_file_only(tmp_path, capfd, script_log):
  from absl import logging as absl_logging
  script_log(tmp_path / "out" / "script.log", after_claim=False)
  absl_logging.info("library chatter")
  absl_logging.warning("something to see")
  err = capfd.readouterr().err
  assert "something to see" in err and "library chatter" not in err
  text = (tmp_path / "out" / "script.log").read_text()
  assert "library chatter" in text and "something to see" in text
  assert cli._expand_bare_v(["x.py", "-v", "--a=1"]) == ["x.py", "--verbosity=1", "--a=1"]
  assert cli._expand_bare_v(["x.py", "-v", "0"]) == ["x.py", "-v", "0"]


def test_plot_runs_script_depth_from_eval_dirs(load_script, tmp_path, capsys):
  qrels, runs = _collection(num_runs=1)
  for k in (3, 6):
    d = tmp_path / f"k{k}"
    d.mkdir()
    cut = {q: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:k]) for q, docs in runs["r0"].items()}
    _write_run(d / "run.trec", cut)
    (d / "metrics.json").write_text(json.dumps({"metrics": {"ndcg_cut_10": k / 10}, "first_stage": {
        "ndcg_cut_10": k / 20}}))
  assert compare.depth_series({"a": [tmp_path / "k6", tmp_path / "k3"]}, "ndcg@10") == {
      "a": [(3, 0.3), (6, 0.6)], "first stage": [(3, 0.15), (6, 0.3)]}
  script = load_script("plot_runs")
  script.run(["plot_runs.py", "depth", f"a={tmp_path / 'k3'},{tmp_path / 'k6'}", f"--output={tmp_path / 'd.png'}"])
  assert _png_size(tmp_path / "d.png") == (800, 450)
  with pytest.raises(SystemExit) as e:
    script.run(["plot_runs.py", "depth", f"a={tmp_path / 'nope'}"])
  assert e.value.code == 2 and "nope has no metrics.json" in capsys.readouterr().err


def test_qrels_default_to_the_first_eval_directorys_data(tmp_path):
  qrels, runs = _collection(num_queries=4, num_runs=1)
  records = [{"qid": q, "query": f"query {q}", "candidates": [{"docid": d, "text": d} for d in docs],
              "qrels": qrels[q]} for q, docs in runs["r0"].items()]
  (tmp_path / "set.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  d = tmp_path / "eval"
  d.mkdir()
  (d / "summary.json").write_text(json.dumps({"data": {"format": "jsonl", "path": str(tmp_path / "set.jsonl")}}))
  assert compare.load_qrels(None, [tmp_path / "a.trec", d]) == (qrels, str(tmp_path / "set.jsonl"))
  with pytest.raises(compare.CompareError, match="no --qrels given"):
    compare.load_qrels(None, [tmp_path / "a.trec"])


def test_eval_script_console_is_quiet_and_logs_to_a_file(tmp_path):
  """The real entry point: no library INFO line on stderr by default, all of them in the log file; -v shows them."""
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  cmd = [sys.executable, str(REPO / "scripts" / "eval_rerank.py"), "--max_queries=1", "--noprogress",
         "--rerank_top_k=4", f"--output_dir={tmp_path / 'out'}"]
  quiet = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  assert quiet.returncode == 0, quiet.stderr[-2000:]
  assert not re.search(r"^I\d{4} ", quiet.stderr, re.M) and "first stage" in quiet.stdout
  log = (tmp_path / "out" / "eval_rerank.log").read_text()
  assert re.search(r"^I\d{4} .*eval: 1 queries", log, re.M) and "orbax" in log.lower()
  loud = subprocess.run(cmd + ["-v"], env=env, capture_output=True, text=True, timeout=300)
  assert loud.returncode == 0 and re.search(r"^I\d{4} .*eval: 1 queries", loud.stderr, re.M)


def test_bootstrap_interval_of_the_mean_difference():
  rng = np.random.default_rng(3)
  d = rng.normal(0.05, 0.2, size=400)
  low, high = significance.bootstrap_ci(d)
  # For many queries the percentile interval is close to the normal one, mean +- 1.96 sd / sqrt(n).
  half = 1.96 * d.std(ddof=1) / np.sqrt(d.size)
  assert low < d.mean() < high
  assert low == pytest.approx(d.mean() - half, abs=0.15 * half) and high == pytest.approx(d.mean() + half, abs=0.15 * half)
  assert significance.bootstrap_ci(d, level=0.5)[1] - significance.bootstrap_ci(d, level=0.5)[0] < high - low
  assert significance.bootstrap_ci(d) == (low, high)  # seeded
  assert significance.bootstrap_ci([0.25]) == (0.25, 0.25) and significance.bootstrap_ci([0.0, 0.0]) == (0.0, 0.0)
  r = significance.paired(d + 1.0, np.ones_like(d))
  assert (r.ci_low, r.ci_high) == pytest.approx((low, high))
  with pytest.raises(ValueError, match="level"):
    significance.bootstrap_ci(d, level=1.0)
