"""Scores a JSONL file of /v1/score requests; writes one response line per request, in order.

  python scripts/score.py --input=requests.jsonl --output=responses.jsonl [--checkpoint_dir=ckpt] [key=value ...]

A request is {"query", "items", "label_token_ids"?, "apply_softmax"?, "item_first"?} (text or
token ids); a response is {"scores", "model", "usage", "object": "scoring"}. A request that
cannot be scored gets {"error": "line N: ..."} on its line and the run goes on. --output may not
be the input; it is written under a temporary name and renamed into place when the run ends.
With --score_mode=raw_logit the scores are the labels' raw lm_head logits (what FlagEmbedding-style
rerankers rank by) instead of probabilities.
"""

import sys

from absl import flags

from maxscore import cli
from maxscore.rerank import eval as eval_lib
from maxscore.files import safety


def define_flags(fv: flags.FlagValues) -> None:
  """The script's flags, on `fv` (the global FLAGS when run as a script, a fresh one in tests)."""
  flags.DEFINE_string("input", None, "JSONL of /v1/score requests ('-': stdin)", flag_values=fv)
  flags.DEFINE_string("output", "-", "JSONL of responses, one per input line ('-': stdout)", flag_values=fv)
  flags.DEFINE_string("checkpoint_dir", None, "maxscore checkpoint; default: the embedded default model; "
                      "'none': random init from the config", flag_values=fv)
  flags.DEFINE_integer("batch_size", 16, "requests scored together in one score_requests call",
                       flag_values=fv)
  flags.DEFINE_enum("score_mode", "probability", ["probability", "raw_logit"],
                    "probability: per request apply_softmax (sglang /v1/score); raw_logit: raw label logits",
                    flag_values=fv)
  flags.DEFINE_multi_string("override", [], "key=value config override (repeatable)", flag_values=fv)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  if not fv.input:
    print("error: --input is required (a JSONL file of /v1/score requests, or - for stdin)", file=sys.stderr)
    sys.exit(2)
  with cli.one_line_errors():
    safety.refuse_overlap([fv.output], [fv.input], "--output")  # before minutes of loading a model
    scorer = eval_lib.build_scorer(fv.checkpoint_dir, list(argv[1:]) + list(fv.override))
    counts = eval_lib.score_jsonl(scorer, fv.input, fv.output, fv.batch_size, fv.score_mode == "raw_logit")
  print(f"scored {counts['ok']} requests, {counts['errors']} errors", file=sys.stderr)
  if counts["errors"]:
    print(f"{counts['errors']} of {counts['ok'] + counts['errors']} requests failed; see their error lines",
          file=sys.stderr)


def run(argv):
  """Parses `argv` into fresh flags and calls main (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
