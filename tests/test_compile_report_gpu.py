"""Compile reports for GPUs that are not here: XLA's deviceless CUDA compile from a target description.

Tests marked `gpu_aot` compile with jax's CUDA plugin (`make test-gpu-aot` installs it in its own
venv; the plain test venv has none, so there they are skipped) for described GPUs; nothing runs
on a GPU. Each asserts compiled + fits + the Triton custom call of the `pallas_gpu` kernel (the
kernel, not a fallback) and the GPU architecture the code was built for.
"""

import importlib.util

import pytest

from maxscore.bench import chips, compile_report
from maxscore.testing import scripts
from maxscore.testing.compile_targets import abstract_scorer, assert_compiled, compile_both_algorithms

compile_check = scripts.load_script("compile_check")

HAVE_CUDA_PLUGIN = any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (12, 13)) \
    if importlib.util.find_spec("jax_plugins") else False
needs_cuda_plugin = pytest.mark.skipif(not HAVE_CUDA_PLUGIN,
                                       reason="jax's CUDA plugin is not installed (make test-gpu-aot installs it)")
H100 = chips.GPUS["h100"]
SMALL = dict(dtype="bfloat16", weight_dtype="bfloat16")


# --- pure pieces ----------------------------------------------------------------------
def test_gpu_table_and_topology_names():
  for chip in chips.GPUS.values():
    assert chip.platform == "gpu" and chip.source.startswith("https://www.nvidia.com/en-us/data-center/")
    assert chip.gpu.source.startswith("https://github.com/openxla/xla/")
    assert chip.hbm_bytes > 7e10 and chip.peak_bf16_flops > 3e14 and chip.hbm_bytes_per_s > 2e12
    text = chips.gpu_target_config(chip)
    major, minor = chip.gpu.compute_capability
    assert f"major: {major} minor: {minor}" in text and f"device_memory_size: {chip.hbm_bytes}" in text
  assert chips.parse_topology("h100") == (H100, (1,))
  assert chips.parse_topology("h200:8") == (chips.GPUS["h200"], (8,))
  for bad in ("h100:0", "h300", "h100:2x2", "H100-8"):
    with pytest.raises(chips.TopologyError, match="topology"):
      chips.parse_topology(bad)
  with pytest.raises(chips.TopologyError, match="not a GPU"):
    chips.gpu_target_config(chips.CHIPS["v6e"])
  with pytest.raises(chips.TopologyError, match="num_slices=2"):
    compile_report.describe_topology("h100", num_slices=2)


def test_missing_cuda_plugin_is_one_clear_line(monkeypatch):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  def no_plugin(*args, **kwargs):
    raise NotImplementedError("topology not implemented for cuda")
  monkeypatch.setattr(topologies, "get_topology_desc", no_plugin)
  with pytest.raises(chips.TopologyError, match=r"topology='h100'.*jax\[cuda12\]") as e:
    compile_report.describe_topology("h100")
  assert "\n" not in str(e.value)


# --- real GPU compiles (no GPU) ---------------------------------------------------------
def _assert_ok(workload, algorithm, entries):
  assert_compiled(workload, algorithm, entries, kernel="pallas_gpu")


@pytest.mark.gpu_aot
@pytest.mark.slow
@needs_cuda_plugin
def test_script_h100_tiny_packed_and_prefill_extend(tmp_path, capsys):
  """The script end to end: auto picks pallas_gpu and packed; forced prefill_extend compiles prefill + extend."""
  out = tmp_path / "r.json"
  report = compile_check.run(["compile_check", "--topology=h100", "--model=tiny-qwen3", "--geometries=200x40x8",
                              "--algorithms=auto,prefill_extend", f"--output_json={out}", "dtype=bfloat16",
                              "weight_dtype=bfloat16"])
  assert out.is_file() and report["attention"] == "pallas_gpu" and report["devices"] == 1
  assert report["chip"]["name"] == "h100" and report["mesh"] == dict(data=1, fsdp=1, tensor=1)
  packed, extend = report["workloads"]
  _assert_ok(packed, "packed", ["packed_logprobs"])
  _assert_ok(extend, "prefill_extend", ["prefill", "extend_logprobs"])
  assert packed["programs"][0]["hbm_capacity"] == H100.hbm_bytes
  text = capsys.readouterr().out
  assert "GPU h100" in text and "FITS" in text


@pytest.mark.gpu_aot
@pytest.mark.slow
@needs_cuda_plugin
def test_qwen3_dims_two_layers_h100():
  """Qwen3-0.6B's real widths (151936 vocab) at 2 layers: packed and prefill+extend compile and fit on an H100."""
  scorer = abstract_scorer("h100", model="qwen3-0.6b", num_layers=2, **SMALL)
  assert scorer.runner.mesh.devices.flat[0].device_kind == H100.device_kind
  packed, extend = compile_both_algorithms(scorer, (500, 64, 16), H100, kernel="pallas_gpu")
  weights = scorer.config.model.num_params() * 2  # bf16
  assert all(r["memory"]["arguments"] >= weights for r in packed["programs"] + extend["programs"])


@pytest.mark.gpu_aot
@pytest.mark.slow
@needs_cuda_plugin
@pytest.mark.parametrize("topology", ["a100", "h100:2"])
def test_other_gpu_and_two_gpus_tensor_parallel(topology):
  """An sm_80 target, and two H100s as tensor=2 (the kernel inside the sharded program)."""
  over = dict(ici_tensor_parallelism=2) if topology.endswith(":2") else {}
  scorer = abstract_scorer(topology, model="tiny-qwen3", **SMALL, **over)
  chip, (count,) = chips.parse_topology(topology)
  assert scorer.runner.mesh.size == count and scorer.runner.mesh.shape["tensor"] == count
  assert {d.device_kind for d in scorer.runner.mesh.devices.flat} == {chip.device_kind}
  _assert_ok(compile_report.compile_workload(scorer, (200, 40, 8), chip), "packed", ["packed_logprobs"])


@pytest.mark.gpu_aot
@needs_cuda_plugin
def test_failed_gpu_compile_is_reported():
  scorer = abstract_scorer("h100", model="tiny-qwen3", **SMALL)
  too_long = scorer.config.buckets.prefix_buckets[-1] + 1
  result = compile_report.compile_workload(scorer, (too_long, 2, 4), H100)
  assert not result["fits"] and "query" in result["error"] and result["items_per_s"] is None


@pytest.mark.gpu_aot
@pytest.mark.slow
@needs_cuda_plugin
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_training_step_compiles_for_h100_with_the_triton_backward(mode):
  """--train on an H100: training_kernel() picks pallas_gpu, and the compiled step holds its forward, dq and dkv
  Triton calls (the Pallas backward, not shared_prefix), and fits."""
  report = compile_check.run(["compile_check", f"--train={mode}", "--topology=h100", "--model=tiny-qwen3",
                              "--geometries=60x8x16", "--batch_size=2", "--lora_rank=8", "--max_batch_size=0",
                              "dtype=bfloat16", "weight_dtype=bfloat16"])
  (step,) = report["steps"]
  assert report["attention"] == "pallas_gpu" and step["error"] is None and step["fits"], step
  assert step["pallas_kernels"] == ["packed_flash_dkv", "packed_flash_dq", "packed_flash_forward"], step
  assert step["compile"]["compile_s"] > 0 and 0 < step["hbm_bytes"] < H100.hbm_bytes
