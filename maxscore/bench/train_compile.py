"""A training fit report: the reranker trainer's step compiled for a TPU topology described on this host.

    report = train_compile.run(CompileOptions(topology="v6e:1x1", model="qwen3-0.6b", geometries=("200x20x20",),
                                              overrides=("dtype=bfloat16",)), TrainCompileOptions(train="full"))
    print(train_compile.summary(report))

docs/ARCHITECTURE.md sections 10 and 12. The step is the reranker trainer's own (maxscore/training/reranker/
model.py: `program` and `jit_step`, the trainer's train_step with the recipe's loss, listwise over each query's
items): built from an abstract scorer (ShapeDtypeStruct params) of the config, as the recipe `recipe` gives
for the mode, with the params and optimizer state laid out as the trainer lays them out (the logical-axis
rules of layers/sharding.py on the whole training mesh, ici_* and dcn_* data/fsdp/tensor), the global batch
split over data x fsdp, and compiled by the real TPU compiler. Per chip it reports HBM split into
params, optimizer state, the batch and activations/temporaries (the compiler's temp: activations,
gradients, remat buffers), and whether the total fits. FLOPs come from the cost model
(maxscore/scoring/cost_model.py: XLA counts a scanned layer stack once) times the training
multipliers of `step_flops`; the roofline step time is max(FLOPs / peak, bytes / HBM bandwidth) per
chip, ignoring collectives. A search doubles then bisects the batch size to the largest that fits.
Modes: `full` (every backbone weight and the head, float32 master weights), `lora` (rank-r adapters beside the
frozen base, in its weight_dtype, and the head), `qlora` (lora on a frozen int8_weights base, docs/ARCHITECTURE.md
section 15: the params figure holds its int8 projections and float32 scales, the optimizer state only the
adapters' and the head's), `head` (the head alone on the frozen backbone's features, which the trainer computes
once before the loop with the scorer's forward: that step holds no backbone, and the scoring report sizes the
forward). The trainer's step donates its state, so the state is counted once (the compiler's aliased bytes).
These are compile-time bounds, not measurements.

Attention: the trainer's choice (layers/kernels/base.py `training_kernel`): `auto` compiles splash with its
Pallas backward (dq and dkv kernels) on a TPU topology; shared_prefix and reference are compiled as named, and
pallas_gpu, a GPU kernel, is refused for a TPU.
"""

import dataclasses
import math
import re
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh

from layers import quantization as quant
from layers import sharding
from layers.config import ModelConfig
from layers.kernels.base import resolve_auto, training_kernel
from layers.lora import TARGETS, LoraConfig
from maxscore.bench import chips, compile_report, compile_summary
from maxscore.checkpoints import adapters as lora_lib
from maxscore.config import Config
from maxscore.distributed import mesh as mesh_lib
from maxscore.errors import TrainError
from maxscore.heads import head
from maxscore.scoring import cost_model
from maxscore.scoring.layout import bucket
from maxscore.scoring.requests import make_request
from maxscore.scoring.scorer import Scorer
from maxscore.training import partition, trainer
from maxscore.training.reranker import model, prepare
from maxscore.training.reranker.config import REMAT, TrainConfig
from maxscore.training.reranker.features import Examples
from maxscore.training.reranker.prepare import Prepared
from maxscore.training.reranker.sources import Source

MODES = ("full", "lora", "qlora", "head")
ADAPTED = ("lora", "qlora")  # the modes that train adapters on a frozen base
LORA_TARGETS = TARGETS  # every projection the trainer's adapters can target (layers/lora.py)
LABELS = (1, 2)  # label token ids of the synthetic workload
TOTAL_STEPS = 1000  # the run length the optimizer's schedule is built for (it changes no shape)
KERNEL_PLATFORMS = {"splash": "tpu", "pallas_gpu": "gpu"}  # the Pallas kernels compile for one platform each


