"""What a reranker training run writes: its output checks before any work, summary.json's contents (with the
run's throughput), and the exports (a checkpoint with the trained weights, or LoRA adapters with their head).
"""

import dataclasses
import json
import os
import pathlib
import shutil
from typing import Any, Optional

import jax

from maxscore.checkpoints import adapters as lora_lib
from maxscore.checkpoints import head_storage
from maxscore.datasets import data
from maxscore.errors import TrainError
from maxscore.files import identity, safety
from maxscore.rerank.prompts import PromptConfig
from maxscore.scoring.scorer import Scorer
from maxscore.training import trainer
from maxscore.training.metrics_log import MetricsLog
from maxscore.training.reranker.config import TrainConfig
from maxscore.training.reranker.prepare import Prepared
from maxscore.training.reranker.sources import Source

def prepare_outputs(workdir: pathlib.Path, export_dir: Optional[os.PathLike], overwrite: bool,
                     checkpoint_dir: Optional[str], feature_cache: Optional[os.PathLike], data_paths,
                     adapters_dir: Optional[os.PathLike] = None) -> None:
  """Refuses, before any work, outputs that are inputs or foreign directories; then (re)creates the
  workdir (--overwrite removes it only when maxscore wrote it)."""
  random_init = checkpoint_dir is not None and str(checkpoint_dir).lower() == "none"
  base = None if random_init else (checkpoint_dir or data.DEFAULT_CHECKPOINT)  # None: the embedded default
  if export_dir and base is None:
    raise TrainError(f"--export_dir={export_dir} copies the base checkpoint (config, tokenizer) with the trained "
                     f"weights, and --checkpoint_dir=none (a random-init model) has none; give --checkpoint_dir "
                     f"or leave out --export_dir")
  # A feature cache inside the workdir is the run's own (written by it, reused on resume, removed with the
  # workdir by --overwrite), not an input the workdir would hold.
  own_cache = feature_cache is not None and safety.resolve(workdir) in safety.resolve(feature_cache).parents
  inputs = [i for i in (base, None if own_cache else feature_cache, *data_paths) if i is not None]
  safety.refuse_overlap([workdir], inputs, "--workdir")
  if export_dir and (base is None or safety.resolve(export_dir) != safety.resolve(base)):  # else: head/ into base
    safety.check_export_dir(export_dir, workdir, inputs, overwrite)
  if adapters_dir:
    if base is None:
      raise TrainError(f"--adapters_dir={adapters_dir} stores adapters against their base checkpoint, and "
                       f"--checkpoint_dir=none has none; give --checkpoint_dir")
    safety.check_export_dir(adapters_dir, workdir, [*inputs, export_dir], overwrite, "lora_adapters",
                            "--adapters_dir")
  if overwrite:
    safety.remove_owned(workdir, "--workdir")
  safety.prepare_output_dir(workdir, "head_training", inputs, "--workdir")


def carry_throughput(summary: dict[str, Any], previous: Optional[dict]) -> None:
  """A run restarted where its last finished process ended (nothing trained now) keeps that process's
  throughput, its wall seconds added to this one's."""
  if previous and previous.get("throughput"):
    summary["throughput"] = {**previous["throughput"], "wall_seconds": summary["throughput"]["wall_seconds"] +
                             (previous["throughput"].get("wall_seconds") or 0.0)}


def summary(cfg: TrainConfig, prompt: PromptConfig, prep: Prepared, scorer: Scorer, workdir: pathlib.Path,
            log: MetricsLog, step: int, steps_per_epoch: int, resume_step: Optional[int], final,
            timing: trainer.Timing, wall: float) -> dict[str, Any]:
  evals = [r for r in log.records if r["kind"] == "eval"]
  examples = prep.examples
  return {
      "workdir": str(workdir),
      "checkpoint_dir": scorer.config.runtime.checkpoint_dir,
      "head": prep.head_cfg.to_dict(),
      "train_config": cfg.flat(),
      "prompt": json.loads(json.dumps(dataclasses.asdict(prompt))),
      "label_ids": list(prep.label_ids),
      "train_queries": prep.num_train,
      "train_items": int(prep.grids["train"][1].sum()),
      "dev_queries": len(examples["dev"].requests) if "dev" in examples else 0,
      "steps": step,
      "steps_per_epoch": steps_per_epoch,
      "resumed_from_step": resume_step,
      "final_train_loss": next((r["loss"] for r in reversed(log.records) if r["kind"] == "train"), None),
      "dev_metrics_initial": next((metric_values(r) for r in evals if r["step"] == 0), None),
      "dev_metrics_final": metric_values(evals[-1]) if evals else None,
      "params_sha256": identity.tree_digest(final["head"]),
      "throughput": throughput(prep.source, examples, timing.step_seconds, timing.step_items,
                               timing.first_step_seconds, timing.eval_seconds, wall),
  }


