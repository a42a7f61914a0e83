"""Compiles what `Scorer.warmup` builds for a TPU topology or GPUs described on this host; reports fit and roofline.

    report = compile_report.run(CompileOptions(topology="v6e:1x1", model="qwen3-0.6b",
                                               geometries=("2000x500x20",), overrides=("dtype=bfloat16",)))
    print(compile_summary.summary(report))      # maxscore/bench/compile_summary.py

docs/ARCHITECTURE.md section 10. The Scorer holds abstract params (ShapeDtypeStructs with their logical-axis
shardings) on the data-group mesh process 0 of a job on that topology would use, and its
warmup lowers and compiles with the real TPU compiler (Mosaic for splash), or for a GPU with
XLA's CUDA compiler from a target description (chips.gpu_target_config: Triton for pallas_gpu,
ptxas to the GPU's code; needs jax's CUDA plugin, not a GPU): same buckets, same selector
choice, same shardings as a run. Per program: per-chip (per-GPU) memory from the compiler
against the chip's HBM; model FLOPs from the cost model (XLA's cost analysis counts a scanned
layer stack once and Pallas calls as zero); bytes each chip reads and writes (arguments and
outputs: its weight shard, K/V, inputs, results); roofline time max(FLOPs / peak, bytes /
bandwidth). Quantized (`quantization`, docs/ARCHITECTURE.md section 15), the weights are int8 with float32
scales in those bytes, and under w8a8 the dense layers' FLOPs run at the chip's int8 peak (`compute_time`).
These are compile-time bounds, not measurements.
"""

import contextlib
import dataclasses
import importlib.util
import math
import os
import re
import sys
import tempfile
from typing import Any, Callable, Iterator, Optional, Sequence

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh

from layers import sharding
from layers.config import ModelConfig
from layers.quantization import QUANTIZATIONS
from maxscore.bench import chips
from maxscore.checkpoints import storage
from maxscore.config import CODE_ONLY, Config, MeshConfig, load_config, parse_override
from maxscore.distributed import mesh as mesh_lib
from maxscore.scoring import cost_model
from maxscore.scoring.requests import make_request
from maxscore.scoring.runner import Program
from maxscore.scoring.scorer import Scorer

# The custom call each Pallas kernel compiles to: its presence in the compiled program is the kernel, not a fallback.
PALLAS_CALLS = {"splash": "tpu_custom_call", "pallas_gpu": "__gpu$xla.gpu.triton"}


def pallas_kernels(compiled_text: str, kernel: str) -> list[str]:
  """Names of the `kernel`'s Pallas calls in a compiled program's text (each call's name scope, read from the
  op_name of its custom call), e.g. splash's fwd, dq and dkv kernels in a training step."""
  target = PALLAS_CALLS.get(kernel)
  if target is None:
    return []
  # A call's metadata (op_name) follows its target, past attributes that may span lines.
  calls = re.finditer(rf'custom_call_target="{re.escape(target)}".*?op_name="([^"]*)"', compiled_text, re.S)
  return sorted({m.group(1).split("/")[-2] for m in calls if m.group(1).endswith("/pallas_call")})


SEARCHABLE = ("num_items", "query_len")  # dimensions --search grows


