"""Score-head training: a light head on a frozen backbone (or, with train_backbone, the whole model).

    summary = train(TrainConfig(head="lm_labels", delta="full"), PromptConfig(), "ckpt/", train_set, dev_set,
                    "out/train", export_dir="ckpt-with-head/")

1. Prompts are built exactly as the eval builds them (a `PromptConfig`: template, labels, truncation).
2. Frozen backbone: each query's features (hidden states h and label log-probs lp at the score
   positions) are computed ONCE, without gradients, by the scorer's own fast path and optionally
   cached in an npz (maxscore/heads/features.py).
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
layout (DESIGN.md section 2) with each scanned layer rematerialized in the backward pass. With
`match_loss_weight` > 0 the loss adds that weight times two auxiliary losses (`losses.probe_bce`):
a linear probe on every candidate token's hidden state predicts whether the token occurs in the query,
and one at each score position ranks a query's candidates by the share of the query's distinct tokens
found in each (pairwise logistic loss; the probes train beside the model and are not exported). With
`coverage_on="score"` that coverage ranking trains the exported ranking score itself instead of a probe:
weak supervision from lexical overlap, which needs no relevance labels.
"""

import dataclasses
import json
import math
import os
import pathlib
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging

from layers.decoder import Decoder
from maxscore import errors
from maxscore.files import identity, safety
from maxscore.heads import features
from maxscore.heads import score_heads as heads
from maxscore.heads.features import (
  Examples,
  load_or_extract,
  make_examples,
  packed_features,
  packed_geometry,
  plan_packed,
)
from maxscore.heads.losses import MASK_LOGIT, batch_loss, probe_bce, probe_logits
from maxscore.heads.train_config import (COVERAGE_ON, LORA_TARGETS, TrainConfig, TrainError,  # noqa: F401  (re-exported)
                                         TrainRun)
from maxscore.heads.metrics_log import MetricsLog
from maxscore.rerank import data, metrics, prompts
from maxscore.rerank.data import RerankSet
from maxscore.rerank.eval import SCORE_MODES, PromptConfig, build_scorer
from maxscore.scoring.scorer import Scorer, finalize_scores

FORMAT_VERSION = 1


def make_optimizer(cfg: TrainConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """clip_by_global_norm, then AdamW on linear warmup + cosine decay to end_learning_rate."""
  warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warmup, max(total_steps, warmup + 1),
                                                cfg.end_learning_rate)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                     optax.adamw(schedule, weight_decay=cfg.weight_decay)), schedule


# --- the loop ------------------------------------------------------------------------------------
def evaluate_split(cfg_head: heads.HeadConfig, params, hidden, logprobs, examples: Examples,
                   prompt: PromptConfig) -> dict[str, float]:
  """Metrics of the ranking eval would compute from the head's scores (score_mode of `prompt`)."""
  apply_softmax, rank_fn = SCORE_MODES[prompt.score_mode]
  if apply_softmax is None:
    raise ValueError("score_mode=raw_logit needs raw lm_head logits; a score head gives log-probs (use p_first)")
  new_lp = np.asarray(heads.jit_apply(cfg_head)(params, hidden, logprobs))
  run = {}
  for i, (qid, docids) in enumerate(zip(examples.qids, examples.docids)):
    scores = np.asarray(rank_fn(finalize_scores(new_lp[i, :len(docids)], apply_softmax)), np.float32)
    run[qid] = {d: float(s) for d, s in zip(docids, scores)}
  per_query = metrics.evaluate(examples.qrels, run, prompt.metrics)
  return metrics.aggregate(per_query) if per_query else {}


# Settings added after runs were first written, with the behaviour from before they existed: recorded
# only when they differ from it, so that a run written before them still resumes.
_LATER_SETTINGS = {"coverage_on": "probe", "lora_rank": 0, "lora_alpha": 16.0, "lora_targets": LORA_TARGETS}


def train_identity(cfg: TrainConfig) -> dict:
  """The training settings a resumed run must match."""
  return {k: v for k, v in dataclasses.asdict(cfg).items() if not (k in _LATER_SETTINGS and v == _LATER_SETTINGS[k])}


