"""Builds the embedded default under maxscore/assets/default/: a small reranker that has learned local text.

  python scripts/build_default_assets.py          # about 28 min on 2 CPU cores; resumes where a killed run stopped

Steps (everything from the running Python's own files; deterministic in the seed and the Python version):
  1. pydoc_rerank.jsonl: rerank queries in the JSONL form with a train/dev/test `split` field: query = a
     section title of the Python reference (pydoc_data), candidates = paragraphs; grade 2 = a paragraph
     of that section, 1 = of the same topic, 0 = elsewhere. Paragraphs are cut with a fixed layout
     tokenizer (sentencepiece, `layout_vocab_size`, trained on the topics), so the set does not move
     when the model's tokenizer does. pydoc_beir/: the same queries over the whole corpus in the BEIR
     layout, with BM25's top `bm25_top_k` per query as bm25.trec (maxscore/lm/default_set.py).
     `--data_only` rebuilds just these files (seconds) and stops.
  2. Pretraining (maxscore/lm/pretrain.py with configs/pretrain.yml): a tokenizer and a Qwen3-family
     decoder (configs/models/pydoc-qwen3.yml) trained on the reference topics and the standard library,
     without the sections of the dev and test queries -> <workdir>/pretrained.
  3. Fine-tuning pairs (maxscore/lm/pairs.py): section titles and docstring summaries against their
     paragraphs, hard negatives from BM25, none from a dev/test section -> <workdir>/finetune_pairs.jsonl.
  4. Fine-tuning the whole model with an lm_labels score head (maxscore/heads/train.py, train_backbone,
     listwise loss plus the match losses; dev = the rerank set's dev split) on candidates cut short
     -> <workdir>/finetuned.
  5. The same again from <workdir>/finetuned on whole candidates (finetune_full_steps > 0)
     -> <workdir>/finetuned_full; the last stage is copied to pydoc-tiny-qwen3/ (params, tokenizer, head/).
  6. manifest.json: sizes, counts, the pretraining and fine-tuning summaries.
The runs in <workdir> are resumable: a killed build restarted with the same flags continues them.
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

from absl import flags, logging

from maxscore import cli
from maxscore import config as config_lib
from maxscore import errors
from maxscore.checkpoints.tokenizer import load_tokenizer
from maxscore.files import safety
from maxscore.heads import train as train_lib
from maxscore.heads import train_config
from maxscore.lm import corpus as corpus_lib
from maxscore.lm import default_set
from maxscore.lm import pairs as pairs_lib
from maxscore.lm import pretrain as pretrain_lib
from maxscore.rerank import data
from maxscore.rerank.eval import PromptConfig
from maxscore.testing.tokenizers import sample_texts


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
  data_only: bool = False
  overwrite: bool = False

  def validate(self) -> "AssetOptions":
    """Every bad value named by its key, all at once."""
    at_least = {"min_tokens": 1, "num_candidates": 2, "layout_vocab_size": 256, "finetune_queries": 1,
                "finetune_steps": 1, "finetune_batch_size": 1, "pretrain_steps": 0, "finetune_keyword_queries": 0,
                "finetune_match_weight": 0, "finetune_warmup_steps": 0, "finetune_max_item_tokens": 0,
                "finetune_full_steps": 0, "finetune_full_warmup_steps": 0, "bm25_top_k": 1}
    bad = [f"{k}={getattr(self, k)} must be >= {v}" for k, v in at_least.items() if getattr(self, k) < v]
    if self.max_tokens < self.min_tokens:
      bad.append(f"max_tokens={self.max_tokens} must be >= min_tokens={self.min_tokens}")
    bad += [f"{k}={getattr(self, k)!r} must be one of {list(train_config.COVERAGE_ON)}"
            for k in ("finetune_coverage_on", "finetune_full_coverage_on")
            if getattr(self, k) not in train_config.COVERAGE_ON]
    if bad:
      raise ValueError("; ".join(bad))
    return self


ENTRY = "assets"
OUTPUT_KIND = "default_assets"  # the marker of a --output_dir this build wrote
SECTIONS = {"assets": AssetOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/assets.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)




def _dir_bytes(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _write_jsonl(path: pathlib.Path, records: list[dict]) -> None:
  safety.atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def rerank_data(o: AssetOptions, tok) -> default_set.DefaultSet:
  """Step 1's files (both forms of the rerank set and the BM25 run), paragraphs cut with `tok`."""
  return default_set.build_files(tok, o.seed, o.num_candidates, o.min_tokens, o.max_tokens, o.bm25_top_k)


def layout_tokenizer(directory, o: AssetOptions):
  """The fixed tokenizer that cuts the rerank set's paragraphs (trained on the topics, in `directory`)."""
  tok = load_tokenizer(corpus_lib.train_tokenizer(directory, sample_texts(), o.layout_vocab_size))
  for label in ("Yes", "No"):
    tok.label_id(label)  # raises unless a single token
  return tok


