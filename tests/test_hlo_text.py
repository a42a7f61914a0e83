"""maxscore/bench/hlo_text.py: the dots and int8 conversions of an optimized HLO module, read from XLA's own
output on CPU and from a GPU-style module (cuBLAS call, Triton GEMM fusion) written the way XLA prints one."""

import jax
import jax.numpy as jnp

from layers import quantization as quant
from maxscore.bench import hlo_text


def _compiled_text(mode: str) -> str:
  x = jnp.ones((16, 32), jnp.bfloat16)
  wq, scale = quant.quantize(jnp.ones((32, 24), jnp.float32), (0,))
  w = wq if mode != "none" else wq.astype(jnp.bfloat16)
  fn = lambda x_, w_, s_: quant.einsum("TD,DF->TF", x_, w_ if mode == "none" else (w_, s_), 1, mode, jnp.bfloat16)
  return jax.jit(fn).lower(x, w, scale).compile().as_text()


def test_w8a8_compiles_to_an_int8_dot_and_one_quantizing_conversion():
  module = hlo_text.parse(_compiled_text("int8"))
  found = hlo_text.dots(module)
  assert [(d["operands"], d["result"]) for d in found] == [(["s8", "s8"], "s32")]
  assert len(hlo_text.int8_dots(found)) == 1
  (conversion,) = hlo_text.int8_conversions(module)
  assert conversion["shape"].startswith("s8[16,32]") and "round-nearest-even" in conversion["ops"]
  assert hlo_text.kernel_count(module) >= 3  # at least the quantization, the dot and the rescale


def test_float_and_int8_weight_programs_hold_no_int8_dot_and_no_quantization():
  for mode in ("none", "int8_weights"):
    module = hlo_text.parse(_compiled_text(mode))
    found = hlo_text.dots(module)
    assert found and not hlo_text.int8_dots(found), mode
    assert hlo_text.int8_conversions(module) == [], mode


_GPU_MODULE = """HloModule jit_f, is_scheduled=true

%fused_norm_quant (p0: bf16[128,64], p1: f32[128]) -> s8[128,64] {
  %p0 = bf16[128,64]{1,0} parameter(0)
  %p1 = f32[128]{0} parameter(1)
  %c = f32[128,64]{1,0} convert(bf16[128,64]{1,0} %p0)
  %r = f32[128]{0} rsqrt(f32[128]{0} %p1)
  %b = f32[128,64]{1,0} broadcast(f32[128]{0} %r), dimensions={0}
  %m = f32[128,64]{1,0} multiply(f32[128,64]{1,0} %c, f32[128,64]{1,0} %b)
  ROOT %q = s8[128,64]{1,0} convert(f32[128,64]{1,0} %m)
}

%triton_gemm_dot (p0.1: s8[128,64], p1.1: s8[64,256]) -> bf16[128,256] {
  %p0.1 = s8[128,64]{1,0} parameter(0)
  %p1.1 = s8[64,256]{1,0} parameter(1)
  %d = s32[128,256]{1,0} dot(s8[128,64]{1,0} %p0.1, s8[64,256]{1,0} %p1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %o = bf16[128,256]{1,0} convert(s32[128,256]{1,0} %d)
}

ENTRY %main (x: bf16[128,64], s: f32[128], w: s8[64,256], w2: bf16[64,256]) -> (bf16[128,256], s32[128,256]) {
  %x = bf16[128,64]{1,0} parameter(0)
  %s = f32[128]{0} parameter(1)
  %w = s8[64,256]{1,0} parameter(2)
  %w2 = bf16[64,256]{1,0} parameter(3)
  %fusion = s8[128,64]{1,0} fusion(bf16[128,64]{1,0} %x, f32[128]{0} %s), kind=kLoop, calls=%fused_norm_quant
  %gemm = bf16[128,256]{1,0} fusion(s8[128,64]{1,0} %fusion, s8[64,256]{1,0} %w), kind=kCustom, calls=%triton_gemm_dot, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %cublas = (s32[128,256]{1,0}, s8[4194304]{0}) custom-call(s8[128,64]{1,0} %fusion, s8[64,256]{1,0} %w), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{}}
  %float = (bf16[128,256]{1,0}, s8[4194304]{0}) custom-call(bf16[128,64]{1,0} %x, bf16[64,256]{1,0} %w2), custom_call_target="__cublas$lt$matmul"
  %gte = s32[128,256]{1,0} get-tuple-element((s32[128,256]{1,0}, s8[4194304]{0}) %cublas), index=0
  %gte.1 = bf16[128,256]{1,0} get-tuple-element((bf16[128,256]{1,0}, s8[4194304]{0}) %float), index=0
  ROOT %t = (bf16[128,256]{1,0}, s32[128,256]{1,0}) tuple(bf16[128,256]{1,0} %gemm, s32[128,256]{1,0} %gte)
}
"""


def test_a_gpu_module_s_triton_gemm_and_cublas_calls_are_read_with_their_operand_types():
  module = hlo_text.parse(_GPU_MODULE)
  assert [c.name for c in module] == ["fused_norm_quant", "triton_gemm_dot", "main"] and module[-1].entry
  found = {d["name"]: d for d in hlo_text.dots(module)}
  assert set(found) == {"d", "cublas", "float"}
  assert (found["d"]["kind"], found["d"]["operands"], found["d"]["result"]) == ("triton", ["s8", "s8"], "s32")
  assert (found["cublas"]["kind"], found["cublas"]["operands"], found["cublas"]["result"]) == (
      "__cublas$gemm", ["s8", "s8"], "s32")
  assert (found["float"]["kind"], found["float"]["operands"]) == ("__cublas$lt$matmul", ["bf16", "bf16"])
  assert {d["name"] for d in hlo_text.int8_dots(list(found.values()))} == {"d", "cublas"}
  (conversion,) = hlo_text.int8_conversions(module)  # the s32 -> bf16 convert is no quantization
  assert conversion["computation"] == "fused_norm_quant" and conversion["fused_with"] == "a normalization"
  assert conversion["called_by"] == [dict(name="fusion", kind="kLoop", backend="")]
  assert hlo_text.kernel_count(module) == 4  # two fusions, two library calls; no parameters, tuples, gtes
