"""Writes tests/slow_tests.txt from a pytest `--durations=0` report on stdin: every test whose setup, call or
teardown took at least THRESHOLD_S seconds (conftest.py marks them slow, so `make test-fast` leaves them out;
`make test` runs them all).

  .venv/bin/python -m pytest -q -n auto --dist worksteal -m "not slow" tests --durations=0 -p no:randomly \
      | .venv/bin/python tests/slow_list.py >> tests/slow_tests.txt   # then sort -u it
"""

import re
import sys

THRESHOLD_S = 2.0
_LINE = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S.*)$")


def main() -> None:
  slow = sorted({m.group(3).strip() for m in map(_LINE.match, sys.stdin) if m and float(m.group(1)) >= THRESHOLD_S})
  sys.stdout.write("".join(f"{nodeid}\n" for nodeid in slow))


if __name__ == "__main__":
  main()
