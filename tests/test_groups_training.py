"""Training on groups (maxscore/datasets/groups.py): the group JSONL as a training set, the per-step draw of one
positive and group_size - 1 negatives, and distillation (loss=distill: KL to a teacher's scores), checked by hand
and by a student that learns a synthetic teacher's order."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from maxscore.datasets import data
from maxscore.errors import DataError, TrainError
from maxscore.rerank import eval as eval_lib, prompts
from maxscore.rerank import query_scoring
from maxscore.scoring import loading
from maxscore.testing import corpus
from maxscore.datasets import groups as groups_lib
from maxscore.training.reranker import batches, losses
from maxscore.training.reranker import evaluation as reranker_evaluation
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.selection import resolve_metric


def _log_softmax(x):
  x = x - x.max()
  return x - np.log(np.exp(x).sum())


def test_distill_kl_equals_a_by_hand_computation():
  rng = np.random.default_rng(0)
  logits, teacher = rng.normal(size=(3, 5)), rng.normal(size=(3, 5)) * 3
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], bool)
  for t in (1.0, 2.5):
    loss, weight = losses.distill_kl(jnp.asarray(logits), jnp.asarray(teacher), jnp.asarray(mask), t)
    for b in range(3):
      keep = mask[b]
      p_log, q_log = _log_softmax(teacher[b, keep] / t), _log_softmax(logits[b, keep] / t)
      want = t * t * np.sum(np.exp(p_log) * (p_log - q_log))
      np.testing.assert_allclose(float(loss[b]), want, rtol=1e-5, atol=1e-6)
    assert weight.tolist() == [1.0, 1.0, 0.0]  # one item: nothing to distil
  same, _ = losses.distill_kl(jnp.asarray(teacher), jnp.asarray(teacher), jnp.asarray(mask), 2.0)
  np.testing.assert_allclose(np.asarray(same), 0.0, atol=1e-6)
  batch = losses.batch_loss("distill", jnp.asarray(logits), jnp.asarray(teacher), jnp.asarray(mask), temperature=1.0)
  per_query, _ = losses.distill_kl(jnp.asarray(logits), jnp.asarray(teacher), jnp.asarray(mask), 1.0)
  np.testing.assert_allclose(float(batch), float(per_query[:2].mean()), rtol=1e-6)


def test_the_lce_distill_mix_equals_a_by_hand_computation():
  """(1 - w) * LCE on the grades + w * T^2 KL to the teacher, each averaged over its own queries: query 2 has no
  positive (no LCE term), query 3 one item (no KL term); w = 0 and 1 are the two losses alone."""
  rng = np.random.default_rng(1)
  logits, teacher = rng.normal(size=(3, 5)), rng.normal(size=(3, 5)) * 3
  grades = np.array([[2, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], np.float32)
  mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], bool)
  t = 0.5
  lce, kl = [], []
  for b in range(3):
    keep = mask[b]
    gains = grades[b, keep]
    if gains.sum() > 0:
      lce.append(-np.sum(gains / gains.sum() * _log_softmax(logits[b, keep])))
    if keep.sum() > 1:
      p_log, q_log = _log_softmax(teacher[b, keep] / t), _log_softmax(logits[b, keep] / t)
      kl.append(t * t * np.sum(np.exp(p_log) * (p_log - q_log)))
  assert len(lce) == 2 and len(kl) == 2
  args = [jnp.asarray(x) for x in (logits, grades, teacher, mask)]
  for w in (0.0, 0.3, 1.0):
    got = float(losses.lce_distill_mix(*args, distill_weight=w, temperature=t))
    np.testing.assert_allclose(got, (1 - w) * np.mean(lce) + w * np.mean(kl), rtol=1e-5)
  lg, gr, te, ma = args
  assert float(losses.lce_distill_mix(*args, distill_weight=0.0, temperature=t)) == float(
      losses.batch_loss("listwise", lg, gr, ma))
  assert float(losses.lce_distill_mix(*args, distill_weight=1.0, temperature=t)) == float(
      losses.batch_loss("distill", lg, te, ma, temperature=t))


def test_distill_weight_is_checked():
  for bad in (dict(distill_weight=-0.1), dict(distill_weight=1.5), dict(distill_weight=0.5, loss="pairwise")):
    with pytest.raises(TrainError, match="distill_weight"):
      TrainConfig.of(**bad).validate()
  TrainConfig.of(distill_weight=0.5).validate()


def test_a_group_is_one_positive_and_negatives_drawn_per_step():
  grades = np.array([[1, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]], np.float32)
  mask = np.ones_like(grades, bool)
  mask[2, 3:] = False  # three items: fewer than the group, all kept
  rows = np.array([4, 7, 9])
  draws = [batches.draw_group_mask(grades, mask, rows, step, 4, seed=0) for step in range(12)]
  for m in draws:
    assert m[:2].sum(-1).tolist() == [4, 4] and (m <= mask).all()
    assert (grades[:2] * m[:2] > 0).sum(-1).tolist() == [1, 1]  # exactly one positive each
    assert m[2].tolist() == mask[2].tolist()
  assert len({m.tobytes() for m in draws}) > 1  # drawn anew per step
  again = batches.draw_group_mask(grades, mask, rows, 5, 4, seed=0)
  assert (again == draws[5]).all()  # the same on every process and after a resume
  alone = batches.draw_group_mask(grades[1:2], mask[1:2], rows[1:2], 5, 4, seed=0)
  assert (alone[0] == draws[5][1]).all()  # a row's draw does not depend on its batch-mates
  assert (batches.draw_group_mask(grades, mask, rows, 0, 0, 0) == mask).all()
  with pytest.raises(TrainError, match="group_size"):
    TrainConfig.of(group_size=1).validate()


def test_a_group_size_above_every_querys_candidates_is_refused_naming_the_largest(tmp_path):
  """It would keep every candidate, as group_size=0 does: a setting that changes nothing is named, not run."""
  train = corpus.split("train", 2)
  largest = max(len(q.candidates) for q in train.queries)
  cfg = TrainConfig.of(batch_size=2, num_steps=2, group_size=largest + 1)
  with pytest.raises(TrainError, match=rf"group_size={largest + 1} is more than any train query's candidates "
                                       rf"\(at most {largest}\).*pass --group_size=0 or at most {largest}"):
    train_lib.train(cfg, prompts.PromptConfig(), None, train, None, tmp_path / "work", progress=False)


def _write_groups(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def test_groups_load_as_a_training_set_with_teacher_scores(tmp_path):
  path = _write_groups(tmp_path / "g.jsonl", [
      {"query": "a", "pos": ["p1"], "neg": ["n1", "n2"], "qid": "q1", "pos_ids": ["d1"], "neg_ids": ["d2", "d3"],
       "pos_scores": [3.0], "neg_scores": [1.0, 2.0]},
      {"query": "b", "pos": ["p2", "p3"], "neg": ["n3"], "qid": "q1", "pos_scores": [1, 2], "neg_scores": [0]}])
  rset = groups_lib.load_groups(path)
  assert [q.qid for q in rset.queries] == ["q1", "g2"]  # a repeated qid gets the line's name
  assert rset.queries[0].candidates == (("d1", "p1"), ("d2", "n1"), ("d3", "n2"))
  assert rset.qrels == {"q1": {"d1": 1, "d2": 0, "d3": 0}, "g2": {"p0": 1, "p1": 1, "n0": 0}}
  assert rset.teacher_scores == {"q1": {"d1": 3.0, "d2": 1.0, "d3": 2.0}, "g2": {"p0": 1.0, "p1": 2.0, "n0": 0.0}}
  assert data.input_paths(rset) == [str(path)]
  _write_groups(path, [{"query": "a", "pos": ["p"], "neg": ["n"], "pos_scores": [1.0], "neg_scores": [0.0]},
                       {"query": "b", "pos": ["p"], "neg": ["n"]}])
  assert groups_lib.load_groups(path).teacher_scores is None  # not every group has them
  _write_groups(path, [{"query": "a", "pos": ["p"], "neg": ["n"], "pos_ids": ["x"], "neg_ids": ["x"]}])
  with pytest.raises(DataError, match="names a document twice"):
    groups_lib.load_groups(path)


def _order_agreement(scorer, rset, teacher):
  """Mean Kendall tau between the scorer's ranking scores (the eval's p_first) and the teacher's, per group."""
  prompt = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=16)
  builder = prompts.PromptBuilder(scorer.tokenizer, prompts.get_template(prompt.template), prompt.instruction,
                                  prompt.max_query_tokens, prompt.max_item_tokens)
  labels = prompts.resolve_labels(scorer.tokenizer, prompts.get_template(prompt.template).default_labels)
  taus = []
  for q in rset.queries:
    scorer.prefix_cache.clear()
    s = scorer.score(builder.query(q.query)[0], [builder.item(t)[0] for _, t in q.candidates], label_token_ids=labels,
                     apply_softmax=True).scores
    log_odds = np.log(s[:, 0]) - np.log(s[:, 1])  # the ranking's order, unsaturated
    taus.append(scipy.stats.kendalltau(log_odds, [teacher[q.qid][d] for d, _ in q.candidates]).statistic)
  return float(np.mean(taus))