@dataclasses.dataclass(frozen=True)
class TrainCompileOptions:
  """What training step to compile (the topology, model and geometries come from CompileOptions)."""
  train: str = ""                 # "": the scoring report; full | lora | qlora | head: the training step
  batch_size: int = 8             # queries per step (global), one packed row each
  lora_rank: int = 16
  lora_alpha: float = 32.0
  lora_targets: tuple[str, ...] = LORA_TARGETS
  remat: str = "per_layer"        # what the backward pass recomputes: the trainer's remat (full | per_layer | none)
  grad_accum_steps: int = 1
  max_batch_size: int = 1024      # the batch search stops here; 0: no search

  def validate(self) -> "TrainCompileOptions":
    if self.train not in ("",) + MODES:
      raise ValueError(f"train={self.train!r} must be one of {list(MODES)} (or empty for the scoring report)")
    if self.batch_size < 1 or self.grad_accum_steps < 1 or self.max_batch_size < 0:
      raise ValueError(f"batch_size={self.batch_size} and grad_accum_steps={self.grad_accum_steps} must be >= 1, "
                       f"max_batch_size={self.max_batch_size} >= 0")
    if self.batch_size % self.grad_accum_steps:
      raise ValueError(f"batch_size={self.batch_size} is not divisible by grad_accum_steps={self.grad_accum_steps}")
    if self.remat not in REMAT:
      raise ValueError(f"remat={self.remat!r} must be one of {list(REMAT)}")
    if self.train in ADAPTED:
      self.lora()
    return self

  def lora(self) -> Optional[LoraConfig]:
    if self.train not in ADAPTED:
      return None
    return LoraConfig(self.lora_rank, self.lora_alpha, tuple(self.lora_targets)).validate()


def recipe(mode: str, batch_size: int = 8, remat: str = "per_layer", lora: Optional[LoraConfig] = None,
           grad_accum_steps: int = 1) -> TrainConfig:
  """The reranker recipe's settings of `mode`: full trains float32 master weights, lora and qlora adapters on
  the scorer's frozen base (qlora's scorer holds it int8), head the head alone on frozen features."""
  if mode == "head":
    return TrainConfig.of(batch_size=batch_size, grad_accum_steps=grad_accum_steps)
  adapters = {} if lora is None else dict(lora_rank=lora.rank, lora_alpha=lora.alpha, lora_targets=lora.targets)
  return TrainConfig.of(batch_size=batch_size, grad_accum_steps=grad_accum_steps, train_backbone=True, remat=remat,
                        param_dtype="float32" if mode == "full" else None, **adapters)


def head_config(cfg: TrainConfig, model_cfg: ModelConfig) -> head.HeadConfig:
  return cfg.head_config(LABELS, model_cfg.hidden_size)


# --- the cost model ---------------------------------------------------------------------------------
def step_flops(model_cfg: ModelConfig, batch: int, prefix_len: int, slot_len: int, num_slots: int, mode: str,
               remat: bool = True, lora: Optional[LoraConfig] = None) -> dict[str, Any]:
  """Model FLOPs of one training step at its padded shape, by part, with the training multipliers.

  Forward = 1. Backward: dense layers and the lm_head 2 (input and weight gradients) when their weights
  train, 1 (input gradients only) when frozen; attention 2 (it has no weights). Remat recomputes each
  layer's forward once more (dense and attention, not the lm_head). LoRA adapters (as applied to
  activations): 2 * r * (in + out) per token per target, with full fine-tuning's multipliers. qlora counts
  as lora (its dequantize is elementwise, not counted). `head` trains the default head (lm_labels, a [D, K]
  delta) on frozen features: 2 * D * K per item forward and 2 * D * K for its weight gradient, no backbone.
  """
  fwd = cost_model.program_flops(model_cfg, batch, prefix_len, slot_len, num_slots, lm_head_rows=0)
  lm_head = cost_model.program_flops(model_cfg, batch, prefix_len, slot_len, num_slots) - fwd
  tokens = batch * (prefix_len + slot_len * num_slots)
  if mode == "head":
    forward = 2 * model_cfg.hidden_size * len(LABELS) * batch * num_slots
    parts = dict(dense=0, attention=0, lm_head=0, adapters=0, head=2 * forward)
    return dict(parts, forward=forward, total=sum(parts.values()), tokens=tokens)
  dense = 2 * model_cfg.non_embedding_params() * tokens
  attention = fwd - dense
  again = 1 if remat else 0
  backward = {"full": (2, 2, 2), "lora": (1, 2, 1), "qlora": (1, 2, 1)}[mode]
  adapters = 0
  if lora is not None:  # per token, 2 FLOPs per adapter weight: 2 * r * (in + out) per target per layer
    shapes = jax.eval_shape(lambda: lora_lib.init_adapters(model_cfg, lora, jax.random.PRNGKey(0)))
    adapters = 2 * sum(x.size for x in jax.tree_util.tree_leaves(shapes)) * tokens * (3 + again)
  parts = dict(dense=dense * (1 + backward[0] + again), attention=attention * (1 + backward[1] + again),
               lm_head=lm_head * (1 + backward[2]), adapters=adapters, head=0)
  return dict(parts, forward=fwd + lm_head, total=sum(parts.values()), tokens=tokens)


