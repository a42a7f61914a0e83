"""The reranker's model side of a training step: the backbone's decoder when it trains, the initial params and
their shardings, which of them train, the loss, a step's batch, and the jitted step itself.

    prog = program(cfg, prep.head_cfg, scorer, mesh, total_steps)   # params, shardings, optimizer
    started = trainer.start(workdir, keep, prog.params, prog.param_shardings, prog.optimizer, key, mesh, ...)
    step = jit_step(cfg, prep.head_cfg, scorer, mesh, prog, started.shardings, labels_K)

The training fit report (maxscore/bench/train_compile.py) builds the same program from an abstract scorer
(ShapeDtypeStruct params) and lowers the same step, so the memory it reports is the trainer's.
"""

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from layers import quantization as quant
from layers import sharding as sharding_lib
from layers.decoder import Decoder
from layers.kernels import get_kernel
from layers.kernels.base import training_kernel
from maxscore.checkpoints import adapters as lora_lib
from maxscore.heads import head
from maxscore.scoring.runner import DTYPES
from maxscore.scoring.scorer import Scorer
from maxscore.training import partition, trainer
from maxscore.training.reranker import batches
from maxscore.training.reranker.features import match_targets, packed_features, plan_packed
from maxscore.training.reranker.losses import MASK_LOGIT, batch_loss, lce_distill_mix, probe_bce, probe_logits
from maxscore.training.optimizer import make_optimizer
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.prepare import Prepared


def backbone_decoder(cfg: TrainConfig, scorer: Scorer, mesh: Optional[Mesh] = None) -> Optional[Decoder]:
  """The scorer's decoder for training, when the backbone trains: its attention kernel run per shard of
  `mesh` (None: unsharded, for the dev eval on a host copy), compute in `compute_dtype` (default the
  scorer's) on params of `param_dtype`, each scanned layer rematerialized unless remat=none."""
  if not cfg.train_backbone:
    return None
  config = scorer.config
  kernel, _ = training_kernel(config.kernel.attention, scorer.platform)
  attend = sharding_lib.shard_kernel(get_kernel(kernel, config.kernel.options()), mesh)
  dtype = DTYPES[cfg.compute_dtype or config.runtime.dtype]
  param_dtype = DTYPES[cfg.param_dtype or config.runtime.dtype]
  decoder = Decoder(config.model, attend, dtype=dtype, param_dtype=param_dtype,
                    precision=config.runtime.matmul_precision, remat=cfg.remat != "none",
                    quantization=scorer.quantization, quantization_group=scorer.quantization_group)
  return lora_lib.adapt(decoder, cfg.lora)


def init_params(cfg: TrainConfig, head_cfg: head.HeadConfig, scorer: Scorer) -> dict[str, Any]:
  """Head params (and the backbone's when it trains, in param_dtype; the match probes when on). From an abstract
  scorer (ShapeDtypeStruct params), their ShapeDtypeStructs: nothing is allocated."""
  init = lambda base: _init_params(cfg, head_cfg, scorer.config.model, scorer.quantization, base)
  if scorer.abstract:
    return jax.eval_shape(init, scorer.params)
  return init(scorer.params)


def _init_params(cfg: TrainConfig, head_cfg: head.HeadConfig, model_cfg, quantization: str,
                 base: Any) -> dict[str, Any]:
  init_key, _ = jax.random.split(jax.random.PRNGKey(cfg.seed))
  params = {}
  if cfg.train_backbone:
    # A QLoRA base's int8 weights and their float32 scales keep their dtypes (they stay frozen).
    keeps = lambda path: quantization != "none" and quant.is_quantized_leaf(path)
    cast = lambda path, x: (jnp.asarray(x, DTYPES[cfg.param_dtype]) if cfg.param_dtype and not keeps(path)
                            else jnp.asarray(x))
    params["backbone"] = jax.tree_util.tree_map_with_path(cast, base)
    if cfg.lora is not None:  # adapters in float32 (A random, B zero: step 0 is the base model exactly)
      adapter_key = jax.random.fold_in(init_key, 1)
      params["backbone"] = lora_lib.add_adapters(params["backbone"], lora_lib.init_adapters(
          model_cfg, cfg.lora, adapter_key))
  params["head"] = head.init_head(head_cfg, init_key)
  if cfg.match_loss_weight:
    probe = lambda: {"w": jnp.zeros((model_cfg.hidden_size,), jnp.float32),
                     "b": jnp.zeros((), jnp.float32)}
    params["match_probe"] = {"token": probe(), **({"coverage": probe()} if cfg.coverage_on == "probe" else {})}
  return params


