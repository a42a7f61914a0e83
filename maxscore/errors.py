"""Errors that are part of maxscore's interface."""


class ScoreInputError(ValueError):
  """Bad scoring input; the message names the field, the value and the limit."""