DEV_RUNS = "dev_runs"  # <workdir>/dev_runs/step_<n>.trec: each dev evaluation's scores
DEV_RUN = "dev_run.trec"  # beside exported adapters: the dev scores of the step exported


def write_dev_run(workdir: pathlib.Path, step: int, run: dict[str, dict[str, float]]) -> None:
  """One dev evaluation's scores as a TREC run (float32 written exactly)."""
  lines = [line for qid, docs in run.items() for line in data.trec_lines(qid, list(docs), list(docs.values()),
                                                                          "dev")]
  (workdir / DEV_RUNS).mkdir(exist_ok=True)
  safety.atomic_write_text(workdir / DEV_RUNS / f"step_{step}.trec", "\n".join(lines) + "\n")


def export(cfg: TrainConfig, prep: Prepared, scorer: Scorer, summary: dict[str, Any], final, workdir: pathlib.Path,
           overwrite: bool, export_dir: Optional[os.PathLike] = None, adapters_dir: Optional[os.PathLike] = None,
           step: Optional[int] = None) -> dict[str, str]:
  """The run's exports of the params `final` (of `step`), as {"export_dir": ..., "adapters_dir": ...} for those
  asked for. An existing export is replaced with `overwrite`, or when this workdir's earlier run wrote it.

  export_dir: the base checkpoint with the trained head (and backbone, when it trained; with LoRA, its adapters
  merged). adapters_dir: the LoRA adapters (lora.json + adapters/, with the base's digest) and the trained head
  (head/): eval_rerank.py --checkpoint_dir=<base> --adapters_dir=<it> scores as the merged export; with the dev
  scores of `step` (dev_run.trec) when that evaluation wrote them, which a copy of the adapters on the same base
  reproduces."""
  base = scorer.config.runtime.checkpoint_dir
  head_params = jax.device_get(final["head"])
  written = {}
  if export_dir:
    info = {k: summary[k] for k in ("train_config", "prompt", "label_ids", "train_queries", "steps",
                                    "dev_metrics_initial", "dev_metrics_final")}
    if "selection" in summary:
      info["selection"] = {k: summary["selection"][k] for k in ("metric", "best_step", "best_value", "stopped_at",
                                                                "reason")}
    # "." when the head was written into its own base checkpoint (paths of this machine mean
    # nothing inside a checkpoint that is copied elsewhere).
    info["base_checkpoint"] = "." if pathlib.Path(export_dir).resolve() == pathlib.Path(base).resolve() else base
    backbone = prep.source.export_backbone(final)  # None: the backbone stayed frozen
    written["export_dir"] = str(head_storage.export_checkpoint(
        base, export_dir, prep.head_cfg, head_params, info, backbone,
        overwrite=overwrite or safety.exported_by(export_dir, workdir), workdir=str(workdir)))
  if adapters_dir:
    out = lora_lib.save_adapters(adapters_dir, jax.device_get(final["backbone"]), cfg.lora, base,
                                 overwrite=overwrite or safety.exported_by(adapters_dir, workdir),
                                 workdir=str(workdir), base_quantization=scorer.quantization,
                                 base_quantization_group=scorer.quantization_group)
    info = {k: summary[k] for k in ("train_config", "prompt", "label_ids", "train_queries", "steps")}
    head_storage.save_head(out, prep.head_cfg, head_params, {**info, "base_checkpoint": base})
    dev_run = workdir / DEV_RUNS / f"step_{step}.trec"
    if step is not None and dev_run.is_file():
      shutil.copyfile(dev_run, pathlib.Path(out) / DEV_RUN)
    written["adapters_dir"] = str(out)
  return written


def metric_values(rec: dict) -> dict[str, float]:
  return {k: v for k, v in rec.items() if k not in ("kind", "step", "split")}


def throughput(source: Source, examples, step_seconds, step_items, first_step_seconds, eval_seconds,
               wall) -> dict[str, Any]:
  """Examples (query-item pairs) per second of head training, and where the time went (a frozen backbone's
  forward counted when it ran, not when its features were read from the cache)."""
  feature_seconds, cached = source.feature_seconds, source.from_cache
  extracted = not (source.trains_backbone or cached)
  extracted_items = sum(int(ex.grid()[1].sum()) for ex in examples.values()) if extracted else 0
  busy = feature_seconds + step_seconds + (first_step_seconds or 0.0) + eval_seconds
  return {
      "train_items_per_s": step_items / step_seconds if step_seconds else None,
      "train_seconds": step_seconds,
      "first_step_seconds": first_step_seconds,
      "frozen_forward_seconds": feature_seconds,
      "frozen_forward_items_per_s": extracted_items / feature_seconds if feature_seconds else None,
      "frozen_forward_share": feature_seconds / busy if busy else None,
      "features_from_cache": cached,
      "eval_seconds": eval_seconds,
      "wall_seconds": wall,
  }
