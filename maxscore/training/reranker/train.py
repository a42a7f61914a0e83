"""The reranker task of the one trainer (maxscore/training): a score head on a frozen backbone (or the backbone
too: whole, or LoRA adapters). This module brings the task's data, loss, dev eval and export; the
state, step, optimizer, data order, checkpoints, metrics log and the mesh are the trainer's.

    summary = train(TrainConfig.of(head="lm_labels", delta="full"), PromptConfig(), "ckpt/", train_set, dev_set,
                    "out/train", export_dir="ckpt-with-head/")

1. Prompts are built exactly as the eval builds them (a `PromptConfig`: template, labels, truncation).
2. Frozen backbone: each query's features (hidden states h and label log-probs lp at the score
   positions) are computed ONCE, without gradients, by the scorer's own fast path and optionally
   cached in an npz (maxscore/training/reranker/features.py).
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
   and the exports are maxscore/training/reranker/outputs.py).

A training backbone (the run's feature source is then sources.Backbone) trains the decoder params together with
the head, through the packed layout (docs/ARCHITECTURE.md section 2) with each scanned layer rematerialized in the
backward pass (`remat`;
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
from absl import logging
from jax.sharding import Mesh

from maxscore import config as config_lib
from maxscore.config import MeshConfig
from maxscore.datasets import data
from maxscore.datasets.data import RerankSet
from maxscore.distributed import mesh as mesh_lib
from maxscore.errors import TrainError
from maxscore.files import identity, safety
from maxscore.rerank.prompts import PromptConfig
from maxscore.scoring.loading import build_scorer
from maxscore.scoring.scorer import Scorer
from maxscore.training import checkpoint, partition, trainer
from maxscore.training.reranker.features import Examples
from maxscore.training.reranker import evaluation, model, outputs, warm_start
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.prepare import Prepared, prepare
from maxscore.training.reranker.selection import Selection, resolve_metric

FORMAT_VERSION = 1


def train_identity(cfg: TrainConfig) -> dict:
  """The training settings a resumed run must match (TrainConfig.identity)."""
  return cfg.identity()


def _run_fingerprint(cfg: TrainConfig, prompt: PromptConfig, scorer: Scorer, examples: dict[str, Examples]) -> dict:
  """What the trained head depends on (maxscore/files/identity.py): a resumed run must match it."""
  return {"format_version": FORMAT_VERSION, "train": train_identity(cfg),
          "prompt": json.loads(json.dumps(dataclasses.asdict(prompt))), "scorer": identity.scorer_identity(scorer),
          "data": {k: v.digest() for k, v in sorted(examples.items())}}


def _mesh_config(overrides: Sequence[str]) -> MeshConfig:
  """The mesh section of configs/base.yml with the mesh keys of `overrides` (the scorer reads the same)."""
  keys = {f.name for f in dataclasses.fields(MeshConfig)}
  return config_lib.load_config({k: v for k, v in map(config_lib.parse_override, overrides) if k in keys}).mesh


def train(cfg: TrainConfig, prompt: PromptConfig, checkpoint_dir: Optional[str], train_set: RerankSet,
          dev_set: Optional[RerankSet], workdir: os.PathLike, *, overrides: Sequence[str] = (),
          feature_cache: Optional[os.PathLike] = None, export_dir: Optional[os.PathLike] = None,
          overwrite: bool = False, progress: bool = True,
          adapters_dir: Optional[os.PathLike] = None, export_only: bool = False,
          init_from: Optional[os.PathLike] = None) -> dict[str, Any]:
  """Trains (or resumes) a score head (and the backbone, when it trains) on the config mesh.

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
    export_only: no training: the exports of the run the workdir holds (stopped early, by Ctrl-C or a kill),
      as its end would have written them at its last checkpoint: the best dev evaluation up to that step when
      selecting (select_metric), else that checkpoint's params.
    init_from: with LoRA, an earlier run's adapters_dir (or a packaged reranker) whose adapters and head this run
      starts from instead of fresh ones (warm_start.py); the optimizer state starts fresh. In the run's fingerprint.
    overwrite: remove the workdir (and replace export_dir) when maxscore wrote it, instead of resuming.
    progress: log progress lines.

  Returns:
    The summary on process 0 (also <workdir>/summary.json: steps, dev metrics before and after, throughput,
    the attention kernel a training backbone differentiates and why, export_dir); {} on the other processes.

  Raises:
    TrainError: an invalid setting, or a batch the mesh cannot split.
    ResumeError: the workdir holds a run with other settings or data.
  """
  _check_settings(cfg, prompt, dev_set, adapters_dir)
  cfg.check_init_from(init_from)
  wall_start = time.perf_counter()
  workdir = pathlib.Path(workdir).resolve()
  if export_only:  # before the workdir is created or its logs opened: a refusal leaves the stopped run as it was
    _check_exportable(workdir, overwrite)
  mesh = partition.train_mesh(_mesh_config(overrides))
  partition.check_batch(cfg.batch_size, mesh, cfg.grad_accum_steps)
  if jax.process_index() == 0:
    outputs.prepare_outputs(workdir, export_dir, overwrite, checkpoint_dir, feature_cache,
                            [*data.input_paths(train_set), *(data.input_paths(dev_set) if dev_set is not None else ())],
                            adapters_dir)
  mesh_lib.sync("train: workdir ready")
  scorer = build_scorer(checkpoint_dir, overrides, use_head=False)
  prep = prepare(cfg, prompt, scorer, train_set, dev_set, feature_cache, progress)
  cfg = cfg.with_chat(prep.listwise_chat)  # as decided for the tokenizer: in the identity
  warm = warm_start.load(init_from, scorer, cfg.lora, prep.head_cfg) if init_from else None
  run = _start(cfg, prompt, prep, scorer, workdir, mesh, warm)
  if export_only:
    state, timing = _stopped(run, workdir)
  else:
    state, timing = _loop(cfg, prompt, prep, run, mesh, workdir, progress)
  final = partition.host_copy(state.params)
  if jax.process_index() != 0:
    return {}
  step = int(state.step)
  summary = outputs.summary(cfg, prompt, prep, scorer, workdir, run.started.log, step, run.steps_per_epoch,
                            run.started.resume_step, final, timing, time.perf_counter() - wall_start)
  summary["attention"] = prep.source.attention()
  if warm is not None:
    summary["init_from"] = {"dir": warm.directory, **warm.identity}
  outputs.carry_throughput(summary, trainer.finished_run_summary(workdir, run.started.resume_step))
  selection = run.selection
  if selection is not None:  # the export is the best evaluation's params, not the last step's
    final = _select(summary, selection, run.started.log)
  summary.update(outputs.export(cfg, prep, scorer, summary, final, workdir, overwrite, export_dir, adapters_dir,
                                selection.best_step if selection else step))
  safety.atomic_write_text(workdir / "summary.json", json.dumps(summary, indent=2) + "\n")
  return summary


def _check_settings(cfg: TrainConfig, prompt: PromptConfig, dev_set: Optional[RerankSet],
                    adapters_dir: Optional[os.PathLike]) -> None:
  """Refuses, before any work, invalid settings and ones the run's other inputs cannot serve."""
  cfg.validate()
  prompt.validate()
  if cfg.select_metric:
    resolve_metric(cfg.select_metric, prompt.metrics, dev_set is not None)
  cfg.check_adapters_dir(adapters_dir)