def param_shardings(cfg: TrainConfig, params: dict[str, Any], scorer: Scorer, mesh: Mesh) -> dict[str, Any]:
  """The backbone by the logical-axis rules, the head and probes replicated."""
  rep = partition.replicated(mesh)
  out = jax.tree_util.tree_map(lambda _: rep, params)
  if "backbone" in params:
    out["backbone"] = sharding_lib.model_param_shardings(scorer.config.model, mesh,
                                                         quantization=scorer.quantization,
                                                         quantization_group=scorer.quantization_group)
    if cfg.lora is not None:
      out["backbone"] = lora_lib.add_adapters(out["backbone"], lora_lib.adapter_shardings(
          scorer.config.model, cfg.lora, mesh))
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
    label_lp = head.apply_head(head_cfg, params["head"], h, lp)
    if cfg.loss == "first_listwise":  # the identifier log-probs at each window's one item
      return batch_loss("first_listwise", label_lp[:, 0, :], batch["id_grades"], batch["id_mask"]), parts
    logits = jnp.where(batch["mask"], head.relevance(label_lp), MASK_LOGIT)
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
    batch["mask"] = batches.draw_group_mask(batch["grades"], batch["mask"], idx, step, cfg.group_size, cfg.seed)
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
      plan = plan_packed(reqs, prep.geometry["train"])
    batch.update(packed=plan.batch, gather=plan.gather_QxN[:, :grades.shape[1]])
    if prep.match_targets:
      match, candidate, coverage = match_targets(plan, reqs)
      batch.update(match=match, match_mask=candidate, coverage=coverage[:, :grades.shape[1]])
  else:
    batch.update(hidden=prep.feats["train"].hidden[safe], logprobs=prep.feats["train"].logprobs[safe])
  return batch, int(batch["mask"].sum())


def trainable_params(cfg: TrainConfig, params: dict[str, Any]) -> Optional[Any]:
  """The boolean trainable pytree the optimizer freezes the rest by (None: everything trains). With LoRA it
  is the head and probes plus the adapter leaves of the backbone (maxscore/checkpoints/adapters.py's trainable_mask,
  wired here together with the adapted decoder and the adapters' params and shardings)."""
  if cfg.lora is None:
    return None
  mask = jax.tree_util.tree_map(lambda _: True, params)
  mask["backbone"] = lora_lib.trainable_mask(params["backbone"])
  return mask


@dataclasses.dataclass(frozen=True)
class Program:
  """What a run trains: the initial params (arrays, or ShapeDtypeStructs from an abstract scorer) and their
  shardings, which of them train (None: all), and the optimizer over those with its learning-rate schedule."""
  params: dict[str, Any]
  param_shardings: dict[str, Any]
  trainable: Optional[Any]
  optimizer: optax.GradientTransformation
  schedule: Callable[[int], Any]


def program(cfg: TrainConfig, head_cfg: head.HeadConfig, scorer: Scorer, mesh: Mesh, total_steps: int) -> Program:
  """The run's params, shardings and optimizer over `total_steps` (the trainer starts or resumes on them)."""
  params = init_params(cfg, head_cfg, scorer)
  trainable = trainable_params(cfg, params)
  optimizer, schedule = make_optimizer(cfg, total_steps, trainable)
  return Program(params, param_shardings(cfg, params, scorer, mesh), trainable, optimizer, schedule)


def jit_step(cfg: TrainConfig, head_cfg: head.HeadConfig, scorer: Scorer, mesh: Mesh, prog: Program,
             shardings: Any, labels_K: jax.Array) -> Callable:
  """The trainer's jitted step of this run's loss on `mesh`: `step(state, batch) -> (state, metrics)`, and
  `step.lower(state, batch)`. `shardings` is the state's (trainer.Started.shardings); the batch's activation
  rules are those of one micro-batch (batch_size / grad_accum_steps queries)."""
  loss_fn = make_loss_fn(cfg, head_cfg, backbone_decoder(cfg, scorer, mesh), labels_K)
  return trainer.jit_train_step(loss_fn, prog.optimizer, shardings, mesh, cfg.grad_accum_steps,
                                sharding_lib.rules_for_batch(cfg.batch_size // cfg.grad_accum_steps, mesh),
                                prog.trainable)
