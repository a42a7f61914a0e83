"""Orbax checkpoints of a TrainState: every process writes and reads only its own shards.

A run's fingerprint (what its result depends on: config, data, base model) is stored beside the
state; a resume must match it. The mesh and the process count are not part of it: the state is
restored straight into the current mesh's shardings, whatever mesh wrote it.
"""

import pathlib
from typing import Optional

import orbax.checkpoint as ocp
from absl import logging

from maxscore.files import identity, safety
from maxscore.training import partition
from maxscore.training.state import TrainState


def manager(workdir: pathlib.Path, keep: int) -> ocp.CheckpointManager:
  """The CheckpointManager of `<workdir>/checkpoints`, keeping the latest `keep` (a relative `workdir` is made
  absolute: Orbax refuses a relative path)."""
  return ocp.CheckpointManager(safety.resolve(workdir) / "checkpoints", options=ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True), item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                     "run": ocp.JsonCheckpointHandler()})


def save(mgr: ocp.CheckpointManager, step: int, state: TrainState, fingerprint: dict) -> None:
  mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state.to_dict()),
                                         run=ocp.args.JsonSave(fingerprint)))


def saved_steps(workdir: pathlib.Path) -> list[int]:
  """The steps of the complete checkpoints in `<workdir>/checkpoints`, read from the directory names without
  opening a manager (which would create the directory): an Orbax save in flight is still in a temporary
  directory, not a step's."""
  d = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def stop_note(workdir: pathlib.Path) -> str:
  """Where a run stopped by Ctrl-C stands: its last complete checkpoint on disk, or none."""
  steps = saved_steps(workdir)
  if not steps:
    return f"no checkpoint was written yet in {workdir}: a rerun starts over"
  return f"the last checkpoint is step {max(steps)} in {workdir}: run the same command to resume from it"


def check_identity(mgr: ocp.CheckpointManager, fingerprint: dict, workdir: pathlib.Path) -> Optional[int]:
  """The latest step (None in a fresh workdir); refuses (ResumeError) a workdir whose run had another config
  or data."""
  step = mgr.latest_step()
  if step is None:
    return None
  stored = mgr.restore(step, args=ocp.args.Composite(run=ocp.args.JsonRestore()))["run"]
  identity.check_same(stored, fingerprint, workdir, "pass --overwrite to start over, or use a new --workdir")
  return step


def check_fits(mgr: ocp.CheckpointManager, step: int, target: TrainState) -> None:
  """Refuses (one line) a checkpoint whose stored param shapes the target (abstract, with shardings) cannot hold."""
  meta = mgr.item_metadata(step)["state"]
  meta = getattr(meta, "tree", meta)
  partition.check_restorable(meta["params"], target.params, f"the checkpoint of step {step}")


def restore(mgr: ocp.CheckpointManager, step: int, target: TrainState) -> TrainState:
  """The state of checkpoint `step`, each array restored straight into its sharding in `target` (an abstract
  TrainState of ShapeDtypeStructs): every process reads only its own shards."""
  restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target.to_dict())))
  state = TrainState.from_dict(restored["state"])
  logging.info("train: resumed from step %d (epoch %d, index %d)", *(int(x) for x in (
      state.step, state.epoch, state.index)))
  return state
