"""Score-head training with train_backbone: the rematerialized decoder, a group packing only its drawn items,
gradients through each kernel, two steps of the script, and the query-match probes and coverage loss. The head
alone: tests/test_train.py."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers.decoder import Decoder
from layers.kernels import KernelOptions, get_kernel
from maxscore.checkpoints import storage as checkpointing
from maxscore.datasets import data
from maxscore.errors import TrainError
from maxscore.rerank import eval as eval_lib
from maxscore.scoring import loading
from maxscore.scoring.requests import TokenRequest
from maxscore.testing import corpus
from maxscore.training.reranker import features, losses
from maxscore.training.reranker import model as reranker_model
from maxscore.training.reranker import prepare as reranker_prepare
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import TrainConfig

PROMPT = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=24)  # as tests/test_train.py's


# --- train_backbone --------------------------------------------------------------------------------
def test_remat_decoder_matches_decoder():
  """train_backbone's forward: same params and hidden states as the scorer's, layers rematerialized."""
  scorer = loading.build_scorer(use_head=False)
  ex = features.make_examples(scorer, corpus.split("train", 1),
                              eval_lib.EvalConfig(max_query_tokens=4, max_item_tokens=6), (4, 5))
  ex = dataclasses.replace(ex, requests=(dataclasses.replace(ex.requests[0], items=ex.requests[0].items[:4]),))
  plan = features.plan_packed(list(ex.requests), features.packed_geometry(scorer, ex))
  attend = scorer.runner.decoder("shared_prefix").attend
  labels = jnp.asarray([4, 5])
  forward = lambda dec: jax.jit(lambda p: features.packed_features(dec, p, plan.batch, plan.gather_QxN, labels))
  remat = Decoder(scorer.config.model, attend, remat=True)
  h0, _ = forward(Decoder(scorer.config.model, attend))(scorer.runner.params)
  h1, _ = forward(remat)(scorer.runner.params)
  np.testing.assert_allclose(h0, h1, atol=1e-6, rtol=0)
  np.testing.assert_allclose(h0[0, :4], scorer.hidden_states_requests(list(ex.requests), "packed")[0], atol=2e-5)
  loss = lambda p: features.packed_features(remat, p, plan.batch, plan.gather_QxN, labels)[1].sum()
  assert "remat" in str(jax.make_jaxpr(jax.grad(loss))(scorer.runner.params))


def test_a_group_packs_only_its_drawn_items_with_the_same_features():
  """A training group's row holds only the items drawn for the step: their hidden states and label
  log-probs equal those of the row that packs every item (items never see each other)."""
  scorer = loading.build_scorer(use_head=False)
  ex = features.make_examples(scorer, corpus.split("train", 2),
                              eval_lib.EvalConfig(max_query_tokens=4, max_item_tokens=6), (4, 5))
  reqs = [dataclasses.replace(r, items=r.items[:5]) for r in ex.requests]
  p, l, _ = features.packed_geometry(scorer, ex)
  attend = scorer.runner.decoder("shared_prefix").attend
  labels = jnp.asarray([4, 5])
  run = lambda plan: features.packed_features(Decoder(scorer.config.model, attend), scorer.runner.params, plan.batch,
                                              plan.gather_QxN, labels)
  whole = features.plan_packed(reqs, (p, l, 8))
  columns = [[0, 2, 4], [1, 3]]
  drawn = features.plan_packed(reqs, (p, l, 4), columns=columns, num_columns=8)
  assert drawn.batch["tokens"].shape[1] < whole.batch["tokens"].shape[1]
  assert drawn.gather_QxN.shape == (2, 8) and drawn.mask_QxN.sum(-1).tolist() == [3, 2]
  (h0, lp0), (h1, lp1) = run(whole), run(drawn)
  for q, cols in enumerate(columns):
    assert drawn.mask_QxN[q, cols].all()
    np.testing.assert_allclose(h1[q, cols], h0[q, cols], atol=2e-5, rtol=0)
    np.testing.assert_allclose(lp1[q, cols], lp0[q, cols], atol=2e-5, rtol=0)
  with pytest.raises(ValueError, match="match targets"):
    features.match_targets(drawn, reqs)


def test_train_backbone_with_groups_packs_the_drawn_group():
  """With group_size, a train_backbone step's rows have room for the group alone, and the gather finds each
  drawn item (the mask's) in them."""
  cfg = TrainConfig.of(train_backbone=True, group_size=3, batch_size=2)
  scorer = loading.build_scorer(use_head=False)
  prep = reranker_prepare.prepare(cfg, PROMPT, scorer, corpus.split("train", 2), None, progress=False)
  whole = features.packed_geometry(scorer, prep.examples["train"])
  geometry = prep.source.geometry
  assert geometry["train"][:2] == whole[:2] and 3 <= geometry["train"][2] < whole[2]  # 24 candidates
  batch, items = reranker_model.make_batch(prep, np.array([0, 1]), step=0, cfg=cfg)
  assert items == 6 and batch.gather.shape == batch.mask.shape
  n = geometry["train"][2]
  assert batch.packed["tokens"].shape[0] == 2
  for q in range(2):
    slots = sorted(batch.gather[q][batch.mask[q]])
    assert len(set(slots)) == 3 and all(q * n <= x < (q + 1) * n for x in slots)  # in the query's own row


@pytest.mark.slow
@pytest.mark.parametrize("kernel,options", [
    ("splash", KernelOptions(kernel_interpret=True, splash_block_q=32, splash_block_kv=128)),
    ("pallas_gpu", KernelOptions(kernel_interpret=True, gpu_block_q=16, gpu_block_kv=16)),
])
def test_backbone_gradients_through_a_pallas_kernel_equal_shared_prefix(kernel, options):
  """The backbone's gradient through the scanned, rematerialized decoder with splash's or pallas_gpu's Pallas
  backward (interpret mode) equals the one through shared_prefix: the kernel a TPU or GPU trains with."""
  scorer = loading.build_scorer(use_head=False)
  ex = features.make_examples(scorer, corpus.split("train", 1),
                              eval_lib.EvalConfig(max_query_tokens=4, max_item_tokens=6), (4, 5))
  ex = dataclasses.replace(ex, requests=(dataclasses.replace(ex.requests[0], items=ex.requests[0].items[:4]),))
  plan = features.plan_packed(list(ex.requests), features.packed_geometry(scorer, ex))
  labels = jnp.asarray([4, 5])

  def loss_and_grads(name, opts):
    decoder = Decoder(scorer.config.model, get_kernel(name, opts), remat=True)
    loss = lambda p: features.packed_features(decoder, p, plan.batch, plan.gather_QxN, labels)[1].sum()
    return jax.jit(jax.value_and_grad(loss))(scorer.runner.params)
  (got, got_g), (want, want_g) = loss_and_grads(kernel, options), loss_and_grads("shared_prefix", KernelOptions())
  assert abs(float(got) - float(want)) < 1e-4
  for g, w in zip(jax.tree_util.tree_leaves(got_g), jax.tree_util.tree_leaves(want_g)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=0)


@pytest.mark.slow
def test_train_backbone_two_steps(tmp_path):
  cfg = TrainConfig.of(train_backbone=True, batch_size=2, num_steps=2, eval_every=0, warmup_steps=0,
                    learning_rate=1e-3)
  summary = train_lib.train(cfg, PROMPT, None, corpus.split("train", 4), corpus.split("dev", 2), tmp_path / "work",
                            export_dir=tmp_path / "export", progress=False)
  assert summary["steps"] == 2 and np.isfinite(summary["final_train_loss"])
  assert summary["attention"]["kernel"] == "shared_prefix" and "auto on cpu" in summary["attention"]["reason"]
  base = checkpointing.restore_checkpoint(data.DEFAULT_CHECKPOINT).params
  tuned = checkpointing.restore_checkpoint(tmp_path / "export").params
  changed = [not np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(base), jax.tree_util.tree_leaves(tuned))]
  assert all(changed)
  assert summary["throughput"]["frozen_forward_seconds"] == 0


