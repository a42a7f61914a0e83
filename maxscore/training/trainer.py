"""One trainer for score heads, backbone fine-tuning and LM pretraining (docs/ARCHITECTURE.md section 12).

    run = start(workdir, keep, params, param_shardings, optimizer, data_key, mesh, fingerprint)
    step_fn = jit_train_step(loss_fn, optimizer, run.shardings, mesh, grad_accum_steps)
    state, timing = loop(settings, run.state, step_fn, hooks)     # hooks: batches, eval, save, log
    finish(run.manager, state, save)

A task brings its params (with their shardings), its `loss_fn(params, batch, rng) -> (loss, aux)`,
its batches (`make_batch(indices) -> (batch, items)`) and its eval; the state, optimizer, data order,
checkpoints, metrics log and timing are the same for every task. The data order: each epoch is a
permutation of the examples drawn from PRNG(seed, epoch); a step takes the next `batch_size` of it
(the last batch of an epoch padded with -1). A resumed run continues where the checkpoint stands,
bit for bit (float32 on CPU).
"""

import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import time
from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh

from layers import sharding as sharding_lib
from maxscore import console, interrupt
from maxscore.errors import TrainingInterrupted
from maxscore.files import safety
from maxscore.training import checkpoint, partition
from maxscore.training.metrics_log import MetricsLog, NullLog
from maxscore.training.state import TrainState, fresh

# Test-only, not a setting: seconds `loop` sleeps after every step, so a test can kill a run between two
# checkpoints (tests/test_train.py). Nothing else sets it.
TEST_STEP_DELAY_ENV = "MAXSCORE_TEST_STEP_DELAY_S"


def abstract_state(params: Any, optimizer: optax.GradientTransformation, data_key: jax.Array) -> TrainState:
  """The state's shapes and dtypes (no arrays allocated): what restore and compile-only programs need."""
  shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), params)
  return fresh(shapes, jax.eval_shape(optimizer.init, shapes), np.asarray(data_key))


def with_shardings(abstract: TrainState, shardings: TrainState) -> TrainState:
  return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                                abstract, shardings)


def placed_abstract_state(params: Any, param_shardings: Any, optimizer: optax.GradientTransformation,
                          data_key: jax.Array, mesh: Mesh) -> tuple[TrainState, TrainState]:
  """(the state's ShapeDtypeStructs placed on their shardings, those shardings): the optimizer state laid out
  like its params, the counters replicated. `params` may be arrays or ShapeDtypeStructs."""
  abstract = abstract_state(params, optimizer, data_key)
  shardings = partition.state_shardings(abstract, param_shardings, mesh)
  return with_shardings(abstract, shardings), shardings


def init(params: Any, shardings: TrainState, optimizer: optax.GradientTransformation,
         data_key: jax.Array) -> TrainState:
  """Step 0's state placed on `shardings` (nothing committed to a single device). The step donates the state, so
  its params are copies of the device arrays passed in: the caller's (a scorer's params) stay valid."""
  params = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x, params)
  params = partition.place(params, shardings.params)
  opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
  return fresh(params, opt_state, data_key)


def to_host_counters(state: TrainState) -> TrainState:
  """The counters and data key as host values (the loop does its bookkeeping on host)."""
  one = lambda x: np.asarray(partition.host_copy(x))
  return state.replace(step=np.int32(one(state.step)), epoch=np.int32(one(state.epoch)),
                       index=np.int32(one(state.index)), rng=one(state.rng))


def restore(mgr, target: TrainState, fingerprint: dict, workdir: pathlib.Path) -> tuple[Optional[TrainState],
                                                                                       Optional[int]]:
  """The latest checkpoint's state on the target's shardings and its step, or (None, None) in a fresh
  workdir. Refuses another run's workdir, or a mesh that cannot hold the stored shapes."""
  step = checkpoint.check_identity(mgr, fingerprint, workdir)
  if step is None:
    return None, None
  checkpoint.check_fits(mgr, step, target)
  return to_host_counters(checkpoint.restore(mgr, step, target)), step