@dataclasses.dataclass(frozen=True)
class CompileOptions:
  """What to compile: topology, model (configs/models/<model>.yml), workloads; `overrides` are key=value."""
  topology: str = "v6e:1x1"
  num_slices: int = 1
  model: str = "qwen3-0.6b"
  num_layers: int = 0                   # 0: the model's own depth
  geometries: tuple[str, ...] = ("2000x500x20",)  # QUERY_LENxNUM_ITEMSxITEM_LEN[xBATCH] (query_len incl. separator)
  algorithms: tuple[str, ...] = ("auto",)
  num_labels: int = 2
  search: tuple[str, ...] = ()          # dimensions to grow until nothing fits: num_items, query_len
  search_algorithms: tuple[str, ...] = ("packed", "prefill_extend")
  quantization: str = ""                # none | int8_weights | int8; "": the config's (configs/base.yml)
  overrides: tuple[str, ...] = dataclasses.field(default=(), metadata=CODE_ONLY)  # configs/base.yml key=value

  def validate(self) -> "CompileOptions":
    """Every flag checked before any compile; each bad value named by its key."""
    from maxscore.scoring.algorithms import ALGORITHMS  # pylint: disable=g-import-not-at-top
    bad = [] if self.geometries else ["geometries is empty (give at least one QUERY_LENxNUM_ITEMSxITEM_LEN)"]
    for g in self.geometries:
      try:
        parse_geometry(g)
      except ValueError as e:
        bad.append(f"geometries: {e}")
    bad += [f"{k}={getattr(self, k)} must be >= {v}" for k, v in (("num_layers", 0), ("num_labels", 1),
                                                                   ("num_slices", 1)) if getattr(self, k) < v]
    algorithms = sorted(ALGORITHMS) + ["auto"]
    for key, allowed in (("algorithms", algorithms), ("search_algorithms", algorithms),
                         ("search", list(SEARCHABLE))):
      unknown = [a for a in getattr(self, key) if a not in allowed]
      if unknown:
        bad.append(f"{key}={unknown} is not among {allowed}")
    if self.quantization and self.quantization not in QUANTIZATIONS:
      bad.append(f"quantization={self.quantization!r} is not one of {list(QUANTIZATIONS)} (or empty: the config's)")
    if not self.algorithms:
      bad.append(f"algorithms is empty (give one or more of {algorithms})")
    try:
      chips.parse_topology(self.topology)
    except chips.TopologyError as e:
      bad.append(str(e))
    if bad:
      raise ValueError("; ".join(bad))
    return self

  def parsed_geometries(self) -> list[tuple[int, ...]]:
    return [parse_geometry(g) for g in self.geometries]


def parse_geometry(text: str) -> tuple[int, ...]:
  """"2000x500x20" or "2000x500x20x4" (query_len x num_items x item_len [x batch]) -> ints."""
  parts = text.lower().split("x")
  if len(parts) not in (3, 4) or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"geometry {text!r} must be QUERY_LENxNUM_ITEMSxITEM_LEN[xBATCH] (e.g. 2000x500x20)")
  geometry = tuple(int(p) for p in parts)
  if geometry[0] < 1 or geometry[2] < 1 or any(g < 1 for g in geometry[3:]):
    raise ValueError(f"geometry {text!r}: query_len, item_len and batch must be >= 1")
  return geometry


# --- the target: devices, mesh, scorer --------------------------------------------------
# libtpu's start-up log on a host without a TPU, written by its C++ code to fd 2 before it reads any log
# setting: expected when only describing a TPU, and nothing the user can act on.
LIBTPU_NOISE = re.compile(r"host bounds|could not determine TPU|Logging before InitGoogle|unexpected worker hostname|"
                          r"Source Location Trace|^[\w./-]+\.(cc|h):\d+\s*$|^\s*$")


@contextlib.contextmanager
def libtpu_start_up_filtered() -> Iterator[None]:
  """Runs the block with fd 2 captured, then writes back every line but libtpu's known start-up noise
  (LIBTPU_NOISE), so the console shows the report and any real error."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True)
              if not LIBTPU_NOISE.search(line)]
      sys.stderr.write("".join(kept))
      sys.stderr.flush()


def describe_topology(topology: str, num_slices: int = 1) -> list:
  """The devices of `num_slices` slices of `topology` (e.g. v6e:2x2), described on this host by libtpu;
  or of `count` GPUs on one host (h100, h100:8), described by jax's CUDA plugin."""
  chip, dims = chips.parse_topology(topology)
  if num_slices < 1:
    raise chips.TopologyError(f"num_slices={num_slices} must be >= 1")
  if chip.platform == "gpu":
    if num_slices != 1:
      raise chips.TopologyError(f"num_slices={num_slices}: GPU topologies ({topology!r}) are one host, num_slices=1")
    return describe_gpus(topology, chip, dims[0])
  # Only compiling: another process on this host (a test run) may hold libtpu's TPU lock.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  bounds = tuple(min(d, 2) for d in dims) + (1,) * (3 - len(dims))  # up to 2x2x1 chips per host
  try:
    with libtpu_start_up_filtered():  # libtpu loads here
      desc = topologies.get_topology_desc(topology_name=topology, platform="tpu", chip_config_name=chip.chip_config,
                                          chips_per_host_bounds=bounds, num_slices=num_slices)
  except Exception as e:  # pylint: disable=broad-except  (libtpu missing, or a shape it does not know)
    if importlib.util.find_spec("libtpu") is None:
      raise chips.TopologyError(f"topology={topology!r}: describing a TPU topology needs libtpu: "
                                f"`pip install 'jax[tpu]=={jax.__version__}'` ({one_line(e)})") from None
    raise chips.TopologyError(f"topology={topology!r} num_slices={num_slices}: libtpu does not know this slice "
                              f"shape ({one_line(e)}); use a shape the chip comes in (e.g. {chip.name}:2x2)") from None
  return list(desc.devices)


