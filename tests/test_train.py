"""Score-head training: losses against hand-computed values, a frozen backbone, feature cache,
kill-and-resume bit-exactness of the script, throughput reporting. Training the backbone too:
tests/test_train_backbone.py."""

import json
import logging
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxscore.checkpoints import head_storage
from maxscore.checkpoints import storage as checkpointing
from maxscore.datasets import data
from maxscore.distributed import processes
from maxscore.errors import ResumeError, TrainError
from maxscore.rerank import eval as eval_lib
from maxscore.scoring import loading
from maxscore.studies import head_study
from maxscore.testing import corpus
from maxscore.testing.tensorboard_events import tensorboard_scalars
from maxscore.training.reranker import losses
from maxscore.training.optimizer import make_optimizer
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.trainer import TEST_STEP_DELAY_ENV

REPO = pathlib.Path(__file__).resolve().parent.parent
# A small slice of the embedded default: 6 train and 3 dev queries, documents cut to 24 tokens.
PROMPT = eval_lib.EvalConfig(max_query_tokens=8, max_item_tokens=24)
SMALL = dict(batch_size=2, num_epochs=3, eval_every=2, save_every=2, warmup_steps=2, learning_rate=1e-2)
SCRIPT_FLAGS = ["--max_train_queries=6", "--max_dev_queries=3", "--max_query_tokens=8", "--max_item_tokens=24",
                "--batch_size=2", "--num_epochs=3", "--eval_every=2", "--save_every=2", "--keep_checkpoints=2",
                "--warmup_steps=2", "--learning_rate=1e-2", "--noprogress"]


# --- losses on tiny inputs -------------------------------------------------------------------------
def test_listwise_loss_by_hand():
  logits = jnp.asarray([[1.0, 0.0, -1.0, 5.0]])
  grades = jnp.asarray([[2.0, 1.0, 0.0, 7.0]])
  mask = jnp.asarray([[True, True, True, False]])  # the 4th item is padding: ignored
  z = math.log(math.e + 1 + math.exp(-1))
  want = -(2 / 3 * (1 - z) + 1 / 3 * (0 - z))
  loss, weight = losses.listwise_softmax_ce(logits, grades, mask)
  np.testing.assert_allclose(loss, [want], rtol=1e-6)
  assert float(weight[0]) == 1.0
  _, weight = losses.listwise_softmax_ce(logits, jnp.zeros_like(grades), mask)
  assert float(weight[0]) == 0.0  # no relevant item: no target, no weight


def test_pairwise_loss_by_hand():
  logits = jnp.asarray([[2.0, 0.5, 1.0]])
  grades = jnp.asarray([[2.0, 1.0, 1.0]])
  mask = jnp.ones((1, 3), bool)
  sp = lambda x: math.log1p(math.exp(x))
  want = (sp(-(2.0 - 0.5)) + sp(-(2.0 - 1.0))) / 2  # pairs (0,1), (0,2); equal grades are no pair
  loss, weight = losses.pairwise_logistic(logits, grades, mask)
  np.testing.assert_allclose(loss, [want], rtol=1e-6)
  assert float(weight[0]) == 1.0


def test_pointwise_loss_by_hand():
  logits = jnp.asarray([[0.0, 2.0, -1.0]])
  grades = jnp.asarray([[0.0, 2.0, 1.0]])
  mask = jnp.asarray([[True, True, False]])
  want = (math.log(2) + math.log1p(math.exp(-2.0))) / 2
  loss, _ = losses.pointwise_bce(logits, grades, mask)
  np.testing.assert_allclose(loss, [want], rtol=1e-6)
  # batch_loss averages over queries with weight only.
  both = losses.batch_loss("listwise", jnp.zeros((2, 2)), jnp.asarray([[1.0, 0.0], [0.0, 0.0]]),
                              jnp.ones((2, 2), bool))
  np.testing.assert_allclose(both, math.log(2), rtol=1e-6)


def test_optimizer_schedule():
  cfg = TrainConfig.of(learning_rate=0.1, warmup_steps=4, end_learning_rate=0.01)
  _, schedule = make_optimizer(cfg, 20)
  traced = []  # each program traced: one for the schedule, not one per jnp op (each a compile, or a cache read)
  listener = lambda name, *_, **__: traced.append(name) if name == "/jax/core/compile/jaxpr_trace_duration" else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    lrs = [float(schedule(step)) for step in (0, 1, 3, 19)]
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  # the first step learns (a quarter of the peak), the fourth runs at the peak, the last at the end rate
  np.testing.assert_allclose(lrs, [0.025, 0.05, 0.1, 0.01], rtol=1e-5)
  assert len(traced) == 1, traced
  _, schedule = make_optimizer(TrainConfig.of(learning_rate=0.1, warmup_steps=0, end_learning_rate=0.01), 20)
  assert float(schedule(0)) == pytest.approx(0.1) and float(schedule(19)) > 0.01  # no warmup: the peak first