@dataclasses.dataclass
class Started:
  """A run's state (fresh or resumed), its shardings, checkpoint manager and metrics log."""
  state: TrainState
  shardings: TrainState
  manager: Any
  resume_step: Optional[int]
  log: Any


def start(workdir: pathlib.Path, keep: int, params: Any, param_shardings: Any, optimizer: optax.GradientTransformation,
          data_key: jax.Array, mesh: Mesh, fingerprint: dict, check: Callable[[], None] = lambda: None) -> Started:
  """Resumes the workdir's run, or starts one.

  The stored run must match `fingerprint` and fit the mesh; only then is the workdir claimed and the state
  placed. Process 0 keeps the metrics log.

  Args:
    workdir: the run's directory (checkpoints/, metrics.jsonl, tensorboard/).
    keep: how many of the latest checkpoints are kept.
    params: step 0's params (host or device arrays), copied and placed when no checkpoint is restored (the
      steps donate the state, never the caller's arrays).
    param_shardings: a pytree like `params` of the shardings each param lives on.
    optimizer: the optax transformation the state's opt_state belongs to.
    data_key: the PRNG key the epochs' data orders are drawn from.
    mesh: the device mesh the state is placed on.
    fingerprint: what the run's result depends on; a stored run with another one is refused.
    check: runs after the stored run passed and before anything is placed (e.g. the model's dimensions
      against the mesh); raises to refuse the run.

  Returns:
    Started: the state (restored, or step 0's), its shardings, the checkpoint manager, the step resumed from
    (None for a fresh run) and the metrics log.

  Raises:
    ResumeError: the workdir holds a run with another fingerprint.
    TrainError: the stored params do not fit this run or its mesh.
  """
  target, shardings = placed_abstract_state(params, param_shardings, optimizer, data_key, mesh)
  mgr = checkpoint.manager(workdir, keep)
  state, resume_step = restore(mgr, target, fingerprint, workdir)
  check()
  safety.claim(workdir)  # every check passed: the run's log may now be written there
  if state is None:
    state = init(params, shardings, optimizer, data_key)
  log = MetricsLog(workdir, resume_step) if jax.process_index() == 0 else NullLog()
  return Started(state, shardings, mgr, resume_step, log)


def placer(shardings: TrainState, mesh: Mesh, batch_size: int) -> Callable[[TrainState, Any], tuple[TrainState, Any]]:
  """(state, this process's rows of the batch) -> both on the mesh, as the jitted step takes them."""
  return lambda state, batch: (partition.place(state, shardings), partition.place_batch(batch, batch_size, mesh))


def _micro_batches(batch: Any, k: int) -> Any:
  return jax.tree_util.tree_map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)


def _value_and_float_grad(loss_fn: Callable) -> Callable:
  """jax.value_and_grad(loss_fn, has_aux=True) over params that may hold integer leaves (a QLoRA base's int8
  weights): those are no variables (an integer has no gradient), so their gradient is a zero of their own
  dtype, which the optimizer's frozen branch (set_to_zero) passes on and apply_updates adds as nothing; the
  int8 weights leave each step byte-identical."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True, allow_int=True)

  def fn(params, *args):
    value, grads = grad_fn(params, *args)
    zero_ints = lambda g, p: jnp.zeros(jnp.shape(p), p.dtype) if g.dtype == jax.dtypes.float0 else g
    return value, jax.tree_util.tree_map(zero_ints, grads, params)
  return fn


def train_step(state: TrainState, batch: Any, *, loss_fn: Callable, optimizer: optax.GradientTransformation,
               grad_accum_steps: int = 1, trainable: Any = None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step.

  Args:
    state: the TrainState before the step; its rng folded with its step seeds the step's randomness.
    batch: the step's inputs, a pytree whose leaves share a leading batch axis.
    loss_fn: `loss_fn(params, batch, rng) -> (loss, aux)`, a scalar loss and a dict of scalars to log.
    optimizer: the optax transformation the state's opt_state belongs to.
    grad_accum_steps: the batch's leading axis is split into this many micro-batches whose gradients (and
      losses and aux) are averaged.
    trainable: a bool pytree like the params (None: all train). Frozen leaves enter the loss as constants,
      so no gradient is computed for them (a LoRA step never forms a frozen kernel's gradient); theirs is
      zero, and grad_norm is the trainable leaves' norm.

  Returns:
    state: the state after the update, its step one higher (epoch, index and rng as they were).
    metrics: {"loss", "grad_norm"} and the aux scalars of loss_fn.
  """
  rng = jax.random.fold_in(jnp.asarray(state.rng), state.step)
  grad_fn = _value_and_float_grad(_frozen_as_constants(loss_fn, trainable))
  if grad_accum_steps == 1:
    (loss, aux), grads = grad_fn(state.params, batch, rng)
  else:
    def body(carry, micro):
      i, mb = micro
      (l, a), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
      return jax.tree_util.tree_map(jnp.add, carry, (l, a, g)), None
    (l0, a0), g0 = jax.eval_shape(grad_fn, state.params, jax.tree_util.tree_map(lambda x: x[0], _micro_batches(
        batch, grad_accum_steps)), rng)
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), (l0, a0, g0))
    total, _ = jax.lax.scan(body, zeros, (jnp.arange(grad_accum_steps), _micro_batches(batch, grad_accum_steps)))
    # An integer leaf's gradient (a zero, _value_and_float_grad) stays an integer of its own dtype.
    mean = lambda x: x / grad_accum_steps if jnp.issubdtype(x.dtype, jnp.inexact) else x
    loss, aux, grads = jax.tree_util.tree_map(mean, total)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), **aux}
  return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics


