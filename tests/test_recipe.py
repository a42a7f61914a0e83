"""The default's fine-tuning recipe: its steps are commands the public scripts accept, run in order, each
skipped once its output exists, and a failing step is one error naming its log."""

import pathlib

import pytest
from absl import flags

from maxscore import cli, errors
from maxscore.datasets import data
from maxscore.lm import assets, recipe
from maxscore.testing.scripts import load_script


def _steps(tmp_path):
  return recipe.commands(assets.AssetOptions().validate(), data.DEFAULT_DOCS_DIR, data.DEFAULT_CHECKPOINT,
                         tmp_path / "recipe")


def test_recipe_steps_are_the_public_scripts_with_flags_they_accept(tmp_path):
  steps = _steps(tmp_path)
  assert [(name, argv[0]) for name, argv, _ in steps] == [
      ("mine", "mine_negatives.py"), ("teacher", "score_teacher.py"), ("distil", "train_reranker.py")]
  for _, argv, _ in steps:
    script = load_script(argv[0].removesuffix(".py"))
    fv = flags.FlagValues()
    script.define_flags(fv)
    assert fv(["prog", *argv[1:]], known_only=False)[1:] == []
    cli.entry_from_flags(fv, script.ENTRY, script.SECTIONS)
  # Each step reads what the one before wrote; the distillation keeps the best dev step.
  (_, mine, groups), (_, teacher, scored), (_, distil, model) = steps
  assert f"--output={groups}" in mine and f"--groups_file={groups}" in teacher
  assert f"--output={scored}" in teacher and f"--groups_file={scored}" in distil
  assert "--loss=distill" in distil and "--select_metric=ndcg@10" in distil and "--split=train" in mine
  assert model == tmp_path / "recipe" / "model" / "head"


def test_recipe_runs_in_order_skips_finished_steps_and_names_a_failure(tmp_path, monkeypatch):
  scripts = tmp_path / "scripts"
  scripts.mkdir()
  (scripts / "ok.py").write_text("import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('x')\nprint('ran')\n")
  (scripts / "fail.py").write_text("import sys\nprint('broken input')\nsys.exit(2)\n")
  monkeypatch.setattr(recipe, "SCRIPTS", scripts)
  work = tmp_path / "work"
  (work / "train").mkdir(parents=True)
  (work / "train" / "summary.json").write_text('{"selection": {"best_step": 50}, "dev_metrics_best": {"n": 1}}')
  first, second = work / "a.out", work / "b.out"
  second.write_text("done before")
  summary = recipe.run([("a", ["ok.py", str(first)], first), ("b", ["ok.py", str(second)], second)], work)
  assert first.read_text() == "x" and second.read_text() == "done before"
  assert summary["a"]["skipped"] is False and summary["b"] == {"seconds": 0.0, "skipped": True}
  assert summary["selection"] == {"best_step": 50} and (work / recipe.DONE).exists()
  assert (work / "a.log").read_text() == "ran\n"
  with pytest.raises(errors.TrainError, match=r"recipe step c \(fail.py\) exited 2; its output is in .*c.log"):
    recipe.run([("c", ["fail.py"], work / "c.out")], work)
  assert (work / "c.log").read_text() == "broken input\n"
