"""Runs an entry script and SIGKILLs its own process at a chosen point of the work, for tests of a lost process:

    python -m maxscore.testing.kill_at eval_query 2 scripts/eval_rerank.py --flags...   # before its 2nd query
    python -m maxscore.testing.kill_at train_step 4 scripts/train_reranker.py ...       # as step 4 begins

The point is a call of a library function, counted in this process, so the kill lands at the same place of the
work however loaded the machine is (no sleeps). The script runs as __main__ with the remaining arguments.
"""

import os
import runpy
import signal
import sys
import time

from maxscore.rerank import query_scoring
from maxscore.training import trainer

KILLED_AT = "kill_at: SIGKILL at"  # then the time.time() of the kill, on stderr


def _kill_on_call(module, name: str, n: int) -> None:
  """module.name, which SIGKILLs this process on its `n`-th call (1-based) instead of running."""
  original, calls = getattr(module, name), [0]

  def wrapped(*args, **kwargs):
    calls[0] += 1
    if calls[0] == n:
      sys.stdout.flush()
      sys.stderr.write(f"{KILLED_AT} {time.time()}\n")
      sys.stderr.flush()
      os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)
  setattr(module, name, wrapped)


# point -> (module, function): eval_query is a query's scoring in the eval loop; train_step is the start of a
# step in the trainer's loop (its batch indices are drawn first).
POINTS = {"eval_query": (query_scoring, "score_prepared"), "train_step": (trainer, "batch_indices")}


def main(argv: list[str]) -> None:
  point, n, script, *rest = argv[1:]
  _kill_on_call(*POINTS[point], int(n))
  sys.argv = [script, *rest]
  runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
  main(sys.argv)