def test_query_match_targets():
  """Per candidate token: does its id occur in the query (separator aside); per candidate: the share of
  the query's distinct ids it holds. Prefix, padding and padding rows stay 0."""
  req = TokenRequest(query=(7, 8, 8, 9), items=((8, 3), (5,), (9, 7, 8)), label_ids=(4, 5), apply_softmax=False,
                     item_first=False, separator=2)
  match, candidate, coverage = features.match_targets(features.plan_packed([req, None], (8, 4, 4)), [req, None])
  p, l = 8, 4
  expect_mask = np.zeros((2, p + 4 * l), bool)
  expect_match = np.zeros((2, p + 4 * l), np.float32)
  for n, (item, hits) in enumerate([((8, 3), (1, 0)), ((5,), (0,)), ((9, 7, 8), (1, 1, 1))]):
    expect_mask[0, p + n * l:p + n * l + len(item)] = True
    expect_match[0, p + n * l:p + n * l + len(item)] = hits
  np.testing.assert_array_equal(candidate, expect_mask)
  np.testing.assert_array_equal(match, expect_match)
  np.testing.assert_allclose(coverage, [[1 / 3, 0, 1, 0], [0, 0, 0, 0]])


def test_probe_bce_by_hand():
  probe = {"w": jnp.asarray([1.0, -2.0]), "b": jnp.asarray(0.5)}
  h = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]])
  z = np.asarray([1.5, -1.5, -2.5])
  target, mask = np.asarray([1.0, 0.25, 0.0]), np.asarray([True, True, False])
  by_hand = [-(t * math.log(1 / (1 + math.exp(-x))) + (1 - t) * math.log(1 - 1 / (1 + math.exp(-x))))
             for x, t in zip(z[:2], target[:2])]
  assert float(losses.probe_bce(probe, h, target, mask)) == pytest.approx(np.mean(by_hand), rel=1e-5)


