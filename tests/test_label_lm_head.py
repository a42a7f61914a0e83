"""Scores that need no vocabulary normalizer read only the K label rows of the lm_head (docs/ARCHITECTURE.md section 3).

Oracle: the same scorer's full-vocabulary path (label log-probs through the [D, V] lm_head and its
log-sum-exp, finalized the same way). Tied and untied lm_heads and a soft-capped (Gemma 2 style) one
whose cap (0.2) is near the tiny model's logits (up to ~0.6), so the tanh bends them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxscore import Scorer
from maxscore.config import load_config
from maxscore.scoring import cost_model, runner
from maxscore.scoring.scorer import finalize_scores

ALGORITHMS = ("serial", "packed", "prefill_extend")
LABELS = [5, 17, 300]
VARIANTS = {"tied": {}, "untied": {"tie_word_embeddings": False},
            "softcap": {"tie_word_embeddings": False, "final_logit_softcap": 0.2}}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def scorer(request):
  over = {"model_name": "tiny-qwen3", "attention": "shared_prefix", "separator_token_id": 3, **VARIANTS[request.param]}
  return Scorer.from_config(load_config(over))


def _request(scorer, seed=0):
  rng = np.random.default_rng(seed)
  query = rng.integers(0, 512, 23).tolist()
  return scorer.make_request(query, [rng.integers(0, 512, n).tolist() for n in (4, 0, 9, 1, 6)], LABELS, True)


def test_label_rows_give_the_full_vocabulary_scores(scorer):
  req = _request(scorer)
  for algorithm in ALGORITHMS:
    got = scorer.score_requests([req], algorithm)[0].scores
    (full_lp, _), = scorer._run([req], algorithm, "logprobs")  # the full-vocabulary path
    np.testing.assert_allclose(got, finalize_scores(full_lp, True), atol=1e-6, rtol=0, err_msg=algorithm)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)
    logits = scorer.label_logits(req.query, req.items, LABELS, algorithm=algorithm).scores
    seq = req.serial_sequence(2)  # one item against the raw model's full [T, V] logits
    np.testing.assert_allclose(logits[2], scorer.logits(seq)[-1][LABELS], atol=1e-5, rtol=0, err_msg=algorithm)


def test_mixed_requests_keep_their_own_mode(scorer):
  soft, full = _request(scorer, 1), _request(scorer, 2)
  full = full.__class__(**{**full.__dict__, "apply_softmax": False})
  both = scorer.score_requests([soft, full, soft])
  alone = [scorer.score_requests([r])[0].scores for r in (soft, full, soft)]
  for b, a in zip(both, alone):
    np.testing.assert_allclose(b.scores, a, atol=1e-6, rtol=0)
  assert abs(both[1].scores.sum(-1) - 1).min() > 1e-3  # full-vocabulary probabilities do not sum to 1


def test_label_logits_program_has_no_vocabulary_product(scorer):
  decoder = scorer.runner.decoder("reference")
  h = jnp.ones((2, 3, scorer.config.model.hidden_size), jnp.float32)
  labels = jnp.asarray(LABELS, jnp.int32)
  vocab = scorer.config.model.vocab_size
  jaxpr = jax.make_jaxpr(lambda p, x, k: runner.label_logits(decoder, p, x, k))(scorer.runner.params, h, labels)
  dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
  assert dots and all(vocab not in e.outvars[0].aval.shape for e in dots)


def test_cost_model_counts_the_label_rows():
  cfg = load_config({"model_name": "tiny-qwen3"}).model
  full = cost_model.model_flops(cfg, 10, [3, 4])
  labels = cost_model.model_flops(cfg, 10, [3, 4], lm_head_cols=2)
  assert full["lm_head"] == 2 * 64 * 512 * 2 and labels["lm_head"] == 2 * 64 * 2 * 2
  assert (full["lm_head_mode"], labels["lm_head_mode"]) == ("vocabulary", "labels")
  assert full["total"] - labels["total"] == full["lm_head"] - labels["lm_head"]
  assert cost_model.program_flops(cfg, 1, 8, 4, 2, lm_head_cols=2) == (
      cost_model.program_flops(cfg, 1, 8, 4, 2) - 2 * 2 * 64 * (512 - 2))
