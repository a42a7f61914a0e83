"""Backbone fine-tuning throughput: tokens/s and % of the matmul peak (in the compute dtype) measured in the
same run, on this process's backend.

    report = train_bench.run(TrainBenchOptions(modes=("full", "lora"), devices=(1, 2)))
    print(train_bench.summary(report))

Times the reranker trainer's own step (maxscore/training/reranker/model.py `jit_step` on the recipe of
train_compile.recipe: the packed layout, the listwise loss, clip + AdamW) on random weights of the model's
dims (default: 2 layers of Qwen3-0.6B), with the trainer's attention kernel (`training_kernel` of the
`attention` override: shared_prefix on CPU, pallas_gpu on a GPU).
FLOPs per step come from the cost model with the training multipliers (forward + backward + remat,
train_compile.step_flops); the peak is this process's matmul FLOP/s in the compute dtype
(measure.measure_matmul_peak).
Device counts other than this process's run in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=N (the batch split over data=N). `qlora` times lora's step
on an int8_weights base (int8 projections dequantized inside the scan); the summary gives its step time over
lora's from the same run.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from layers import quantization as quant
from layers import sharding
from layers.kernels.base import training_kernel
from layers.lora import LoraConfig
from maxscore.bench import measure, train_compile
from maxscore.config import CODE_ONLY, ConfigError, load_config, parse_override
from maxscore.distributed import processes
from maxscore.scoring.scorer import Scorer
from maxscore.training import trainer
from maxscore.training.reranker import model


@dataclasses.dataclass(frozen=True)
class TrainBenchOptions:
  """What to time; see configs/bench_train.yml for each key."""
  model: str = "qwen3-0.6b"
  num_layers: int = 2
  modes: tuple[str, ...] = ("full", "lora")
  devices: tuple[int, ...] = (1, 2)
  batch_size: int = 4
  query_len: int = 200
  num_items: int = 20
  item_len: int = 20
  lora_rank: int = 16
  lora_alpha: float = 32.0
  remat: str = "per_layer"
  repeats: int = 3
  seed: int = 0
  peak_sizes: tuple[int, ...] = (2048, 4096)  # n of the [n, n] x [n, n] products that measure the matmul peak
  overrides: tuple[str, ...] = dataclasses.field(default=(), metadata=CODE_ONLY)  # configs/base.yml key=value

  def validate(self) -> "TrainBenchOptions":
    bad = [m for m in self.modes if m not in train_compile.MODES]
    if bad or not self.modes:
      raise ValueError(f"modes={list(self.modes)}: each must be one of {list(train_compile.MODES)}")
    if not self.devices or any(d < 1 or self.batch_size % d for d in self.devices):
      raise ValueError(f"devices={list(self.devices)} must be >= 1 and divide batch_size={self.batch_size}")
    for name in ("batch_size", "query_len", "num_items", "item_len", "repeats", "lora_rank"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
    measure.check_peak_sizes(self.peak_sizes)
    if self.remat not in train_compile.REMAT:
      raise ValueError(f"remat={self.remat!r} must be one of {list(train_compile.REMAT)}")
    return self


def _config(options: TrainBenchOptions, mode: str = "full"):
  """The bench's config; qlora's base is the int8_weights one the trainer's QLoRA trains on."""
  over = dict(parse_override(a) for a in options.overrides)
  over.update(model_name=options.model, num_layers=options.num_layers)
  config = load_config(over)
  quant.refuse_training(config.runtime.quantization, "the training benchmark", ConfigError)
  if mode == "qlora":
    config = config.replace(quantization="int8_weights")
  return config


def time_mode(options: TrainBenchOptions, mode: str, num_devices: int) -> dict[str, Any]:
  """Compiles and times the `mode` step on this process's first `num_devices` devices (batch over data)."""
  config = _config(options, mode)
  mesh = Mesh(np.array(jax.devices()[:num_devices]).reshape(-1, 1, 1), sharding.MESH_AXES)
  lora = LoraConfig(options.lora_rank, options.lora_alpha) if mode in train_compile.ADAPTED else None
  kernel, _ = training_kernel(config.kernel.attention)
  cfg = train_compile.recipe(mode, options.batch_size, options.remat, lora)
  cfg = dataclasses.replace(cfg, seed=options.seed)
  scorer = Scorer.from_config(config, mesh=mesh)
  head_cfg = train_compile.head_config(cfg, config.model)
  geometry = (options.query_len, options.item_len, options.num_items)
  prep = train_compile.synthetic_prepared(cfg, scorer, options.batch_size, options.query_len, options.num_items,
                                          options.item_len, geometry, options.seed)
  prog = model.program(cfg, head_cfg, prep.source, mesh, train_compile.TOTAL_STEPS)
  data_key = jax.random.PRNGKey(options.seed)
  _, shardings = trainer.placed_abstract_state(prog.params, prog.param_shardings, prog.optimizer, data_key, mesh)
  step = model.jit_step(cfg, head_cfg, prep.source, mesh, prog, shardings,
                        jnp.asarray(train_compile.LABELS, jnp.int32))
  batch, _ = model.make_batch(prep, np.arange(options.batch_size), 0, cfg)
  place = trainer.placer(shardings, mesh, options.batch_size)
  state, batch = place(trainer.init(prog.params, shardings, prog.optimizer, data_key), batch)
  t0 = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  first = time.perf_counter() - t0
  times = []
  for _ in range(options.repeats):
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t0)
  flops = train_compile.step_flops(config.model, options.batch_size, *geometry, mode, options.remat != "none", lora)
  best = min(times)
  kernel = kernel if prep.source.trains_backbone else "none"
  return dict(mode=mode, devices=num_devices, kernel=kernel, first_step_s=first,
              step_s=best, step_times_s=times, flops=flops["total"], flops_parts=flops, tokens=flops["tokens"],
              tokens_per_s=flops["tokens"] / best, flops_per_s=flops["total"] / best, loss=float(metrics["loss"]))