def test_match_loss_weight_needs_train_backbone():
  with pytest.raises(TrainError, match="match_loss_weight"):
    TrainConfig.of(match_loss_weight=1.0).validate()
  with pytest.raises(TrainError, match="match_loss_weight"):
    TrainConfig.of(train_backbone=True, match_loss_weight=-1.0).validate()
  with pytest.raises(TrainError, match="coverage_on"):
    TrainConfig.of(train_backbone=True, match_loss_weight=1.0, coverage_on="head").validate()


def test_a_later_setting_at_its_earlier_behaviour_keeps_old_runs_resumable():
  """coverage_on came after runs were written: at "probe" (the behaviour before it) it is left out of
  the run's identity, so such a run resumes; "score" is recorded, so it never resumes one."""
  assert "coverage_on" not in train_lib.train_identity(TrainConfig())
  changed = TrainConfig.of(train_backbone=True, match_loss_weight=1.0, coverage_on="score")
  assert train_lib.train_identity(changed)["coverage_on"] == "score"
  assert train_lib.train_identity(changed).keys() - {"coverage_on"} == train_lib.train_identity(
      TrainConfig()).keys()


@pytest.mark.slow
@pytest.mark.parametrize("coverage_on", ["probe", "score"])
def test_train_backbone_match_loss(tmp_path, coverage_on):
  """The auxiliary losses are logged beside the ranking loss, add up to the step loss, and the probes
  stay out of the export (it restores as the base model's params, changed); the coverage ranking
  trains a probe or the exported score."""
  cfg = TrainConfig.of(train_backbone=True, batch_size=2, num_steps=2, eval_every=0, warmup_steps=0,
                    learning_rate=1e-3, match_loss_weight=0.5, coverage_on=coverage_on)
  train_lib.train(cfg, PROMPT, None, corpus.split("train", 4), None, tmp_path / "work", export_dir=tmp_path / "export",
                  progress=False)
  lines = [json.loads(l) for l in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
  for line in (l for l in lines if l["kind"] == "train"):
    assert 0 < line["match_loss"] < 1 and 0 < line["coverage_loss"] < 1
    assert line["loss"] == pytest.approx(line["rank_loss"] + 0.5 * (line["match_loss"] + line["coverage_loss"]),
                                         rel=1e-5)
  base = checkpointing.restore_checkpoint(data.DEFAULT_CHECKPOINT).params
  tuned = checkpointing.restore_checkpoint(tmp_path / "export").params
  assert jax.tree_util.tree_structure(base) == jax.tree_util.tree_structure(tuned)
  assert not np.array_equal(jax.tree_util.tree_leaves(base)[0], jax.tree_util.tree_leaves(tuned)[0])