def _frozen_as_constants(loss_fn: Callable, trainable: Any) -> Callable:
  """loss_fn with the params that `trainable` marks False behind stop_gradient."""
  if trainable is None:
    return loss_fn

  def fn(params, *args):
    params = jax.tree_util.tree_map(lambda p, on: p if on else jax.lax.stop_gradient(p), params, trainable)
    return loss_fn(params, *args)
  return fn


def jit_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, shardings: TrainState, mesh: Mesh,
                   grad_accum_steps: int = 1, rules=sharding_lib.RULES, trainable: Any = None) -> Callable:
  """train_step jitted with explicit shardings, the state donated: the update is made in place, so a step holds
  one copy of the params and optimizer state, not two (the fit report, docs/will-it-fit.md, sizes this program).
  The state passed in is consumed; use the one returned.

  Args:
    loss_fn: `loss_fn(params, batch, rng) -> (loss, aux)` (train_step).
    optimizer: the optax transformation the state's opt_state belongs to.
    shardings: a TrainState of the shardings the state lives on (Started.shardings).
    mesh: the device mesh; the batch is split over its data x fsdp axes, the metrics replicated.
    grad_accum_steps: micro-batches per step (train_step).
    rules: the logical-axis rules current while tracing, so the model's activation constraints apply.
    trainable: the bool pytree of the leaves that train (train_step), or None.

  Returns:
    `step(state, batch) -> (state, metrics)`, the compiled train_step on the mesh; `step.lower(state, batch)`
    lowers it (arrays or placed ShapeDtypeStructs) under the same rules, for the fit report and its tests.
  """
  fn = functools.partial(train_step, loss_fn=loss_fn, optimizer=optimizer, grad_accum_steps=grad_accum_steps,
                         trainable=trainable)
  jitted = jax.jit(fn, in_shardings=(shardings, partition.batch_sharding(mesh)),
                   out_shardings=(shardings, partition.replicated(mesh)), donate_argnums=0)

  def step(state, batch):
    with sharding_lib.activate(mesh, rules):
      return jitted(state, batch)

  def lower(state, batch):
    with sharding_lib.activate(mesh, rules):
      return jitted.lower(state, batch)
  step.lower = lower
  return step


def batch_indices(state: TrainState, n_examples: int, batch_size: int) -> np.ndarray:
  """The next `batch_size` examples of the epoch's order (drawn from PRNG(seed, epoch)); -1 pads."""
  epoch, index = int(state.epoch), int(state.index)
  order = np.asarray(jax.random.permutation(jax.random.fold_in(jnp.asarray(state.rng), epoch), n_examples))
  idx = order[index:index + batch_size]
  return np.concatenate([idx, np.full(batch_size - len(idx), -1, idx.dtype)])


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The loop's cadence; `name` prefixes its progress lines."""
  total_steps: int
  batch_size: int
  num_examples: int
  log_every: int
  eval_every: int
  save_every: int
  progress_every: int
  name: str = "train"
  progress: bool = True


