"""Checkpoint selection: the params of the dev evaluation that scored best on a named metric are kept, and
training stops after `patience` evaluations without a gain; the export is the best params, not the last.

    sel = Selection.start("ndcg@10", patience=3, workdir=work, resume_step=None)
    sel.observe(step, dev_metrics, params)   # after each dev eval: True when it is a new best
    sel.should_stop()                        # patience evaluations without a gain
    sel.best_params()                        # for the export
    sel.report()                             # which step won, with what value, and why training ended

The best params live in `<workdir>/best/` (Orbax, written by process 0 at each new best) with
`<workdir>/selection.json` (every evaluation's value, the best step, the stop). A resumed run rebuilds the
state from the evaluations up to the step it resumes from (metrics.jsonl), so every process decides the same
and a resumed run selects as an uninterrupted one. A gain is a value above the best by more than `min_delta`;
ties keep the earlier step.
"""

import dataclasses
import json
import pathlib
import shutil
from typing import Any, Optional, Sequence

import jax
import numpy as np

from maxscore.checkpoints import storage
from maxscore.errors import TrainError
from maxscore.files import safety
from maxscore.rerank import metrics

BEST_DIR, REPORT_FILE = "best", "selection.json"


def resolve_metric(metric: str, dev_metrics: Sequence[str], has_dev_split: bool) -> str:
  """The trec_eval name of a select_metric, refused in one line (TrainError) before any work when the dev
  evaluations cannot give it: no dev split, an unknown name, or a metric the dev evaluations leave out."""
  if not has_dev_split:
    raise TrainError(f"select_metric={metric!r} keeps the best dev evaluation: it needs a dev split (--dev_split)")
  name = _trec_name(metric)
  dev = [metrics.canonical_name(m) for m in dev_metrics]
  if name not in dev:
    raise TrainError(f"select_metric={metric!r} ({name}) is not among the dev metrics {dev}; add it to --metrics")
  return name


def _trec_name(metric: str) -> str:
  """The trec_eval name of a select_metric; an unknown name is a one-line TrainError."""
  try:
    return metrics.canonical_name(metric)
  except ValueError as e:
    raise TrainError(f"select_metric={metric!r}: {e}") from None


@dataclasses.dataclass
class Selection:
  metric: str                      # the trec_eval name the dev metrics are keyed by
  patience: int                    # evaluations without a gain before training stops; 0 = never stop early
  workdir: pathlib.Path
  min_delta: float = 0.0
  history: list = dataclasses.field(default_factory=list)  # [(step, value)] of every dev evaluation
  best_step: Optional[int] = None
  best_value: Optional[float] = None
  stopped_at: Optional[int] = None

  @classmethod
  def start(cls, metric: str, patience: int, workdir: pathlib.Path, resume_step: Optional[int],
            min_delta: float = 0.0) -> "Selection":
    sel = cls(_trec_name(metric), patience, pathlib.Path(workdir), min_delta)
    log = sel.workdir / "metrics.jsonl"
    if resume_step is not None and log.is_file():  # the evaluations the resumed run keeps
      for line in log.read_text(encoding="utf-8").splitlines():
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          continue
        if rec.get("kind") == "eval" and rec.get("step", 0) <= resume_step:
          sel._record(rec["step"], rec)
    return sel

  def _value(self, values: dict[str, Any]) -> float:
    if self.metric not in values:
      raise TrainError(f"select_metric {self.metric!r} is not among the dev metrics {sorted(values)}; add it to "
                       f"--metrics")
    return float(values[self.metric])

  def _record(self, step: int, values: dict[str, Any]) -> bool:
    value = self._value(values)
    self.history.append((step, value))
    if self.best_value is None or value > self.best_value + self.min_delta:
      self.best_step, self.best_value = step, value
      return True
    if self.patience and self._since_best() >= self.patience:
      self.stopped_at = step
    return False

  def _since_best(self) -> int:
    return sum(1 for s, _ in self.history if s > self.best_step)

  def observe(self, step: int, values: Optional[dict[str, Any]], params) -> bool:
    """Records a dev evaluation; at a new best, process 0 keeps `params` in <workdir>/best/."""
    if values is None:
      raise TrainError("select_metric needs a dev split (--dev_split) to evaluate")
    improved = self._record(step, values)
    if jax.process_index() == 0:
      if improved:
        self._save(params)
      safety.atomic_write_text(self.workdir / REPORT_FILE, json.dumps(self.report(), indent=2) + "\n")
    return improved

  def _save(self, params) -> None:
    host = jax.tree_util.tree_map(np.asarray, jax.device_get(params))
    tmp = self.workdir / f".{BEST_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a killed run's half-written copy
    ckpt = storage.local_checkpointer()  # process 0 alone
    ckpt.save((tmp / "params").resolve(), host)
    ckpt.wait_until_finished()
    safety.mark_owned(tmp, "best_params", step=self.best_step)
    safety.swap_dir(tmp, self.workdir / BEST_DIR)

  def should_stop(self) -> bool:
    return self.stopped_at is not None

  def best_params(self):
    """The kept params (numpy), as the evaluation of best_step saw them; a workdir that keeps another step's
    (an evaluation after its last checkpoint, before it stopped) is a TrainError."""
    kept = (safety.owner(self.workdir / BEST_DIR) or {}).get("step")
    if self.best_step is None or kept != self.best_step:
      raise TrainError(f"{self.workdir} keeps no params of its best dev evaluation (best: step {self.best_step}; "
                       f"kept: step {kept}); rerun without --export_only to go on training")
    return storage.local_checkpointer().restore((self.workdir / BEST_DIR / "params").resolve())

  def report(self) -> dict[str, Any]:
    """Which step won and why training ended."""
    if self.stopped_at is not None:
      reason = (f"stopped at step {self.stopped_at}: {self.patience} evaluations without a gain over "
                f"{self.metric} {self.best_value:.4f} (step {self.best_step})")
    else:
      reason = f"best {self.metric} over every evaluation"
    return {"metric": self.metric, "patience": self.patience, "min_delta": self.min_delta,
            "best_step": self.best_step, "best_value": self.best_value, "stopped_at": self.stopped_at,
            "reason": reason, "evaluations": [{"step": s, self.metric: v} for s, v in self.history]}
