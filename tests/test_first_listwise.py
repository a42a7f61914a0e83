"""Training with FIRST's objective (maxscore/training/reranker/first_listwise.py): the weighted RankNet by hand, the
window a query trains on, and runs through the trainer on the embedded default (frozen backbone, LoRA, and
LoRA on 2 host devices equal to 1)."""

import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxscore.checkpoints import storage
from maxscore.distributed.processes import subprocess_env
from maxscore.errors import TrainError
from maxscore.scoring import loading
from maxscore.testing import corpus
from maxscore.training.reranker import first_listwise
from maxscore.training.reranker.losses import batch_loss
from maxscore.training.reranker import model as reranker_model
from maxscore.training.reranker import prepare as reranker_prepare
from maxscore.training.reranker.config import TrainConfig

REPO = pathlib.Path(__file__).resolve().parent.parent
# 4 train queries in one batch (every step sees the same windows), windows of 4 short passages, plain prompts
# (the embedded default's tokenizer has no chat template).
FLAGS = ["--loss=first_listwise", "--listwise_window=4", "--listwise_chat=false", "--listwise_passage_tokens=12",
         "--max_train_queries=4", "--max_dev_queries=4", "--batch_size=4", "--num_steps=4", "--eval_every=0",
         "--save_every=0", "--warmup_steps=0", "--noprogress"]
LORA = ["--train_backbone", "--lora_rank=4", "--lora_alpha=8", "--use_bias=false", "--learning_rate=1e-3",
        "--dev_split="]


def _softplus(x):
  return float(np.log1p(np.exp(x)))


