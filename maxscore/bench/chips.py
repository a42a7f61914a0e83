"""Per-chip TPU figures a roofline needs: HBM capacity, peak bf16 FLOP/s, HBM bandwidth.

Figures are per chip as Google Cloud publishes them. v4 is described in megacore mode (one
JAX device per chip, its two TensorCores together), which is what jax's TPU meshes require.
"""

import dataclasses
import re


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


GB = 10**9
GiB = 1 << 30

CHIPS = {
    # https://cloud.google.com/tpu/docs/v4 (system architecture: 32 GiB HBM2, 1200 GBps, 275 TFLOPs bf16)
    "v4": Chip("v4", "TPU v4", 32 * GiB, 275e12, 1200 * GB, "https://cloud.google.com/tpu/docs/v4",
                "megacore"),
    # https://cloud.google.com/tpu/docs/v5e (16 GB HBM2, 819 GBps, 197 TFLOPs bf16)
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GB, 197e12, 819 * GB, "https://cloud.google.com/tpu/docs/v5e"),
    # https://cloud.google.com/tpu/docs/v5p (95 GB HBM2e, 2765 GBps, 459 TFLOPs bf16)
    "v5p": Chip("v5p", "TPU v5", 95 * GB, 459e12, 2765 * GB, "https://cloud.google.com/tpu/docs/v5p"),
    # https://cloud.google.com/tpu/docs/v6e (Trillium: 32 GB HBM, 1640 GBps, 918 TFLOPs bf16)
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GB, 918e12, 1640 * GB, "https://cloud.google.com/tpu/docs/v6e"),
}

_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$")


class TopologyError(ValueError):
  """A topology name maxscore cannot describe."""


def parse_topology(topology: str) -> tuple[Chip, tuple[int, ...]]:
  """("v6e:2x4") -> (the v6e Chip, (2, 4)); errors name the allowed forms."""
  m = _TOPOLOGY.match(topology.strip())
  if not m:
    raise TopologyError(f"topology={topology!r} must look like <chip>:<X>x<Y>[x<Z>] with chip one of "
                        f"{sorted(CHIPS)} (e.g. v6e:1x1, v5e:2x2, v5p:2x2x1)")
  dims = tuple(int(d) for d in m.groups()[1:] if d is not None)
  if any(d <= 0 for d in dims):
    raise TopologyError(f"topology={topology!r}: every dimension must be positive")
  return CHIPS[m.group(1)], dims
