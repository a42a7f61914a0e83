"""Score heads: the lm_labels head with a zero delta is the scorer bit for bit, deltas are the
full-vocabulary log-softmax with the label logits replaced, linear/mlp semantics, storage."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxscore import ScoreInputError
from maxscore.scoring import loading

from maxscore.checkpoints import head_storage
from maxscore.checkpoints.storage import CheckpointError
from maxscore.datasets import data
from maxscore.heads import head
from maxscore.scoring import head_scorer

QUERY = "What does the for statement do?"
ITEMS = ["The for statement iterates over the elements of a sequence.", "Boolean operations.", "",
         "Assignment statements bind names to objects."]


@pytest.fixture(scope="module")
def scorer():
  return loading.build_scorer(use_head=False)


@pytest.fixture(scope="module")
def labels(scorer):
  return tuple(scorer.tokenizer.label_id(w) for w in ("Yes", "No"))


def _cfg(scorer, labels, **kw):
  return head.HeadConfig(label_token_ids=labels, hidden_size=scorer.config.model.hidden_size, **kw).validate()


def _random_params(cfg, seed):
  params = head.init_head(cfg, jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(seed), len(params))
  return {k: 0.5 * jax.random.normal(key, v.shape) for (k, v), key in zip(sorted(params.items()), keys)}


@pytest.mark.parametrize("algorithm,delta", [("packed", "full"), ("packed", "low_rank"), ("packed", "none"),
                                             ("prefill_extend", "full"), ("serial", "full")])
def test_lm_labels_zero_delta_is_the_scorer_exactly(scorer, labels, algorithm, delta):
  cfg = _cfg(scorer, labels, delta=delta, rank=4)
  through_head = head_scorer.HeadScorer(scorer, cfg, head.init_head(cfg, jax.random.PRNGKey(1)))
  for apply_softmax in (False, True):
    want = scorer.score(QUERY, ITEMS, list(labels), apply_softmax=apply_softmax, algorithm=algorithm)
    got = through_head.score(QUERY, ITEMS, apply_softmax=apply_softmax, algorithm=algorithm)
    assert got.scores.dtype == np.float32 and np.array_equal(got.scores, want.scores), (apply_softmax, algorithm)
    assert got.algorithm == want.algorithm and got.usage == want.usage


def test_shift_label_logits_is_the_full_vocabulary_replacement():
  rng = np.random.default_rng(0)
  logits_NxV = rng.normal(0, 3, (5, 300)).astype(np.float32)
  label_ids = np.array([7, 42, 299])
  logits_NxV[:, 42] += 9.0  # a label holding most of the mass
  delta_NxK = rng.normal(0, 2, (5, 3)).astype(np.float32)
  lp = jax.nn.log_softmax(logits_NxV.astype(np.float64), axis=-1)[:, label_ids]
  replaced = logits_NxV.astype(np.float64).copy()
  replaced[:, label_ids] += delta_NxK
  want = np.asarray(jax.nn.log_softmax(replaced, axis=-1))[:, label_ids]
  got = np.asarray(head.shift_label_logits(jnp.asarray(lp, jnp.float32), jnp.asarray(delta_NxK)))
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
  np.testing.assert_array_equal(head.shift_label_logits(jnp.asarray(lp, jnp.float32), jnp.zeros((5, 3))),
                                jnp.asarray(lp, jnp.float32))


@pytest.mark.parametrize("delta", ["full", "low_rank"])
def test_lm_labels_head_scores_match_the_lm_head_computation(scorer, labels, delta):
  """With a nonzero hidden + bias delta, score() = the full-vocab log-softmax of the lm_head logits of
  hidden_states with the label logits moved by the delta (within float32 tolerance)."""
  cfg = _cfg(scorer, labels, delta=delta, rank=3)
  params = _random_params(cfg, 2)
  through_head = head_scorer.HeadScorer(scorer, cfg, params)
  h = scorer.hidden_states(QUERY, ITEMS)
  dec = scorer.runner.decoder("reference")
  logits = np.asarray(dec.apply({"params": scorer.runner.params}, h, method=type(dec).logits), np.float64)
  w = np.asarray(params["W"]) if delta == "full" else np.asarray(params["A"]) @ np.asarray(params["B"])
  logits[:, list(labels)] += h @ w + np.asarray(params["b"])
  want = np.exp(np.asarray(jax.nn.log_softmax(logits, axis=-1))[:, list(labels)])
  got = through_head.score(QUERY, ITEMS).scores
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
  # The delta moved the label log-probs (compared as logs: these labels' probabilities can be ~1e-5).
  assert not np.allclose(np.log(got), np.log(scorer.score(QUERY, ITEMS, list(labels)).scores), atol=1e-3)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("num_outputs", [0, 1])
def test_linear_and_mlp_heads(scorer, labels, kind, num_outputs):
  cfg = _cfg(scorer, labels, kind=kind, num_outputs=num_outputs, mlp_hidden=16)
  params = _random_params(cfg, 3)
  through_head = head_scorer.HeadScorer(scorer, cfg, params)
  h = scorer.hidden_states(QUERY, ITEMS)
  if kind == "linear":
    out = h @ np.asarray(params["W"]) + np.asarray(params["c"])
  else:
    out = np.asarray(jax.nn.gelu(h @ np.asarray(params["W1"]) + np.asarray(params["c1"]))) @ np.asarray(params["W2"]) \
        + np.asarray(params["c2"])
  if num_outputs == 1:  # one relevance logit s: scores [sigmoid(s), sigmoid(-s)]
    want = np.stack([1 / (1 + np.exp(-out[:, 0])), 1 / (1 + np.exp(out[:, 0]))], axis=-1)
  else:
    want = np.exp(out - out.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
  for apply_softmax in (False, True):  # the head is its own K-way classifier either way
    got = through_head.score(QUERY, ITEMS, apply_softmax=apply_softmax).scores
    np.testing.assert_allclose(got, want, atol=1e-5)
  untrained = head_scorer.HeadScorer(scorer, cfg, head.init_head(cfg, jax.random.PRNGKey(0)))
  np.testing.assert_allclose(untrained.score(QUERY, ITEMS).scores, 0.5, atol=1e-6)  # all items equal


def test_relevance_is_the_label_log_odds():
  lp = jnp.log(jnp.asarray([[0.2, 0.3, 0.1], [0.6, 0.1, 0.2]]))
  np.testing.assert_allclose(head.relevance(lp), np.log([0.2 / 0.4, 0.6 / 0.3]), rtol=1e-6)
  np.testing.assert_allclose(head.relevance(lp[:, :2]), np.log([0.2 / 0.3, 0.6 / 0.1]), rtol=1e-6)


def test_export_load_and_eval_use_the_head(scorer, labels, tmp_path):
  cfg = _cfg(scorer, labels, delta="low_rank", rank=2)
  params = _random_params(cfg, 4)
  out = head_storage.export_checkpoint(data.DEFAULT_CHECKPOINT, tmp_path / "ckpt", cfg, params, {"note": "test"})
  assert head_storage.has_head(out) and not head_storage.has_head(data.DEFAULT_CHECKPOINT / "missing")
  loaded_cfg, loaded, info = head_storage.load_head(out)
  assert loaded_cfg == cfg and info == {"note": "test"}
  for k in params:
    np.testing.assert_array_equal(loaded[k], params[k])
  with_head = loading.build_scorer(str(out))
  assert isinstance(with_head, head_scorer.HeadScorer)
  np.testing.assert_array_equal(with_head.score(QUERY, ITEMS, algorithm="packed").scores,
                                head_scorer.HeadScorer(scorer, cfg, params).score(QUERY, ITEMS, algorithm="packed").scores)
  assert not isinstance(loading.build_scorer(str(out), use_head=False), head_scorer.HeadScorer)
  # Other labels are the backbone's scores; a batch mixes both kinds; validation is the scorer's.
  swapped = [labels[1], labels[0]]
  mixed = with_head.score_batch([{"query": QUERY, "items": ITEMS, "label_token_ids": swapped},
                                 {"query": QUERY, "items": ITEMS, "label_token_ids": list(labels)}], "packed")
  np.testing.assert_array_equal(mixed[0].scores, scorer.score(QUERY, ITEMS, swapped, algorithm="packed").scores)
  np.testing.assert_array_equal(mixed[1].scores, with_head.score(QUERY, ITEMS, algorithm="packed").scores)
  with pytest.raises(ScoreInputError, match="label_token_ids is empty"):
    with_head.score_batch([{"query": QUERY, "items": ITEMS}])
  # A head that does not fit is refused.
  (out / "head" / "head.json").write_text((out / "head" / "head.json").read_text().replace(
      '"rank": 2', '"rank": 5'))
  with pytest.raises(CheckpointError, match="the head config needs"):
    head_storage.load_head(out)


def test_head_config_errors(labels):
  with pytest.raises(ValueError, match="kind='bilinear' is not one of"):
    head.HeadConfig(kind="bilinear", label_token_ids=labels, hidden_size=8).validate()
  with pytest.raises(ValueError, match="nothing to train"):
    head.HeadConfig(label_token_ids=labels, hidden_size=8, delta="none", use_bias=False).validate()
  with pytest.raises(ValueError, match="rank=0 must be >= 1"):
    head.HeadConfig(label_token_ids=labels, hidden_size=8, delta="low_rank", rank=0).validate()
  with pytest.raises(ValueError, match="num_outputs=3 must be 1"):
    head.HeadConfig(kind="linear", label_token_ids=labels, hidden_size=8, num_outputs=3).validate()
  with pytest.raises(ValueError, match="unknown head config keys"):
    head.HeadConfig.from_dict({"kind": "linear", "label_token_ids": [1, 2], "hidden_size": 8, "width": 3})