def _run_fingerprint(cfg: TrainConfig, prompt: PromptConfig, scorer: Scorer, examples: dict[str, Examples]) -> dict:
  """What the trained head depends on (maxscore/files/identity.py): a resumed run must match it."""
  return {"format_version": FORMAT_VERSION, "train": train_identity(cfg),
          "prompt": json.loads(json.dumps(dataclasses.asdict(prompt))), "scorer": identity.scorer_identity(scorer),
          "data": {k: v.digest() for k, v in sorted(examples.items())}}


class ResumeError(TrainError, errors.ResumeError):
  """The workdir holds a run with another config or data."""


@dataclasses.dataclass
class Prepared:
  """Everything a run trains on, built once: the scorer, its labels and head, and each split's
  examples with their frozen features (or packed plans when the backbone trains too)."""
  scorer: Scorer
  label_ids: tuple[int, ...]
  head_cfg: heads.HeadConfig
  examples: dict[str, Examples]
  grids: dict[str, tuple[np.ndarray, np.ndarray]]
  feats: Optional[dict] = None       # frozen features per split
  geometry: Optional[dict] = None    # train_backbone: packed geometry per split
  feature_seconds: float = 0.0
  cached: bool = False
  match_targets: bool = False        # batches carry the token-match targets (match_loss_weight > 0)

  @property
  def num_train(self) -> int:
    return len(self.examples["train"].requests)


def prepare(cfg: TrainConfig, prompt: PromptConfig, checkpoint_dir: Optional[str], train_set: RerankSet,
            dev_set: Optional[RerankSet], overrides: Sequence[str] = (), feature_cache: Optional[os.PathLike] = None,
            progress: bool = True) -> Prepared:
  """Loads the backbone, builds the prompts as the eval does, and the features training reads."""
  scorer = build_scorer(checkpoint_dir, overrides, use_head=False)
  label_ids = prompts.resolve_labels(scorer.tokenizer, prompt.labels or prompts.TEMPLATES[prompt.template].default_labels)
  examples = {"train": make_examples(scorer, train_set, prompt, label_ids)}
  if dev_set is not None:
    examples["dev"] = make_examples(scorer, dev_set, prompt, label_ids)
  if not examples["train"].requests:
    raise data.DataError("the train split has no queries with candidates")
  prep = Prepared(scorer, tuple(label_ids), cfg.head_config(label_ids, scorer.config.model.hidden_size), examples,
                  {s: ex.grid() for s, ex in examples.items()})
  if cfg.train_backbone:
    prep.geometry = {s: packed_geometry(scorer, ex) for s, ex in examples.items()}
    prep.match_targets = cfg.match_loss_weight > 0
  else:
    prep.feats = load_or_extract(scorer, examples, feature_cache, cfg.algorithm, progress)
    prep.feature_seconds = sum(f.seconds for f in prep.feats.values())
    prep.cached = all(f.cached for f in prep.feats.values())
  return prep


def init_train_state(cfg: TrainConfig, prep: Prepared, optimizer: optax.GradientTransformation) -> dict[str, Any]:
  """Head params (and the backbone's when it trains), optimizer state, step and data position."""
  init_key, data_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
  params = {"head": heads.init_head(prep.head_cfg, init_key)}
  if cfg.train_backbone:
    params["backbone"] = jax.tree_util.tree_map(jnp.asarray, prep.scorer.runner.params)
  if cfg.match_loss_weight:
    probe = lambda: {"w": jnp.zeros((prep.scorer.config.model.hidden_size,), jnp.float32),
                     "b": jnp.zeros((), jnp.float32)}
    params["match_probe"] = {"token": probe(), **({"coverage": probe()} if cfg.coverage_on == "probe" else {})}
  # Committed to one device, like the arrays every step returns (else step 2 compiles again).
  params = jax.device_put(params, jax.local_devices()[0])
  return {"params": params, "opt_state": jax.device_put(optimizer.init(params), jax.local_devices()[0]),
          "step": np.int32(0), "epoch": np.int32(0), "index": np.int32(0), "rng": np.asarray(data_key)}


