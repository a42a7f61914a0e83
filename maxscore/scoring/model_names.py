"""The names a scorer answers to: the served names (aliases, as vLLM's --served-model-name), checked the
same way by the HTTP server (404) and scripts/score.py (an error line).

A request may leave `model` out or give any served name; responses report the first name.
"""

from typing import Any, Mapping, Sequence

from maxscore.errors import ScoreInputError, UnknownModelError
from maxscore.scoring.requests import short


def served_names(aliases: Sequence[str], default: str) -> tuple[str, ...]:
  """The served names: `aliases` in order (duplicates dropped), or `default` (the checkpoint's name) when
  none are given. An empty or blank alias is refused."""
  bad = [a for a in aliases if not isinstance(a, str) or not a.strip()]
  if bad:
    raise ValueError(f"served_model_name={list(aliases)} holds an empty name; give model names, or [] for the "
                     f"checkpoint's name {default!r}")
  return tuple(dict.fromkeys(aliases)) or (default,)


def check_model(request: Mapping[str, Any], names: Sequence[str]) -> None:
  """Refuses a request whose `model` is not a string (ScoreInputError) or not one of `names`
  (UnknownModelError); a request without `model` is for the served model."""
  model = request.get("model")
  if model is None:
    return
  if not isinstance(model, str):
    raise ScoreInputError(f"model={short(model)} must be a string")
  if model not in names:
    served = ", ".join(short(n, 200) for n in names)
    raise UnknownModelError(f"model {short(model)} is not served here; the served names are {served} "
                            f"(served_model_name)")