@dataclasses.dataclass
class Hooks:
  """What a task plugs into the loop: its batches, its eval (a dict to log, or None), the save, the log
  and the learning-rate schedule (logged beside the loss)."""
  make_batch: Callable[[np.ndarray, int], tuple[Any, int]]  # (example indices (-1: padding), step) -> rows, real items
  place: Callable[[TrainState, Any], tuple[TrainState, Any]]
  evaluate: Callable[[Any, int], Optional[dict]]  # (params, step) -> metrics to log, or None
  save: Callable[[int, TrainState], None]
  log: MetricsLog
  schedule: Callable[[int], Any]
  local_rows: Optional[np.ndarray] = None  # the batch rows this process builds (None: all)
  should_stop: Optional[Callable[[], bool]] = None  # asked after each eval (and at the start): stop early


@dataclasses.dataclass
class Timing:
  """Where a process's time went; the first step (it compiles) is timed apart."""
  eval_seconds: float = 0.0
  step_seconds: float = 0.0
  steps_timed: int = 0
  step_items: int = 0
  first_step_seconds: Optional[float] = None
  steps_done: int = 0  # the step the loop has reached


def _log_eval(s: LoopSettings, hooks: Hooks, step: int, params, timing: Timing) -> None:
  t = time.perf_counter()
  values = hooks.evaluate(params, step)
  seconds = time.perf_counter() - t
  timing.eval_seconds += seconds
  if values is not None:
    hooks.log.write("eval", step, values)
    shown = [f"{k} {v:.4f}" for k, v in values.items() if isinstance(v, (int, float))][:3]
    if s.progress and shown:
      logging.info("%s: step %d/%d dev %s (%.1f s)", s.name, step, s.total_steps, ", ".join(shown), seconds,
                   extra=console.PROGRESS)


def loop(s: LoopSettings, state: TrainState, step_fn: Callable, hooks: Hooks) -> tuple[TrainState, Timing]:
  """Steps from the state's step to `total_steps`: train lines, evals and checkpoints on their cadence.

  Args:
    s: the loop's cadence (total steps, batch size, number of examples, log/eval/save/progress intervals).
    state: the state to step from, its counters on host (Started.state).
    step_fn: `step_fn(state, batch) -> (state, metrics)`, as jit_train_step returns.
    hooks: the task's batches, placement, eval, save, metrics log and learning-rate schedule.

  Returns:
    state: the state at `total_steps`.
    timing: where this process's time went (step, first step and eval seconds, items trained).

  Raises:
    TrainingInterrupted: Ctrl-C during the loop (maxscore/interrupt.py), with the step reached. The loop stops
      at its next safe point: after a step (the first one's compile included), its metrics, eval and save; in one
      process it saves that step first, unless it was just saved.
  """
  delay_s = float(os.environ.get(TEST_STEP_DELAY_ENV) or 0)
  timing = Timing()
  with interrupt.stop_points():
    return _steps(s, state, step_fn, hooks, timing, delay_s)


