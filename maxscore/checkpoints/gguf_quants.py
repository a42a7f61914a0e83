"""GGML tensor encodings -> float32, computed as llama.cpp's reference dequantizers compute them.

Each block format is split in two steps: `unpack` reads a block's bytes into integer codes with one
scale (and, for the affine formats, one offset) per group of codes, and `Blocks.dequantize` forms
`scale * codes + offset` in float32. The float result is bit-identical to the reference (the same
float32 products and sums, in the same order), and the unpacked form is what an int8 weight path
would load without a float round trip (Q8_0: int8 codes, one float scale per 32 weights: `q8_0_blocks`, the
layout of quantization_group_size=32; `q8_0_per_channel` says when a load is exact in the per-output-channel
layout).

Formats (llama.cpp's ggml-common.h; bytes per block / weights per block):
    Q8_0  34/32   f16 d, 32 x int8 q                         w = d * q
    Q4_0  18/32   f16 d, 16 bytes of 4-bit q                 w = d * (q - 8)
    Q4_1  20/32   f16 d, f16 m, 16 bytes of 4-bit q          w = d * q + m
    Q5_0  22/32   f16 d, 32 high bits, 16 bytes of low nibbles  w = d * (q - 16)
    Q5_1  24/32   f16 d, f16 m, 32 high bits, low nibbles    w = d * q + m
    Q4_K  144/256 f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 4-bit q (8 groups of 32)
    Q5_K  176/256 as Q4_K plus 32 bytes of high bits         w = (d * sc) * q - dmin * m
    Q6_K  210/256 4-bit low and 2-bit high q, 16 int8 scales, f16 d (16 groups of 16)  w = (d * sc) * (q - 32)
"""

import dataclasses
from typing import Callable, Optional

import numpy as np

QK_K = 256  # weights per K-quant super-block


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Unpacked blocks: each weight is `scale * code + offset` over the last axis of `codes`.

  codes_NxGxE: integer codes (int8 where the format is symmetric, else uint8), G groups of E weights per block;
  scale_NxGx1 and offset_NxGx1 (None: no offset): float32 per group."""
  codes_NxGxE: np.ndarray
  scale_NxGx1: np.ndarray
  offset_NxGx1: Optional[np.ndarray] = None

  def dequantize(self) -> np.ndarray:
    """float32 weights [N, G * E], bit-identical to the reference dequantizer."""
    w = self.codes_NxGxE.astype(np.float32) * self.scale_NxGx1
    if self.offset_NxGx1 is not None:
      w = w + self.offset_NxGx1
    return w.reshape(w.shape[0], -1)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
  """The float16 at byte `start` of each block, as float32 [N, 1, 1]."""
  return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32).reshape(-1, 1, 1)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
  """4-bit codes [N, chunks * 2, width] from bytes [N, chunks * width]: each chunk's low nibbles, then its high."""
  qs = qs.reshape(qs.shape[0], -1, 1, width)
  return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(qs.shape[0], -1, width)


def _unpack_q8_0(blocks: np.ndarray) -> Blocks:
  return Blocks(blocks[:, 2:].copy().view(np.int8).reshape(-1, 1, 32), _f16(blocks, 0))


def _unpack_q4_0(blocks: np.ndarray) -> Blocks:
  q = _nibbles(blocks[:, 2:], 16).reshape(-1, 1, 32)
  return Blocks(q.astype(np.int8) - np.int8(8), _f16(blocks, 0))


def _unpack_q4_1(blocks: np.ndarray) -> Blocks:
  return Blocks(_nibbles(blocks[:, 4:], 16).reshape(-1, 1, 32), _f16(blocks, 0), _f16(blocks, 2))


