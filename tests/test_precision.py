"""bfloat16 (and, on the embedded eval, int8) against float32 on CPU: the deltas measured on the embedded eval
and a random Qwen3-shaped model, held with margin so a regression fails CI (measured figures: BENCHMARKS.md,
"bf16 against float32")."""

import jax
import jax.numpy as jnp
import pytest

from maxscore.bench import precision
from maxscore.config import load_config
from maxscore.datasets import data
from maxscore.rerank import eval as rerank_eval
from maxscore.scoring import loading
from maxscore.scoring.scorer import Scorer

BF16 = ["dtype=bfloat16", "weight_dtype=bfloat16"]


def test_kendall_tau_by_hand():
  assert precision.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
  assert precision.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
  # one swapped pair out of 6
  assert precision.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
  assert precision.kendall_tau([5.0], [1.0]) == 1.0


@pytest.fixture(scope="module")
def default_float_scorer():
  """The embedded default model in float32 without its head: the reference of the bfloat16 and int8 bounds on
  the embedded eval, built (and its programs compiled) once."""
  return loading.build_scorer(None, [], use_head=False)


@pytest.mark.slow
def test_bf16_on_the_embedded_eval_stays_within_measured_bounds(default_float_scorer):
  """The pretrained + fine-tuned default (no head), its first 10 queries x 24 candidates. Measured: max |d
  log-prob| 0.0362, max |d score| 0.0064, tau mean / min 0.991 / 0.978, d nDCG@10 -0.0021 (on all 20 queries:
  the same maxima, tau min 0.964, d nDCG@10 -0.0011)."""
  bf16 = loading.build_scorer(None, BF16, use_head=False)
  assert {x.dtype for x in jax.tree_util.tree_leaves(bf16.runner.params)} == {jnp.dtype(jnp.bfloat16)}
  r = precision.compare_on_rerank_set(default_float_scorer, bf16, data.load_jsonl(data.DEFAULT_JSONL),
                                      rerank_eval.EvalConfig(max_queries=10))
  assert r["queries"] == 10 and r["items"] == 240
  assert 0 < r["max_abs_logprob"] < 0.08, r
  assert r["max_abs_score"] < 0.02, r
  assert r["kendall_tau_min"] > 0.93 and r["kendall_tau_mean"] > 0.97, r
  assert abs(r["metric_deltas"]["ndcg_cut_10"]) < 0.03, r


@pytest.mark.slow
@pytest.mark.parametrize("mode,logprob,score,tau_min", [("int8_weights", 0.04, 0.01, 0.95),
                                                       ("int8", 0.07, 0.015, 0.93)])
def test_int8_on_the_embedded_eval_stays_within_measured_bounds(default_float_scorer, mode, logprob, score, tau_min):
  """The pretrained + fine-tuned default, no head, its first 10 queries x 24 candidates. Measured: int8_weights
  max |d log-prob| 0.0177, max |d score| 0.0039, tau mean / min 0.996 / 0.986, d nDCG@10 -0.0007; int8 0.0352,
  0.0071, 0.988 / 0.978, -0.0018 (on all 20 queries the same maxima and minima). Held with about 2x margin, as
  the bf16 figures are."""
  quantized = loading.build_scorer(None, [f"quantization={mode}"], use_head=False)
  r = precision.compare_on_rerank_set(default_float_scorer, quantized, data.load_jsonl(data.DEFAULT_JSONL),
                                      rerank_eval.EvalConfig(max_queries=10))
  assert r["queries"] == 10 and r["items"] == 240
  assert 0 < r["max_abs_logprob"] < logprob, r
  assert r["max_abs_score"] < score, r
  assert r["kendall_tau_min"] > tau_min and r["kendall_tau_mean"] > 0.97, r
  assert abs(r["metric_deltas"]["ndcg_cut_10"]) < 0.01, r


@pytest.mark.slow
def test_bf16_on_a_random_qwen3_shaped_model_stays_within_measured_bounds():
  """Qwen3-0.6B widths (151936 vocab) at 2 layers, random weights shared by both scorers.

  Measured: max |d log-prob| 0.022, max |d score| 0.0039, tau 0.983 (64-token query, 16 items x 8).
  """
  cfg = load_config(dict(model_name="qwen3-0.6b", num_layers=2))
  ref = Scorer.from_config(cfg, mesh=None)
  bf16 = Scorer(cfg.replace(dtype="bfloat16", weight_dtype="bfloat16"), ref.runner.params, mesh=None)
  r = precision.compare_on_random_tokens(ref, bf16, 64, 16, 8, [9454, 2753])
  assert 0 < r["max_abs_logprob"] < 0.08, r
  assert r["max_abs_score"] < 0.02, r
  assert r["kendall_tau"] > 0.9, r