@pytest.mark.slow
def test_a_student_distilled_from_a_teacher_reaches_its_order(tmp_path):
  """A score head (an MLP) on the frozen embedded default, trained with loss=distill on groups whose teacher scores
  are a synthetic order unrelated to relevance (a random permutation per group), ranks those groups in the
  teacher's order; without teacher scores, distill is refused."""
  train = data.load_jsonl(data.DEFAULT_JSONL, split="train")
  rng = np.random.default_rng(0)
  records = []
  for q in train.queries[:8]:
    rel = [d for d, _ in q.candidates if train.qrels.get(q.qid, {}).get(d, 0) > 0][:1]
    if not rel:
      continue
    negs = [d for d, _ in q.candidates if d not in rel][:5]
    text = dict(q.candidates)
    scores = rng.permutation(len(negs) + 1).astype(float)  # the teacher's order
    records.append({"query": q.query, "qid": q.qid, "pos": [text[d] for d in rel], "neg": [text[d] for d in negs],
                    "pos_ids": rel, "neg_ids": negs, "pos_scores": scores[:1].tolist(),
                    "neg_scores": scores[1:].tolist()})
  assert len(records) >= 6
  rset = groups_lib.load_groups(_write_groups(tmp_path / "groups.jsonl", records))
  prompt = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=16)
  cfg = TrainConfig.of(loss="distill", distill_temperature=3.0, head="mlp", num_outputs=1, batch_size=8, num_steps=300,
                    eval_every=0, save_every=0, warmup_steps=0, learning_rate=0.003, weight_decay=0.0, log_every=50)
  train_lib.train(cfg, prompt, None, rset, None, tmp_path / "work", export_dir=tmp_path / "model", progress=False)
  losses_seen = [json.loads(l)["loss"] for l in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()
                 if json.loads(l)["kind"] == "train"]
  tau = _order_agreement(loading.build_scorer(str(tmp_path / "model")), rset, rset.teacher_scores)
  print(f"distill loss {losses_seen[0]:.3f} -> {losses_seen[-1]:.3f}; mean Kendall tau with the teacher {tau:.3f}")
  assert losses_seen[-1] < losses_seen[0] / 2 and tau > 0.7, (losses_seen, tau)
  with pytest.raises(TrainError, match="teacher"):
    bare = data.RerankSet(rset.queries, rset.qrels, rset.source)
    train_lib.train(cfg, prompt, None, bare, None, tmp_path / "bare", progress=False)


