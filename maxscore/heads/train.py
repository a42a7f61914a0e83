"""Score-head training: a light head on a frozen backbone (or, with train_backbone, the whole model).

    summary = train(TrainConfig(head="lm_labels", delta="full"), EvalConfig(), "ckpt/", train_set, dev_set,
                    "out/train", export_dir="ckpt-with-head/")

1. Prompts are built exactly as the eval builds them (an `EvalConfig`: template, labels, truncation).
2. Frozen backbone: each query's features (hidden states h and label log-probs lp at the score
   positions) are computed ONCE, without gradients, by the scorer's own fast path and optionally
   cached in an npz (maxscore/features.py).
3. Each step takes `batch_size` queries in an order drawn per epoch from PRNG(seed, epoch); the
   head maps (h, lp) to label log-probs, `heads.relevance` to one ranking logit per item, and the
   loss compares each query's logits with its graded qrels: `listwise` softmax cross-entropy
   against the normalized gains (default), `pairwise` logistic over pairs with different grades,
   or `pointwise` binary cross-entropy (relevant = grade >= 1). Optimizer: clip_by_global_norm
   then AdamW on a warmup + cosine schedule.
4. Orbax CheckpointManager in `<workdir>/checkpoints`: params, optimizer state, step and data
   position (epoch, index in the epoch's order, PRNG key), every `save_every` steps and at the
   end, the last `keep_checkpoints` kept. A restarted run resumes from the latest: every later
   step, metric and the final params equal an uninterrupted run's bit for bit (float32 on CPU).
5. `<workdir>/metrics.jsonl`: train loss lines and dev-eval lines (`metrics.evaluate` over the
   ranking score eval would compute from the head's scores); lines past the checkpoint a run
   resumes from are dropped first, so the file reads as one uninterrupted run. The same scalars go
   to TensorBoard event files in `<workdir>/tensorboard` (tensorboardX: flax.metrics.tensorboard
   would need tensorflow), which a resumed run rewrites from the kept lines.
6. `export_dir`: a copy of the base checkpoint with the head in head/ (heads.export_checkpoint).

`train_backbone=True` trains the decoder params together with the head, through the packed
layout (DESIGN.md section 2) with each scanned layer rematerialized in the backward pass.
"""

import dataclasses
import json
import math
import os
import pathlib
import shutil
import time
from typing import Any, Literal, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tensorboardX
from absl import logging

from layers.decoder import Decoder
from maxscore import errors
from maxscore.files import identity, safety
from maxscore.heads import features, score_heads as heads
from maxscore.rerank import data, metrics, prompts
from maxscore.heads.features import (Examples, load_or_extract, make_examples, packed_features, packed_geometry,
                               plan_packed)
from maxscore.rerank.data import RerankSet
from maxscore.rerank.eval import SCORE_MODES, EvalConfig, build_scorer
from maxscore.scoring.scorer import Scorer, finalize_scores

FORMAT_VERSION = 1
MASK_LOGIT = -1e9  # ranking logit of padding items: exp underflows to 0, gradients stay finite