def _write_rerank_data(out: pathlib.Path, built: default_set.DefaultSet) -> pathlib.Path:
  jsonl = out / data.DEFAULT_JSONL.name
  _write_jsonl(jsonl, built.records)
  for name, text in built.beir.items():
    path = out / default_set.BEIR_DIR / name
    path.parent.mkdir(parents=True, exist_ok=True)
    safety.atomic_write_text(path, text)
  return jsonl


def _data(o: AssetOptions, out: pathlib.Path,
          work: pathlib.Path) -> tuple[pathlib.Path, list[dict], pathlib.Path, dict]:
  """Steps 1 and 3: the rerank set and the fine-tuning pairs, paragraphs cut with the layout tokenizer."""
  with tempfile.TemporaryDirectory() as tmp:
    tok = layout_tokenizer(tmp, o)
    built = rerank_data(o, tok)
    records = built.records
    held = {corpus_lib.section_index(r["qid"]) for r in records if r["split"] in ("dev", "test")}
    docs = corpus_lib.collect(held, ("docstrings",)).texts
    pairs = pairs_lib.build_pairs(tok, corpus_lib.pydoc_sections(), held, docs, seed=o.seed,
                                  num_candidates=o.finetune_candidates, max_queries=o.finetune_queries,
                                  hard_negatives=o.finetune_hard_negatives,
                                  keyword_queries=o.finetune_keyword_queries,
                                  min_tokens=o.min_tokens, max_tokens=o.max_tokens)
  jsonl, pairs_file = _write_rerank_data(out, built), work / "finetune_pairs.jsonl"
  _write_jsonl(pairs_file, pairs)
  info = {"queries": len(pairs), "from": dict(collections.Counter(
      "keywords" if r["qid"].startswith("ft-kw-") else "pydoc" if r["qid"].startswith("ft-pydoc") else "docstrings"
      for r in pairs))}
  return jsonl, records, pairs_file, info


def _pretrain(o: AssetOptions, work: pathlib.Path, jsonl: pathlib.Path) -> dict:
  """Step 2: configs/pretrain.yml's settings, the run in <workdir>/pretrain, the model in <workdir>/pretrained."""
  loaded = config_lib.load_entry("pretrain", {"run": pretrain_lib.PretrainRun, "pretrain": pretrain_lib.PretrainConfig})
  run = dataclasses.replace(loaded["run"], jsonl=str(jsonl), workdir=str(work / "pretrain"),
                            export_dir=str(work / "pretrained"), tokenizer_path=None)
  cfg = loaded["pretrain"]
  cfg = dataclasses.replace(cfg, num_steps=o.pretrain_steps or cfg.num_steps, seed=o.seed)
  return pretrain_lib.run_pretraining(run, cfg)


def _finetune(o: AssetOptions, work: pathlib.Path, jsonl: pathlib.Path, pairs: pathlib.Path) -> dict:
  """Step 4: the whole model and an lm_labels head trained on the pairs, candidates cut to
  finetune_max_item_tokens (dev: the rerank set's dev split, cut alike) -> <workdir>/finetuned."""
  return _finetune_stage(o, work, jsonl, pairs, "pretrained", "finetune", "finetuned", o.finetune_steps,
                         o.finetune_learning_rate, o.finetune_warmup_steps, o.finetune_max_item_tokens,
                         o.finetune_coverage_on)


def _finetune_full(o: AssetOptions, work: pathlib.Path, jsonl: pathlib.Path, pairs: pathlib.Path) -> dict:
  """Step 5: <workdir>/finetuned trained on again with whole candidates (a fresh head: its head is
  not read) -> <workdir>/finetuned_full. Short candidates teach matching fast; whole ones what the eval reads."""
  return _finetune_stage(o, work, jsonl, pairs, "finetuned", "finetune_full", "finetuned_full",
                         o.finetune_full_steps, o.finetune_full_learning_rate, o.finetune_full_warmup_steps, 0,
                         o.finetune_full_coverage_on)