def test_teacher_scores_are_the_eval_ranking_scores_of_each_group(tmp_path, load_script, capsys):
  """score_teacher.py with the embedded default: each group's pos_scores/neg_scores are the scores the eval's
  own scoring of that query and those documents gives, and the written file trains with loss=distill."""
  train = data.load_jsonl(data.DEFAULT_JSONL, split="train")
  records = [{"query": q.query, "pos": [q.candidates[0][1]], "neg": [t for _, t in q.candidates[1:4]]}
             for q in train.queries[:3]]
  groups = _write_groups(tmp_path / "groups.jsonl", records)
  out = tmp_path / "teacher" / "groups.jsonl"
  argv = ["x", f"--groups_file={groups}", f"--output={out}", "--max_item_tokens=16", "--max_query_tokens=8"]
  load_script("score_teacher").run(argv)
  assert "wrote 3 groups" in capsys.readouterr().out
  scored = groups_lib.read_groups(out)
  scorer = loading.build_scorer(None)
  prompt = prompts.PromptConfig(score_mode="log_odds", max_query_tokens=8, max_item_tokens=16)
  template = prompts.get_template(prompt.template)
  builder = prompts.PromptBuilder(scorer.tokenizer, template, prompt.instruction, 8, 16)
  labels = prompts.resolve_labels(scorer.tokenizer, template.default_labels)
  for rec, got in zip(records, scored):
    assert {k: got[k] for k in rec} == rec
    q = data.RerankQuery("q", rec["query"], tuple((f"d{i}", t) for i, t in enumerate(rec["pos"] + rec["neg"])))
    want = query_scoring.score_query(scorer, builder, q, labels, prompt)["scores"]
    assert got["pos_scores"] + got["neg_scores"] == want
  assert groups_lib.load_groups(out).teacher_scores is not None
  with pytest.raises(SystemExit) as e:  # not replaced without --overwrite
    load_script("score_teacher").run(argv)
  assert e.value.code == 2 and "--overwrite" in capsys.readouterr().err


