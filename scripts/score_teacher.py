"""Scores mined groups with a teacher checkpoint: writes them again with `pos_scores`/`neg_scores`, the
teacher's ranking scores (the eval's prompt, labels and score mode), for `train_reranker.py --loss=distill`.

  python scripts/score_teacher.py --checkpoint_dir=ckpt/big-reranker --template=qwen3_reranker \\
      --groups_file=out/groups.jsonl --output=out/groups_teacher.jsonl
  python scripts/train_reranker.py --checkpoint_dir=ckpt/small --groups_file=out/groups_teacher.jsonl \\
      --loss=distill --distill_temperature=2 --workdir=out/student

A large reranker scoring on a pod is the teacher for a small one. Every flag is a key of configs/teacher.yml;
trailing key=value arguments set configs/base.yml keys of the teacher's scorer. The output is written whole or
not at all. Input errors exit 2.
"""

from absl import flags

from maxscore import cli
from maxscore.files import safety
from maxscore.training import teacher

ENTRY = "teacher"
SECTIONS = {"teacher": teacher.TeacherConfig}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/teacher.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  with cli.one_line_errors():
    cfg = cli.entry_from_flags(fv, ENTRY, SECTIONS)["teacher"]
    output = teacher.output_path(cfg)
    safety.check_output_file(output, [cfg.groups_file, cfg.checkpoint_dir, cfg.adapters_dir], "--output")
    output.parent.mkdir(parents=True, exist_ok=True)
    with safety.atomic_output(output) as out:
      n = teacher.score_groups(cfg, out, overrides=argv[1:])
  print(f"wrote {n} groups with the teacher's scores to {output}")


def run(argv):
  """Parses `argv` into fresh flags and calls main (tests)."""
  return cli.run_with_fresh_flags(define_flags, main, argv)


if __name__ == "__main__":
  cli.run_script(main, define_flags)
