"""Which library INFO lines a quiet console shows: progress lines, marked where they are logged.

    logging.info("train: step %d/%d loss %.4f", step, total, loss, extra=console.PROGRESS)

Consoles show warnings, errors and progress; every other INFO line goes to the run's log file (cli.py), and
progress lines go there too.
"""

import logging

PROGRESS = {"console": True}  # `extra=` of a log call: the line is progress a console shows


def is_progress(record: logging.LogRecord) -> bool:
  return bool(getattr(record, "console", False))