def test_a_warmup_longer_than_half_the_run_is_cut_to_half_so_the_run_decays(caplog):
  """warmup_steps=10 on 4 steps: the rate peaks at the second step and falls to the end rate by the last, with a
  warning; without the cut the run would end at the peak and never decay."""
  cfg = TrainConfig.of(learning_rate=0.1, warmup_steps=10, end_learning_rate=0.0)
  with caplog.at_level(logging.WARNING):
    _, schedule = make_optimizer(cfg, 4)
  lrs = [float(schedule(i)) for i in range(4)]
  np.testing.assert_allclose(lrs[:2], [0.05, 0.1], rtol=1e-6)
  assert 0 < lrs[2] < 0.1 and max(lrs) == lrs[1] and lrs[3] == 0.0
  assert "warmup_steps=10 is more than half of the run's 4 steps: warming up for 2 steps" in caplog.text
  caplog.clear()
  make_optimizer(TrainConfig.of(warmup_steps=2), 4)
  assert "warmup_steps" not in caplog.text  # no cut, no warning


@pytest.mark.parametrize("setting, message", [
    (dict(learning_rate=math.nan), "learning_rate=nan must be > 0 and finite"),
    (dict(learning_rate=math.inf), "learning_rate=inf must be > 0 and finite"),
    (dict(learning_rate=0.0), "learning_rate=0.0 must be > 0 and finite"),
    (dict(end_learning_rate=math.nan), "end_learning_rate=nan must be >= 0 and finite"),
    (dict(end_learning_rate=-1e-3), "end_learning_rate=-0.001 must be >= 0 and finite"),
    (dict(weight_decay=math.nan), "weight_decay=nan must be >= 0 and finite"),
    (dict(weight_decay=-1e-4), "weight_decay=-0.0001 must be >= 0 and finite"),
    (dict(clip_norm=-1.0), "clip_norm=-1.0 must be > 0 and finite"),  # would turn every update around
    (dict(clip_norm=0.0), "clip_norm=0.0 must be > 0 and finite"),  # would scale every update to 0
    (dict(clip_norm=math.nan), "clip_norm=nan must be > 0 and finite"),
    (dict(distill_temperature=math.nan), "distill_temperature=nan must be > 0 and finite"),
    (dict(train_backbone=True, match_loss_weight=math.nan), "match_loss_weight=nan must be >= 0 and finite"),
    (dict(train_backbone=True, match_loss_weight=math.inf), "match_loss_weight=inf must be >= 0 and finite"),
    (dict(train_backbone=True, lora_rank=4, lora_alpha=math.inf), "lora_alpha=inf must be > 0 and finite"),
])
def test_a_float_setting_that_trains_on_nan_or_not_at_all_is_refused(setting, message):
  """The comparisons alone let nan through (learning_rate=nan trained to a nan loss and exited 0): every float
  setting of the trainer is checked to be finite, and the optimizer's ones of the pretrainer too."""
  with pytest.raises(TrainError, match=f"^{re.escape(message)}$"):
    TrainConfig.of(**setting).validate()
  optimizer_keys = {"learning_rate", "end_learning_rate", "weight_decay", "clip_norm"}
  if set(setting) <= optimizer_keys:
    from maxscore.lm.pretrain import PretrainConfig  # pylint: disable=import-outside-toplevel
    with pytest.raises(TrainError, match=f"^{re.escape(message)}$"):
      PretrainConfig(**setting).validate()
  # The rest of the setting is valid: the bad value is what was refused.
  TrainConfig.of(**{k: v for k, v in setting.items() if k in ("train_backbone", "lora_rank")}).validate()


# --- training in-process ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("frozen")
  cfg = TrainConfig.of(**SMALL)
  summary = train_lib.train(cfg, PROMPT, None, corpus.split("train", 6), corpus.split("dev", 3), root / "work",
                            feature_cache=root / "features.npz", export_dir=root / "export", progress=False)
  return cfg, root, summary


