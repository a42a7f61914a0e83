"""How much a trained score head helps: heads x seeds, dev and test, against no head.

    report = study(checkpoint_dir=None, jsonl=None, specs=("lm_labels", "linear"), seeds=(0, 1, 2),
                   workdir="out/head_study")

For every head spec (x learning rate x loss, when given) and seed, one training run (train.train, features cached per split) gives the
final head; its nDCG@10 (and the other eval metrics) on the dev and the test split come from the
trainer's own dev evaluation, run once with each split as the "dev" set (training never reads the
dev set, so both runs end with the same params: checked by digest). The first seed of each spec is
exported and re-scored by eval.run_eval on both splits for per-query metrics, which
compare.compare_per_query tests against the backbone scored without a head (paired t and randomization
tests, Holm-Bonferroni across the exported heads of a split). A BM25
ranking over lowercase words is reported beside them as a reference for what the data allows
(it is no maxscore scoring path).
"""

import collections
import dataclasses
import itertools
import pathlib
from typing import Any, Optional, Sequence

import numpy as np

from maxscore.datasets import bm25, data
from maxscore.errors import TrainError
from maxscore.files import safety
from maxscore.rerank import compare, eval as eval_lib, metrics
from maxscore.scoring import loading
from maxscore.training.reranker import train as train_lib
from maxscore.training.reranker.config import TrainConfig

# Named head settings (TrainConfig's flat keys); the rest are TrainConfig's defaults.
SPECS: dict[str, dict[str, Any]] = {
    "lm_labels": {"head": "lm_labels", "delta": "full"},
    "lm_labels_low_rank": {"head": "lm_labels", "delta": "low_rank"},
    "linear": {"head": "linear", "num_outputs": 1},
    "mlp": {"head": "mlp", "num_outputs": 1},
}
SPLITS = ("dev", "test")


@dataclasses.dataclass(frozen=True)
class StudyOptions:
  """scripts/head_study.py's settings (configs/study.yml documents each key)."""
  checkpoint_dir: Optional[str] = None
  jsonl: Optional[str] = None
  specs: tuple[str, ...] = ("lm_labels", "lm_labels_low_rank", "linear")
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  learning_rates: tuple[float, ...] = ()
  losses: tuple[str, ...] = ()
  max_queries: int = 0
  num_epochs: int = 20
  workdir: str = "out/head_study"
  output_json: Optional[str] = None

  def validate(self) -> "StudyOptions":  # specs, seeds and losses are checked by study() and TrainConfig
    if self.max_queries < 0 or self.num_epochs < 1:
      raise TrainError(f"max_queries={self.max_queries} must be >= 0 and num_epochs={self.num_epochs} >= 1")
    return self


def bm25_run(dataset: data.RerankSet, k1: float = 1.2, b: float = 0.75) -> dict[str, dict[str, float]]:
  """BM25 scores of each query's candidates (`datasets.bm25`: lowercase [a-z] words); idf and the
  average length come from the distinct candidates of `dataset` (a reference ranking, not a model)."""
  texts = {d: t for q in dataset.queries for d, t in q.candidates}
  row = {d: i for i, d in enumerate(texts)}
  index = bm25.BM25Index(list(texts.values()), k1, b)
  run = {}
  for q in dataset.queries:
    scores = index.scores(q.query)
    run[q.qid] = {d: float(scores[row[d]]) for d, _ in q.candidates}
  return run


