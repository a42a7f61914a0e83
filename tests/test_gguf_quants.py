"""Each GGML dequantizer against gguf's reference (llama.cpp's gguf-py) on random blocks: bit-identical."""

import numpy as np
import pytest

from maxscore.checkpoints import gguf_quants

# byte offsets of each block type's float16 scale fields (kept finite so every weight is a number)
_F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
               "Q5_K": (0, 2), "Q6_K": (208,)}


def _random_blocks(type_name: str, n_blocks: int, rng) -> np.ndarray:
  fmt = gguf_quants.BLOCK_FORMATS[type_name]
  blocks = rng.integers(0, 256, (n_blocks, fmt.type_size), dtype=np.uint8)
  for start in _F16_FIELDS[type_name]:
    blocks[:, start:start + 2] = rng.normal(0, 0.05, (n_blocks, 1)).astype(np.float16).view(np.uint8)
  return blocks


@pytest.mark.parametrize("type_name", sorted(gguf_quants.BLOCK_FORMATS))
def test_block_dequantizers_are_bit_identical_to_gguf(type_name):
  import gguf
  rng = np.random.default_rng(sum(map(ord, type_name)))
  fmt = gguf_quants.BLOCK_FORMATS[type_name]
  rows, blocks_per_row = 6, 3
  data = _random_blocks(type_name, rows * blocks_per_row, rng).reshape(rows, blocks_per_row * fmt.type_size)
  want = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[type_name])
  got = gguf_quants.dequantize(data, type_name, (rows, blocks_per_row * fmt.block_size))
  assert got.dtype == np.float32 and got.shape == want.shape
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # every bit: the error is 0
  assert np.ptp(got) > 0


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16"])
def test_float_types_are_bit_identical_to_gguf(type_name):
  import gguf
  w = np.random.default_rng(0).normal(0, 1, (4, 64)).astype(np.float32)
  qtype = gguf.GGMLQuantizationType[type_name]
  stored = gguf.quants.quantize(w, qtype)
  want = gguf.quants.dequantize(stored, qtype)
  np.testing.assert_array_equal(gguf_quants.dequantize(stored, type_name, w.shape).view(np.uint32),
                                np.asarray(want, np.float32).view(np.uint32))


def test_q8_0_unpacks_to_int8_codes_and_one_scale_per_32_weights():
  """The int8 path: Q8_0 blocks load as int8 codes with a float scale per block, no float round trip."""
  import gguf
  w = np.random.default_rng(1).normal(0, 1, (2, 64)).astype(np.float32)
  blocks = gguf_quants.unpack(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), "Q8_0")
  assert blocks.codes_NxGxE.dtype == np.int8 and blocks.codes_NxGxE.shape == (4, 1, 32)
  assert blocks.scale_NxGx1.shape == (4, 1, 1) and blocks.offset_NxGx1 is None
  np.testing.assert_allclose(blocks.dequantize().reshape(w.shape), w, atol=np.abs(w).max() / 127)