def test_frozen_backbone_gets_no_updates(frozen_run):
  cfg, root, summary = frozen_run
  # The training state holds head params only: no gradient is ever taken w.r.t. the backbone.
  manager_dir = root / "work" / "checkpoints"
  last = max(int(p.name) for p in manager_dir.iterdir() if p.name.isdigit())
  assert last == summary["steps"] == 3 * 3
  state_tree = json.loads((manager_dir / str(last) / "state" / "_METADATA").read_text())["tree_metadata"]
  assert all("backbone" not in key for key in state_tree)
  # The exported checkpoint's backbone is the base's, bit for bit.
  base = checkpointing.restore_checkpoint(data.DEFAULT_CHECKPOINT).params
  exported = checkpointing.restore_checkpoint(root / "export").params
  for a, b in zip(jax.tree_util.tree_leaves(base), jax.tree_util.tree_leaves(exported)):
    np.testing.assert_array_equal(a, b)
  assert (root / "export" / "tokenizer").is_dir() and head_storage.has_head(root / "export")


def test_summary_reports_metrics_and_throughput(frozen_run):
  _, root, summary = frozen_run
  t = summary["throughput"]
  assert t["train_items_per_s"] > 0 and 0 < t["frozen_forward_share"] <= 1 and t["frozen_forward_seconds"] > 0
  assert not t["features_from_cache"]
  assert set(summary["dev_metrics_final"]) >= {"ndcg_cut_10", "map"}
  assert summary["attention"] is None  # a frozen backbone differentiates no attention
  lines = [json.loads(l) for l in (root / "work" / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines if l["kind"] == "eval"] == [0, 2, 4, 6, 8, 9]
  assert [l["step"] for l in lines if l["kind"] == "train"] == list(range(1, 10))
  assert all(np.isfinite(l["loss"]) for l in lines if l["kind"] == "train")
  # The same scalars in TensorBoard event files.
  tb = tensorboard_scalars(root / "work" / "tensorboard")
  assert sorted(s for tag, s in tb if tag == "train/loss") == list(range(1, 10))
  assert sorted(s for tag, s in tb if tag == "eval/ndcg_cut_10") == [0, 2, 4, 6, 8, 9]
  for l in lines:
    key = "loss" if l["kind"] == "train" else "ndcg_cut_10"
    assert tb[(f"{l['kind']}/{key}", l["step"])] == pytest.approx(l[key], rel=1e-6)
  # Exported head, used by eval: dev metrics of run_eval equal the trainer's final dev metrics.
  report = eval_lib.run_eval(loading.build_scorer(summary["export_dir"]), corpus.split("dev", 3), PROMPT,
                             root / "eval", progress=False)
  for k, v in summary["dev_metrics_final"].items():
    assert report.metrics[k] == pytest.approx(v, abs=1e-6), k
  assert report.summary["head"]["config"]["kind"] == "lm_labels"


def test_the_metrics_log_writes_tensorboard_events_without_importing_torch(tmp_path):
  """tensorboardX imports torch when it is installed (seconds of a training run's start-up); the log keeps it out
  of a process that has not loaded torch, and torch still imports afterwards."""
  code = ("import sys, pathlib; from maxscore.training.metrics_log import MetricsLog\n"
          "log = MetricsLog(pathlib.Path(sys.argv[1]), None); log.write('train', 1, {'loss': 0.5}); log.close()\n"
          "assert 'torch' not in sys.modules, 'torch imported'\n"
          "import torch; print(torch.__name__)")
  done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                        check=False)
  assert done.returncode == 0 and done.stdout.split() == ["torch"], done.stderr[-2000:]
  assert tensorboard_scalars(tmp_path / "tensorboard") == {("train/loss", 1): 0.5}


def test_feature_cache_and_determinism(frozen_run, tmp_path):
  cfg, root, summary = frozen_run
  again = train_lib.train(cfg, PROMPT, None, corpus.split("train", 6), corpus.split("dev", 3), tmp_path / "work",
                          feature_cache=root / "features.npz", progress=False)
  assert again["throughput"]["features_from_cache"] and again["throughput"]["frozen_forward_seconds"] == 0
  assert again["params_sha256"] == summary["params_sha256"]
  assert again["dev_metrics_final"] == summary["dev_metrics_final"]
  # Run again over the finished run: nothing trains, and the timing of the process that did is kept.
  rerun = train_lib.train(cfg, PROMPT, None, corpus.split("train", 6), corpus.split("dev", 3), tmp_path / "work",
                          feature_cache=root / "features.npz", progress=False)
  assert rerun["resumed_from_step"] == again["steps"] and rerun["params_sha256"] == again["params_sha256"]
  assert rerun["throughput"]["wall_seconds"] > again["throughput"]["wall_seconds"]
  assert {**rerun["throughput"], "wall_seconds": None} == {**again["throughput"], "wall_seconds": None}
  # A feature cache inside the workdir (README: --workdir=out/head --feature_cache=out/head/features.npz) is the
  # run's own: written there, and kept when the run is restarted (nothing retrains), the same head.
  own = tmp_path / "own"
  inside = train_lib.train(cfg, PROMPT, None, corpus.split("train", 6), corpus.split("dev", 3), own,
                           feature_cache=own / "features.npz", progress=False)
  assert (own / "features.npz").is_file() and inside["params_sha256"] == summary["params_sha256"]
  resumed = train_lib.train(cfg, PROMPT, None, corpus.split("train", 6), corpus.split("dev", 3), own,
                            feature_cache=own / "features.npz", progress=False)
  assert resumed["resumed_from_step"] == inside["steps"] and resumed["params_sha256"] == summary["params_sha256"]
  assert (own / "features.npz").is_file()
  # Another workdir config in the same workdir is refused, not mixed.
  with pytest.raises(ResumeError, match=r"changed: train.seed"):
    train_lib.train(TrainConfig.of(**{**SMALL, "seed": 1}), PROMPT, None, corpus.split("train", 6),
                    corpus.split("dev", 3), tmp_path / "work", feature_cache=root / "features.npz", progress=False)