def describe_gpus(topology: str, chip: chips.Chip, count: int) -> list:
  """`count` compile-only GPUs of `chip` on one host: XLA's deviceless GPU compile, from a target description."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    desc = topologies.get_topology_desc(platform="cuda", target_config=chips.gpu_target_config(chip),
                                        topology=f"1x1x{count}")
  except Exception as e:  # pylint: disable=broad-except  (the CUDA plugin missing, or a description it rejects)
    raise chips.TopologyError(f"topology={topology!r}: jax's CUDA plugin could not describe it ({one_line(e)}); "
                              f"it needs `pip install 'jax[cuda12]=={jax.__version__}'` (make test-gpu-aot's "
                              f"venv), no GPU") from None
  return list(desc.devices)


def target_mesh(mesh_cfg: MeshConfig, devices: Sequence[Any]) -> Mesh:
  """The mesh process 0 of a job on `devices` scores with: its data group (docs/ARCHITECTURE.md section 8)."""
  return mesh_lib.data_group(mesh_lib.create_mesh(mesh_cfg, devices), process_index=0).mesh


def abstract_scorer(config: Config, mesh: Mesh) -> Scorer:
  """A Scorer whose params are ShapeDtypeStructs on `mesh`: it compiles (warmup) and runs nothing."""
  return Scorer(config, storage.abstract_params(config.model), mesh=mesh)


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of placed ShapeDtypeStructs (its shard of each leaf)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


def one_line(error: BaseException, limit: int = 400) -> str:
  text = " ".join(f"{type(error).__name__}: {error}".split())
  return text if len(text) <= limit else text[:limit] + " ..."


# --- one program, one workload ----------------------------------------------------------
def _lm_head_rows(program: Program) -> Optional[int]:
  if program.entry == "logits":
    return program.prefix_len
  if program.entry == "prefill" or program.entry.endswith("hidden"):
    return 0
  return None  # one row per slot


def _lm_head_cols(program: Program) -> Optional[int]:
  """The label rows only for the raw-logit entries (packed_logits, extend_logits: [..., K] out), else the vocabulary."""
  if program.entry in ("packed_logits", "extend_logits"):
    return int(program.out_shape.shape[-1])
  return None


def compute_shards(mesh: Mesh, batch: int) -> int:
  """Chips that split one program's work: tensor, times the batch axes that divide its rows."""
  batch_axes = sharding.batch_axes(batch, mesh) or ()
  return mesh.shape["tensor"] * math.prod(mesh.shape[a] for a in batch_axes)


def compute_time(flops: float, int8_flops: float, chip: chips.Chip, devices_per_chip: int = 1) -> float:
  """Seconds of matmul at peak: `int8_flops` of `flops` at the chip's int8 peak (w8a8 projections), the rest
  (attention, the lm_head rows, float projections) at its bf16 peak."""
  return ((flops - int8_flops) / (chip.peak_bf16_flops / devices_per_chip)
          + (int8_flops / (chip.matmul_peak(int8=True) / devices_per_chip) if int8_flops else 0.0))