class TrainError(ValueError):
  """A training setting is invalid, or the workdir holds another run."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Head, loss, optimizer and loop settings (prompts and metrics come from an EvalConfig)."""
  head: Literal["lm_labels", "linear", "mlp"] = "lm_labels"
  delta: Literal["full", "low_rank", "none"] = "full"  # lm_labels: h @ W, h @ A @ B, or no hidden term
  rank: int = 8                    # lm_labels with delta=low_rank: rank of h @ A @ B
  use_bias: bool = True            # lm_labels: a trainable bias on the label logits
  num_outputs: int = 0             # linear/mlp: 1 = one relevance logit, 0 = one logit per label
  mlp_hidden: int = 256            # mlp: hidden width
  loss: Literal["listwise", "pairwise", "pointwise"] = "listwise"
  learning_rate: float = 1e-3      # peak of the warmup + cosine schedule
  end_learning_rate: float = 0.0   # value the cosine decays to at the last step
  warmup_steps: int = 10
  weight_decay: float = 1e-4       # AdamW decoupled weight decay
  clip_norm: float = 1.0           # clip_by_global_norm before AdamW
  batch_size: int = 8              # queries per step
  num_epochs: int = 20
  num_steps: int = 0               # total steps; 0 = num_epochs over the train queries
  seed: int = 0                    # head init and data order
  log_every: int = 1               # train-loss lines every N steps
  eval_every: int = 20             # dev eval every N steps (and at step 0 and the end); 0 = start and end only
  save_every: int = 20             # checkpoint every N steps (and at the end)
  keep_checkpoints: int = 3        # checkpoints kept (the latest ones)
  train_backbone: bool = False     # fine-tune the decoder too (with remat); no feature cache then
  algorithm: Optional[str] = None  # scorer algorithm for the frozen features; None = the scorer's choice

  def validate(self) -> "TrainConfig":
    if self.loss not in LOSSES:
      raise TrainError(f"loss={self.loss!r} is not one of {sorted(LOSSES)}")
    if self.head not in heads.HEADS:
      raise TrainError(f"head={self.head!r} is not one of {sorted(heads.HEADS)}")
    for name in ("batch_size", "num_epochs", "keep_checkpoints", "log_every"):
      if getattr(self, name) < 1:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 1")
    for name in ("num_steps", "warmup_steps", "eval_every", "save_every", "rank"):
      if getattr(self, name) < 0:
        raise TrainError(f"{name}={getattr(self, name)} must be >= 0")
    if self.learning_rate <= 0:
      raise TrainError(f"learning_rate={self.learning_rate} must be > 0")
    return self

  def head_config(self, label_ids: Sequence[int], hidden_size: int) -> heads.HeadConfig:
    try:
      return self._head_config(label_ids, hidden_size)
    except ValueError as e:
      raise TrainError(str(e)) from None

  def _head_config(self, label_ids: Sequence[int], hidden_size: int) -> heads.HeadConfig:
    return heads.HeadConfig(kind=self.head, label_token_ids=tuple(label_ids), hidden_size=hidden_size,
                            delta=self.delta if self.head == "lm_labels" else "full", rank=self.rank,
                            use_bias=self.use_bias if self.head == "lm_labels" else True,
                            num_outputs=self.num_outputs if self.head != "lm_labels" else 0,
                            mlp_hidden=self.mlp_hidden).validate()


# --- losses: (ranking logits [B, N], grades [B, N], mask [B, N]) -> (loss [B], weight [B]) -------------
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


LOSSES = {"listwise": listwise_softmax_ce, "pairwise": pairwise_logistic, "pointwise": pointwise_bce}


def batch_loss(name: str, logits_BxN, grades_BxN, mask_BxN) -> jax.Array:
  """Mean of the per-query losses over the queries that have weight."""
  loss, weight = LOSSES[name](logits_BxN, grades_BxN, mask_BxN)
  return jnp.sum(loss * weight) / jnp.maximum(weight.sum(), 1.0)


def make_optimizer(cfg: TrainConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """clip_by_global_norm, then AdamW on linear warmup + cosine decay to end_learning_rate."""
  warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warmup, max(total_steps, warmup + 1),
                                                cfg.end_learning_rate)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                     optax.adamw(schedule, weight_decay=cfg.weight_decay)), schedule


# --- the loop ------------------------------------------------------------------------------------
class MetricsLog:
  """metrics.jsonl and TensorBoard scalars (`<kind>/<name>` at each step); resumable."""

  def __init__(self, workdir: pathlib.Path, resume_step: Optional[int]):
    self.path = workdir / "metrics.jsonl"
    kept = []
    if resume_step is not None and self.path.exists():
      for line in self.path.read_text(encoding="utf-8").split("\n"):
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          continue  # a torn last line
        if rec.get("step", 0) <= resume_step:
          kept.append(rec)
    safety.atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
    self.logged = {(r["kind"], r["step"]) for r in kept}
    self.records = kept
    # metrics.jsonl is the record; the event files mirror it. A killed run's last events may never
    # have left tensorboardX's writer thread, so a resumed run rewrites them from the kept lines.
    tb_dir = workdir / "tensorboard"
    if tb_dir.exists():
      shutil.rmtree(tb_dir)
    self.writer = tensorboardX.SummaryWriter(str(tb_dir))
    for rec in kept:
      self._scalars(rec["kind"], rec["step"], rec)
    self.writer.flush()

  def _scalars(self, kind: str, step: int, values: dict[str, Any]) -> None:
    for name, v in values.items():
      if isinstance(v, (int, float)) and name not in ("epoch", "step"):
        self.writer.add_scalar(f"{kind}/{name}", v, step)

  def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
    if (kind, step) in self.logged:
      return
    rec = {"kind": kind, "step": step, **values}
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(rec) + "\n")
    self.logged.add((kind, step))
    self.records.append(rec)
    self._scalars(kind, step, values)
    self.writer.flush()

  def close(self) -> None:
    self.writer.close()


