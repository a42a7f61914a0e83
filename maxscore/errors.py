"""Errors that are part of maxscore's interface."""


class ScoreInputError(ValueError):
  """Bad scoring input; the message names the field, the value and the limit."""


class RequestTooLargeError(ScoreInputError):
  """A request above a size limit (a bucket, max_request_tokens, max_items); the message names the limit."""


class UnsafeOutputError(ValueError):
  """An output would overwrite or delete something maxscore did not write (an input, a foreign directory)."""


class ResumeError(ValueError):
  """An output directory holds the results of a different run (an eval's, a training's); the message says
  what changed."""


class DataError(ScoreInputError):
  """A dataset file is malformed; the message starts with `file:line` where there is one."""


class TrainError(ValueError):
  """A training setting is invalid, or a run cannot start with it (the batch, the mesh, stored shapes)."""


class UnknownModelError(ScoreInputError):
  """A request names a model that is not served (the HTTP server answers 404; score.py an error line)."""


class Interrupted(KeyboardInterrupt):
  """Ctrl-C (SIGINT) seen at a safe point of a loop (maxscore/interrupt.py): the run stopped there; `message()`
  is the one line the scripts print before exiting 130."""

  def message(self) -> str:
    return str(self.args[0]) if self.args else "stopped (Ctrl-C)"


class TrainingInterrupted(Interrupted):
  """Ctrl-C (SIGINT) during a training loop: `step` steps were done; `saved` is the last checkpointed step
  (where the same command resumes; None = none yet), its writes finished before this is raised."""

  def __init__(self, step: int, saved=None, workdir=None):
    super().__init__(step)
    self.step, self.saved, self.workdir = step, saved, workdir

  def message(self) -> str:
    where = f" in {self.workdir}" if self.workdir else ""
    if self.saved is None:
      return f"stopped at step {self.step} (Ctrl-C); no checkpoint was written yet{where}: a rerun starts over"
    return (f"stopped at step {self.step} (Ctrl-C); the last checkpoint is step {self.saved}{where}: run the same "
            f"command to resume from it")