@pytest.mark.slow
def test_weighted_ranknet_by_hand():
  # Row 0: grades [0, 1, 0] -> ideal ranks [2, 1, 3]; pairs (1, 0) weight 1/3 and (1, 2) weight 1/4.
  # Row 1: one padded item; grades [2, 1, 0(pad)] -> one pair (0, 1), weight 1/3.
  # Row 2: equal grades: no pair, weight 0.
  logits = jnp.asarray([[2.0, 0.0, 1.0], [0.5, 1.5, 9.0], [1.0, 2.0, 3.0]])
  grades = jnp.asarray([[0.0, 1.0, 0.0], [2.0, 1.0, 5.0], [1.0, 1.0, 1.0]])
  mask = jnp.asarray([[True, True, True], [True, True, False], [True, True, True]])
  loss, weight = first_listwise.weighted_ranknet(logits, grades, mask)
  row0 = (_softplus(2.0) / 3 + _softplus(1.0) / 4) / 2
  row1 = _softplus(1.0) / 3
  np.testing.assert_allclose(loss, [row0, row1, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(weight, [1.0, 1.0, 0.0])
  np.testing.assert_allclose(batch_loss("first_listwise", logits, grades, mask), (row0 + row1) / 2, rtol=1e-6)
  # The ideal order scored far apart costs (almost) nothing; the reverse order costs more than the tie.
  good = first_listwise.weighted_ranknet(jnp.asarray([[0.0, 50.0, -50.0]]), grades[:1], mask[:1])[0]
  bad = first_listwise.weighted_ranknet(jnp.asarray([[50.0, -50.0, 0.0]]), grades[:1], mask[:1])[0]
  assert float(good[0]) < 1e-6 < row0 < float(bad[0])


def test_ideal_ranks_keep_the_window_order_among_equal_grades_and_pad_last():
  ranks = first_listwise.ideal_ranks(jnp.asarray([[0.0, 1.0, 0.0, 1.0, 3.0]]),
                                     jnp.asarray([[True, True, True, True, False]]))
  np.testing.assert_array_equal(ranks, [[3, 1, 4, 2, 5]])


def test_a_window_holds_the_positives_then_the_first_negatives_in_first_stage_order():
  assert first_listwise.pick_window([0, 0, 0, 1, 0, 2], 4) == [0, 1, 3, 5]
  assert first_listwise.pick_window([1, 1, 1, 1, 1], 3) == [0, 1, 2]
  assert first_listwise.pick_window([0, 0], 4) == [0, 1]


def test_window_examples_read_the_identifiers_at_the_answer_position():
  scorer = loading.build_scorer(None, [], use_head=False)
  ds = corpus.split("train", 3)
  builder = first_listwise.window_prompts(scorer.tokenizer, 4, chat=False, max_passage_tokens=12)
  examples, grades, mask = first_listwise.window_examples(scorer, ds, builder, 4)
  assert len(examples.requests) == 3 and grades.shape == mask.shape == (3, 4)
  for req, docids, g, m, q in zip(examples.requests, examples.docids, grades, mask, ds.queries):
    assert len(req.items) == 1 and tuple(req.label_ids) == builder.label_ids[:4]
    assert tuple(req.items[0][-len(scorer.tokenizer.encode("[")):]) == tuple(scorer.tokenizer.encode("["))
    assert list(g[m]) == [ds.qrels[q.qid].get(d, 0) for d in docids]
  with pytest.raises(TrainError, match="listwise_window=30"):
    first_listwise.window_prompts(scorer.tokenizer, 30, chat=False)
  # listwise_chat unset: the default's tokenizer has no chat template, so the windows are the plain-text ones.
  unset = first_listwise.window_prompts(scorer.tokenizer, 4, max_passage_tokens=12)
  assert unset.chat is False and unset.window("q", ["a b", "c"]) == builder.window("q", ["a b", "c"])


def test_first_listwise_settings_are_checked():
  with pytest.raises(TrainError, match="head=lm_labels"):
    TrainConfig.of(loss="first_listwise", head="mlp").validate()
  with pytest.raises(TrainError, match="group_size"):
    TrainConfig.of(loss="first_listwise", group_size=4).validate()


def _script(workdir, *extra, devices: int = 1):
  cmd = [sys.executable, str(REPO / "scripts" / "train_reranker.py"), f"--workdir={workdir}", *FLAGS, *extra]
  out = subprocess.run(cmd, env=subprocess_env(devices), capture_output=True, text=True, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return workdir


def _records(workdir, kind="train"):
  return [r for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.mark.slow
def test_frozen_backbone_head_lowers_the_loss_and_evaluates_dev_windows(tmp_path):
  work = _script(tmp_path / "work", "--learning_rate=1e-2")
  losses = [r["loss"] for r in _records(work)]
  assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]
  evals = _records(work, "eval")
  assert [r["step"] for r in evals] == [0, 4] and 0 < evals[0]["ndcg_cut_10"] <= 1


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
  return _script(tmp_path_factory.mktemp("first_lora") / "work", *LORA)


@pytest.mark.slow
def test_lora_trains_only_the_adapters_and_lowers_the_loss(lora_run):
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from maxscore.datasets import data  # pylint: disable=import-outside-toplevel
  from maxscore.checkpoints import adapters as lora_lib  # pylint: disable=import-outside-toplevel
  losses = [r["loss"] for r in _records(lora_run)]
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  state = ocp.StandardCheckpointer().restore(lora_run / "checkpoints" / "4" / "state")
  base_after, adapters = lora_lib.split_adapters(jax.tree_util.tree_map(np.asarray, state["params"]["backbone"]))
  base_before = storage.restore_checkpoint(data.DEFAULT_CHECKPOINT).params
  for x, y in zip(jax.tree_util.tree_leaves(base_before), jax.tree_util.tree_leaves(base_after)):
    assert np.asarray(x).tobytes() == y.tobytes()  # the frozen base: the same bytes
  b_leaves = [v for p, v in jax.tree_util.tree_leaves_with_path(adapters) if str(p[-1].key).endswith("_lora_b")]
  assert b_leaves and all(np.abs(b).max() > 0 for b in b_leaves)  # B starts at zero: the loss reached each one


@pytest.mark.slow
def test_lora_on_two_host_devices_equals_one_device(lora_run, tmp_path):
  two = _script(tmp_path / "work", *LORA, devices=2)
  for key in ("loss", "grad_norm"):
    np.testing.assert_allclose([r[key] for r in _records(two)], [r[key] for r in _records(lora_run)], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.slow
def test_gradients_reach_the_backbone_only_when_it_trains():
  """The loss differentiates through the packed forward into the adapters (LoRA) or every weight (full), and
  with a frozen backbone only the head has params."""
  from maxscore.rerank.prompts import PromptConfig  # pylint: disable=import-outside-toplevel
  from maxscore.checkpoints import adapters as lora_lib  # pylint: disable=import-outside-toplevel
  ds = corpus.split("train", 2)
  common = dict(loss="first_listwise", listwise_window=4, listwise_chat=False, listwise_passage_tokens=8,
                batch_size=2, use_bias=False)
  scorer = loading.build_scorer(use_head=False)
  for kw in (dict(train_backbone=True, lora_rank=2), dict(train_backbone=True), {}):
    cfg = TrainConfig.of(**common, **kw).validate()
    prep = reranker_prepare.prepare(cfg, PromptConfig(), scorer, ds, None, progress=False)
    params = reranker_model.init_params(cfg, prep.head_cfg, prep.source)
    loss_fn = reranker_model.make_loss_fn(cfg, prep.head_cfg, prep.source, None, jnp.asarray(prep.label_ids, jnp.int32))
    batch, _ = reranker_model.make_batch(prep, np.arange(2), 0, cfg)
    grads = jax.jit(jax.grad(lambda p: loss_fn(p, batch, None)[0]))(params)
    assert max(np.abs(np.asarray(g)).max() for g in jax.tree_util.tree_leaves(grads["head"])) > 0
    if not kw:
      assert set(grads) == {"head"}
      continue
    _, adapters = lora_lib.split_adapters(jax.tree_util.tree_map(np.asarray, grads["backbone"]))
    b_grads = [v for p, v in jax.tree_util.tree_leaves_with_path(adapters) if str(p[-1].key).endswith("_lora_b")]
    if "lora_rank" in kw:
      assert b_grads and all(np.abs(g).max() > 0 for g in b_grads)
      assert prep.source.trainable(params) is not None
    else:
      assert not b_grads and np.abs(np.asarray(grads["backbone"]["embed"]["embedding"])).max() > 0


@pytest.mark.slow
def test_cost_bench_counts_the_windows_and_sets(load_script):
  """scripts/bench_listwise_cost.py on one query: FIRST over 8 candidates with windows of 4, stride 2, is 3
  windows; pointwise is one forward; every row has both prefix-cache settings."""
  report = load_script("bench_listwise_cost").run(["x", "--max_queries=1", "--top_k=8", "--window=4", "--stride=2",
                                                   "--set_size=3", "--setwise_top_k=2"])
  for cache in ("on", "off"):
    rows = report["prefix_cache"][cache]
    assert rows["pointwise"]["forwards"] == 1 and rows["first"]["forwards"] == 3
    assert rows["setwise"]["forwards"] >= 3 and all(r["seconds"] > 0 and r["prompt_tokens"] > 0
                                                     for r in rows.values())