def evaluate_split(cfg_head: heads.HeadConfig, params, hidden, logprobs, examples: Examples,
                   prompt: EvalConfig) -> dict[str, float]:
  """Metrics of the ranking eval would compute from the head's scores (score_mode of `prompt`)."""
  apply_softmax, rank_fn = SCORE_MODES[prompt.score_mode]
  new_lp = np.asarray(heads.jit_apply(cfg_head)(params, hidden, logprobs))
  run = {}
  for i, (qid, docids) in enumerate(zip(examples.qids, examples.docids)):
    scores = np.asarray(rank_fn(finalize_scores(new_lp[i, :len(docids)], apply_softmax)), np.float32)
    run[qid] = {d: float(s) for d, s in zip(docids, scores)}
  per_query = metrics.evaluate(examples.qrels, run, prompt.metrics)
  return metrics.aggregate(per_query) if per_query else {}


def _run_fingerprint(cfg: TrainConfig, prompt: EvalConfig, scorer: Scorer, examples: dict[str, Examples]) -> dict:
  """What the trained head depends on (maxscore/files/identity.py): a resumed run must match it."""
  return {"format_version": FORMAT_VERSION, "train": dataclasses.asdict(cfg),
          "prompt": json.loads(json.dumps(dataclasses.asdict(prompt))), "scorer": identity.scorer_identity(scorer),
          "data": {k: v.digest() for k, v in sorted(examples.items())}}


class ResumeError(TrainError, errors.ResumeError):
  """The workdir holds a run with another config or data."""