def _finetune_stage(o: AssetOptions, work: pathlib.Path, jsonl: pathlib.Path, pairs: pathlib.Path, base: str,
                    run: str, export: str, steps: int, learning_rate: float, warmup_steps: int,
                    max_item_tokens: int, coverage_on: str) -> dict:
  cfg = train_config.TrainConfig(train_backbone=True, loss="listwise", batch_size=o.finetune_batch_size,
                                 num_steps=steps, learning_rate=learning_rate, warmup_steps=warmup_steps,
                                 eval_every=50, save_every=50, log_every=10, seed=o.seed,
                                 match_loss_weight=o.finetune_match_weight, coverage_on=coverage_on)
  return train_lib.train(cfg, PromptConfig(max_item_tokens=max_item_tokens), str(work / base),
                         data.load_jsonl(pairs, "train"), data.load_jsonl(jsonl, "dev"), work / run,
                         export_dir=work / export)


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    o = cli.entry_from_flags(fv, ENTRY, SECTIONS)["assets"]
  out, work = pathlib.Path(o.output_dir or data.DEFAULT_DIR), pathlib.Path(o.workdir)
  if o.data_only:
    with tempfile.TemporaryDirectory() as tmp:
      built = rerank_data(o, layout_tokenizer(tmp, o))
    out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {_write_rerank_data(out, built)} and {out / default_set.BEIR_DIR}")
    return
  with cli.one_line_errors():
    if work.resolve() in (out.resolve(), *out.resolve().parents):
      raise errors.UnsafeOutputError(f"--output_dir {out} lies inside --workdir {work} (which --overwrite "
                                     "removes); choose an output directory outside it")
    packaged = safety.resolve(out) == safety.resolve(data.DEFAULT_DIR)  # the repository's own, rebuilt in place
    if not packaged:
      safety.check_output_dir(out, OUTPUT_KIND, [work], "--output_dir")
    if o.overwrite:
      safety.remove_owned(work, "--workdir")
    safety.prepare_output_dir(work, "default_build", [out], "--workdir")
    if not packaged:
      safety.prepare_output_dir(out, OUTPUT_KIND, [work], "--output_dir")
  t = time.perf_counter()
  jsonl, records, pairs, pairs_info = _data(o, out, work)
  logging.info("build: rerank set and %d fine-tuning queries in %.0f s", pairs_info["queries"], time.perf_counter() - t)
  pre = _pretrain(o, work, jsonl)
  logging.info("build: pretrained in %.0f s (held-out perplexity %s, unigram %s)", pre["wall_seconds"],
               pre["held_out_final"], pre["unigram_held_out"])
  fine = _finetune(o, work, jsonl, pairs)
  fine["pairs"] = pairs_info
  logging.info("build: fine-tuned in %.0f s (dev %s -> %s)", fine["throughput"]["wall_seconds"],
               fine["dev_metrics_initial"], fine["dev_metrics_final"])
  full = _finetune_full(o, work, jsonl, pairs) if o.finetune_full_steps else None
  if full:
    logging.info("build: fine-tuned on whole candidates in %.0f s (dev %s -> %s)",
                 full["throughput"]["wall_seconds"], full["dev_metrics_initial"], full["dev_metrics_final"])
  ckpt = out / data.DEFAULT_CHECKPOINT.name
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{ckpt.name}.", suffix=".tmp", dir=out))
  shutil.copytree(work / ("finetuned_full" if full else "finetuned"), tmp, dirs_exist_ok=True,
                  ignore=shutil.ignore_patterns(safety.MARKER))
  safety.swap_dir(tmp, ckpt)  # the output directory is the build's own (checked above)
  logging.info("wrote %s", out)
  manifest = _manifest(o, out, ckpt, jsonl, records, pre, fine, full)
  safety.atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
  print(json.dumps(manifest, indent=2))


def _manifest(o: AssetOptions, out: pathlib.Path, ckpt: pathlib.Path, jsonl: pathlib.Path, records: list[dict],
              pre: dict, fine: dict, full: Optional[dict]) -> dict:
  splits = collections.Counter(r["split"] for r in records)
  model = pre["model"]
  return {
      "seed": o.seed,
      "python": sys.version.split()[0],
      "source": "pydoc_data.topics and the standard library of this Python (maxscore/lm/corpus.py)",
      "model": {"checkpoint": ckpt.name, "init": "pretrained on local text, then fine-tuned as a reranker",
                "vocab_size": model["vocab_size"], "hidden_size": model["hidden_size"],
                "num_layers": model["num_layers"], "params": pre["params"], "bytes": _dir_bytes(ckpt)},
      "pretraining": {k: pre.get(k) for k in ("steps", "train_tokens", "epochs", "held_out_tokens", "held_out_final",
                                               "unigram_held_out", "held_out_copy_probe", "tokens_per_s", "wall_seconds",
                                               "data")},
      "finetuning": {"pairs": fine["pairs"], "steps": fine["steps"], "train_config": fine["train_config"],
                     "dev_metrics_initial": fine["dev_metrics_initial"], "dev_metrics_final": fine["dev_metrics_final"],
                     "wall_seconds": fine["throughput"]["wall_seconds"]},
      "finetuning_whole_candidates": full and {
          k: full[k] for k in ("steps", "train_config", "dev_metrics_initial", "dev_metrics_final")} | {
              "wall_seconds": full["throughput"]["wall_seconds"]},
      "rerank_set": {"file": jsonl.name, "queries": len(records), "splits": dict(sorted(splits.items())),
                     "candidates_per_query": o.num_candidates, "bytes": jsonl.stat().st_size,
                     "paragraph_tokens": [o.min_tokens, o.max_tokens],
                     "grades": {"2": "paragraph of the query's section", "1": "paragraph of the same topic",
                                "0": "unjudged (another topic)"}},
  }


if __name__ == "__main__":
  cli.run_script(main, define_flags)  # quiet console: library INFO with -v only (no log file inside the output)