def program_row(program: Program, model: ModelConfig, chip: chips.Chip, mesh: Mesh,
                devices_per_chip: int = 1, quantization: str = "none") -> dict[str, Any]:
  """Per-device memory, fit, FLOPs, bytes and roofline time of one compiled program; under quantization=int8
  its dense layers' FLOPs count at the chip's int8 peak."""
  ma = program.compiled.memory_analysis()
  memory = dict(arguments=ma.argument_size_in_bytes, outputs=ma.output_size_in_bytes,
                aliased=ma.alias_size_in_bytes, temporaries=ma.temp_size_in_bytes,
                code=ma.generated_code_size_in_bytes)
  total = memory["arguments"] + memory["outputs"] - memory["aliased"] + memory["temporaries"] + memory["code"]
  capacity = chip.hbm_bytes // devices_per_chip
  flops = cost_model.program_flops(model, program.batch, program.prefix_len, program.slot_len, program.num_slots,
                                   prefix_cached=program.entry.startswith("extend"),
                                   lm_head_rows=_lm_head_rows(program), lm_head_cols=_lm_head_cols(program))
  shards = compute_shards(mesh, program.batch)
  flops_device = flops / shards
  int8_device = (cost_model.program_dense_flops(model, program.batch, program.prefix_len, program.slot_len,
                                                program.num_slots, prefix_cached=program.entry.startswith("extend"))
                 / shards if quantization == "int8" else 0)
  bytes_device = memory["arguments"] + memory["outputs"]
  t_compute = compute_time(flops_device, int8_device, chip, devices_per_chip)
  t_memory = bytes_device / (chip.hbm_bytes_per_s / devices_per_chip)
  return dict(entry=program.entry, kernel=program.kernel, batch=program.batch, prefix_len=program.prefix_len,
              slot_len=program.slot_len, num_slots=program.num_slots, calls=program.calls,
              memory=memory, hbm_bytes=total, hbm_capacity=capacity, fits=total <= capacity,
              headroom_bytes=capacity - total, flops=flops, flops_per_device=flops_device,
              int8_flops_per_device=int8_device,
              bytes_per_device=bytes_device, roofline_s=max(t_compute, t_memory),
              bound="compute" if t_compute >= t_memory else "memory",
              pallas=program.kernel in PALLAS_CALLS and PALLAS_CALLS[program.kernel] in program.compiled.as_text())


def _dummy_request(scorer: Scorer, geometry: Sequence[int], num_labels: int):
  """The request Scorer.warmup builds for `geometry` (to ask the selector which algorithm it gets)."""
  q_len, n, l = geometry[:3]
  return make_request([1] * q_len, [[1] * l] * n, list(range(num_labels)), False, False, None,
                      scorer.config.model.vocab_size)


def compile_workload(scorer: Scorer, geometry: Sequence[int], chip: chips.Chip, algorithm: str = "auto",
                     num_labels: int = 2, devices_per_chip: int = 1) -> dict[str, Any]:
  """Compiles (warmup) one geometry with `algorithm`; the programs it calls, each with its report row.

  A compile failure (e.g. the program does not fit in HBM) is reported, not raised.
  """
  geometry = tuple(geometry) + (1,) * (4 - len(geometry))
  runner, model = scorer.runner, scorer.config.model
  for program in runner.programs.values():
    program.calls = 0
  algo = None if algorithm == "auto" else algorithm
  out: dict[str, Any] = dict(geometry=list(geometry), requested=algorithm, error=None)
  try:
    choice = scorer.choose(_dummy_request(scorer, geometry, num_labels), algo)
    out.update(algorithm=choice.algorithm, reason=choice.reason)
    scorer.warmup([geometry], algorithm=algo, num_labels=num_labels)
  except Exception as e:  # pylint: disable=broad-except  (the compiler's error is the report)
    out["error"] = one_line(e)
  rows = [program_row(p, model, chip, runner.mesh, devices_per_chip, runner.quantization)
          for p in runner.programs.values() if p.calls]
  q_len, n, l, b = geometry
  useful = cost_model.model_flops(model, q_len, [l] * n, separator=False)["total"] * b
  time_s = sum(r["calls"] * r["roofline_s"] for r in rows)
  out.update(programs=rows, fits=out["error"] is None and all(r["fits"] for r in rows),
             peak_hbm_bytes=max((r["hbm_bytes"] for r in rows), default=0),
             pallas=bool(rows) and all(r["pallas"] for r in rows if r["kernel"] in PALLAS_CALLS),
             useful_flops=useful, program_flops=sum(r["calls"] * r["flops"] for r in rows),
             roofline_s=time_s, items_per_s=(n * b / time_s) if time_s and out["error"] is None else None)
  return out


# --- the largest workload that fits -----------------------------------------------------
def largest_fitting(probe: Callable[[int], bool], start: int, limit: int, rel_tol: float = 0.05) -> int:
  """The largest x in [1, limit] with probe(x) true, for a probe monotone in x (fits up to a size).

  Doubles from `start` until a failure or `limit`, then bisects to `rel_tol`; 0 if nothing fits.
  """
  lo, x = 0, max(1, min(start, limit))
  while probe(x):
    lo = x
    if x == limit:
      return lo
    x = min(2 * x, limit)
  hi = x  # the smallest size known not to fit
  while hi - lo > max(1, int(rel_tol * lo)):
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if probe(mid) else (lo, mid)
  return lo