def _dev_set():
  return data.load_jsonl(data.DEFAULT_JSONL, split="dev")


@pytest.mark.parametrize("metric, dev, message", [
    ("ndcg@10", False, r"select_metric='ndcg@10' keeps the best dev evaluation: it needs a dev split"),
    ("ndgc@10", True, r"select_metric='ndgc@10': Unknown metric 'ndgc@10'; valid forms"),
    ("p@5", True, r"select_metric='p@5' \(P_5\) is not among the dev metrics \['ndcg_cut_10', 'map'\]; add it to "
                  r"--metrics"),
])
def test_a_select_metric_the_dev_evaluations_cannot_give_is_refused_before_any_work(tmp_path, metric, dev, message):
  """Refused in one line before the workdir is made or a model loaded, not at the first dev evaluation."""
  cfg = TrainConfig.of(batch_size=2, num_steps=2, select_metric=metric)
  prompt = prompts.PromptConfig(metrics=("ndcg@10", "map"))
  with pytest.raises(TrainError, match=message) as e:
    train_lib.train(cfg, prompt, None, corpus.split("train", 2), _dev_set() if dev else None, tmp_path / "work",
                    progress=False)
  assert "\n" not in str(e.value) and not (tmp_path / "work").exists()
  assert resolve_metric("ndcg@10", prompt.metrics, True) == "ndcg_cut_10"


@pytest.mark.slow
def test_selection_exports_the_best_dev_step_and_patience_stops(tmp_path, monkeypatch):
  """Dev evaluations with planted values (one per eval, best at step 4): the export holds step 4's params, training
  stops two evaluations later, selection.json and the summary say which step won and why, and a rerun over the
  stopped workdir trains nothing more."""
  from maxscore.checkpoints import head_storage  # pylint: disable=import-outside-toplevel
  planted = {0: 0.1, 2: 0.3, 4: 0.5, 6: 0.45, 8: 0.5, 10: 0.9}
  seen_params = {}

  def fake_dev_metrics(cfg, prompt, prep, labels_K, params, runs=None):
    step = len(seen_params) * 2
    seen_params[step] = jax_tree_copy(params["head"])
    return {"split": "dev", "ndcg_cut_10": planted[step], "map": 0.0}
  monkeypatch.setattr(reranker_evaluation, "dev_metrics", fake_dev_metrics)
  train = corpus.split("train", 4)
  prompt = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=16)
  cfg = TrainConfig.of(batch_size=2, num_steps=10, eval_every=2, save_every=2, warmup_steps=0, select_metric="ndcg@10",
                    patience=2)
  summary = train_lib.train(cfg, prompt, None, train, _dev_set(), tmp_path / "work", export_dir=tmp_path / "model",
                            progress=False)
  assert summary["selection"]["best_step"] == 4 and summary["selection"]["stopped_at"] == 8
  assert summary["steps"] == 8 and "2 evaluations without a gain" in summary["selection"]["reason"]
  assert summary["dev_metrics_best"]["ndcg_cut_10"] == 0.5  # step 8 ties 0.5: the earlier step is kept
  report = json.loads((tmp_path / "work" / "selection.json").read_text())
  assert [e["step"] for e in report["evaluations"]] == [0, 2, 4, 6, 8]
  exported = head_storage.load_head(tmp_path / "model")[1]
  for a, b in zip(jax_leaves(exported), jax_leaves(seen_params[4])):
    np.testing.assert_array_equal(a, b)
  assert head_storage.load_head(tmp_path / "model")[2]["selection"]["best_step"] == 4
  again = train_lib.train(cfg, prompt, None, train, _dev_set(), tmp_path / "work", export_dir=tmp_path / "model",
                          progress=False)
  assert again["steps"] == 8 and again["selection"]["best_step"] == 4 and len(seen_params) == 5
  with pytest.raises(TrainError, match="patience"):
    TrainConfig.of(patience=2).validate()


def jax_tree_copy(tree):
  import jax  # pylint: disable=import-outside-toplevel
  return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), jax.device_get(tree))


def jax_leaves(tree):
  import jax  # pylint: disable=import-outside-toplevel
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]