def train(cfg: TrainConfig, prompt: EvalConfig, checkpoint_dir: Optional[str], train_set: RerankSet,
          dev_set: Optional[RerankSet], workdir: os.PathLike, *, overrides: Sequence[str] = (),
          feature_cache: Optional[os.PathLike] = None, export_dir: Optional[os.PathLike] = None,
          overwrite: bool = False, progress: bool = True, step_delay_s: float = 0.0) -> dict[str, Any]:
  """Trains (or resumes) a score head; writes checkpoints, metrics.jsonl and summary.json in
  `workdir` and the exported checkpoint in `export_dir`. Returns the summary."""
  cfg.validate()
  prompt.validate()
  wall_start = time.perf_counter()
  workdir = pathlib.Path(workdir).resolve()
  _prepare_outputs(workdir, export_dir, overwrite, checkpoint_dir, feature_cache,
                   [*data.input_paths(train_set), *(data.input_paths(dev_set) if dev_set is not None else ())])

  scorer = build_scorer(checkpoint_dir, overrides, use_head=False)
  label_ids = prompts.resolve_labels(scorer.tokenizer, prompt.labels or prompts.TEMPLATES[prompt.template].default_labels)
  examples = {"train": make_examples(scorer, train_set, prompt, label_ids)}
  if dev_set is not None:
    examples["dev"] = make_examples(scorer, dev_set, prompt, label_ids)
  if not examples["train"].requests:
    raise data.DataError("the train split has no queries with candidates")
  head_cfg = cfg.head_config(label_ids, scorer.config.model.hidden_size)
  grids = {s: ex.grid() for s, ex in examples.items()}

  # Features (frozen) or packed plans (train_backbone).
  if cfg.train_backbone:
    feats, feature_seconds, cached = None, 0.0, False
    geometry = {s: packed_geometry(scorer, ex) for s, ex in examples.items()}
  else:
    feats = load_or_extract(scorer, examples, feature_cache, cfg.algorithm, progress)
    feature_seconds = sum(f.seconds for f in feats.values())
    cached = all(f.cached for f in feats.values())

  # Optimizer, state, checkpoints.
  n_train = len(examples["train"].requests)
  steps_per_epoch = math.ceil(n_train / cfg.batch_size)
  total_steps = cfg.num_steps or cfg.num_epochs * steps_per_epoch
  optimizer, schedule = make_optimizer(cfg, total_steps)
  init_key, data_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
  params = {"head": heads.init_head(head_cfg, init_key)}
  if cfg.train_backbone:
    params["backbone"] = jax.tree_util.tree_map(jnp.asarray, scorer.runner.params)
  # Committed to one device, like the arrays every step returns (else step 2 compiles again).
  params = jax.device_put(params, jax.local_devices()[0])
  state = {"params": params, "opt_state": jax.device_put(optimizer.init(params), jax.local_devices()[0]),
           "step": np.int32(0), "epoch": np.int32(0), "index": np.int32(0), "rng": np.asarray(data_key)}
  fingerprint = _run_fingerprint(cfg, prompt, scorer, examples)
  manager = ocp.CheckpointManager(workdir / "checkpoints", options=ocp.CheckpointManagerOptions(
      max_to_keep=cfg.keep_checkpoints, create=True))
  resume_step = manager.latest_step()
  if resume_step is not None:
    stored = manager.restore(resume_step, args=ocp.args.Composite(run=ocp.args.JsonRestore()))["run"]
    try:
      identity.check_same(stored, fingerprint, workdir, "pass --overwrite to start over, or use a new --workdir")
    except errors.ResumeError as e:
      raise ResumeError(str(e)) from None
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=device), state)
    state = manager.restore(resume_step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    logging.info("train: resumed from step %d (epoch %d, index %d)", int(state["step"]), int(state["epoch"]),
                 int(state["index"]))
  log = MetricsLog(workdir, resume_step)

  # The step function.
  decoder = Decoder(scorer.config.model, scorer.runner.decoder(scorer.runner.default_kernel).attend,
                    dtype=scorer.runner.dtype, param_dtype=scorer.runner.dtype, precision=scorer.runner.precision,
                    remat=True) if cfg.train_backbone else None
  labels_K = jnp.asarray(label_ids, jnp.int32)

  def loss_fn(params, batch):
    if cfg.train_backbone:
      h, lp = packed_features(decoder, params["backbone"], batch["packed"], batch["gather"], labels_K)
    else:
      h, lp = batch["hidden"], batch["logprobs"]
    logits = jnp.where(batch["mask"], heads.relevance(heads.apply_head(head_cfg, params["head"], h, lp)), MASK_LOGIT)
    return batch_loss(cfg.loss, logits, batch["grades"], batch["mask"])

  @jax.jit
  def train_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, optax.global_norm(grads)

  def make_batch(idx: np.ndarray) -> tuple[dict, int]:
    valid = idx >= 0
    safe = np.where(valid, idx, 0)
    grades, mask = grids["train"]
    batch = {"grades": grades[safe], "mask": mask[safe] & valid[:, None]}
    if cfg.train_backbone:
      plan = plan_packed([examples["train"].requests[i] if i >= 0 else None for i in idx], geometry["train"])
      batch.update(packed=plan.batch, gather=plan.gather_QxN[:, :grades.shape[1]])
    else:
      batch.update(hidden=feats["train"].hidden[safe], logprobs=feats["train"].logprobs[safe])
    return batch, int(batch["mask"].sum())

  def dev_metrics(params) -> Optional[dict[str, float]]:
    if "dev" not in examples:
      return None
    if cfg.train_backbone:
      h, lp = features.backbone_features(decoder, params["backbone"], examples["dev"], geometry["dev"], labels_K,
                                 cfg.batch_size)
    else:
      h, lp = feats["dev"].hidden, feats["dev"].logprobs
    return evaluate_split(head_cfg, params["head"], h, lp, examples["dev"], prompt)

  def save(step: int) -> None:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                               run=ocp.args.JsonSave(fingerprint)))

  step = int(state["step"])
  eval_seconds, step_seconds, step_items, first_step_seconds = 0.0, 0.0, 0, None
  if step == 0:
    t = time.perf_counter()
    m = dev_metrics(state["params"])
    eval_seconds += time.perf_counter() - t
    if m is not None:
      log.write("eval", 0, {"split": "dev", **m})
  while step < total_steps:
    epoch, index = int(state["epoch"]), int(state["index"])
    order = np.asarray(jax.random.permutation(jax.random.fold_in(jnp.asarray(state["rng"]), epoch), n_train))
    idx = order[index:index + cfg.batch_size]
    idx = np.concatenate([idx, np.full(cfg.batch_size - len(idx), -1, idx.dtype)])
    batch, items = make_batch(idx)
    t = time.perf_counter()
    new_params, new_opt, loss, gnorm = train_step(state["params"], state["opt_state"], batch)
    loss = float(loss)  # waits for the step
    dt = time.perf_counter() - t
    if first_step_seconds is None:
      first_step_seconds = dt
    else:
      step_seconds, step_items = step_seconds + dt, step_items + items
    index += cfg.batch_size
    if index >= n_train:
      epoch, index = epoch + 1, 0
    step += 1
    state = {"params": new_params, "opt_state": new_opt, "step": np.int32(step), "epoch": np.int32(epoch),
             "index": np.int32(index), "rng": state["rng"]}
    if step % cfg.log_every == 0 or step == total_steps:
      log.write("train", step, {"epoch": epoch, "loss": loss, "grad_norm": float(gnorm),
                                "learning_rate": float(schedule(step - 1))})
    if (cfg.eval_every and step % cfg.eval_every == 0) or step == total_steps:
      t = time.perf_counter()
      m = dev_metrics(state["params"])
      eval_seconds += time.perf_counter() - t
      if m is not None:
        log.write("eval", step, {"split": "dev", **m})
    if (cfg.save_every and step % cfg.save_every == 0) or step == total_steps:
      save(step)
    if progress and step % max(1, total_steps // 10) == 0:
      logging.info("train: step %d/%d loss %.4f", step, total_steps, loss)
    if step_delay_s:
      time.sleep(step_delay_s)
  manager.wait_until_finished()
  if step == total_steps and manager.latest_step() != step:  # resumed at the end: nothing ran
    save(step)
    manager.wait_until_finished()
  log.close()

  final = state["params"]
  evals = [r for r in log.records if r["kind"] == "eval"]
  summary = {
      "workdir": str(workdir),
      "checkpoint_dir": scorer.config.runtime.checkpoint_dir,
      "head": head_cfg.to_dict(),
      "train_config": dataclasses.asdict(cfg),
      "prompt": json.loads(json.dumps(dataclasses.asdict(prompt))),
      "label_ids": list(label_ids),
      "train_queries": n_train,
      "train_items": int(grids["train"][1].sum()),
      "dev_queries": len(examples["dev"].requests) if "dev" in examples else 0,
      "steps": step,
      "steps_per_epoch": steps_per_epoch,
      "resumed_from_step": resume_step,
      "final_train_loss": next((r["loss"] for r in reversed(log.records) if r["kind"] == "train"), None),
      "dev_metrics_initial": next((_metric_values(r) for r in evals if r["step"] == 0), None),
      "dev_metrics_final": _metric_values(evals[-1]) if evals else None,
      "params_sha256": _params_digest(final["head"]),
      "throughput": _throughput(feats, feature_seconds, cached, examples, step_seconds, step_items,
                                first_step_seconds, eval_seconds, time.perf_counter() - wall_start),
  }
  if export_dir:
    info = {k: summary[k] for k in ("train_config", "prompt", "label_ids", "train_queries", "steps",
                                    "dev_metrics_initial", "dev_metrics_final")}
    # "." when the head was written into its own base checkpoint (paths of this machine mean
    # nothing inside a checkpoint that is copied elsewhere).
    same = pathlib.Path(export_dir).resolve() == pathlib.Path(summary["checkpoint_dir"]).resolve()
    info["base_checkpoint"] = "." if same else summary["checkpoint_dir"]
    backbone = jax.device_get(final["backbone"]) if cfg.train_backbone else None
    again = _exported_by(pathlib.Path(export_dir), workdir)
    summary["export_dir"] = str(heads.export_checkpoint(scorer.config.runtime.checkpoint_dir, export_dir, head_cfg,
                                                        jax.device_get(final["head"]), info, backbone,
                                                        overwrite=overwrite or again, workdir=str(workdir)))
  safety.atomic_write_text(workdir / "summary.json", json.dumps(summary, indent=2) + "\n")
  return summary


def _prepare_outputs(workdir: pathlib.Path, export_dir: Optional[os.PathLike], overwrite: bool,
                     checkpoint_dir: Optional[str], feature_cache: Optional[os.PathLike], data_paths) -> None:
  """Refuses, before any work, outputs that are inputs or foreign directories; then (re)creates the
  workdir (--overwrite removes it only when maxscore wrote it)."""
  base = None if str(checkpoint_dir).lower() == "none" else (checkpoint_dir or data.DEFAULT_CHECKPOINT)
  inputs = [i for i in (base, feature_cache, *data_paths) if i is not None]
  safety.refuse_overlap([workdir], inputs, "--workdir")
  if export_dir and (base is None or safety.resolve(export_dir) != safety.resolve(base)):  # else: head/ into base
    safety.refuse_overlap([export_dir], inputs, "--export_dir")
    if workdir == safety.resolve(export_dir) or workdir in safety.resolve(export_dir).parents:
      raise errors.UnsafeOutputError(f"--export_dir {export_dir} would replace the --workdir {workdir}; "
                                     f"choose an export path inside or beside it")
    _check_export_dir(pathlib.Path(export_dir), workdir, overwrite)
  if overwrite:
    safety.remove_owned(workdir, "--workdir")
  safety.prepare_output_dir(workdir, "head_training", inputs, "--workdir")


def _exported_by(export_dir: pathlib.Path, workdir: pathlib.Path) -> bool:
  """Whether `export_dir` is the export an earlier (or killed) run of this workdir wrote."""
  return (safety.owner(export_dir) or {}).get("workdir") == str(workdir)


def _check_export_dir(export_dir: pathlib.Path, workdir: pathlib.Path, overwrite: bool) -> None:
  """Before any work: an existing export directory is replaced only when maxscore wrote it, and only
  with --overwrite or when this workdir's earlier run wrote it (a resumed run exports again)."""
  if not export_dir.exists():
    return
  if not export_dir.is_dir() or not safety.is_owned(export_dir, "checkpoint"):
    raise errors.UnsafeOutputError(f"--export_dir {export_dir} exists and was not written by maxscore (no "
                                   f"{safety.MARKER} marker); it is left untouched: choose a new path")
  if not (overwrite or _exported_by(export_dir, workdir)):
    raise errors.UnsafeOutputError(f"--export_dir {export_dir} already exists; pass --overwrite to replace it")


def _metric_values(rec: dict) -> dict[str, float]:
  return {k: v for k, v in rec.items() if k not in ("kind", "step", "split")}


def _params_digest(tree) -> str:
  return identity.tree_digest(tree)


def _throughput(feats, feature_seconds, cached, examples, step_seconds, step_items, first_step_seconds,
                eval_seconds, wall) -> dict[str, Any]:
  """Examples (query-item pairs) per second of head training, and where the time went."""
  extracted_items = 0 if (feats is None or cached) else sum(int(ex.grid()[1].sum()) for ex in examples.values())
  busy = feature_seconds + step_seconds + (first_step_seconds or 0.0) + eval_seconds
  return {
      "train_items_per_s": step_items / step_seconds if step_seconds else None,
      "train_seconds": step_seconds,
      "first_step_seconds": first_step_seconds,
      "frozen_forward_seconds": feature_seconds,
      "frozen_forward_items_per_s": extracted_items / feature_seconds if feature_seconds else None,
      "frozen_forward_share": feature_seconds / busy if busy else None,
      "features_from_cache": cached,
      "eval_seconds": eval_seconds,
      "wall_seconds": wall,
  }