def measure_here(options: TrainBenchOptions, num_devices: int,
                 peak: Optional[dict[str, Any]] = None) -> dict[str, Any]:
  """Every mode on `num_devices` devices of this process, against `peak` (measure.measure_matmul_peak's
  result; measured here in the compute dtype when not given)."""
  peak = peak or measure.measure_matmul_peak(options.peak_sizes, dtype=_config(options).runtime.dtype)
  rows = [time_mode(options, m, num_devices) for m in options.modes]
  for r in rows:
    r["peak_fraction"] = r["flops_per_s"] / peak["flops_per_s"]
  return dict(devices=num_devices, platform=jax.default_backend(), matmul_peak=peak, rows=rows,
              machine=measure.machine_info())


def _in_subprocess(options: TrainBenchOptions, num_devices: int) -> dict[str, Any]:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=processes.xla_flags(num_devices))
  arg = json.dumps(dataclasses.asdict(options))
  out = subprocess.run([sys.executable, "-m", "maxscore.bench.train_bench", arg, str(num_devices)], env=env,
                       capture_output=True, text=True, check=False)
  if out.returncode:
    raise RuntimeError(f"the {num_devices}-device run failed: {out.stderr.strip().splitlines()[-1:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def run(options: TrainBenchOptions) -> dict[str, Any]:
  """Each device count: here when this process has exactly that many devices, else in a subprocess."""
  options = options.validate()
  runs = [measure_here(options, n) if n == jax.device_count() else _in_subprocess(options, n)
          for n in options.devices]
  config = _config(options)
  return dict(options=dataclasses.asdict(options), params=config.model.num_params(),
              dtype=config.runtime.dtype, runs=runs, loadavg=_loadavg(),
              note="FLOPs: cost model x training multipliers (forward + backward + remat)")


def _loadavg() -> str:
  try:
    with open("/proc/loadavg") as f:
      return f.read().strip()
  except OSError:
    return "n/a"


def summary(report: dict[str, Any]) -> str:
  o = report["options"]
  platform = report["runs"][0].get("platform", "cpu").upper()
  params = f" ({report['params'] / 1e6:.0f}M params)" if report.get("params") else ""
  lines = [f"{platform} fine-tuning step: {o['model']} dims, {o['num_layers']} layers{params},"
           f" {o['batch_size']} queries x ({o['query_len']} + {o['num_items']} x {o['item_len']}) tokens per step, "
           f"dtype {report['dtype']}, remat {o['remat']}; {report['note']}",
           f"{'mode':<6}{'kernel':>14}{'devices':>8}{'step s':>9}{'first s':>9}{'tokens/s':>10}{'GFLOP/step':>12}"
           f"{'GFLOP/s':>9}{'peak GFLOP/s':>13}{'% peak':>8}"]
  for run_ in report["runs"]:
    for r in run_["rows"]:
      lines.append(f"{r['mode']:<6}{r.get('kernel', ''):>14}{r['devices']:>8}{r['step_s']:>9.3f}{r['first_step_s']:>9.2f}"
                   f"{r['tokens_per_s']:>10,.0f}{r['flops'] / 1e9:>12.1f}{r['flops_per_s'] / 1e9:>9.1f}"
                   f"{run_['matmul_peak']['flops_per_s'] / 1e9:>13.1f}{100 * r['peak_fraction']:>7.1f}%")
  for run_ in report["runs"]:
    by_mode = {r["mode"]: r for r in run_["rows"]}
    if "lora" in by_mode and "qlora" in by_mode:
      lines.append(f"qlora / lora step time, {run_['devices']} device(s): "
                   f"{by_mode['qlora']['step_s'] / by_mode['lora']['step_s']:.2f}")
  lines.append(f"load average after: {report['loadavg']}")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the subprocess of `run`: options JSON, device count -> one JSON line
  _opts = json.loads(sys.argv[1])
  _opts = TrainBenchOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in _opts.items()})
  print(json.dumps(measure_here(_opts, int(sys.argv[2]))))
