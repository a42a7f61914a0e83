"""Entry-point settings: every configs/<entry>.yml documents its sections' keys with the dataclass
defaults, flags come from the YAML, bad values are one-line ConfigErrors, and every example command
in the README's and the guides' (docs/*.md) code blocks parses against its script's flags and the config."""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from absl import flags

from maxscore import cli, config as config_lib
from maxscore.config import ConfigError, load_config
from maxscore.distributed import processes

REPO = pathlib.Path(__file__).resolve().parent.parent
ENTRY_SCRIPTS = ["bench", "bench_corpus", "bench_eval", "bench_listwise_cost", "bench_serve", "bench_train", "build_default_assets", "build_question_sets", "compare_runs",
                 "compile_check",
                 "convert_gguf_checkpoint", "convert_hf_checkpoint", "eval_rerank", "eval_suite",
                 "export_hf_checkpoint", "gpu_check", "head_study", "mine_negatives", "package_reranker", "plot_runs", "pretrain_lm", "profile_shares",
                 "score", "score_teacher", "serve", "train_reranker", "train_score_head"]


def test_every_script_is_an_entry_of_the_one_config_system():
  assert sorted(p.stem for p in (REPO / "scripts").glob("*.py")) == sorted(ENTRY_SCRIPTS)


@pytest.mark.parametrize("name", ENTRY_SCRIPTS)
def test_entry_yaml_documents_every_key_with_the_dataclass_default(load_script, name):
  script = load_script(name)
  path = config_lib.CONFIG_DIR / f"{script.ENTRY}.yml"
  values, comments = yaml.safe_load(path.read_text()), config_lib.read_comments(path)
  loaded = config_lib.load_entry(script.ENTRY, script.SECTIONS)
  for section, cls in script.SECTIONS.items():
    assert loaded[section] == cls(), f"{path}: defaults of {cls.__name__} drifted from the dataclass"
  assert set(values) == set(config_lib.entry_keys(script.SECTIONS))
  assert all(comments[k] for k in values), [k for k in values if not comments[k]]


@pytest.mark.parametrize("name", ENTRY_SCRIPTS)
def test_flags_are_the_yaml_keys(load_script, name):
  script = load_script(name)
  fv = flags.FlagValues()
  script.define_flags(fv)
  fv(["prog"])
  loaded = cli.entry_from_flags(fv, script.ENTRY, script.SECTIONS)
  assert loaded == config_lib.load_entry(script.ENTRY, script.SECTIONS)


def test_null_on_the_command_line_is_none_for_a_key_that_may_be_none(load_script):
  """`--select_metric=null` means what `select_metric: null` means in configs/train.yml (the last step)."""
  script = load_script("train_reranker")
  fv = flags.FlagValues()
  script.define_flags(fv)
  fv(["prog", "--select_metric=null", "--patience=0"])
  loaded = cli.entry_from_flags(fv, script.ENTRY, script.SECTIONS)
  assert loaded["train"].select_metric is None
  fv = flags.FlagValues()
  script.define_flags(fv)
  fv(["prog", "--select_metric=ndcg@10"])
  assert cli.entry_from_flags(fv, script.ENTRY, script.SECTIONS)["train"].select_metric == "ndcg@10"


@pytest.mark.parametrize("name", ["train_reranker", "eval_rerank", "eval_suite", "serve", "score_teacher"])
def test_template_help_lists_every_template_of_the_registry(load_script, name):
  """--help lists the templates from maxscore/rerank/prompts.py TEMPLATES (bge_gemma trains too), not a
  hand-written list."""
  from maxscore.rerank.prompts import TEMPLATES  # pylint: disable=import-outside-toplevel
  script = load_script(name)
  fv = flags.FlagValues()
  script.define_flags(fv)
  assert {"plain", "qwen3_reranker", "bge_gemma"} <= set(TEMPLATES)
  assert f"(one of: {' | '.join(TEMPLATES)})" in fv["template"].help


@pytest.mark.parametrize("argv, message", [
    (["--batch_size=0"], "batch_size=0 must be >= 1"),
    (["--learning_rate=-1"], "learning_rate=-1.0 must be > 0"),
    (["--learning_rate=nan"], "learning_rate=nan must be > 0 and finite"),
    (["--clip_norm=-1"], "clip_norm=-1.0 must be > 0 and finite"),
    (["--max_train_queries=-2"], "max_train_queries=-2 must be >= 0"),
])
def test_bad_entry_value_is_a_config_error(load_script, argv, message):
  script = load_script("train_score_head")
  fv = flags.FlagValues()
  script.define_flags(fv)
  fv(["prog"] + argv)
  with pytest.raises(ConfigError, match=re.escape(message)):
    cli.entry_from_flags(fv, script.ENTRY, script.SECTIONS)


