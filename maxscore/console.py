"""Which library INFO lines a quiet console shows: progress lines, marked where they are logged.

    logging.info("train: step %d/%d loss %.4f", step, total, loss, extra=console.PROGRESS)

Consoles show warnings, errors and progress; every other INFO line goes to the run's log file (cli.py), and
progress lines go there too.
"""

import logging

PROGRESS = {"console": True}  # `extra=` of a log call: the line is progress a console shows


def is_progress(record: logging.LogRecord) -> bool:
  return bool(getattr(record, "console", False))


def rate(per_second) -> str:
  """A throughput for a console line: "n/a" when unknown, one decimal below 10 (a slow CPU's 0.4 items/s is not
  0), whole numbers with thousands separators above."""
  if per_second is None:
    return "n/a"
  return f"{per_second:.1f}" if per_second < 10 else f"{per_second:,.0f}"


def count(n: int, one: str, many: str) -> str:
  """"1 query", "3 queries": a count with its noun in number."""
  return f"{n} {one if n == 1 else many}"