def checkpoint_manager(workdir: pathlib.Path, cfg: TrainConfig) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(workdir / "checkpoints", options=ocp.CheckpointManagerOptions(
      max_to_keep=cfg.keep_checkpoints, create=True))


def save_state(manager: ocp.CheckpointManager, step: int, state: dict, fingerprint: dict) -> None:
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), run=ocp.args.JsonSave(fingerprint)))


def restore_state(manager: ocp.CheckpointManager, state: dict, fingerprint: dict,
                  workdir: pathlib.Path) -> tuple[dict, Optional[int]]:
  """The latest checkpoint's state (and its step), or `state` unchanged (and None) in a fresh workdir.

  Refuses a workdir whose run had another config or data."""
  resume_step = manager.latest_step()
  if resume_step is None:
    return state, None
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
  return state, resume_step


def backbone_decoder(cfg: TrainConfig, scorer: Scorer) -> Optional[Decoder]:
  """The scorer's decoder with each scanned layer rematerialized, when the backbone trains."""
  if not cfg.train_backbone:
    return None
  runner = scorer.runner
  return Decoder(scorer.config.model, runner.decoder(runner.default_kernel).attend, dtype=runner.dtype,
                 param_dtype=runner.dtype, precision=runner.precision, remat=True)


def make_train_step(cfg: TrainConfig, head_cfg: heads.HeadConfig, optimizer: optax.GradientTransformation,
                    decoder: Optional[Decoder], labels_K: jax.Array):
  """The jitted step: (params, opt_state, batch) -> (params, opt_state, loss, grad norm, parts); `parts`
  holds the ranking and token-match losses when match_loss_weight > 0 (else it is empty)."""

  def loss_fn(params, batch):
    parts = {}
    if cfg.match_loss_weight:
      h, lp, residual_LxBxTxD = packed_features(decoder, params["backbone"], batch["packed"], batch["gather"],
                                                labels_K, residuals=True)
      # Probed halfway up the stack, so the layers above can gather the matches at the score position.
      middle = residual_LxBxTxD[(residual_LxBxTxD.shape[0] - 1) // 2]
      parts["match_loss"] = probe_bce(params["match_probe"]["token"], middle, batch["match"], batch["match_mask"])
    elif decoder is not None:
      h, lp = packed_features(decoder, params["backbone"], batch["packed"], batch["gather"], labels_K)
    else:
      h, lp = batch["hidden"], batch["logprobs"]
    logits = jnp.where(batch["mask"], heads.relevance(heads.apply_head(head_cfg, params["head"], h, lp)), MASK_LOGIT)
    if cfg.match_loss_weight:
      coverage = logits if cfg.coverage_on == "score" else probe_logits(params["match_probe"]["coverage"], h)
      parts["coverage_loss"] = batch_loss("pairwise", coverage, batch["coverage"], batch["mask"])
    loss = batch_loss(cfg.loss, logits, batch["grades"], batch["mask"])
    if parts:
      parts["rank_loss"] = loss
      loss = loss + cfg.match_loss_weight * (parts["match_loss"] + parts["coverage_loss"])
    return loss, parts

  @jax.jit
  def train_step(params, opt_state, batch):
    (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, optax.global_norm(grads), parts

  return train_step


def batch_indices(state: dict, n_train: int, batch_size: int) -> np.ndarray:
  """The next `batch_size` train queries of the epoch's order (drawn from PRNG(seed, epoch)); -1 pads."""
  epoch, index = int(state["epoch"]), int(state["index"])
  order = np.asarray(jax.random.permutation(jax.random.fold_in(jnp.asarray(state["rng"]), epoch), n_train))
  idx = order[index:index + batch_size]
  return np.concatenate([idx, np.full(batch_size - len(idx), -1, idx.dtype)])


def make_batch(prep: Prepared, idx: np.ndarray) -> tuple[dict, int]:
  """The step's inputs for train queries `idx` (-1: padding) and the number of real items in it."""
  valid = idx >= 0
  safe = np.where(valid, idx, 0)
  grades, mask = prep.grids["train"]
  batch = {"grades": grades[safe], "mask": mask[safe] & valid[:, None]}
  if prep.geometry is not None:
    plan = plan_packed([prep.examples["train"].requests[i] if i >= 0 else None for i in idx], prep.geometry["train"],
                       match_targets=prep.match_targets)
    batch.update(packed=plan.batch, gather=plan.gather_QxN[:, :grades.shape[1]])
    if prep.match_targets:
      batch.update(match=plan.match_BxT, match_mask=plan.match_mask_BxT,
                   coverage=plan.coverage_QxN[:, :grades.shape[1]])
  else:
    batch.update(hidden=prep.feats["train"].hidden[safe], logprobs=prep.feats["train"].logprobs[safe])
  return batch, int(batch["mask"].sum())


def dev_metrics(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, decoder: Optional[Decoder],
                labels_K: jax.Array, params) -> Optional[dict[str, float]]:
  """Dev metrics of the current params (None without a dev split)."""
  if "dev" not in prep.examples:
    return None
  if decoder is not None:
    h, lp = features.backbone_features(decoder, params["backbone"], prep.examples["dev"], prep.geometry["dev"],
                                       labels_K, cfg.batch_size)
  else:
    h, lp = prep.feats["dev"].hidden, prep.feats["dev"].logprobs
  return evaluate_split(prep.head_cfg, params["head"], h, lp, prep.examples["dev"], prompt)


@dataclasses.dataclass
class _Timing:
  eval_seconds: float = 0.0
  step_seconds: float = 0.0
  step_items: int = 0
  first_step_seconds: Optional[float] = None


def _log_dev(log: MetricsLog, step: int, evaluate, params, timing: _Timing) -> None:
  t = time.perf_counter()
  m = evaluate(params)
  timing.eval_seconds += time.perf_counter() - t
  if m is not None:
    log.write("eval", step, {"split": "dev", **m})


def train_loop(cfg: TrainConfig, prep: Prepared, state: dict, train_step, schedule, total_steps: int,
               evaluate, log: MetricsLog, save, progress: bool, step_delay_s: float) -> tuple[dict, _Timing]:
  """Steps from the state's step to `total_steps`: logs, dev evals and checkpoints on their cadence."""
  timing = _Timing()
  step = int(state["step"])
  if step == 0:
    _log_dev(log, 0, evaluate, state["params"], timing)
  while step < total_steps:
    batch, items = make_batch(prep, batch_indices(state, prep.num_train, cfg.batch_size))
    t = time.perf_counter()
    new_params, new_opt, loss, gnorm, parts = train_step(state["params"], state["opt_state"], batch)
    loss = float(loss)  # waits for the step
    dt = time.perf_counter() - t
    if timing.first_step_seconds is None:
      timing.first_step_seconds = dt
    else:
      timing.step_seconds, timing.step_items = timing.step_seconds + dt, timing.step_items + items
    epoch, index = int(state["epoch"]), int(state["index"]) + cfg.batch_size
    if index >= prep.num_train:
      epoch, index = epoch + 1, 0
    step += 1
    state = {"params": new_params, "opt_state": new_opt, "step": np.int32(step), "epoch": np.int32(epoch),
             "index": np.int32(index), "rng": state["rng"]}
    if step % cfg.log_every == 0 or step == total_steps:
      log.write("train", step, {"epoch": epoch, "loss": loss, "grad_norm": float(gnorm),
                                "learning_rate": float(schedule(step - 1)),
                                **{k: float(v) for k, v in sorted(parts.items())}})
    if (cfg.eval_every and step % cfg.eval_every == 0) or step == total_steps:
      _log_dev(log, step, evaluate, state["params"], timing)
    if (cfg.save_every and step % cfg.save_every == 0) or step == total_steps:
      save(step, state)
    if progress and step % max(1, total_steps // 10) == 0:
      logging.info("train: step %d/%d loss %.4f", step, total_steps, loss)
    if step_delay_s:
      time.sleep(step_delay_s)
  return state, timing


def train(cfg: TrainConfig, prompt: PromptConfig, checkpoint_dir: Optional[str], train_set: RerankSet,
          dev_set: Optional[RerankSet], workdir: os.PathLike, *, overrides: Sequence[str] = (),
          feature_cache: Optional[os.PathLike] = None, export_dir: Optional[os.PathLike] = None,
          overwrite: bool = False, progress: bool = True, step_delay_s: float = 0.0) -> dict[str, Any]:
  """Trains (or resumes) a score head; writes checkpoints, metrics.jsonl and summary.json in
  `workdir` and the exported checkpoint in `export_dir`. Returns the summary."""
  cfg.validate()
  if cfg.lora_rank:  # adapters train through maxscore/training (the shared trainer), not this loop
    raise TrainError(f"lora_rank={cfg.lora_rank}: this head trainer does not train LoRA adapters; use lora_rank=0")
  prompt.validate()
  wall_start = time.perf_counter()
  workdir = pathlib.Path(workdir).resolve()
  _prepare_outputs(workdir, export_dir, overwrite, checkpoint_dir, feature_cache,
                   [*data.input_paths(train_set), *(data.input_paths(dev_set) if dev_set is not None else ())])

  prep = prepare(cfg, prompt, checkpoint_dir, train_set, dev_set, overrides, feature_cache, progress)
  steps_per_epoch = math.ceil(prep.num_train / cfg.batch_size)
  total_steps = cfg.num_steps or cfg.num_epochs * steps_per_epoch
  optimizer, schedule = make_optimizer(cfg, total_steps)
  fingerprint = _run_fingerprint(cfg, prompt, prep.scorer, prep.examples)
  manager = checkpoint_manager(workdir, cfg)
  state, resume_step = restore_state(manager, init_train_state(cfg, prep, optimizer), fingerprint, workdir)
  log = MetricsLog(workdir, resume_step)

  decoder = backbone_decoder(cfg, prep.scorer)
  labels_K = jnp.asarray(prep.label_ids, jnp.int32)
  train_step = make_train_step(cfg, prep.head_cfg, optimizer, decoder, labels_K)
  evaluate = lambda params: dev_metrics(cfg, prompt, prep, decoder, labels_K, params)
  save = lambda step, state: save_state(manager, step, state, fingerprint)
  state, timing = train_loop(cfg, prep, state, train_step, schedule, total_steps, evaluate, log, save, progress,
                             step_delay_s)
  manager.wait_until_finished()
  step = int(state["step"])
  if step == total_steps and manager.latest_step() != step:  # resumed at the end: nothing ran
    save(step, state)
    manager.wait_until_finished()
  log.close()

  summary = _summary(cfg, prompt, prep, workdir, log, step, steps_per_epoch, resume_step, state["params"], timing,
                     time.perf_counter() - wall_start)
  previous = finished_run_summary(workdir, resume_step)
  if previous and previous.get("throughput"):
    summary["throughput"] = {**previous["throughput"], "wall_seconds": summary["throughput"]["wall_seconds"] +
                             (previous["throughput"].get("wall_seconds") or 0.0)}
  if export_dir:
    summary["export_dir"] = export(cfg, prep, summary, state["params"], export_dir, workdir, overwrite)
  safety.atomic_write_text(workdir / "summary.json", json.dumps(summary, indent=2) + "\n")
  return summary


def finished_run_summary(workdir: os.PathLike, resume_step: Optional[int]) -> Optional[dict]:
  """The summary.json of the process that finished this run, when this process resumed at its last step
  (a rerun over a finished run, as a restarted build does): nothing trained now, so the timing measured
  then stands. None otherwise."""
  path = pathlib.Path(workdir) / "summary.json"
  if resume_step is None or not path.is_file():
    return None
  try:
    previous = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  return previous if isinstance(previous, dict) and previous.get("steps") == resume_step else None


def _summary(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, workdir: pathlib.Path, log: MetricsLog,
             step: int, steps_per_epoch: int, resume_step: Optional[int], final, timing: _Timing,
             wall: float) -> dict[str, Any]:
  evals = [r for r in log.records if r["kind"] == "eval"]
  examples = prep.examples
  return {
      "workdir": str(workdir),
      "checkpoint_dir": prep.scorer.config.runtime.checkpoint_dir,
      "head": prep.head_cfg.to_dict(),
      "train_config": dataclasses.asdict(cfg),
      "prompt": json.loads(json.dumps(dataclasses.asdict(prompt))),
      "label_ids": list(prep.label_ids),
      "train_queries": prep.num_train,
      "train_items": int(prep.grids["train"][1].sum()),
      "dev_queries": len(examples["dev"].requests) if "dev" in examples else 0,
      "steps": step,
      "steps_per_epoch": steps_per_epoch,
      "resumed_from_step": resume_step,
      "final_train_loss": next((r["loss"] for r in reversed(log.records) if r["kind"] == "train"), None),
      "dev_metrics_initial": next((_metric_values(r) for r in evals if r["step"] == 0), None),
      "dev_metrics_final": _metric_values(evals[-1]) if evals else None,
      "params_sha256": _params_digest(final["head"]),
      "throughput": _throughput(prep.feats, prep.feature_seconds, prep.cached, examples, timing.step_seconds,
                                timing.step_items, timing.first_step_seconds, timing.eval_seconds, wall),
  }


def export(cfg: TrainConfig, prep: Prepared, summary: dict[str, Any], final, export_dir: os.PathLike,
           workdir: pathlib.Path, overwrite: bool) -> str:
  """The base checkpoint with the trained head (and backbone, when it trained) in `export_dir`; an
  existing export is replaced with `overwrite`, or when this workdir's earlier run wrote it."""
  info = {k: summary[k] for k in ("train_config", "prompt", "label_ids", "train_queries", "steps",
                                  "dev_metrics_initial", "dev_metrics_final")}
  # "." when the head was written into its own base checkpoint (paths of this machine mean
  # nothing inside a checkpoint that is copied elsewhere).
  same = pathlib.Path(export_dir).resolve() == pathlib.Path(summary["checkpoint_dir"]).resolve()
  info["base_checkpoint"] = "." if same else summary["checkpoint_dir"]
  backbone = jax.device_get(final["backbone"]) if cfg.train_backbone else None
  again = safety.exported_by(export_dir, workdir)
  return str(heads.export_checkpoint(prep.scorer.config.runtime.checkpoint_dir, export_dir, prep.head_cfg,
                                     jax.device_get(final["head"]), info, backbone, overwrite=overwrite or again,
                                     workdir=str(workdir)))


def _prepare_outputs(workdir: pathlib.Path, export_dir: Optional[os.PathLike], overwrite: bool,
                     checkpoint_dir: Optional[str], feature_cache: Optional[os.PathLike], data_paths) -> None:
  """Refuses, before any work, outputs that are inputs or foreign directories; then (re)creates the
  workdir (--overwrite removes it only when maxscore wrote it)."""
  random_init = checkpoint_dir is not None and str(checkpoint_dir).lower() == "none"
  base = None if random_init else (checkpoint_dir or data.DEFAULT_CHECKPOINT)  # None: the embedded default
  if export_dir and base is None:
    raise TrainError(f"--export_dir={export_dir} copies the base checkpoint (config, tokenizer) with the trained "
                     f"weights, and --checkpoint_dir=none (a random-init model) has none; give --checkpoint_dir "
                     f"or leave out --export_dir")
  inputs = [i for i in (base, feature_cache, *data_paths) if i is not None]
  safety.refuse_overlap([workdir], inputs, "--workdir")
  if export_dir and (base is None or safety.resolve(export_dir) != safety.resolve(base)):  # else: head/ into base
    safety.check_export_dir(export_dir, workdir, inputs, overwrite)
  if overwrite:
    safety.remove_owned(workdir, "--workdir")
  safety.prepare_output_dir(workdir, "head_training", inputs, "--workdir")


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
