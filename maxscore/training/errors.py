"""The trainer's errors: one-line messages that scripts print and exit 2 on."""

from maxscore import errors


class TrainError(ValueError):
  """A training setting is invalid, or the workdir holds another run."""


class ResumeError(TrainError, errors.ResumeError):
  """The workdir holds a run with another config or data."""