# --- the recipe's inputs ----------------------------------------------------------------------------
per_device_bytes = compile_report.per_device_bytes


def synthetic_prepared(cfg: TrainConfig, scorer: Scorer, batch: int, query_len: int, num_items: int,
                       item_len: int, padded: tuple[int, int, int], seed: int = 0) -> Prepared:
  """A run's prepared inputs for `batch` queries of random tokens (query_len + num_items x item_len each, every
  query with a relevant item), packed at `padded` (P, L, N) when the backbone trains, else zero frozen features:
  what model.make_batch builds the step's batch from."""
  rng = np.random.default_rng(seed)
  model_cfg = scorer.config.model
  vocab = model_cfg.vocab_size
  reqs = tuple(make_request(rng.integers(3, vocab, query_len).tolist(),
                            rng.integers(3, vocab, (num_items, item_len)).tolist(), list(LABELS), False, False,
                            None, vocab) for _ in range(batch))
  grades = rng.integers(0, 3, (batch, num_items))
  grades[:, 0] = np.maximum(grades[:, 0], 1)
  examples = Examples(tuple(f"q{i}" for i in range(batch)), tuple(tuple(f"d{j}" for j in range(num_items))
                                                                  for _ in range(batch)),
                      reqs, tuple(map(tuple, grades.tolist())), {})
  source = prepare.synthetic_source(cfg, scorer, padded, (batch, num_items, len(LABELS)))
  return Prepared(LABELS, head_config(cfg, model_cfg), {"train": examples}, {"train": examples.grid()}, source)


def abstract_batch(batch: Any, mesh: Mesh) -> Any:
  """A host batch as the trainer places it: ShapeDtypeStructs of its (canonical) dtypes, split over data x fsdp."""
  split = partition.batch_sharding(mesh)
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(np.asarray(x).dtype),
                                     sharding=split), batch)


def lower_step(source: Source, cfg: TrainConfig, head_cfg: head.HeadConfig, prog: model.Program, mesh: Mesh,
               batch: Any, label_ids=LABELS) -> Any:
  """The recipe's step (model.jit_step) lowered on the abstract state of `prog` placed as trainer.start places
  it, and `batch` (placed ShapeDtypeStructs)."""
  state, shardings = trainer.placed_abstract_state(prog.params, prog.param_shardings, prog.optimizer,
                                                   jax.random.PRNGKey(0), mesh)
  step = model.jit_step(cfg, head_cfg, source, mesh, prog, shardings, jnp.asarray(label_ids, jnp.int32))
  return step.lower(state, batch), state


# --- one compile ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Target:
  """Everything fixed across compiles of one report: config, mesh, chip, mode and the recipe's program."""
  config: Config
  mesh: Mesh
  chip: chips.Chip
  devices_per_chip: int
  options: TrainCompileOptions
  scorer: Scorer          # abstract: ShapeDtypeStruct params on the mesh
  recipe: TrainConfig
  head_cfg: head.HeadConfig
  program: model.Program
  kernel: str             # the attention kernel the step differentiates ("none": a head-only step has none)


