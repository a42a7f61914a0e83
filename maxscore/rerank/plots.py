"""PNG plots for evaluation reports (matplotlib, Agg backend: no display needed).

* `per_query_delta`: one run minus the baseline on one metric, query by query, sorted (wins and losses).
* `metric_vs_depth`: a metric against the rerank depth k, one line per system.
* `training_curves`: train loss and the dev metric against the step, from a head's metrics.jsonl.

Each writes `path` at `size` inches x `dpi` (so the PNG is size * dpi pixels) in the format its suffix
names (.png, .pdf, .svg) and returns the path.
"""

import dataclasses
import json
import os
import pathlib
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt, ticker  # noqa: E402  (after the backend is chosen)

from maxscore.files import safety  # noqa: E402
from maxscore.rerank import metrics  # noqa: E402

SIZE = (8.0, 4.5)
DPI = 100


class PlotError(ValueError):
  """Nothing to plot, or a plot that would mislead; the message names the file, metric or flag."""


FORMATS = ("png", "pdf", "svg")  # written in the format the output's suffix names


def image_format(path: os.PathLike) -> str:
  """The format `path`'s suffix names; PlotError for any other suffix."""
  suffix = pathlib.Path(path).suffix.lower().lstrip(".")
  if suffix not in FORMATS:
    raise PlotError(f"output {path}: the suffix must name the image format, one of "
                    f"{['.' + f for f in FORMATS]}")
  return suffix


@dataclasses.dataclass(frozen=True)
class PlotOptions:
  """scripts/plot_runs.py's settings (configs/plot.yml documents each key)."""
  metric: str = "ndcg@10"
  output: Optional[str] = None

  def validate(self) -> "PlotOptions":
    metrics.canonical_name(self.metric)  # ValueError naming the valid forms
    if self.output:
      image_format(self.output)
    return self


def _save(fig, path: os.PathLike, dpi: int) -> pathlib.Path:
  path = pathlib.Path(path)
  fmt = image_format(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  with safety.atomic_output(path, "wb") as f:  # a killed run leaves the old picture or none
    fig.savefig(f, dpi=dpi, format=fmt)
  plt.close(fig)
  return path


def per_query_delta(deltas: Mapping[str, float], path: os.PathLike, *, run: str, baseline: str, metric: str,
                    size: tuple[float, float] = SIZE, dpi: int = DPI) -> pathlib.Path:
  """Bars of run - baseline per query, sorted descending: wins green, losses red, ties on the zero line."""
  if not deltas:
    raise PlotError(f"no per-query deltas to plot for {run} vs {baseline}")
  values = sorted(deltas.values(), reverse=True)
  fig, ax = plt.subplots(figsize=size)
  x = range(len(values))
  groups = (("wins", "tab:green", lambda v: v > 0), ("ties", "tab:gray", lambda v: v == 0),
            ("losses", "tab:red", lambda v: v < 0))
  for label, color, keep in groups:
    xs = [i for i in x if keep(values[i])]
    if label == "ties":  # zero-height bars would not show: a dot on the zero line
      ax.scatter(xs, [0.0] * len(xs), color=color, zorder=3, s=12, label=f"{label} ({len(xs)})")
    else:
      ax.bar(xs, [values[i] for i in xs], width=0.85, color=color, label=f"{label} ({len(xs)})")
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  ax.axhline(0.0, color="black", linewidth=0.8)
  mean = sum(values) / len(values)
  ax.axhline(mean, color="tab:blue", linestyle="--", linewidth=1.0, label=f"mean {mean:+.4f}")
  ax.set_title(f"{run} vs {baseline}: per-query {metric} difference ({len(values)} queries)")
  ax.set_xlabel("query (sorted by difference)")
  ax.set_ylabel(f"Δ {metric}")
  ax.legend(loc="upper right")
  return _save(fig, path, dpi)


def metric_vs_depth(series: Mapping[str, Sequence[tuple[int, float]]], path: os.PathLike, *, metric: str,
                    reference: str = "first stage", size: tuple[float, float] = SIZE,
                    dpi: int = DPI) -> pathlib.Path:
  """One line per system: `metric` at each rerank depth k (points sorted by k); the `reference` series
  (the first stage) dashed and gray."""
  if not series:
    raise PlotError("no series to plot against the rerank depth")
  fig, ax = plt.subplots(figsize=size)
  ks = sorted({k for points in series.values() for k, _ in points})
  for label, points in series.items():
    points = sorted(points)
    style = dict(color="gray", linestyle="--") if label == reference else {}
    ax.plot([k for k, _ in points], [v for _, v in points], marker="o", label=label, **style)
  ax.set_xscale("log", base=2)
  ax.set_xticks(ks, [str(k) for k in ks])
  ax.set_title(f"{metric} vs rerank depth")
  ax.set_xlabel("rerank depth k (candidates per query)")
  ax.set_ylabel(metric)
  ax.grid(True, alpha=0.3)
  ax.legend()
  return _save(fig, path, dpi)


def read_metrics_jsonl(path: os.PathLike) -> list[dict]:
  """The records of a training run's metrics.jsonl (a torn last line is passed over)."""
  try:
    text = pathlib.Path(path).read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise PlotError(f"{path} is not UTF-8 text (byte {e.start}): not a metrics.jsonl") from None
  records = []
  for line in text.splitlines():
    try:
      record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
      continue
    if isinstance(record, dict):
      records.append(record)
  return records


def training_curves(records: Sequence[Mapping], path: os.PathLike, *, dev_metric: str = "ndcg_cut_10",
                    size: tuple[float, float] = SIZE, dpi: int = DPI) -> pathlib.Path:
  """Train loss (left) and the dev metric (right) against the step, from metrics.jsonl records."""
  train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train" and "loss" in r and "step" in r]
  evals = [r for r in records if r.get("kind") == "eval" and "step" in r]
  dev = [(r["step"], r[dev_metric]) for r in evals if dev_metric in r]
  if not train:
    raise PlotError("no train loss records to plot (a train_score_head.py metrics.jsonl has them)")
  if not dev:
    logged = sorted({k for r in evals for k in r} - {"kind", "step", "split"})
    raise PlotError(f"the dev metric {dev_metric} was never logged; logged: {logged or 'no dev metric'}")
  fig, (left, right) = plt.subplots(1, 2, figsize=size)
  left.plot([s for s, _ in train], [v for _, v in train], color="tab:blue", label="train loss")
  left.set_title("train loss")
  left.set_xlabel("step")
  left.set_ylabel("loss")
  left.legend()
  right.plot([s for s, _ in dev], [v for _, v in dev], color="tab:orange", marker="o", label=f"dev {dev_metric}")
  right.set_title(f"dev {dev_metric}")
  right.set_xlabel("step")
  right.set_ylabel(dev_metric)
  right.legend()
  for ax in (left, right):
    ax.grid(True, alpha=0.3)
  return _save(fig, path, dpi)