def study(checkpoint_dir: Optional[str], jsonl: Optional[str], specs: Sequence[str], seeds: Sequence[int],
          workdir: str, prompt: eval_lib.EvalConfig = eval_lib.EvalConfig(), overrides: Sequence[str] = (),
          max_queries: int = 0, learning_rates: Sequence[Optional[float]] = (None,),
          losses: Sequence[Optional[str]] = (None,), **train_kw: Any) -> dict[str, Any]:
  """Trains every spec x learning rate x loss x seed (None = TrainConfig's default); returns
  {"baseline", "bm25", "runs", "paired"} (see the module docstring; "paired" is keyed by the
  setting's name, for its first seed)."""
  unknown = [s for s in specs if s not in SPECS]
  if unknown or not specs or not seeds:
    raise TrainError(f"specs {list(specs)} / seeds {list(seeds)}: need >= 1 of each, specs from "
                     f"{sorted(SPECS)}")
  work = pathlib.Path(workdir)
  jsonl = jsonl or str(data.DEFAULT_JSONL)
  inputs = [jsonl, None if str(checkpoint_dir).lower() == "none" else checkpoint_dir or data.DEFAULT_CHECKPOINT]
  safety.check_output_dir(work, "head_study", inputs, "--workdir")
  sets = {s: data.load_jsonl(jsonl, split=s) for s in ("train",) + SPLITS}
  safety.prepare_output_dir(work, "head_study", inputs, "--workdir")
  safety.claim(work)
  if max_queries:
    for s in sets.values():
      s.queries = s.queries[:max_queries]

  def evaluate(scorer, split: str, name: str) -> dict[str, dict[str, float]]:
    report = eval_lib.run_eval(scorer, sets[split], prompt, work / "eval" / f"{name}-{split}", overwrite=True,
                               progress=False)
    return report.per_query

  base = loading.build_scorer(checkpoint_dir, overrides, use_head=False)
  baseline = {s: evaluate(base, s, "no_head") for s in SPLITS}
  out: dict[str, Any] = {
      "baseline": {s: metrics.aggregate(pq) for s, pq in baseline.items()},
      "bm25": {s: metrics.aggregate(metrics.evaluate(sets[s].qrels, bm25_run(sets[s]), prompt.metrics))
               for s in SPLITS},
      "runs": [], "paired": {}}
  exported: dict[str, dict[str, metrics.PerQuery]] = {s: {} for s in SPLITS}  # split -> setting -> per query
  for spec, lr, loss in itertools.product(specs, learning_rates, losses):
    setting = {**train_kw, **SPECS[spec]}
    setting.update({k: v for k, v in (("learning_rate", lr), ("loss", loss)) if v is not None})
    name = spec + "".join(f" {k}={v}" for k, v in (("lr", lr), ("loss", loss)) if v is not None)
    tag = name.replace(" ", "_").replace("=", "")
    for seed in seeds:
      cfg = TrainConfig.of(**{**setting, "seed": seed, "eval_every": 0})
      export = work / f"{tag}-s{seed}-export" if seed == seeds[0] else None
      finals, digests = {}, set()
      for split in SPLITS:
        summary = train_lib.train(cfg, prompt, checkpoint_dir, sets["train"], sets[split],
                                  work / f"{tag}-s{seed}-{split}", overrides=overrides,
                                  feature_cache=work / f"features-{split}.npz", overwrite=True, progress=False,
                                  export_dir=export if split == SPLITS[-1] else None)
        finals[split] = summary["dev_metrics_final"]
        digests.add(summary["params_sha256"])
      if len(digests) != 1:
        raise RuntimeError(f"{name} seed {seed}: the dev set changed the trained head ({sorted(digests)})")
      out["runs"].append({"name": name, "spec": spec, "seed": seed, "config": dataclasses.asdict(cfg), **finals})
      if export is not None:
        scorer = loading.build_scorer(str(export), overrides)
        for s in SPLITS:
          exported[s][name] = evaluate(scorer, s, f"{tag}-s{seed}")
  out["paired"] = paired_tests(baseline, exported)
  return out


def paired_tests(baseline: dict[str, metrics.PerQuery], exported: dict[str, dict[str, metrics.PerQuery]],
                 metric: str = "ndcg_cut_10") -> dict[str, dict[str, dict[str, Any]]]:
  """setting -> split -> its test against no head on `metric` (compare's test record, Holm-adjusted over
  the settings compared on that split)."""
  paired: dict[str, dict[str, dict[str, Any]]] = {}
  for s, heads in exported.items():
    if not heads:
      continue
    c = compare.compare_per_query({"no head": baseline[s], **heads}, [metric], baseline="no head")
    for t in c.tests:
      paired.setdefault(t["run"], {})[s] = t
  return paired


def markdown(report: dict[str, Any], metric: str = "ndcg_cut_10") -> str:
  """The report as a markdown table (mean, min-max over seeds) plus the paired tests."""
  rows = ["| system | " + " | ".join(SPLITS) + " |", "|---|" + "---|" * len(SPLITS)]
  rows.append("| no head (untrained) | " + " | ".join(f"{report['baseline'][s][metric]:.4f}" for s in SPLITS) + " |")
  by_spec = collections.defaultdict(list)
  for r in report["runs"]:
    by_spec[r["name"]].append(r)
  for spec, runs in by_spec.items():
    cells = []
    for s in SPLITS:
      v = [r[s][metric] for r in runs]
      cells.append(f"{v[0]:.4f}" if len(v) == 1 else f"{np.mean(v):.4f} ({min(v):.4f}-{max(v):.4f})")
    seeds = ",".join(str(r["seed"]) for r in runs)
    label = f"seed {seeds}" if len(runs) == 1 else f"seeds {seeds}: mean (min-max)"
    rows.append(f"| {spec}, {label} | " + " | ".join(cells) + " |")
  rows.append("| BM25 reference | " + " | ".join(f"{report['bm25'][s][metric]:.4f}" for s in SPLITS) + " |")
  lines = ["\n".join(rows), ""]
  for spec, tests in report["paired"].items():
    for s, t in tests.items():
      lines.append(f"{spec} seed {by_spec[spec][0]['seed']} vs no head, {s}: {t['delta']:+.4f} over "
                   f"{t['queries']} queries, {t['wins']} wins / {t['losses']} losses / {t['ties']} ties, "
                   f"paired t p = {t['p_t']:.3f}, randomization p = {t['p_randomization']:.3f} "
                   f"(Holm over {len(report['paired'])} heads: {t['p_randomization_holm']:.3f})")
  return "\n".join(lines)
