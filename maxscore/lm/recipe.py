"""The fine-tuning recipe that makes the embedded default's reranker, run through the public scripts only:
mine hard negatives -> a teacher's scores -> distil into the student -> keep the best dev step.

    steps = commands(options, data_dir, checkpoint_dir, workdir)   # [(name, argv), ...]
    summary = run(steps, workdir)                                  # each a subprocess; finished steps skipped

1. scripts/mine_negatives.py: per train query of the python-docs set, its section's paragraphs (grade 2) as
   positives and `recipe_negatives` of BM25's top `bm25_top_k` as negatives (never a judged paragraph).
2. scripts/score_teacher.py: the teacher's scores of every group (all-MiniLM-L6-v2 from its registry wheel:
   torch and transformers are build-time dependencies only).
3. scripts/train_reranker.py: a one-output MLP head on the frozen student, trained toward the teacher's
   scores (loss=distill), evaluated on the dev split every `eval_every` steps; the best dev nDCG@10 step is
   exported (select_metric, patience), with the reason in its summary.
Every step writes under `workdir`; a step whose output already exists is not run again.
"""

import json
import pathlib
import subprocess
import sys
import time
from typing import Sequence

from maxscore import errors

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
DONE = "recipe.json"


def commands(options, data_dir: pathlib.Path, checkpoint_dir: pathlib.Path,
             workdir: pathlib.Path) -> list[tuple[str, list[str], pathlib.Path]]:
  """(step name, script argv, the output that marks it done) for the recipe's three steps (module docstring)."""
  run = data_dir / "bm25.trec"
  groups, scored, train_dir, model = (workdir / "groups.jsonl", workdir / "groups_teacher.jsonl",
                                      workdir / "train", workdir / "model")
  return [
      ("mine", ["mine_negatives.py", f"--data_dir={data_dir}", f"--run_file={run}", "--split=train",
                "--range_min=0", f"--range_max={options.bm25_top_k}", f"--num_negatives={options.recipe_negatives}",
                "--min_relevance=2", f"--seed={options.seed}", f"--output={groups}"], groups),
      ("teacher", ["score_teacher.py", "--teacher=sentence_transformer", f"--model_dir={options.recipe_teacher}",
                   f"--groups_file={groups}", f"--output={scored}"], scored),
      ("distil", ["train_reranker.py", f"--checkpoint_dir={checkpoint_dir}", f"--groups_file={scored}",
                  f"--data_dir={data_dir}", f"--run_file={run}", f"--rerank_top_k={options.bm25_top_k}",
                  "--loss=distill", f"--distill_temperature={options.recipe_temperature}", "--head=mlp",
                  "--num_outputs=1", f"--learning_rate={options.recipe_learning_rate}", "--batch_size=16",
                  f"--num_steps={options.recipe_steps}", "--eval_every=50", "--save_every=50", "--warmup_steps=20",
                  "--select_metric=ndcg@10", f"--patience={options.recipe_patience}", f"--seed={options.seed}",
                  f"--workdir={train_dir}", f"--export_dir={model}", "--noprogress"], model / "head"),
  ]


def run(steps: Sequence[tuple[str, list[str], pathlib.Path]], workdir: pathlib.Path) -> dict:
  """Runs each step not yet done as `python scripts/<script> ...`, logging to <workdir>/<name>.log; returns
  {name: {"seconds", "skipped"}} plus the distillation's selection (also <workdir>/recipe.json)."""
  workdir.mkdir(parents=True, exist_ok=True)
  summary = {}
  for name, argv, output in steps:
    if output.exists():
      summary[name] = {"seconds": 0.0, "skipped": True}
      continue
    start = time.perf_counter()
    log = workdir / f"{name}.log"
    with open(log, "w", encoding="utf-8") as f:
      done = subprocess.run([sys.executable, str(SCRIPTS / argv[0]), *argv[1:]], stdout=f, stderr=subprocess.STDOUT,
                            check=False)
    if done.returncode:
      raise errors.TrainError(f"recipe step {name} ({argv[0]}) exited {done.returncode}; its output is in {log}")
    summary[name] = {"seconds": round(time.perf_counter() - start, 1), "skipped": False}
  trained = json.loads((workdir / "train" / "summary.json").read_text(encoding="utf-8"))
  summary["selection"] = trained.get("selection")
  summary["dev_metrics_best"] = trained.get("dev_metrics_best")
  (workdir / DONE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
  return summary
