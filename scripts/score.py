"""Scores a JSONL file of /v1/score requests; writes one response line per request, in order.

  python scripts/score.py --input=requests.jsonl --output=responses.jsonl [--checkpoint_dir=ckpt] [key=value ...]

A request is {"query", "items", "label_token_ids"?, "apply_softmax"?, "item_first"?, "model"?} (text or
token ids); a response is {"scores", "model", "usage", "object": "scoring"}. Blank lines are skipped. A
request naming a model other than the served ones (--served_model_name, as serve.py's; by default the
checkpoint's name) is refused as the server refuses it (404 there). A request that
cannot be scored gets {"error": "line N: ..."} on its line and the run goes on; the exit status is then 3
(one summary line on stderr), 0 when every line was scored, 2 when the run is refused. --output may not
be the input, nor an existing file without --overwrite; it is written under a temporary name and renamed into
place when the run ends.
With --score_mode=raw_logit the scores are the labels' raw lm_head logits (what FlagEmbedding-style
rerankers rank by) instead of probabilities. Every flag is a key of configs/score.yml; trailing `key=value`
arguments override configs/base.yml keys (the scorer).
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
import dataclasses
import sys
from typing import Literal, Optional

from absl import flags

from maxscore import cli
from maxscore.config import ConfigError
from maxscore.files import safety
from maxscore.scoring import jsonl as score_file, loading, model_names


@dataclasses.dataclass(frozen=True)
class ScoreOptions:
  """What scripts/score.py reads and writes (configs/score.yml documents each key)."""
  input: Optional[str] = None
  output: str = "-"
  checkpoint_dir: Optional[str] = None
  batch_size: int = 16
  score_mode: Literal["probability", "raw_logit"] = "probability"
  served_model_name: tuple[str, ...] = ()  # names a request's "model" may give (the server's rule); () = the checkpoint's
  overwrite: bool = False  # replace an existing --output file

  def validate(self) -> "ScoreOptions":
    if self.batch_size < 1:
      raise ValueError(f"batch_size={self.batch_size} must be >= 1")
    model_names.served_names(self.served_model_name, "the checkpoint's name")
    return self


ENTRY = "score"
SOME_FAILED = 3  # exit status when some lines got an error line (2: the run was refused, nothing written)
SECTIONS = {"score": ScoreOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/score.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  with cli.one_line_errors():
    opts = cli.entry_from_flags(fv, ENTRY, SECTIONS)["score"]
    if not opts.input:
      raise ConfigError("--input is required (a JSONL file of /v1/score requests, or - for stdin)")
    safety.check_output_file(opts.output, [opts.input, opts.checkpoint_dir], "--output",  # before loading a model
                             overwrite=opts.overwrite)
    scorer = loading.build_scorer(opts.checkpoint_dir, argv[1:])
    counts = score_file.score_jsonl(scorer, opts.input, opts.output, opts.batch_size, opts.score_mode == "raw_logit",
                                    opts.served_model_name)
  if counts["errors"]:
    scored = f"the other {counts['ok']} were scored" if counts["ok"] else "none was scored"
    print(f"error: {counts['errors']} of {counts['ok'] + counts['errors']} requests failed (see their error "
          f"lines in the output); {scored}", file=sys.stderr)
    sys.exit(SOME_FAILED)
  print(f"scored {counts['ok']} requests", file=sys.stderr)


def run(argv):
  """Parses `argv` into fresh flags and calls main (for tests: no global flag state)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