def make_target(config: Config, mesh: Mesh, chip: chips.Chip, devices_per_chip: int,
                options: TrainCompileOptions) -> Target:
  if options.train == "qlora":
    quant.refuse_qlora(config.runtime.quantization, TrainError)
    if config.runtime.quantization != "int8_weights":
      raise TrainError(f"train=qlora trains adapters on an int8_weights base; quantization="
                       f"{config.runtime.quantization!r} is not one (leave it out, or give int8_weights)")
  else:
    quant.refuse_training(config.runtime.quantization, f"train={options.train}", TrainError)
  platform = mesh.devices.flat[0].platform
  kernel, _ = training_kernel(config.kernel.attention, platform)
  if KERNEL_PLATFORMS.get(kernel, platform) != platform:
    raise TrainError(f"attention={kernel} is a {KERNEL_PLATFORMS[kernel].upper()} kernel; a training step for "
                     f"{platform.upper()} compiles with auto ({resolve_auto(platform)}), shared_prefix or reference")
  sharding.check_divisible(config.model, mesh)
  cfg = recipe(options.train, options.batch_size, options.remat, options.lora(), options.grad_accum_steps)
  scorer = compile_report.abstract_scorer(config, mesh)
  head_cfg = head_config(cfg, config.model)
  source = prepare.synthetic_source(cfg, scorer)
  prog = model.program(cfg, head_cfg, source, mesh, TOTAL_STEPS)
  return Target(config, mesh, chip, devices_per_chip, options, scorer, cfg, head_cfg, prog,
                kernel if source.trains_backbone else "none")


def padded_geometry(config: Config, geometry) -> tuple[int, int, int]:
  """(P, L, N): the buckets a training batch of query_len x num_items x item_len is packed into."""
  q_len, n, l = geometry[:3]
  bk = config.buckets
  return (bucket(q_len, bk.prefix_buckets, "query_len"), bucket(l, bk.item_buckets, "item_len"),
          bucket(n, bk.item_count_buckets, "num_items"))


def _lowered(target: Target, batch: int, geometry) -> tuple[Any, Any, Any]:
  """(the lowered step at `batch` queries of `geometry`, its abstract state, its abstract batch)."""
  cfg = dataclasses.replace(target.recipe, batch_size=batch)
  q_len, n_items, l_item = geometry[:3]
  padded = padded_geometry(target.config, geometry)
  prep = synthetic_prepared(cfg, target.scorer, batch, q_len, n_items, l_item, padded)
  host_batch, _ = model.make_batch(prep, np.arange(batch), 0, cfg)
  batch_in = abstract_batch(host_batch, target.mesh)
  lowered, state = lower_step(prep.source, cfg, target.head_cfg, target.program, target.mesh, batch_in)
  return lowered, state, batch_in


def compile_step(target: Target, batch: int, geometry) -> dict[str, Any]:
  """Compiles the step at `batch` queries of `geometry`; memory split, fit, FLOPs, roofline. A compile
  failure (e.g. out of HBM) is reported, not raised."""
  mesh, chip, dpc = target.mesh, target.chip, target.devices_per_chip
  partition.check_batch(batch, mesh, target.options.grad_accum_steps)
  p, l, n = padded_geometry(target.config, geometry)
  out = dict(batch_size=batch, geometry=list(geometry[:3]), padded=[p, l, n], error=None)
  try:
    t0 = time.perf_counter()
    lowered, state, batch_in = _lowered(target, batch, geometry)
    t1 = time.perf_counter()
    compiled = sharding.compile_deviceless(lowered)
    out["compile"] = dict(lower_s=t1 - t0, compile_s=time.perf_counter() - t1,
                          hlo_ops=hlo_op_counts(lowered, compiled))
  except Exception as e:  # pylint: disable=broad-except  (the compiler's error is the report)
    out.update(error=compile_report.one_line(e), fits=False)
    return out
  ma = compiled.memory_analysis()
  params_b, opt_b, batch_b = (per_device_bytes(state.params), per_device_bytes(state.opt_state),
                              per_device_bytes(batch_in))
  total = (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes + ma.temp_size_in_bytes
           + ma.generated_code_size_in_bytes)
  capacity = chip.hbm_bytes // dpc
  flops = step_flops(target.config.model, batch, p, l, n, target.options.train, target.options.remat != "none",
                     target.options.lora())
  flops_device = flops["total"] / compile_report.compute_shards(mesh, batch)
  bytes_device = ma.argument_size_in_bytes + ma.output_size_in_bytes
  t_compute = flops_device / (chip.peak_bf16_flops / dpc)
  t_memory = bytes_device / (chip.hbm_bytes_per_s / dpc)
  roofline = max(t_compute, t_memory)
  q_len, n_items, l_item = geometry[:3]
  tokens = batch * (q_len + n_items * l_item)
  out.update(memory=dict(params=params_b, optimizer=opt_b, batch=batch_b, temporaries=ma.temp_size_in_bytes,
                         arguments=ma.argument_size_in_bytes, outputs=ma.output_size_in_bytes,
                         aliased=ma.alias_size_in_bytes, code=ma.generated_code_size_in_bytes),
             hbm_bytes=total, hbm_capacity=capacity, fits=total <= capacity, flops=flops,
             flops_per_device=flops_device, bytes_per_device=bytes_device, roofline_s=roofline,
             bound="compute" if t_compute >= t_memory else "memory", tokens=tokens, tokens_per_s=tokens / roofline,
             pallas_kernels=compile_report.pallas_kernels(compiled.as_text(), target.kernel))
  return out


