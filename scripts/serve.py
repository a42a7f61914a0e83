"""Serves a maxscore checkpoint over HTTP: sglang's /v1/score and Cohere/Jina /v1/rerank, with dynamic batching.

  python scripts/serve.py                                   # the embedded default model on 127.0.0.1:8000
  python scripts/serve.py --checkpoint_dir=ckpt/qwen3-reranker-0.6b --template=qwen3_reranker --port=8080

Every flag is a key of configs/serve.yml; trailing `key=value` arguments override configs/base.yml keys
(the scorer). Bad settings, a busy port or a host this machine does not have print one line and exit 2
before the model loads; SIGTERM answers the requests in flight and exits 0. One process: started under
jax.distributed with several processes it refuses.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import sys

from absl import flags

from maxscore import cli, serving

ENTRY = "serve"
SECTIONS = {"serve": serving.ServeConfig, "prompt": serving.RerankPrompt}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/serve.yml as a flag, plus the multi-process flags (refused when > 1)."""
  cli.define_job_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  cli.join_job(fv)  # before any other JAX call
  with cli.one_line_errors():
    s = cli.entry_from_flags(fv, ENTRY, SECTIONS)
    serving.run_server(s["serve"], s["prompt"], argv[1:],
                       log=lambda line: print(line, file=sys.stderr, flush=True))


def run(argv):
  """Parses `argv` into fresh flags and calls main (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
