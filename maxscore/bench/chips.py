"""Per-chip TPU and per-GPU figures a roofline needs: HBM capacity, peak bf16 FLOP/s and int8 op/s, HBM bandwidth.

TPU figures are per chip as Google Cloud publishes them. v4 is described in megacore mode (one
JAX device per chip, its two TensorCores together), which is what jax's TPU meshes require.
GPU peak and bandwidth are NVIDIA's published SXM figures (the bf16 peak dense, i.e. half the
"with sparsity" figure NVIDIA lists; the int8 peak likewise); the GPU's memory is the size the device reports, as XLA's
own target descriptions of these GPUs record it. A GPU also carries the target description
XLA's GPU compiler needs to compile for it without the device (`gpu_target_config`).
"""

import dataclasses
import re
from typing import Optional


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """What XLA's GPU compiler reads of a GPU it cannot see (the fields of its GpuTargetConfigProto)."""
  compute_capability: tuple[int, int]   # (major, minor): 9.0 -> sm_90a code
  sms: int                              # streaming multiprocessors (core_count)
  fp32_lanes_per_sm: int                # fpus_per_core
  shared_memory_per_sm: int             # bytes
  shared_memory_per_block_optin: int    # bytes one block may opt in to
  l2_bytes: int
  clock_ghz: float
  source: str                           # where these figures (and the Chip's memory size) come from


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation, per chip."""
  name: str                  # the topology prefix: v6e in "v6e:2x2"
  device_kind: str           # jax Device.device_kind of its devices
  hbm_bytes: int             # HBM capacity
  peak_bf16_flops: float     # dense bf16 matmul peak, FLOP/s
  hbm_bytes_per_s: float     # HBM bandwidth, bytes/s
  source: str                # where the figures come from
  chip_config: str = "default"  # libtpu's chip_config_name when describing a topology
  platform: str = "tpu"      # the jax platform its devices have: tpu or gpu
  gpu: Optional[GpuTarget] = None  # GPUs only: the target description XLA compiles for
  peak_int8_ops: float = 0.0  # dense int8 matmul peak, op/s (int32 accumulation): what quantization=int8 dots run at

  def matmul_peak(self, int8: bool = False) -> float:
    """The dense matmul peak a dot runs at: int8 (w8a8) or the bf16 one."""
    return self.peak_int8_ops if int8 else self.peak_bf16_flops


GB = 10**9
GiB = 1 << 30

CHIPS = {
    # https://cloud.google.com/tpu/docs/v4 (system architecture: 32 GiB HBM2, 1200 GBps, 275 TFLOPs bf16;
    # the page gives one peak "bf16 or int8", so int8 dots gain no compute rate on v4)
    "v4": Chip("v4", "TPU v4", 32 * GiB, 275e12, 1200 * GB, "https://cloud.google.com/tpu/docs/v4",
                "megacore", peak_int8_ops=275e12),
    # https://cloud.google.com/tpu/docs/v5e (16 GB HBM2, 819 GBps, 197 TFLOPs bf16, 393 TOPs int8)
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GB, 197e12, 819 * GB, "https://cloud.google.com/tpu/docs/v5e",
                peak_int8_ops=393e12),
    # https://cloud.google.com/tpu/docs/v5p (95 GB HBM2e, 2765 GBps, 459 TFLOPs bf16). The page gives no int8
    # figure; 918 TOPs int8 is Google's v5p launch figure (December 2023), as secondary sources quote it.
    "v5p": Chip("v5p", "TPU v5", 95 * GB, 459e12, 2765 * GB, "https://cloud.google.com/tpu/docs/v5p",
                peak_int8_ops=918e12),
    # https://cloud.google.com/tpu/docs/v6e (Trillium: 32 GB HBM, 1640 GBps, 918 TFLOPs bf16, 1836 TOPs int8)
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GB, 918e12, 1640 * GB, "https://cloud.google.com/tpu/docs/v6e",
                peak_int8_ops=1836e12),
}

_XLA_SPECS = "https://github.com/openxla/xla/tree/main/xla/backends/gpu/target_config/specs/"

GPUS = {
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 80 GB HBM3, 3.35 TB/s,
    # BF16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense; INT8 Tensor Core 3,958 TOPS with sparsity = 1,979)
    "h100": Chip("h100", "NVIDIA H100 80GB HBM3", 84942979072, 989e12, 3350 * GB,
                 "https://www.nvidia.com/en-us/data-center/h100/", platform="gpu",
                 gpu=GpuTarget((9, 0), 132, 128, 233472, 232448, 52428800, 1.98,
                               _XLA_SPECS + "h100_sxm.txtpb"), peak_int8_ops=1979e12),
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 141 GB HBM3e, 4.8 TB/s,
    # BF16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense; INT8 Tensor Core 3,958 TOPS with sparsity = 1,979)
    "h200": Chip("h200", "NVIDIA H200 141GB HBM3e", 151397597184, 989e12, 4800 * GB,
                 "https://www.nvidia.com/en-us/data-center/h200/", platform="gpu",
                 gpu=GpuTarget((9, 0), 132, 128, 233472, 232448, 52428800, 1.98,
                               _XLA_SPECS + "h200.txtpb"), peak_int8_ops=1979e12),
    # https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM: HBM2e, 2,039 GB/s,
    # BF16 Tensor Core 312 TFLOPS dense, 624 with sparsity; INT8 Tensor Core 624 TOPS dense)
    "a100": Chip("a100", "NVIDIA A100-SXM4-80GB", 85100068864, 312e12, 2039 * GB,
                 "https://www.nvidia.com/en-us/data-center/a100/", platform="gpu",
                 gpu=GpuTarget((8, 0), 108, 64, 167936, 166912, 41943040, 1.41,
                               _XLA_SPECS + "a100_sxm_80.txtpb"), peak_int8_ops=624e12),
}

_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$")
_GPU_TOPOLOGY = re.compile(r"^(h100|h200|a100)(?::(\d+))?$")


class TopologyError(ValueError):
  """A topology name maxscore cannot describe."""


def parse_topology(topology: str) -> tuple[Chip, tuple[int, ...]]:
  """("v6e:2x4") -> (the v6e Chip, (2, 4)); ("h100:8") -> (the H100, (8,)), "h100" is one GPU.

  Errors name the allowed forms."""
  g = _GPU_TOPOLOGY.match(topology.strip())
  if g:
    count = int(g.group(2) or 1)
    if count <= 0:
      raise TopologyError(f"topology={topology!r}: the GPU count must be positive")
    return GPUS[g.group(1)], (count,)
  m = _TOPOLOGY.match(topology.strip())
  if not m:
    raise TopologyError(f"topology={topology!r} must look like <chip>:<X>x<Y>[x<Z>] with chip one of "
                        f"{sorted(CHIPS)} (e.g. v6e:1x1, v5e:2x2, v5p:2x2x1), or <gpu>[:<count>] with gpu "
                        f"one of {sorted(GPUS)} (e.g. h100, h100:8)")
  dims = tuple(int(d) for d in m.groups()[1:] if d is not None)
  if any(d <= 0 for d in dims):
    raise TopologyError(f"topology={topology!r}: every dimension must be positive")
  return CHIPS[m.group(1)], dims


def gpu_target_config(chip: Chip) -> str:
  """`chip`'s target description as the text GpuTargetConfigProto XLA's deviceless GPU compile reads."""
  t = chip.gpu
  if t is None:
    raise TopologyError(f"{chip.name} is not a GPU: it has no GPU target description")
  major, minor = t.compute_capability
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {t.shared_memory_per_sm}
  threads_per_core_limit: 2048
  core_count: {t.sms}
  fpus_per_core: {t.fp32_lanes_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(chip.hbm_bytes_per_s)}
  l2_cache_size: {t.l2_bytes}
  clock_rate_ghz: {t.clock_ghz}
  device_memory_size: {chip.hbm_bytes}
  shared_memory_per_block_optin: {t.shared_memory_per_block_optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 patch: 0 }}
device_description_str: "{chip.device_kind}"
"""