_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?[%\w.\-]+\s*=\s", re.M)


def hlo_op_counts(lowered: Any, compiled: Any) -> dict[str, int]:
  """The program's HLO instructions as lowered (before XLA's passes) and as compiled (after them, fusions'
  bodies included): the compile-size measure, which does not drift with the machine's load as seconds do."""
  return dict(lowered=len(_HLO_INSTRUCTION.findall(lowered.as_text(dialect="hlo"))),
              optimized=len(_HLO_INSTRUCTION.findall(compiled.as_text())))


def local_step_op_counts(config: Config, mode: str = "full", batch_size: int = 2,
                         geometry: tuple[int, int, int] = (16, 4, 8), remat: str = "per_layer",
                         lora: Optional[LoraConfig] = None) -> dict[str, int]:
  """hlo_op_counts of the recipe's `mode` step compiled for this process's first device (the kernel the trainer
  picks here), at `batch_size` queries of query_len x num_items x item_len `geometry`."""
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), sharding.MESH_AXES)
  lora = lora or (LoraConfig(4, 8.0) if mode in ADAPTED else None)
  options = TrainCompileOptions(train=mode, batch_size=batch_size, remat=remat, max_batch_size=0,
                                **({} if lora is None else dict(lora_rank=lora.rank, lora_alpha=lora.alpha,
                                                                lora_targets=lora.targets)))
  target = make_target(config, mesh, chips.CHIPS["v6e"], 1, options.validate())
  lowered, *_ = _lowered(target, batch_size, geometry)
  return hlo_op_counts(lowered, lowered.compile())