def _steps(s: LoopSettings, state: TrainState, step_fn: Callable, hooks: Hooks, timing: Timing,
           delay_s: float) -> tuple[TrainState, Timing]:
  """loop's body; `timing.steps_done` follows the step reached (what a Ctrl-C reports)."""
  step = timing.steps_done = int(state.step)
  saved = step  # the step a rerun would resume from: the checkpoint this run started from (0: none)
  stop = hooks.should_stop or (lambda: False)
  if step == 0:
    _log_eval(s, hooks, 0, state.params, timing)
  while step < s.total_steps and not stop():
    if interrupt.requested():  # a safe point: every step before is logged and its checkpoint handed on
      if step > saved and jax.process_count() == 1:
        # Ctrl-C saves first, so a rerun goes on from here rather than from the last periodic save. (Several
        # processes would each take the signal at their own step, and a save is a collective of all of them.)
        hooks.save(step, state)
      raise TrainingInterrupted(step)
    interrupt.planted(f"begin:{step + 1}")  # a test's signal as step step + 1 begins
    idx = batch_indices(state, s.num_examples, s.batch_size)
    batch, items = hooks.make_batch(idx if hooks.local_rows is None else idx[hooks.local_rows], step)
    t = time.perf_counter()
    first = timing.first_step_seconds is None
    if first:
      if s.progress:  # the first step compiles: a minute on a CPU, which the console should not spend silent
        logging.info("%s: step %d/%d: compiling the training step", s.name, step + 1, s.total_steps,
                     extra=console.PROGRESS)
      interrupt.planted("compile")  # a test's Ctrl-C as the first step is traced and compiled
    new_state, metrics = step_fn(*hooks.place(state, batch))
    metrics = {k: float(v) for k, v in partition.host_copy(metrics).items()}  # waits for the step
    dt = time.perf_counter() - t
    if first:
      timing.first_step_seconds = dt
    else:
      timing.step_seconds, timing.steps_timed = timing.step_seconds + dt, timing.steps_timed + 1
      timing.step_items += items
    epoch, index = int(state.epoch), int(state.index) + s.batch_size
    if index >= s.num_examples:
      epoch, index = epoch + 1, 0
    step += 1
    state = new_state.replace(step=np.int32(step), epoch=np.int32(epoch), index=np.int32(index), rng=state.rng)
    timing.steps_done = step
    loss, gnorm = metrics.pop("loss"), metrics.pop("grad_norm")
    if step % s.log_every == 0 or step == s.total_steps:
      hooks.log.write("train", step, {"epoch": epoch, "loss": loss, "grad_norm": gnorm,
                                      "learning_rate": float(hooks.schedule(step - 1)), **dict(sorted(metrics.items()))})
    if (s.eval_every and step % s.eval_every == 0) or step == s.total_steps:
      _log_eval(s, hooks, step, state.params, timing)
    if (s.save_every and step % s.save_every == 0) or step == s.total_steps or stop():
      hooks.save(step, state)
      saved = step
      interrupt.planted(f"save:{step}")  # a test's Ctrl-C while the save is in flight
    if s.progress and (step % s.progress_every == 0 or first):
      compiled = f" (compiled and run in {dt:.1f} s)" if first else ""
      logging.info("%s: step %d/%d loss %.4f%s", s.name, step, s.total_steps, loss, compiled, extra=console.PROGRESS)
    interrupt.planted(f"step:{step}")
    if delay_s > 0:
      time.sleep(delay_s)
  if interrupt.requested():  # during the last step: it is saved, and the rest of the run is left to a rerun
    raise TrainingInterrupted(step)
  return state, timing


@contextlib.contextmanager
def reports_interrupt(mgr, workdir: pathlib.Path) -> Iterator[None]:
  """Around the loop: Ctrl-C that stops it (TrainingInterrupted) names the last complete checkpoint, the writes
  in flight finished first."""
  try:
    yield
  except TrainingInterrupted as e:
    mgr.wait_until_finished()
    e.saved, e.workdir = mgr.latest_step(), pathlib.Path(workdir).resolve()
    raise


def ctrl_c_note(workdir: os.PathLike):
  """Around a whole run (a script's call): Ctrl-C that stops the process at once, outside the loop (loading,
  features, compiling the eval, exports), names the last complete checkpoint on disk, or none."""
  return interrupt.note(lambda: checkpoint.stop_note(pathlib.Path(workdir).resolve()))


def finish(mgr, state: TrainState, save: Callable[[int, TrainState], None], total_steps: Optional[int] = None) -> None:
  """Waits for the checkpoint writes; a run resumed at its end (nothing ran) saves its state once more.

  Args:
    mgr: the run's checkpoint manager (Started.manager).
    state: the state the loop returned.
    save: `save(step, state)`, the same save the loop's hooks call.
    total_steps: the run's last step, the only step saved again; None: any step without a checkpoint is.
  """
  mgr.wait_until_finished()
  step = int(state.step)
  if (total_steps is None or step == total_steps) and mgr.latest_step() != step:
    save(step, state)
    mgr.wait_until_finished()


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
