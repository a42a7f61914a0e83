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


class TrainError(ValueError):
  """A training setting is invalid, or a run cannot start with it (the batch, the mesh, stored shapes)."""