def _five_bit(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
  """5-bit codes [N, 1, 32]: low nibbles from `qs`, bit i of the little-endian 32-bit `qh` as weight i's fifth bit."""
  high = np.unpackbits(qh, axis=-1, bitorder="little")
  return (_nibbles(qs, 16).reshape(-1, 32) | (high << 4)).reshape(-1, 1, 32)


def _unpack_q5_0(blocks: np.ndarray) -> Blocks:
  q = _five_bit(blocks[:, 2:6], blocks[:, 6:])
  return Blocks(q.astype(np.int8) - np.int8(16), _f16(blocks, 0))


def _unpack_q5_1(blocks: np.ndarray) -> Blocks:
  return Blocks(_five_bit(blocks[:, 4:8], blocks[:, 8:]), _f16(blocks, 0), _f16(blocks, 2))


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Q4_K/Q5_K 6-bit scales and mins [N, 8] from 12 bytes: groups 0-3 in the low 6 bits of bytes 0-3 (scales)
  and 4-7 (mins); groups 4-7 from the nibbles of bytes 8-11 with their top two bits in the top bits of 0-7."""
  s, m, low = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
  scales = np.concatenate([s & 0x3F, (low & 0x0F) | ((s >> 6) << 4)], axis=-1)
  mins = np.concatenate([m & 0x3F, (low >> 4) | ((m >> 6) << 4)], axis=-1)
  return scales, mins


def _k_affine(blocks: np.ndarray, codes_Nx8x32: np.ndarray) -> Blocks:
  scales, mins = _k_scales_mins(blocks[:, 4:16])
  d, dmin = _f16(blocks, 0), _f16(blocks, 2)
  scale = d * scales.astype(np.float32)[..., None]
  offset = -(dmin * mins.astype(np.float32)[..., None])
  return Blocks(codes_Nx8x32, scale, offset)


def _unpack_q4_k(blocks: np.ndarray) -> Blocks:
  return _k_affine(blocks, _nibbles(blocks[:, 16:144], 32))


def _unpack_q5_k(blocks: np.ndarray) -> Blocks:
  qh = blocks[:, 16:48].reshape(-1, 1, 32)  # bit g of byte l: the fifth bit of weight l in group g
  high = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
  return _k_affine(blocks, _nibbles(blocks[:, 48:176], 32) | (high << 4))


def _unpack_q6_k(blocks: np.ndarray) -> Blocks:
  n = blocks.shape[0]
  low = _nibbles(blocks[:, 0:128], 64).reshape(n, 8, 32)  # per half of 128: 64 low nibbles, then 64 high
  qh = blocks[:, 128:192].reshape(n, 2, 1, 32)  # per half: 2 bits for each quarter, quarter k at bits 2k
  high = ((qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).reshape(n, 8, 32)
  q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16)
  scale = _f16(blocks, 208) * blocks[:, 192:208].copy().view(np.int8).astype(np.float32)[..., None]
  return Blocks(q, scale)


@dataclasses.dataclass(frozen=True)
class BlockFormat:
  """A GGML block encoding: `block_size` weights in `type_size` bytes, unpacked by `unpack`."""
  block_size: int
  type_size: int
  unpack: Callable[[np.ndarray], Blocks]


BLOCK_FORMATS = {
    "Q8_0": BlockFormat(32, 34, _unpack_q8_0),
    "Q4_0": BlockFormat(32, 18, _unpack_q4_0),
    "Q4_1": BlockFormat(32, 20, _unpack_q4_1),
    "Q5_0": BlockFormat(32, 22, _unpack_q5_0),
    "Q5_1": BlockFormat(32, 24, _unpack_q5_1),
    "Q4_K": BlockFormat(QK_K, 144, _unpack_q4_k),
    "Q5_K": BlockFormat(QK_K, 176, _unpack_q5_k),
    "Q6_K": BlockFormat(QK_K, 210, _unpack_q6_k),
}
FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
SUPPORTED_TYPES = tuple(FLOAT_TYPES) + tuple(BLOCK_FORMATS)


def unpack(data: np.ndarray, type_name: str) -> Blocks:
  """The blocks of a block-quantized tensor's raw bytes (any shape of uint8 holding whole blocks)."""
  fmt = BLOCK_FORMATS[type_name]
  return fmt.unpack(np.ascontiguousarray(data).view(np.uint8).reshape(-1, fmt.type_size))


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
  """float32 weights of `shape` (row-major, GGUF's dims reversed) from a tensor's stored data."""
  if type_name == "BF16":  # the high 16 bits of a float32
    bits = np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)
  if type_name in FLOAT_TYPES:
    return np.ascontiguousarray(data).view(FLOAT_TYPES[type_name]).astype(np.float32).reshape(shape)
  return unpack(data, type_name).dequantize().reshape(shape)


def q8_0_blocks(data: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
  """A Q8_0 matrix [rows, cols] (rows: output channels; blocks run along cols) as stored: (int8 codes
  [rows, cols], float32 block scales [rows, cols / 32]). The f16 scales widen to float32 exactly, so
  codes * scales (each scale repeated over its block) are the reference dequantizer's values, bit for bit."""
  rows, cols = shape
  blocks = unpack(data, "Q8_0")
  return blocks.codes_NxGxE.reshape(rows, cols).astype(np.int8), blocks.scale_NxGx1.reshape(rows, cols // 32)


def q8_0_per_channel(data: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A Q8_0 matrix [rows, cols] (rows: output channels; blocks run along cols, the contracting dim) in the
  per-output-channel int8 layout of layers/quantization.py: (int8 codes [rows, cols], float32 scale [rows],
  exact [rows] bool).

  Q8_0 keeps one f16 scale d per 32 weights, finer than one scale per channel, so a load is exact only where
  every block of a row shares one d: that row keeps its codes and d as they are stored (no float round trip,
  no rounding at all). Any other row is requantized per channel from its dequantized values d_b * q, which are
  exact in float32 (an 11-bit f16 mantissa times an 8-bit code): s = max|w| / 127 over the row, codes
  round(w / s) (layers/quantization.py's `quantize`), so each weight moves from the file's value by at most
  s / 2 <= max_b(d_b) * max|q| / 254 (on top of Q8_0's own rounding of the original weights, <= d_b / 2). A
  row of zeros (d = 0) gets scale 1 and zero codes, as `quantize` gives it."""
  from layers import quantization as quant  # pylint: disable=import-outside-toplevel  (jax, only for this)
  rows, cols = shape
  blocks = unpack(data, "Q8_0")
  codes = blocks.codes_NxGxE.reshape(rows, cols)
  d = blocks.scale_NxGx1.reshape(rows, cols // 32)
  exact = np.all(d == d[:, :1], axis=1)
  w = blocks.dequantize().reshape(rows, cols)
  requant, requant_scale = (np.asarray(x) for x in quant.quantize(w, (1,)))
  zero = d[:, 0] == 0
  out_codes = np.where((exact & ~zero)[:, None], codes, requant).astype(np.int8)
  out_scale = np.where(exact & ~zero, d[:, 0], requant_scale).astype(np.float32)
  return out_codes, out_scale, exact