# --- kill and resume -------------------------------------------------------------------------------
def _script(workdir, cache, export, *extra):
  cmd = [sys.executable, str(REPO / "scripts" / "train_score_head.py"), f"--workdir={workdir}",
         f"--feature_cache={cache}", f"--export_dir={export}", *SCRIPT_FLAGS, *extra]
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  return cmd, env


def _checkpoints(workdir):
  d = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def _head_params(export):
  _, params, _ = head_storage.load_head(export)
  return {k: np.asarray(v) for k, v in params.items()}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl_c"])
def test_kill_and_resume_is_bit_exact(tmp_path, sig):
  """SIGKILL: no cleanup. Ctrl-C (SIGINT): one line naming the step and the checkpoint, exit 130, and the
  checkpoints as consistent as after SIGKILL: the resumed run ends as the uninterrupted one, bit for bit."""
  cache = tmp_path / "features.npz"
  cmd, env = _script(tmp_path / "a", cache, tmp_path / "a_export")
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  # The same run, slowed down and killed (SIGKILL: no cleanup) once a checkpoint past step 2 exists.
  cmd, env = _script(tmp_path / "b", cache, tmp_path / "b_export")
  err_path = tmp_path / "killed.err"
  with open(err_path, "w") as err:
    # Ctrl-C's default in the child: a shell starts background jobs with SIGINT ignored, and Python then
    # keeps it ignored (no KeyboardInterrupt), so a suite run in the background would not test Ctrl-C.
    proc = subprocess.Popen(processes.with_sigint(cmd), env={**env, TEST_STEP_DELAY_ENV: "0.5"},
                            stdout=subprocess.DEVNULL, stderr=err)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None and not any(s >= 4 for s in _checkpoints(tmp_path / "b")):
    time.sleep(0.05)
  assert proc.poll() is None, "the run ended before it could be killed"
  proc.send_signal(sig)
  code = proc.wait(timeout=120)
  killed_at = max(_checkpoints(tmp_path / "b"))
  if sig == signal.SIGINT:
    lines = err_path.read_text().strip().splitlines()
    assert code == 130 and "Traceback" not in err_path.read_text(), err_path.read_text()[-3000:]
    m = re.fullmatch(r"stopped at step (\d+) \(Ctrl-C\); the last checkpoint is step (\d+) in .*: run the same "
                     r"command to resume from it", lines[-1])
    assert m and int(m.group(2)) == killed_at <= int(m.group(1)), lines[-1]
  assert 4 <= killed_at < 9 and not (tmp_path / "b" / "summary.json").exists()
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  a = json.loads((tmp_path / "a" / "summary.json").read_text())
  b = json.loads((tmp_path / "b" / "summary.json").read_text())
  assert b["resumed_from_step"] >= killed_at and a["resumed_from_step"] is None
  assert a["params_sha256"] == b["params_sha256"] and a["steps"] == b["steps"] == 9
  assert a["dev_metrics_final"] == b["dev_metrics_final"] and a["final_train_loss"] == b["final_train_loss"]
  pa, pb = _head_params(tmp_path / "a_export"), _head_params(tmp_path / "b_export")
  assert set(pa) == set(pb) and all(pa[k].dtype == np.float32 and np.array_equal(pa[k], pb[k]) for k in pa)
  # metrics.jsonl reads as one uninterrupted run.
  assert (tmp_path / "a" / "metrics.jsonl").read_text() == (tmp_path / "b" / "metrics.jsonl").read_text()
  # TensorBoard too: the resumed run rewrote the event files from the kept metrics lines.
  assert tensorboard_scalars(tmp_path / "a" / "tensorboard") == tensorboard_scalars(tmp_path / "b" / "tensorboard")
  assert len(_checkpoints(tmp_path / "a")) == 2  # keep_checkpoints


