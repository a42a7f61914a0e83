"""metrics.jsonl and TensorBoard scalars of a training run; a resumed run reads as one uninterrupted run."""

import json
import pathlib
import shutil
import sys
from typing import Any, Optional

from maxscore.files import safety


def _tensorboardx():
  """tensorboardX, imported without torch unless torch is loaded already: its writer imports torch when it is
  installed (2.4 s of a training run's start-up here, 0.2 s without) only to accept torch tensors, and this log
  writes Python numbers. Imported here, not at the top: scoring never needs it."""
  block = "torch" not in sys.modules
  if block:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX handles
  try:
    import tensorboardX  # pylint: disable=import-outside-toplevel
  finally:
    if block:
      del sys.modules["torch"]
  return tensorboardX


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
    self.writer = _tensorboardx().SummaryWriter(str(tb_dir))
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


class NullLog:
  """The metrics log of a process other than 0: it writes nothing (process 0 keeps the record)."""
  records: list = []

  def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
    del kind, step, values

  def close(self) -> None:
    pass
