"""Load-tests the HTTP server on loopback: C concurrent clients x R /v1/rerank requests, batched vs not.

  python scripts/bench_serve.py                     # 32 clients x 20 requests x 24 items, the embedded default
  python scripts/bench_serve.py --clients=8 --requests_per_client=5

Prints a Markdown table (p50/p95/p99 latency, requests/s, items/s, answers checked against each request
scored alone) for the batched server, max_batch_wait_ms=0 and one request per call, the batching gain,
and the load average before and after. Every flag is a key of configs/bench_serve.yml; trailing
`key=value` arguments override configs/base.yml keys (the scorer).
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
from absl import flags

from maxscore import cli
from maxscore.bench import serve_load

ENTRY = "bench_serve"
SECTIONS = {"load": serve_load.LoadConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/bench_serve.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  with cli.one_line_errors():
    cfg = cli.entry_from_flags(fv, ENTRY, SECTIONS)["load"]
    report = serve_load.run_load(cfg, list(argv[1:]))
  print(serve_load.format_report(report))


def run(argv):
  """Parses `argv` into fresh flags and calls main (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