def test_script_input_errors(load_script, tmp_path):
  module = load_script("train_score_head")
  with pytest.raises(SystemExit) as e:
    module.run(["prog", f"--workdir={tmp_path}", "--batch_size=0"])
  assert e.value.code == 2
  with pytest.raises(SystemExit) as e:
    module.run(["prog", f"--workdir={tmp_path}", "--train_split=nope"])
  assert e.value.code == 2


def _write_beir(d, run, splits):
  """The given {split: RerankSet} as one BEIR directory (corpus, queries, qrels/<split>.tsv) + a TREC run."""
  (d / "qrels").mkdir(parents=True)
  docs = {doc: text for ds in splits.values() for q in ds.queries for doc, text in q.candidates}
  (d / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items()))
  (d / "queries.jsonl").write_text("".join(json.dumps({"_id": q.qid, "text": q.query}) + "\n"
                                           for ds in splits.values() for q in ds.queries))
  for name, ds in splits.items():
    (d / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q.qid}\t{doc}\t{g}\n" for q in ds.queries for doc, g in ds.qrels.get(q.qid, {}).items()))
  run.write_text("".join(f"{q.qid} Q0 {doc} {r} {-r} bm25\n" for ds in splits.values() for q in ds.queries
                         for r, (doc, _) in enumerate(q.candidates, 1)))


def test_beir_and_jsonl_training_data_train_the_same_head(load_script, tmp_path):
  """train_score_head.py on BEIR + run equals the same queries in the JSONL form, bit for bit."""
  module = load_script("train_score_head")
  _write_beir(tmp_path / "beir", tmp_path / "run.trec", {"train": corpus.split("train", 6), "dev": corpus.split("dev", 3)})
  flags_ = [f for f in SCRIPT_FLAGS if not f.startswith("--max_")] + ["--max_query_tokens=8", "--max_item_tokens=24",
                                                                      "--num_epochs=1"]
  module.run(["prog", f"--workdir={tmp_path / 'b'}", f"--data_dir={tmp_path / 'beir'}",
              f"--run_file={tmp_path / 'run.trec'}", *flags_])
  module.run(["prog", f"--workdir={tmp_path / 'j'}", "--max_train_queries=6", "--max_dev_queries=3", *flags_])
  b, j = (json.loads((tmp_path / w / "summary.json").read_text()) for w in ("b", "j"))
  assert b["train_queries"] == j["train_queries"] == 6 and b["dev_queries"] == j["dev_queries"] == 3
  assert b["params_sha256"] == j["params_sha256"] and b["dev_metrics_final"] == j["dev_metrics_final"]


# --- head study ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_head_study_small(tmp_path):
  report = head_study.study(None, None, ["lm_labels", "linear"], [0, 1], tmp_path, prompt=PROMPT, max_queries=3,
                            num_epochs=2, batch_size=2, learning_rate=1e-2)
  assert [(r["spec"], r["seed"]) for r in report["runs"]] == [("lm_labels", 0), ("lm_labels", 1), ("linear", 0),
                                                               ("linear", 1)]
  assert all(set(r["dev"]) >= {"ndcg_cut_10"} and set(r["test"]) >= {"ndcg_cut_10"} for r in report["runs"])
  # The exported first-seed head re-scored by run_eval gives the trainer's test metrics.
  for spec in ("lm_labels", "linear"):
    first = next(r for r in report["runs"] if r["spec"] == spec)
    paired = report["paired"][spec]["test"]
    assert paired["queries"] == 3 and paired["wins"] + paired["losses"] + paired["ties"] == 3
    assert paired["delta"] == pytest.approx(first["test"]["ndcg_cut_10"] - report["baseline"]["test"]["ndcg_cut_10"],
                                                abs=1e-6)
  table = head_study.markdown(report)
  assert "| no head (untrained) |" in table and "BM25 reference" in table and "p = " in table
  with pytest.raises(TrainError, match="specs"):
    head_study.study(None, None, ["nope"], [0], tmp_path)


def test_head_study_script_input_errors(load_script, tmp_path, capsys):
  module = load_script("head_study")
  with pytest.raises(SystemExit) as e:
    module.run(["prog", f"--workdir={tmp_path}", "--specs=nope"])
  assert e.value.code == 2 and "nope" in capsys.readouterr().err