@dataclasses.dataclass
class _Run:
  """A started run: the trainer's state and checkpoints (`started`), and what the loop needs beside them."""
  started: trainer.Started
  program: model.Program
  fingerprint: dict
  total_steps: int
  steps_per_epoch: int
  selection: Optional[Selection]  # select_metric: the checkpoint selection, with the evaluations a resume keeps


def _start(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, scorer: Scorer, workdir: pathlib.Path,
           mesh: Mesh, warm: Optional[warm_start.WarmStart] = None) -> _Run:
  """Initial params (with `warm`, its adapters and head), the optimizer over what trains, and the trainer started
  on them: resumed from the workdir's latest checkpoint when it holds this run (same fingerprint), else fresh;
  with select_metric, the checkpoint selection resumed with it."""
  steps_per_epoch = math.ceil(prep.num_train / cfg.batch_size)
  total_steps = cfg.num_steps or cfg.num_epochs * steps_per_epoch
  prog = model.program(cfg, prep.head_cfg, prep.source, mesh, total_steps)
  fingerprint = _run_fingerprint(cfg, prompt, scorer, prep.examples)
  if warm is not None:  # absent otherwise: the fingerprints of runs without a warm start are unchanged
    prog = dataclasses.replace(prog, params=warm.apply(prog.params))
    fingerprint["init_from"] = warm.identity
  started = trainer.start(workdir, cfg.keep_checkpoints, prog.params, prog.param_shardings, prog.optimizer,
                          jax.random.split(jax.random.PRNGKey(cfg.seed))[1], mesh, fingerprint,
                          lambda: prep.source.check_mesh(mesh))
  mesh_lib.sync("train: metrics log kept")  # selection reads the kept evaluations
  selection = (Selection.start(cfg.select_metric, cfg.patience, workdir, started.resume_step)
               if cfg.select_metric else None)
  # The state holds its own copy of the initial params: the run keeps their shapes only (no cast copy held).
  prog = dataclasses.replace(prog, params=jax.eval_shape(lambda: prog.params))
  return _Run(started, prog, fingerprint, total_steps, steps_per_epoch, selection)


