"""Ranking losses for score-head training: (ranking logits [B, N], targets [B, N], mask [B, N]) ->
(loss [B], weight [B]); a query with weight 0 (nothing to learn from) does not count in the batch mean.
The targets are the qrels grades, or for `distill` a teacher's scores."""

import jax
import jax.numpy as jnp

from maxscore.training.reranker.first_listwise import weighted_ranknet

MASK_LOGIT = -1e9  # ranking logit of padding items: exp underflows to 0, gradients stay finite


def listwise_softmax_ce(logits_BxN, grades_BxN, mask_BxN):
  """Cross-entropy of softmax(logits) over a query's items against its gains normalized to sum 1
  (negative grades count 0); a query without a positive grade has weight 0."""
  gains = jnp.where(mask_BxN, jnp.maximum(grades_BxN, 0.0), 0.0)
  total = gains.sum(-1)
  target = gains / jnp.maximum(total, 1e-12)[:, None]
  logp = jax.nn.log_softmax(jnp.where(mask_BxN, logits_BxN, MASK_LOGIT), axis=-1)
  loss = -jnp.sum(jnp.where(mask_BxN, target * logp, 0.0), axis=-1)
  return loss, (total > 0).astype(jnp.float32)


def pairwise_logistic(logits_BxN, grades_BxN, mask_BxN):
  """Mean of log(1 + exp(-(s_i - s_j))) over the pairs (i, j) of a query with grade_i > grade_j."""
  pair = mask_BxN[:, :, None] & mask_BxN[:, None, :] & (grades_BxN[:, :, None] > grades_BxN[:, None, :])
  diff = logits_BxN[:, :, None] - logits_BxN[:, None, :]
  count = pair.sum((1, 2))
  loss = jnp.sum(jnp.where(pair, jax.nn.softplus(-diff), 0.0), axis=(1, 2)) / jnp.maximum(count, 1)
  return loss, (count > 0).astype(jnp.float32)


def pointwise_bce(logits_BxN, grades_BxN, mask_BxN):
  """Mean binary cross-entropy of sigmoid(logit) against relevant (grade >= 1) over a query's items."""
  y = (grades_BxN >= 1).astype(jnp.float32)
  per_item = jax.nn.softplus(logits_BxN) - y * logits_BxN
  count = mask_BxN.sum(-1)
  loss = jnp.sum(jnp.where(mask_BxN, per_item, 0.0), axis=-1) / jnp.maximum(count, 1)
  return loss, (count > 0).astype(jnp.float32)


def distill_kl(logits_BxN, teacher_BxN, mask_BxN, temperature: float = 1.0):
  """T^2 * KL(softmax(teacher / T) || softmax(logits / T)) over a query's items (Hinton et al.'s scaling, so the
  gradient's size does not shrink as T grows); a query with fewer than two items has weight 0."""
  t = jnp.asarray(temperature, jnp.float32)
  logp_teacher = jax.nn.log_softmax(jnp.where(mask_BxN, teacher_BxN / t, MASK_LOGIT), axis=-1)
  logp_student = jax.nn.log_softmax(jnp.where(mask_BxN, logits_BxN / t, MASK_LOGIT), axis=-1)
  kl = jnp.sum(jnp.where(mask_BxN, jnp.exp(logp_teacher) * (logp_teacher - logp_student), 0.0), axis=-1)
  return t * t * kl, (mask_BxN.sum(-1) > 1).astype(jnp.float32)


# first_listwise: FIRST's weighted RankNet over one window's identifier logits [B, K] (maxscore/training/
# first_listwise.py), the targets each identifier's grade.
LOSSES = {"listwise": listwise_softmax_ce, "pairwise": pairwise_logistic, "pointwise": pointwise_bce,
          "distill": distill_kl, "first_listwise": weighted_ranknet}


def batch_loss(name: str, logits_BxN, targets_BxN, mask_BxN, **kw) -> jax.Array:
  """Mean of the per-query losses over the queries that have weight."""
  loss, weight = LOSSES[name](logits_BxN, targets_BxN, mask_BxN, **kw)
  return jnp.sum(loss * weight) / jnp.maximum(weight.sum(), 1.0)


def lce_distill_mix(logits_BxN, grades_BxN, teacher_BxN, mask_BxN, distill_weight: float,
                    temperature: float = 1.0) -> jax.Array:
  """(1 - w) * the batch's listwise softmax CE on the grades (LCE over a group) + w * its distillation KL toward
  the teacher's scores, each the mean over its own weighted queries: w = 0 is `listwise` alone, w = 1 `distill`
  alone. Labels say which item is relevant; the teacher also orders the negatives."""
  w = jnp.asarray(distill_weight, jnp.float32)
  lce = batch_loss("listwise", logits_BxN, grades_BxN, mask_BxN)
  kl = batch_loss("distill", logits_BxN, teacher_BxN, mask_BxN, temperature=temperature)
  return (1.0 - w) * lce + w * kl


def probe_logits(probe, hidden_XxD) -> jax.Array:
  """A linear probe (`w` [D], `b` []) on hidden states [..., D]: one float32 logit per position."""
  return hidden_XxD.astype(jnp.float32) @ probe["w"] + probe["b"]


def probe_bce(probe, hidden_XxD, target_X, mask_X) -> jax.Array:
  """Mean binary cross-entropy (targets in [0, 1]) of a linear probe (`w` [D], `b` []) on hidden states
  [..., D] over the masked positions.

  Whole-model fine-tuning's token-match loss: a small backbone does not learn from a ranking loss
  alone to find the query's tokens in a candidate, so a probe asks it per candidate token whether the
  token occurs in the query (maxscore/training/reranker/model.py; its coverage probe uses the pairwise loss)."""
  logits = probe_logits(probe, hidden_XxD)
  per_position = jax.nn.softplus(logits) - target_X * logits
  weight = mask_X.astype(jnp.float32)
  return jnp.sum(per_position * weight) / jnp.maximum(weight.sum(), 1.0)