def search_batch(target: Target, geometry, start: int) -> dict[str, Any]:
  """The largest global batch (a multiple of data x fsdp, up to max_batch_size) whose step fits."""
  shards = partition.batch_shards(target.mesh) * target.options.grad_accum_steps
  limit = target.options.max_batch_size // shards
  failures: dict[int, str] = {}

  def probe(k: int) -> bool:
    r = compile_step(target, k * shards, geometry)
    if not r["fits"]:
      failures[k] = r["error"] or f"needs {r['hbm_bytes'] / 1e9:.2f} GB per device"
    logging.info("train search batch_size=%d: %s", k * shards, "fits" if r["fits"] else failures[k])
    return r["fits"]

  if limit < 1:
    return dict(largest=0, limit=target.options.max_batch_size, at_limit=False, first_failure=None, failure=None)
  best = compile_report.largest_fitting(probe, max(1, start // shards), limit)
  first = min((k for k in failures if k > best), default=None)
  return dict(largest=best * shards, limit=limit * shards, at_limit=best == limit,
              first_failure=first * shards if first else None, failure=failures.get(first))


# --- the report ------------------------------------------------------------------------------------------
def run(options: compile_report.CompileOptions, train: TrainCompileOptions) -> dict[str, Any]:
  """Compiles the training step of `train` for each geometry of `options`; the report as a JSON-able dict.
  train=qlora compiles with quantization=int8_weights unless the options name another (refused)."""
  if train.train == "qlora" and not options.quantization:
    options = dataclasses.replace(options, quantization="int8_weights")
  config = compile_report.build_config(options)
  geometries = options.parsed_geometries()
  for g in geometries:
    if len(g) > 3:
      raise TrainError(f"geometry {'x'.join(map(str, g))}: a training step takes QUERY_LENxNUM_ITEMSxITEM_LEN; "
                       "give the queries per step with --batch_size")
    padded_geometry(config, g)  # a geometry above the largest bucket fails before any compile
  chip, dims = chips.parse_topology(options.topology)
  devices = compile_report.describe_topology(options.topology, options.num_slices)
  mesh = mesh_lib.create_mesh(config.mesh, devices)
  partition.check_batch(train.batch_size, mesh, train.grad_accum_steps)
  devices_per_chip = max(1, len(devices) // (math.prod(dims) * options.num_slices))
  target = make_target(config, mesh, chip, devices_per_chip, train)
  steps = [compile_step(target, train.batch_size, g) for g in geometries]
  search = search_batch(target, geometries[0], train.batch_size) if train.max_batch_size else None
  m = config.model
  lora = train.lora()
  return dict(topology=options.topology, num_slices=options.num_slices, chip=dataclasses.asdict(chip),
              devices=len(devices), devices_per_chip=devices_per_chip, mesh=dict(mesh.shape), model=options.model,
              num_layers=m.num_layers, params=m.num_params(), train=train.train, remat=train.remat,
              lora=dataclasses.asdict(lora) if lora else None, dtype=config.runtime.dtype,
              frozen_dtype=config.runtime.weight_dtype, quantization=config.runtime.quantization,
              attention=target.kernel,
              grad_accum_steps=train.grad_accum_steps, overrides=list(options.overrides), steps=steps,
              search=search, fits=all(s["fits"] for s in steps),
              note="compile-time bounds from the TPU compiler and the cost model, not measurements")


def _step_lines(s: dict[str, Any]) -> list[str]:
  g, pad = "x".join(map(str, s["geometry"])), "x".join(map(str, s["padded"]))
  head = f"step: batch_size {s['batch_size']} at {g} (query_len x items x item_len; packed P x L x N {pad})"
  if s["error"]:
    return [head, f"  compile error: {s['error']}", "  => DOES NOT FIT / DID NOT COMPILE"]
  mem, f, c, gb = s["memory"], s["flops"], s["compile"], compile_summary.gb
  return [head,
          f"  HBM per chip: params {gb(mem['params'])} + optimizer state {gb(mem['optimizer'])} + batch "
          f"{gb(mem['batch'])} + activations/temporaries {gb(mem['temporaries'])} (code {gb(mem['code'])}) = "
          f"{gb(s['hbm_bytes'])} GB of {gb(s['hbm_capacity'])}",
          f"  step FLOPs (cost model, fwd + bwd + remat): {f['total'] / 1e12:.3f} TFLOP (dense {f['dense'] / 1e12:.3f},"
          f" attention {f['attention'] / 1e12:.3f}, lm_head {f['lm_head'] / 1e12:.3f}, adapters "
          f"{f['adapters'] / 1e12:.3f}, head {f['head'] / 1e12:.3f}); {s['flops_per_device'] / 1e12:.3f} TFLOP per chip",
          f"  roofline step time {s['roofline_s'] * 1e3:.2f} ms ({s['bound']}-bound) = {s['tokens_per_s']:,.0f} "
          f"tokens/s bound ({s['tokens']:,} tokens per step)",
          f"  compile: lowering {c['lower_s']:.1f} s + XLA {c['compile_s']:.1f} s; HLO instructions "
          f"{c['hlo_ops']['lowered']:,} lowered, {c['hlo_ops']['optimized']:,} optimized",
          f"  => {'FITS' if s['fits'] else 'DOES NOT FIT'}: {gb(s['hbm_bytes'])} GB per chip"]


def summary(report: dict[str, Any]) -> str:
  """The report as text; the last line is FITS or DOES NOT FIT (every geometry at --batch_size)."""
  lora = report["lora"]
  mode = report["train"] + (f" (rank {lora['rank']}, alpha {lora['alpha']}, targets {','.join(lora['targets'])})"
                             if lora else "")
  frozen = report["frozen_dtype"] + (" (int8 projections + float32 scales)" if report["quantization"] != "none"
                                     else "")
  lines = compile_summary.header_lines(
      report, "training mesh", f"; train={mode}, remat={report['remat']}, compute {report['dtype']}, float32 master "
      f"weights and Adam state, frozen weights {frozen}, attention={report['attention']}")
  for s in report["steps"]:
    lines += _step_lines(s) + [""]
  if report["search"]:
    lines.append(compile_summary.search_line("batch_size that fits (first geometry)", report["search"]))
  lines.append("FITS" if report["fits"] else "DOES NOT FIT")
  return "\n".join(lines) + "\n"
