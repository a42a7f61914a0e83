"""The reranker's model side of a training step: the initial params and their shardings, which of them train,
the loss, a step's batch, and the jitted step itself. What differs between a frozen and a training backbone is
the run's feature source's (sources.py: `prep.source`).

    prog = program(cfg, prep.head_cfg, prep.source, mesh, total_steps)   # params, shardings, optimizer
    started = trainer.start(workdir, keep, prog.params, prog.param_shardings, prog.optimizer, key, mesh, ...)
    step = jit_step(cfg, prep.head_cfg, prep.source, mesh, prog, started.shardings, labels_K)

The training fit report (maxscore/bench/train_compile.py) builds the same program from a source on an abstract
scorer (ShapeDtypeStruct params) and lowers the same step, so the memory it reports is the trainer's.
"""

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from layers import sharding as sharding_lib
from maxscore.heads import head
from maxscore.training import partition, trainer
from maxscore.training.optimizer import make_optimizer
from maxscore.training.reranker import batches
from maxscore.training.reranker.batches import Batch
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.losses import MASK_LOGIT, batch_loss, lce_distill_mix
from maxscore.training.reranker.prepare import Prepared
from maxscore.training.reranker.sources import Source


def init_params(cfg: TrainConfig, head_cfg: head.HeadConfig, source: Source) -> dict[str, Any]:
  """The head's params, and the source's (a training backbone's, with its adapters and probes). From an abstract
  scorer (ShapeDtypeStruct params), their ShapeDtypeStructs: nothing is allocated."""
  init_key, _ = jax.random.split(jax.random.PRNGKey(cfg.seed))
  init = lambda base: {**source.init_params(init_key, base), "head": head.init_head(head_cfg, init_key)}
  return jax.eval_shape(init, source.base) if source.abstract else init(source.base)


def param_shardings(params: dict[str, Any], source: Source, mesh: Mesh) -> dict[str, Any]:
  """The source's params by its own rules (a backbone by the logical-axis rules), the head and probes replicated."""
  rep = partition.replicated(mesh)
  return {**jax.tree_util.tree_map(lambda _: rep, params), **source.param_shardings(params, mesh)}


def make_loss_fn(cfg: TrainConfig, head_cfg: head.HeadConfig, source: Source, mesh: Optional[Mesh],
                 labels_K: jax.Array):
  """loss_fn(params, batch, rng) -> (loss, parts); `parts` holds the ranking and token-match losses when
  match_loss_weight > 0 (else it is empty)."""
  step_features = source.step_features(mesh, labels_K)
  kind = cfg.loss.kind

  def loss_fn(params, batch: Batch, rng):
    del rng  # no dropout
    h, lp, parts = step_features(params, batch)
    label_lp = head.apply_head(head_cfg, params["head"], h, lp)
    if kind == "first_listwise":  # the identifier log-probs at each window's one item
      return batch_loss("first_listwise", label_lp[:, 0, :], batch.id_grades, batch.id_mask), parts
    logits = jnp.where(batch.mask, head.relevance(label_lp), MASK_LOGIT)
    if kind == "distill":
      loss = batch_loss("distill", logits, batch.teacher, batch.mask, temperature=cfg.loss.distill_temperature)
    elif cfg.loss.distill_weight:
      loss = lce_distill_mix(logits, batch.grades, batch.teacher, batch.mask, cfg.loss.distill_weight,
                             cfg.loss.distill_temperature)
    else:
      loss = batch_loss(kind, logits, batch.grades, batch.mask)
    return source.aux_losses(params, batch, loss, logits, h, parts)

  return loss_fn


def make_batch(prep: Prepared, idx: np.ndarray, step: int = 0, cfg: Optional[TrainConfig] = None
               ) -> tuple[Batch, int]:
  """The step's inputs for train queries `idx` (-1: padding) and the number of real items in it: the targets,
  and the inputs of the run's feature source. With cfg.group_size, each query's mask keeps one positive and
  group_size - 1 negatives drawn for this step."""
  valid = idx >= 0
  safe = np.where(valid, idx, 0)
  grades, mask = prep.grids["train"]
  targets = {"grades": grades[safe], "mask": mask[safe] & valid[:, None]}
  if cfg is not None and cfg.group_size:
    targets["mask"] = batches.draw_group_mask(targets["grades"], targets["mask"], idx, step, cfg.group_size,
                                              cfg.seed)
  if prep.teacher is not None:
    targets["teacher"] = prep.teacher[safe]
  if prep.window_grades is not None:
    id_grades, id_mask = prep.window_grades["train"]
    targets.update(id_grades=id_grades[safe], id_mask=id_mask[safe] & valid[:, None])
  batch = prep.source.make_batch(prep.examples["train"], "train", idx, targets)
  return batch, int(batch.mask.sum())


@dataclasses.dataclass(frozen=True)
class Program:
  """What a run trains: the initial params (arrays, or ShapeDtypeStructs from an abstract scorer) and their
  shardings, which of them train (None: all), and the optimizer over those with its learning-rate schedule."""
  params: dict[str, Any]
  param_shardings: dict[str, Any]
  trainable: Optional[Any]
  optimizer: optax.GradientTransformation
  schedule: Callable[[int], Any]


def program(cfg: TrainConfig, head_cfg: head.HeadConfig, source: Source, mesh: Mesh, total_steps: int) -> Program:
  """The run's params, shardings and optimizer over `total_steps` (the trainer starts or resumes on them)."""
  params = init_params(cfg, head_cfg, source)
  trainable = source.trainable(params)
  optimizer, schedule = make_optimizer(cfg, total_steps, trainable)
  return Program(params, param_shardings(params, source, mesh), trainable, optimizer, schedule)


def jit_step(cfg: TrainConfig, head_cfg: head.HeadConfig, source: Source, mesh: Mesh, prog: Program,
             shardings: Any, labels_K: jax.Array) -> Callable:
  """The trainer's jitted step of this run's loss on `mesh`: `step(state, batch) -> (state, metrics)`, and
  `step.lower(state, batch)`. `shardings` is the state's (trainer.Started.shardings); the batch's activation
  rules are those of one micro-batch (batch_size / grad_accum_steps queries)."""
  loss_fn = make_loss_fn(cfg, head_cfg, source, mesh, labels_K)
  return trainer.jit_train_step(loss_fn, prog.optimizer, shardings, mesh, cfg.grad_accum_steps,
                                sharding_lib.rules_for_batch(cfg.batch_size // cfg.grad_accum_steps, mesh),
                                prog.trainable)
