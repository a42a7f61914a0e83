"""The reranker task of the one trainer (maxscore/training): a score head on a frozen backbone (or, with
train_backbone, the whole model). This module brings the task's data, loss, dev eval and export; the
state, step, optimizer, data order, checkpoints, metrics log and the mesh are the trainer's.

    summary = train(TrainConfig(head="lm_labels", delta="full"), PromptConfig(), "ckpt/", train_set, dev_set,
                    "out/train", export_dir="ckpt-with-head/")

1. Prompts are built exactly as the eval builds them (a `PromptConfig`: template, labels, truncation).
2. Frozen backbone: each query's features (hidden states h and label log-probs lp at the score
   positions) are computed ONCE, without gradients, by the scorer's own fast path and optionally
   cached in an npz (maxscore/training/head_features.py).
3. Each step takes `batch_size` queries in an order drawn per epoch from PRNG(seed, epoch); the
   head maps (h, lp) to label log-probs, `head.relevance` to one ranking logit per item, and the
   loss compares each query's logits with its graded qrels: `listwise` softmax cross-entropy
   against the normalized gains (default), `pairwise` logistic over pairs with different grades,
   or `pointwise` binary cross-entropy (relevant = grade >= 1). Optimizer: clip_by_global_norm
   then AdamW on a warmup + cosine schedule. The state lives on the mesh of the base.yml mesh keys
   (the backbone by the logical-axis rules, the head replicated), the batch split over data x fsdp.
4. Orbax CheckpointManager in `<workdir>/checkpoints`: params, optimizer state, step and data
   position (epoch, index in the epoch's order, PRNG key), every `save_every` steps and at the
   end, the last `keep_checkpoints` kept. A restarted run resumes from the latest: every later
   step, metric and the final params equal an uninterrupted run's bit for bit (float32 on CPU).
   Every process writes its own shards; a checkpoint resumes on another mesh or process count.
5. `<workdir>/metrics.jsonl`: train loss lines and dev-eval lines (`metrics.evaluate` over the
   ranking score eval would compute from the head's scores); lines past the checkpoint a run
   resumes from are dropped first, so the file reads as one uninterrupted run. The same scalars go
   to TensorBoard event files in `<workdir>/tensorboard` (tensorboardX: flax.metrics.tensorboard
   would need tensorflow), which a resumed run rewrites from the kept lines.
6. `export_dir`: a copy of the base checkpoint with the head in head/ (the summary, the checks on the outputs
   and the exports are maxscore/training/reranker_outputs.py).

`train_backbone=True` trains the decoder params together with the head, through the packed
layout (docs/ARCHITECTURE.md section 2) with each scanned layer rematerialized in the backward pass (`remat`;
`compute_dtype`/`param_dtype` for bf16 activations on f32 master weights). With
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
from absl import logging
from jax.sharding import Mesh

from layers import quantization as quant
from layers import sharding as sharding_lib
from layers.decoder import Decoder
from layers.kernels import get_kernel
from layers.kernels.base import training_kernel
from maxscore import config as config_lib
from maxscore.checkpoints import adapters as lora_lib
from maxscore.config import MeshConfig
from maxscore.datasets import data
from maxscore.datasets.data import RerankSet
from maxscore.distributed import mesh as mesh_lib
from maxscore.errors import TrainError
from maxscore.files import identity, safety
from maxscore.heads import head
from maxscore.rerank import metrics
from maxscore.rerank.prompts import SCORE_MODES, PromptConfig
from maxscore.scoring.runner import DTYPES
from maxscore.scoring.scorer import Scorer, finalize_scores
from maxscore.training import checkpoint, first_listwise, groups, partition, trainer
from maxscore.training import head_features as features
from maxscore.training import reranker_outputs as outputs
from maxscore.training.head_features import Examples, packed_features, plan_packed
from maxscore.training.losses import MASK_LOGIT, batch_loss, lce_distill_mix, probe_bce, probe_logits
from maxscore.training.optimizer import make_optimizer
from maxscore.training.reranker_config import LORA_TARGETS, TrainConfig, lora_settings
from maxscore.training.reranker_data import Prepared, prepare
from maxscore.training.selection import Selection

FORMAT_VERSION = 1


def evaluate_split(cfg_head: head.HeadConfig, params, hidden, logprobs, examples: Examples,
                   prompt: PromptConfig, runs: Optional[list] = None) -> dict[str, float]:
  """Metrics of the ranking eval would compute from the head's scores (score_mode of `prompt`); `runs`, when
  given, gets the scores themselves appended ({qid: {docid: score}})."""
  apply_softmax, rank_fn = SCORE_MODES[prompt.score_mode]
  if apply_softmax is None:
    raise ValueError("score_mode=raw_logit needs raw lm_head logits; a score head gives log-probs (use p_first)")
  new_lp = np.asarray(head.jit_apply(cfg_head)(params, hidden, logprobs))
  run = {}
  for i, (qid, docids) in enumerate(zip(examples.qids, examples.docids)):
    scores = np.asarray(rank_fn(finalize_scores(new_lp[i, :len(docids)], apply_softmax)), np.float32)
    run[qid] = {d: float(s) for d, s in zip(docids, scores)}
  if runs is not None:
    runs.append(run)
  per_query = metrics.evaluate(examples.qrels, run, prompt.metrics)
  return metrics.aggregate(per_query) if per_query else {}


# Settings a run's identity names only when they differ from these values: an identity that does not name one
# stands for that setting at its value here (the TrainConfig default).
_IDENTITY_DEFAULTS = {"coverage_on": "probe", "lora_rank": 0, "lora_alpha": 16.0, "lora_targets": LORA_TARGETS,
                      "grad_accum_steps": 1, "compute_dtype": None, "param_dtype": None, "remat": "per_layer",
                      "group_size": 0, "distill_temperature": 1.0, "distill_weight": 0.0, "select_metric": None, "patience": 0,
                      "listwise_window": 20, "listwise_identifiers": "letters", "listwise_passage_tokens": 128,
                      "listwise_window_tokens": 4096, "listwise_chat": True}


def train_identity(cfg: TrainConfig) -> dict:
  """The training settings a resumed run must match."""
  return {k: v for k, v in dataclasses.asdict(cfg).items()
          if not (k in _IDENTITY_DEFAULTS and v == _IDENTITY_DEFAULTS[k])}


def _run_fingerprint(cfg: TrainConfig, prompt: PromptConfig, scorer: Scorer, examples: dict[str, Examples]) -> dict:
  """What the trained head depends on (maxscore/files/identity.py): a resumed run must match it."""
  return {"format_version": FORMAT_VERSION, "train": train_identity(cfg),
          "prompt": json.loads(json.dumps(dataclasses.asdict(prompt))), "scorer": identity.scorer_identity(scorer),
          "data": {k: v.digest() for k, v in sorted(examples.items())}}


def backbone_decoder(cfg: TrainConfig, scorer: Scorer, mesh: Optional[Mesh] = None) -> Optional[Decoder]:
  """The scorer's decoder for training, when the backbone trains: its attention kernel run per shard of
  `mesh` (None: unsharded, for the dev eval on a host copy), compute in `compute_dtype` (default the
  scorer's) on params of `param_dtype`, each scanned layer rematerialized unless remat=none."""
  if not cfg.train_backbone:
    return None
  runner = scorer.runner
  kernel, _ = training_kernel(scorer.config.kernel.attention, runner.platform)
  attend = sharding_lib.shard_kernel(get_kernel(kernel, runner.options), mesh)
  dtype = DTYPES[cfg.compute_dtype] if cfg.compute_dtype else runner.dtype
  param_dtype = DTYPES[cfg.param_dtype] if cfg.param_dtype else runner.dtype
  decoder = Decoder(scorer.config.model, attend, dtype=dtype, param_dtype=param_dtype, precision=runner.precision,
                    remat=cfg.remat != "none", quantization=runner.quantization,
                    quantization_group=runner.quantization_group)
  return lora_lib.adapt(decoder, lora_settings(cfg))


def init_params(cfg: TrainConfig, prep: Prepared) -> dict[str, Any]:
  """Head params (and the backbone's when it trains, in param_dtype; the match probes when on)."""
  init_key, _ = jax.random.split(jax.random.PRNGKey(cfg.seed))
  params = {"head": head.init_head(prep.head_cfg, init_key)}
  if cfg.train_backbone:
    # A QLoRA base's int8 weights and their float32 scales keep their dtypes (they stay frozen).
    keeps = lambda path: prep.scorer.runner.quantization != "none" and quant.is_quantized_leaf(path)
    cast = lambda path, x: (jnp.asarray(x, DTYPES[cfg.param_dtype]) if cfg.param_dtype and not keeps(path)
                            else jnp.asarray(x))
    params["backbone"] = jax.tree_util.tree_map_with_path(cast, prep.scorer.runner.params)
    if lora_settings(cfg) is not None:  # adapters in float32 (A random, B zero: step 0 is the base model exactly)
      adapter_key = jax.random.fold_in(init_key, 1)
      params["backbone"] = lora_lib.add_adapters(params["backbone"], lora_lib.init_adapters(
          prep.scorer.config.model, lora_settings(cfg), adapter_key))
  if cfg.match_loss_weight:
    probe = lambda: {"w": jnp.zeros((prep.scorer.config.model.hidden_size,), jnp.float32),
                     "b": jnp.zeros((), jnp.float32)}
    params["match_probe"] = {"token": probe(), **({"coverage": probe()} if cfg.coverage_on == "probe" else {})}
  return params


def param_shardings(cfg: TrainConfig, params: dict[str, Any], prep: Prepared, mesh: Mesh) -> dict[str, Any]:
  """The backbone by the logical-axis rules, the head and probes replicated."""
  rep = partition.replicated(mesh)
  out = jax.tree_util.tree_map(lambda _: rep, params)
  if "backbone" in params:
    out["backbone"] = sharding_lib.model_param_shardings(prep.scorer.config.model, mesh,
                                                         quantization=prep.scorer.runner.quantization,
                                                         quantization_group=prep.scorer.runner.quantization_group)
    if lora_settings(cfg) is not None:
      out["backbone"] = lora_lib.add_adapters(out["backbone"], lora_lib.adapter_shardings(
          prep.scorer.config.model, lora_settings(cfg), mesh))
  return out


def make_loss_fn(cfg: TrainConfig, head_cfg: head.HeadConfig, decoder: Optional[Decoder], labels_K: jax.Array):
  """loss_fn(params, batch, rng) -> (loss, parts); `parts` holds the ranking and token-match losses when
  match_loss_weight > 0 (else it is empty)."""

  def features(backbone, batch, residuals):
    # One packed request per row (row q holds request q): the gather index of its item j is q * N + slot, where
    # q counts from the first row of this (micro-)batch, whichever process built it.
    n = batch["packed"]["score_index"].shape[1]
    gather = jnp.arange(batch["gather"].shape[0])[:, None] * n + batch["gather"] % n
    return packed_features(decoder, backbone, batch["packed"], gather, labels_K, residuals=residuals)
  if cfg.remat == "full":
    features = jax.checkpoint(features, static_argnums=(2,))

  def loss_fn(params, batch, rng):
    del rng  # no dropout
    parts = {}
    if cfg.match_loss_weight:
      h, lp, residual_LxBxTxD = features(params["backbone"], batch, True)
      # Probed halfway up the stack, so the layers above can gather the matches at the score position.
      middle = residual_LxBxTxD[(residual_LxBxTxD.shape[0] - 1) // 2]
      parts["match_loss"] = probe_bce(params["match_probe"]["token"], middle, batch["match"], batch["match_mask"])
    elif decoder is not None:
      h, lp = features(params["backbone"], batch, False)
    else:
      h, lp = batch["hidden"], batch["logprobs"]
    if cfg.loss == "first_listwise":  # the head's identifier log-probs at each window's one item
      label_lp = head.apply_head(head_cfg, params["head"], h, lp)[:, 0, :]
      return batch_loss("first_listwise", label_lp, batch["id_grades"], batch["id_mask"]), parts
    logits = jnp.where(batch["mask"], head.relevance(head.apply_head(head_cfg, params["head"], h, lp)), MASK_LOGIT)
    if cfg.match_loss_weight:
      coverage = logits if cfg.coverage_on == "score" else probe_logits(params["match_probe"]["coverage"], h)
      parts["coverage_loss"] = batch_loss("pairwise", coverage, batch["coverage"], batch["mask"])
    if cfg.loss == "distill":
      loss = batch_loss("distill", logits, batch["teacher"], batch["mask"], temperature=cfg.distill_temperature)
    elif cfg.distill_weight:
      loss = lce_distill_mix(logits, batch["grades"], batch["teacher"], batch["mask"], cfg.distill_weight,
                             cfg.distill_temperature)
    else:
      loss = batch_loss(cfg.loss, logits, batch["grades"], batch["mask"])
    if parts:
      parts["rank_loss"] = loss
      loss = loss + cfg.match_loss_weight * (parts["match_loss"] + parts["coverage_loss"])
    return loss, parts

  return loss_fn


def make_batch(prep: Prepared, idx: np.ndarray, step: int = 0, cfg: Optional[TrainConfig] = None
               ) -> tuple[dict, int]:
  """The step's inputs for train queries `idx` (-1: padding) and the number of real items in it. With
  cfg.group_size, each query's mask keeps one positive and group_size - 1 negatives drawn for this step."""
  valid = idx >= 0
  safe = np.where(valid, idx, 0)
  grades, mask = prep.grids["train"]
  batch = {"grades": grades[safe], "mask": mask[safe] & valid[:, None]}
  if cfg is not None and cfg.group_size:
    batch["mask"] = groups.draw_group_mask(batch["grades"], batch["mask"], idx, step, cfg.group_size, cfg.seed)
  if prep.teacher is not None:
    batch["teacher"] = prep.teacher[safe]
  if prep.window_grades is not None:
    id_grades, id_mask = prep.window_grades["train"]
    batch.update(id_grades=id_grades[safe], id_mask=id_mask[safe] & valid[:, None])
  if prep.geometry is not None:
    reqs = [prep.examples["train"].requests[i] if i >= 0 else None for i in idx]
    if prep.group_rows:  # only the drawn items are packed
      plan = plan_packed(reqs, prep.geometry["train"], columns=[np.nonzero(m)[0] for m in batch["mask"]],
                         num_columns=grades.shape[1])
    else:
      plan = plan_packed(reqs, prep.geometry["train"], match_targets=prep.match_targets)
    batch.update(packed=plan.batch, gather=plan.gather_QxN[:, :grades.shape[1]])
    if prep.match_targets:
      batch.update(match=plan.match_BxT, match_mask=plan.match_mask_BxT,
                   coverage=plan.coverage_QxN[:, :grades.shape[1]])
  else:
    batch.update(hidden=prep.feats["train"].hidden[safe], logprobs=prep.feats["train"].logprobs[safe])
  return batch, int(batch["mask"].sum())


def dev_metrics(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, decoder: Optional[Decoder],
                labels_K: jax.Array, params, runs: Optional[list] = None) -> Optional[dict[str, float]]:
  """Dev metrics of the current params (None without a dev split); every process computes them. `runs`, when
  given, gets the dev scores appended (pointwise losses only)."""
  if "dev" not in prep.examples:
    return None
  params = partition.host_copy(params)
  if decoder is not None:
    h, lp = features.backbone_features(decoder, params["backbone"], prep.examples["dev"], prep.geometry["dev"],
                                       labels_K, cfg.batch_size)
  else:
    h, lp = prep.feats["dev"].hidden, prep.feats["dev"].logprobs
  if cfg.loss == "first_listwise":  # each dev window ordered by its identifiers' scores
    label_lp = np.asarray(head.jit_apply(prep.head_cfg)(params["head"], h, lp))[:, 0, :]
    return {"split": "dev", **first_listwise.evaluate_windows(label_lp, prep.examples["dev"], prompt.metrics)}
  return {"split": "dev", **evaluate_split(prep.head_cfg, params["head"], h, lp, prep.examples["dev"], prompt, runs)}


def _mesh_config(overrides: Sequence[str]) -> MeshConfig:
  """The mesh section of configs/base.yml with the mesh keys of `overrides` (the scorer reads the same)."""
  keys = {f.name for f in dataclasses.fields(MeshConfig)}
  return config_lib.load_config({k: v for k, v in map(config_lib.parse_override, overrides) if k in keys}).mesh


def _trainable(cfg: TrainConfig, params: dict[str, Any]) -> Optional[Any]:
  """The boolean trainable pytree the optimizer freezes the rest by (None: everything trains). With LoRA it
  is the head and probes plus the adapter leaves of the backbone (maxscore/checkpoints/adapters.py's trainable_mask,
  wired here together with the adapted decoder and the adapters' params and shardings)."""
  if lora_settings(cfg) is None:
    return None
  mask = jax.tree_util.tree_map(lambda _: True, params)
  mask["backbone"] = lora_lib.trainable_mask(params["backbone"])
  return mask


def train(cfg: TrainConfig, prompt: PromptConfig, checkpoint_dir: Optional[str], train_set: RerankSet,
          dev_set: Optional[RerankSet], workdir: os.PathLike, *, overrides: Sequence[str] = (),
          feature_cache: Optional[os.PathLike] = None, export_dir: Optional[os.PathLike] = None,
          overwrite: bool = False, progress: bool = True,
          adapters_dir: Optional[os.PathLike] = None) -> dict[str, Any]:
  """Trains (or resumes) a score head (and the backbone with train_backbone) on the config mesh.

  Writes checkpoints, metrics.jsonl and summary.json in `workdir` and, on process 0, the exported checkpoint
  in `export_dir`. A workdir holding this run's checkpoints resumes from the latest.

  Args:
    cfg: the head, loss, optimizer and loop settings.
    prompt: how prompts are built and which dev metrics are computed, as the eval does.
    checkpoint_dir: the backbone checkpoint; None = the embedded default, "none" = a random-init model.
    train_set: the queries, candidates and qrels to train on.
    dev_set: the split evaluated every `cfg.eval_every` steps; None = no dev eval.
    workdir: the run's directory, created, resumed, or (with `overwrite`) replaced.
    overrides: configs/base.yml `key=value` settings for the scorer and the mesh.
    feature_cache: an npz of the frozen features, reused when it matches (frozen backbone only).
    export_dir: where the base checkpoint with the trained head (and backbone) is written; None = no export.
      With LoRA the backbone there is merged (W + alpha / rank * A @ B).
    adapters_dir: with LoRA, where the adapters and the trained head are written (maxscore/checkpoints/adapters.py's
      layout, which eval_rerank.py --checkpoint_dir=<base> --adapters_dir reads); None = not written.
    overwrite: remove the workdir (and replace export_dir) when maxscore wrote it, instead of resuming.
    progress: log progress lines.

  Returns:
    The summary on process 0 (also <workdir>/summary.json: steps, dev metrics before and after, throughput,
    the attention kernel a training backbone differentiates and why, export_dir); {} on the other processes.

  Raises:
    TrainError: an invalid setting, or a batch the mesh cannot split.
    ResumeError: the workdir holds a run with other settings or data.
  """
  cfg.validate()
  prompt.validate()
  if adapters_dir and lora_settings(cfg) is None:
    raise TrainError(f"--adapters_dir={adapters_dir} writes LoRA adapters: it needs --train_backbone and "
                     f"--lora_rank > 0 (--export_dir writes the trained model as a checkpoint)")
  wall_start = time.perf_counter()
  workdir = pathlib.Path(workdir).resolve()
  mesh = partition.train_mesh(_mesh_config(overrides))
  partition.check_batch(cfg.batch_size, mesh, cfg.grad_accum_steps)
  if jax.process_index() == 0:
    outputs.prepare_outputs(workdir, export_dir, overwrite, checkpoint_dir, feature_cache,
                            [*data.input_paths(train_set), *(data.input_paths(dev_set) if dev_set is not None else ())],
                            adapters_dir)
  mesh_lib.sync("train: workdir ready")

  prep = prepare(cfg, prompt, checkpoint_dir, train_set, dev_set, overrides, feature_cache, progress)
  cfg = dataclasses.replace(cfg, listwise_chat=prep.listwise_chat)  # as decided for the tokenizer: in the identity
  steps_per_epoch = math.ceil(prep.num_train / cfg.batch_size)
  total_steps = cfg.num_steps or cfg.num_epochs * steps_per_epoch
  params = init_params(cfg, prep)
  trainable = _trainable(cfg, params)
  optimizer, schedule = make_optimizer(cfg, total_steps, trainable)
  fingerprint = _run_fingerprint(cfg, prompt, prep.scorer, prep.examples)
  check = lambda: sharding_lib.check_divisible(prep.scorer.config.model, mesh) if cfg.train_backbone else None
  run = trainer.start(workdir, cfg.keep_checkpoints, params, param_shardings(cfg, params, prep, mesh), optimizer,
                      jax.random.split(jax.random.PRNGKey(cfg.seed))[1], mesh, fingerprint, check)

  attention = None
  if cfg.train_backbone:  # a frozen backbone's features come from the scorer's forward kernel
    kernel, reason = training_kernel(prep.scorer.config.kernel.attention, prep.scorer.runner.platform)
    attention = dict(kernel=kernel, reason=reason)
    logging.info("train: attention %s (%s)", kernel, reason)
  decoder = backbone_decoder(cfg, prep.scorer)
  labels_K = jnp.asarray(prep.label_ids, jnp.int32)
  step_fn = trainer.jit_train_step(make_loss_fn(cfg, prep.head_cfg, backbone_decoder(cfg, prep.scorer, mesh),
                                                labels_K), optimizer, run.shardings, mesh, cfg.grad_accum_steps,
                                   sharding_lib.rules_for_batch(cfg.batch_size // cfg.grad_accum_steps, mesh),
                                   trainable)
  save = lambda step, state: checkpoint.save(run.manager, step, state, fingerprint)
  settings = trainer.LoopSettings(total_steps, cfg.batch_size, prep.num_train, cfg.log_every, cfg.eval_every,
                                  cfg.save_every, max(1, total_steps // 10), "train", progress)
  mesh_lib.sync("train: metrics log kept")  # selection reads the kept evaluations
  selection = (Selection.start(cfg.select_metric, cfg.patience, workdir, run.resume_step) if cfg.select_metric
               else None)

  def evaluate(params, step):
    runs = []
    values = dev_metrics(cfg, prompt, prep, decoder, labels_K, params, runs)
    if runs and jax.process_index() == 0:  # each evaluation's dev scores, for the export of the step kept
      outputs.write_dev_run(workdir, step, runs[0])
    if selection is not None:
      selection.observe(step, values, params)
    return values
  hooks = trainer.Hooks(lambda idx, step: make_batch(prep, idx, step, cfg),
                        trainer.placer(run.shardings, mesh, cfg.batch_size), evaluate, save, run.log, schedule,
                        partition.local_rows(cfg.batch_size, mesh),
                        selection.should_stop if selection is not None else None)
  with trainer.reports_interrupt(run.manager, workdir):
    state, timing = trainer.loop(settings, run.state, step_fn, hooks)
  trainer.finish(run.manager, state, save, total_steps)
  run.log.close()
  final = partition.host_copy(state.params)
  if jax.process_index() != 0:
    return {}
  step = int(state.step)
  summary = outputs.summary(cfg, prompt, prep, workdir, run.log, step, steps_per_epoch, run.resume_step, final,
                            timing, time.perf_counter() - wall_start)
  summary["attention"] = attention
  outputs.carry_throughput(summary, trainer.finished_run_summary(workdir, run.resume_step))
  if selection is not None:  # the export is the best evaluation's params, not the last step's
    summary["selection"] = selection.report()
    summary["dev_metrics_best"] = next(outputs.metric_values(r) for r in run.log.records
                                       if r["kind"] == "eval" and r["step"] == selection.best_step)
    final = selection.best_params()
    logging.info("train: exporting step %d (%s %.4f): %s", selection.best_step, selection.metric,
                 selection.best_value, selection.report()["reason"])
  if export_dir:
    summary["export_dir"] = outputs.export(cfg, prep, summary, final, export_dir, workdir, overwrite,
                                           lora_settings(cfg))
  if adapters_dir:
    summary["adapters_dir"] = outputs.export_adapters(prep, summary, final, adapters_dir, workdir, overwrite,
                                                      lora_settings(cfg), selection.best_step if selection else step)
  safety.atomic_write_text(workdir / "summary.json", json.dumps(summary, indent=2) + "\n")
  return summary