def search_largest(scorer: Scorer, geometry: Sequence[int], chip: chips.Chip, algorithm: str, dimension: str,
                   limit: int, num_labels: int = 2, devices_per_chip: int = 1) -> dict[str, Any]:
  """Grows `dimension` ("num_items" or "query_len") of `geometry` until `algorithm`'s programs stop fitting."""
  index = {"query_len": 0, "num_items": 1}[dimension]
  failures: dict[int, str] = {}

  def probe(x: int) -> bool:
    g = list(geometry)
    g[index] = x
    result = compile_workload(scorer, g, chip, algorithm, num_labels, devices_per_chip)
    if not result["fits"]:
      failures[x] = result["error"] or f"needs {result['peak_hbm_bytes'] / 1e9:.2f} GB per device"
    logging.info("search %s %s=%d: %s (peak %.2f GB per device)", algorithm, dimension, x,
                 "fits" if result["fits"] else failures[x], result["peak_hbm_bytes"] / 1e9)
    return result["fits"]

  best = largest_fitting(probe, geometry[index], limit)
  first_failure = min((x for x in failures if x > best), default=None)
  return dict(algorithm=algorithm, dimension=dimension, base_geometry=list(geometry), largest=best, limit=limit,
              at_limit=best == limit, first_failure=first_failure,
              failure=failures.get(first_failure) if first_failure else None)


# --- the report ----------------------------------------------------------------------------
def build_config(options: CompileOptions) -> Config:
  # No persistent compilation cache unless asked for: the report times compiles, and a cache would time reads.
  over = {"compilation_cache_dir": "none", **dict(parse_override(a) for a in options.overrides)}
  over["model_name"] = options.model
  if options.quantization:
    if over.get("quantization", options.quantization) != options.quantization:
      raise ValueError(f"quantization={options.quantization!r} and the override quantization="
                       f"{over['quantization']!r} disagree: give one")
    over["quantization"] = options.quantization
  if options.num_layers:
    over["num_layers"] = options.num_layers
  return load_config(over)


def run(options: CompileOptions) -> dict[str, Any]:
  """Compiles every (geometry, algorithm) of `options` for its topology; the report as a JSON-able dict."""
  config = build_config(options)
  chip, dims = chips.parse_topology(options.topology)
  devices = describe_topology(options.topology, options.num_slices)
  devices_per_chip = max(1, len(devices) // (math.prod(dims) * options.num_slices))
  mesh = target_mesh(config.mesh, devices)
  scorer = abstract_scorer(config, mesh)
  common = dict(num_labels=options.num_labels, devices_per_chip=devices_per_chip)
  geometries = options.parsed_geometries()
  workloads = [compile_workload(scorer, g, chip, a, **common) for g in geometries for a in options.algorithms]
  g = tuple(geometries[0])
  limits = dict(num_items=max(1, (config.scoring.max_request_tokens - g[0]) // g[2]),  # the request token cap
                query_len=config.buckets.prefix_buckets[-1])                           # the largest prefix bucket
  unknown = set(options.search) - set(limits)
  if unknown:
    raise ValueError(f"search={sorted(unknown)}: the searchable dimensions are {sorted(limits)}")
  searches = [search_largest(scorer, g, chip, a, d, limits[d], **common)
              for a in options.search_algorithms for d in options.search]
  m = config.model
  return dict(topology=options.topology, num_slices=options.num_slices, chip=dataclasses.asdict(chip),
              devices=len(devices), devices_per_chip=devices_per_chip, mesh=dict(mesh.shape),
              model=options.model, num_layers=m.num_layers, params=m.num_params(),
              dtype=config.runtime.dtype, weight_dtype=config.runtime.weight_dtype,
              quantization=config.runtime.quantization, weights_bytes=per_device_bytes(scorer.runner.params),
              attention=scorer.runner.default_kernel, overrides=list(options.overrides),
              workloads=workloads, searches=searches,
              note=f"compile-time bounds from the {chip.platform.upper()} compiler and the cost model, "
                   "not measurements")