TYPED_PARSERS = (flags.EnumParser, flags.IntegerParser, flags.FloatParser, flags.BooleanParser)


@pytest.mark.parametrize("name", ENTRY_SCRIPTS)
def test_every_typed_flag_given_a_bad_value_is_one_line_and_exit_2(load_script, name, capsys):
  """Enums, numbers and booleans of every script: maxscore's `error: ...` naming the flag and what it takes,
  not absl's FATAL and exit 1; unknown flags too. Parsing fails before main runs, so nothing loads."""
  script = load_script(name)
  fv = flags.FlagValues()
  script.define_flags(fv)
  typed = [f for f in fv if isinstance(fv[f].parser, TYPED_PARSERS)]
  assert typed or name == "plot_runs"  # plot_runs has string and list flags only
  for flag in typed + ["no_such_flag"]:
    with pytest.raises(SystemExit) as e:
      cli.run_with_fresh_flags(script.define_flags, script.main, ["prog", f"--{flag}=bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), (flag, err)
    assert f"--{flag}=bogus" in err or (flag == "no_such_flag" and "no_such_flag" in err), err
  if "score_mode" in fv and isinstance(fv["score_mode"].parser, flags.EnumParser):
    with pytest.raises(SystemExit):
      cli.run_with_fresh_flags(script.define_flags, script.main, ["prog", "--score_mode=bogus"])
    assert "takes one of " + ", ".join(fv["score_mode"].parser.enum_values) in capsys.readouterr().err


def test_a_bad_enum_on_the_command_line_is_one_line_and_exit_2(tmp_path):
  """The absl app path (cli.run_script), not only run(argv): no FATAL, no usage text."""
  r = subprocess.run([sys.executable, str(REPO / "scripts" / "score.py"), "--score_mode=bogus"], capture_output=True,
                     text=True, timeout=300, cwd=tmp_path, env=processes.subprocess_env(1))
  assert r.returncode == 2, r.stderr
  assert r.stderr.strip() == ("error: --score_mode=bogus is not valid: --score_mode takes one of probability, "
                              "raw_logit"), r.stderr
  assert list(tmp_path.iterdir()) == []


def test_unknown_entry_key_names_the_nearest(load_script):
  script = load_script("bench")
  with pytest.raises(ConfigError, match="did you mean num_items"):
    config_lib.load_entry(script.ENTRY, script.SECTIONS, {"num_itmes": 3})


# The pages whose code shows commands: the README and the task guides (not the design notes or the generated
# configuration reference).
DOC_PAGES = [REPO / "README.md"] + sorted(p for p in (REPO / "docs").glob("*.md")
                                          if p.name not in ("ARCHITECTURE.md", "configuration.md"))


def _readme_commands():
  """(script name, argv) of every `scripts/<name>.py ...` command in the DOC_PAGES' code (fenced or
  indented blocks), shell syntax around it removed ($VAR -> 0, `&`, `;`, quotes, comments)."""
  lines = []
  for page in DOC_PAGES:
    fenced = False
    for line in page.read_text().splitlines():
      if line.startswith("```"):
        fenced = not fenced
      elif fenced or line.startswith("    "):
        lines.append(line)
  out = []
  for cmd in "\n".join(lines).replace("\\\n", " ").splitlines():
    m = re.search(r"scripts/(\w+)\.py(.*)", cmd)
    if m:
      rest = re.split(r"[&;|#]", m.group(2))[0].replace('"', " ").replace("'", " ")
      rest = re.sub(r"\$\w+", "0", rest)
      out.append((m.group(1), [a for a in shlex.split(rest) if a not in ("...", "[--dtype=bfloat16]")]))
  return out


README_COMMANDS = _readme_commands()
RUN_LIST_SCRIPTS = ("compare_runs", "plot_runs")


def test_readme_has_example_commands():
  assert len(README_COMMANDS) >= 8


@pytest.mark.parametrize("name, args", README_COMMANDS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(README_COMMANDS)])
def test_readme_command_parses(load_script, name, args):
  """Its flags exist and take their values; trailing key=value arguments are valid config keys."""
  script = load_script(name)
  fv = flags.FlagValues()
  script.define_flags(fv)
  rest = fv(["prog"] + args, known_only=False)[1:]
  if hasattr(script, "SECTIONS"):
    cli.entry_from_flags(fv, script.ENTRY, script.SECTIONS)
  if name in RUN_LIST_SCRIPTS:  # trailing arguments are runs (`name=path` or a path), not config keys
    assert rest and all(a and not a.startswith("-") for a in rest), rest
    return
  overrides = [a for a in rest if "=" in a]
  load_config([o for o in overrides if not o.startswith("checkpoint_dir=")])