def _loop(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, run: _Run, mesh: Mesh, workdir: pathlib.Path,
          progress: bool):
  """Runs the trainer's loop to the last step: (the final state, its timing); the run's selection observes each
  dev evaluation. Interrupted, it reports the checkpoint a rerun resumes from (trainer.reports_interrupt)."""
  attention = prep.source.attention()  # None: a frozen backbone's features came from the scorer's forward kernel
  if attention is not None:
    logging.info("train: attention %s (%s)", attention["kernel"], attention["reason"])
  labels_K = jnp.asarray(prep.label_ids, jnp.int32)
  step_fn = model.jit_step(cfg, prep.head_cfg, prep.source, mesh, run.program, run.started.shardings, labels_K)
  manager = run.started.manager
  save = lambda step, state: checkpoint.save(manager, step, state, run.fingerprint)
  settings = trainer.LoopSettings(run.total_steps, cfg.batch_size, prep.num_train, cfg.log_every, cfg.eval_every,
                                  cfg.save_every, max(1, run.total_steps // 10), "train", progress)
  selection = run.selection

  def evaluate(params, step):
    runs = []
    values = evaluation.dev_metrics(cfg, prompt, prep, labels_K, params, runs)
    if runs and jax.process_index() == 0:  # each evaluation's dev scores, for the export of the step kept
      outputs.write_dev_run(workdir, step, runs[0])
    if selection is not None:
      selection.observe(step, values, params)
    return values
  hooks = trainer.Hooks(lambda idx, step: model.make_batch(prep, idx, step, cfg),
                        trainer.placer(run.started.shardings, mesh, cfg.batch_size), evaluate, save, run.started.log,
                        run.program.schedule, partition.local_rows(cfg.batch_size, mesh),
                        selection.should_stop if selection is not None else None)
  with trainer.reports_interrupt(manager, workdir):
    state, timing = trainer.loop(settings, run.started.state, step_fn, hooks)
  trainer.finish(manager, state, save, run.total_steps)
  run.started.log.close()
  return state, timing


def _check_exportable(workdir: pathlib.Path, overwrite: bool) -> None:
  """export_only: refuses a workdir that holds no checkpoint (missing, or stopped before its first save), and
  --overwrite, which would remove the run it is to export. A checkpoint of another run is refused later, by the
  trainer's fingerprint check, still before the run's logs are opened."""
  if overwrite:
    raise TrainError(f"--export_only exports the run in {workdir} and --overwrite would remove it first; leave out "
                     f"--overwrite (an export this workdir wrote is replaced without it)")
  if not checkpoint.saved_steps(workdir):
    raise _nothing_to_export(workdir)


def _nothing_to_export(workdir: pathlib.Path) -> TrainError:
  return TrainError(f"--export_only: {workdir} holds no checkpoint of a run with these flags and data to export "
                    f"(a run's exports come from rerunning its own command with --export_only)")


def _stopped(run: _Run, workdir: pathlib.Path):
  """export_only: (the state, an empty timing) of the run the workdir holds, as its loop would have left them at
  its last checkpoint."""
  step = run.started.resume_step
  if step is None:  # removed since _check_exportable looked
    raise _nothing_to_export(workdir)
  logging.info("train: exporting the stopped run at step %d", step)
  return run.started.state, trainer.Timing(steps_done=step)


def _select(summary: dict[str, Any], selection: Selection, log) -> Any:
  """Records the checkpoint selection in the summary and returns the best evaluation's params, which are
  exported instead of the last step's."""
  summary["selection"] = selection.report()
  summary["dev_metrics_best"] = next(outputs.metric_values(r) for r in log.records
                                     if r["kind"] == "eval" and r["step"] == selection.best_step)
  logging.info("train: exporting step %d (%s %.4f): %s", selection.best_step, selection.metric,
               selection.best_value, selection.report()["reason"])
  return selection.best_params()
