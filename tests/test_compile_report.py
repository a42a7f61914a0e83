"""Compile reports: the fit search, the cost model per program, and real TPU compiles from this CPU host.

Tests marked `tpu_aot` compile with libtpu (the test extra installs it) for described TPU
topologies; nothing runs on a TPU. Each asserts compiled + fits + the Mosaic custom call.
"""

import dataclasses
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from layers import sharding
from layers.config import ModelConfig
from maxscore.bench import chips, compile_report, compile_summary
from maxscore.config import load_config
from maxscore.distributed import processes
from maxscore.scoring import cost_model
from maxscore.testing import scripts
from maxscore.testing.compile_targets import abstract_scorer, assert_compiled, compile_both_algorithms

compile_check = scripts.load_script("compile_check")

V6E = chips.CHIPS["v6e"]
SMALL = dict(dtype="bfloat16", weight_dtype="bfloat16")
# tiny-qwen3 widened so TPU tile padding of its small arrays is negligible next to the weights.
WIDE = dict(SMALL, vocab_size=8192, hidden_size=256, head_dim=128, mlp_dim=1024)


# --- pure pieces ----------------------------------------------------------------------
@pytest.mark.parametrize("threshold,start,limit", [(37, 4, 1000), (1000, 4, 1000), (3, 8, 100), (0, 5, 50),
                                                   (1, 1, 1), (600, 500, 100000)])
def test_largest_fitting_finds_the_threshold(threshold, start, limit):
  probed = []

  def probe(x):
    probed.append(x)
    return x <= threshold
  got = compile_report.largest_fitting(probe, start, limit, rel_tol=0.0)
  assert got == min(threshold, limit)
  assert len(probed) <= 2 * math.log2(limit) + 3  # doubling then bisection, not a scan


def test_largest_fitting_tolerance_bounds_the_probes():
  got = compile_report.largest_fitting(lambda x: x <= 70000, 500, 10**6, rel_tol=0.05)
  assert 0.95 * 70000 <= got <= 70000


def test_program_flops_agree_with_the_request_cost_model():
  cfg = ModelConfig(vocab_size=50, hidden_size=8, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=4, mlp_dim=16)
  p, l, n = 11, 3, 5
  whole = cost_model.model_flops(cfg, p, [l] * n, separator=False)["total"]
  assert cost_model.program_flops(cfg, 1, p, l, n) == whole
  # prefill once + extend against the cache = the same work as one packed row; batch rows add linearly.
  prefill = cost_model.program_flops(cfg, 1, p, 0, 0)
  extend = cost_model.program_flops(cfg, 1, p, l, n, prefix_cached=True)
  assert prefill + extend == whole
  assert cost_model.program_flops(cfg, 4, p, l, n) == 4 * whole


def test_chip_table_and_topology_names():
  for chip in chips.CHIPS.values():
    assert chip.source.startswith("https://cloud.google.com/tpu/docs/")
    assert chip.hbm_bytes > 8e9 and chip.peak_bf16_flops > 1e14 and chip.hbm_bytes_per_s > 5e11
    assert chip.peak_bf16_flops <= chip.peak_int8_ops <= 2 * chip.peak_bf16_flops
  for chip in chips.GPUS.values():
    assert chip.matmul_peak(int8=True) == chip.peak_int8_ops >= chip.matmul_peak() == chip.peak_bf16_flops
  assert chips.parse_topology("v5p:2x2x1") == (chips.CHIPS["v5p"], (2, 2, 1))
  for bad in ("v7:2x2", "v6e-4", "v6e:0x2", "v6e:2"):
    with pytest.raises(chips.TopologyError, match="topology"):
      chips.parse_topology(bad)
  assert compile_report.parse_geometry("2000x500x20x4") == (2000, 500, 20, 4)
  with pytest.raises(ValueError, match="QUERY_LEN"):
    compile_report.parse_geometry("2000x500")


def test_int8_flops_count_at_the_int8_peak_and_the_rest_at_bf16():
  v5e = chips.CHIPS["v5e"]
  assert compile_report.compute_time(197e12, 0, v5e) == pytest.approx(1.0)
  assert compile_report.compute_time(197e12, 197e12, v5e) == pytest.approx(197 / 393)
  assert compile_report.compute_time(2 * 197e12, 197e12, v5e, devices_per_chip=2) == pytest.approx(2 + 394 / 393)
  cfg = ModelConfig(vocab_size=50, hidden_size=8, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=4, mlp_dim=16)
  whole, dense = cost_model.program_flops(cfg, 2, 11, 3, 5), cost_model.program_dense_flops(cfg, 2, 11, 3, 5)
  assert 0 < dense < whole and dense == 2 * 2 * cfg.non_embedding_params() * (11 + 15)
  assert cost_model.program_dense_flops(cfg, 2, 11, 3, 5, prefix_cached=True) == dense * 15 / 26


def test_quantization_flag_and_override_must_agree():
  opts = compile_report.CompileOptions(model="tiny-qwen3", quantization="int8", overrides=("quantization=int8",))
  assert compile_report.build_config(opts).runtime.quantization == "int8"
  with pytest.raises(ValueError, match="disagree"):
    compile_report.build_config(compile_report.CompileOptions(model="tiny-qwen3", quantization="int8",
                                                              overrides=("quantization=none",)))
  with pytest.raises(ValueError, match="quantization='int4'"):
    compile_report.CompileOptions(quantization="int4").validate()


# --- real TPU compiles ------------------------------------------------------------------
def _assert_ok(workload, algorithm, entries):
  assert_compiled(workload, algorithm, entries, kernel="splash")


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_script_v6e_1x1_tiny_packed_and_prefill_extend(tmp_path, capsys):
  """The script end to end: auto picks splash and packed; forced prefill_extend compiles prefill + extend;
  the query-length search grows to the largest prefix bucket."""
  out = tmp_path / "r.json"
  report = compile_check.run(["compile_check", "--topology=v6e:1x1", "--model=tiny-qwen3",
                              "--geometries=200x40x8", "--algorithms=auto,prefill_extend",
                              "--search=query_len", "--search_algorithms=packed", f"--output_json={out}",
                              "dtype=bfloat16", "weight_dtype=bfloat16", "prefix_buckets=[256,512,1024]"])
  assert out.is_file() and report["attention"] == "splash" and report["mesh"] == dict(data=1, fsdp=1, tensor=1)
  packed, extend = report["workloads"]
  _assert_ok(packed, "packed", ["packed_logprobs"])
  _assert_ok(extend, "prefill_extend", ["prefill", "extend_logprobs"])
  (search,) = report["searches"]
  assert search["algorithm"] == "packed" and search["dimension"] == "query_len"
  assert search["largest"] == search["limit"] == 1024 and search["at_limit"]
  assert "FITS" in capsys.readouterr().out


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_qwen3_dims_two_layers_v6e_1x1():
  """Qwen3-0.6B's real widths (151936 vocab) at 2 layers: both splash programs compile and fit on one v6e."""
  scorer = abstract_scorer("v6e:1x1", model="qwen3-0.6b", num_layers=2, **SMALL)
  packed, extend = compile_both_algorithms(scorer, (128, 16, 16), V6E, kernel="splash")
  weights = scorer.config.model.num_params() * 2  # bf16
  assert all(r["memory"]["arguments"] >= weights for r in packed["programs"] + extend["programs"])


def _param_bytes_per_device(scorer) -> int:
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(scorer.runner.params))


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_four_chip_data_by_tensor_mesh_shards_weights():
  """v6e:2x2 as data=2 x tensor=2: compiled, fits, Mosaic inside shard_map; per-chip weights shrink with tensor."""
  scorer = abstract_scorer("v6e:2x2", model="tiny-qwen3", ici_tensor_parallelism=2, **WIDE)
  assert dict(scorer.runner.mesh.shape) == dict(data=2, fsdp=1, tensor=2)
  _assert_ok(compile_report.compile_workload(scorer, (200, 40, 8, 2), V6E), "packed", ["packed_logprobs"])
  extend = compile_report.compile_workload(scorer, (200, 40, 8), V6E, "prefill_extend")
  _assert_ok(extend, "prefill_extend", ["prefill", "extend_logprobs"])
  packed_rows = [p for p in scorer.runner.programs.values() if p.entry == "packed_logprobs"]
  assert compile_report.compute_shards(scorer.runner.mesh, packed_rows[0].batch) == 4  # batch 2 over data

  data_only = abstract_scorer("v6e:2x2", model="tiny-qwen3", **WIDE)  # data=4, tensor=1
  assert dict(data_only.runner.mesh.shape) == dict(data=4, fsdp=1, tensor=1)
  prefill_t1 = compile_report.compile_workload(data_only, (200, 40, 8), V6E, "prefill_extend")["programs"]
  by_entry = lambda rows: {r["entry"]: r for r in rows}  # noqa: E731
  t1, t2 = by_entry(prefill_t1)["prefill"], by_entry(extend["programs"])["prefill"]
  w1, w2 = _param_bytes_per_device(data_only), _param_bytes_per_device(scorer)
  assert w2 < 0.6 * w1  # everything but the norms is split over tensor=2
  # The compiler's per-chip arguments shrink by the weights tensor splits (up to TPU tile padding).
  shrink = t1["memory"]["arguments"] - t2["memory"]["arguments"]
  assert abs(shrink - (w1 - w2)) < 0.05 * (w1 - w2), (shrink, w1 - w2)
  # The checked layout is what layers/sharding.py says.
  spec = sharding.model_param_shardings(scorer.config.model, scorer.runner.mesh)
  assert jax.tree_util.tree_leaves(spec)[0].mesh.shape == scorer.runner.mesh.shape


LIBTPU_NOISE = ("host bounds", "worker hostname", "Source Location Trace", "InitGoogle")


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_script_console_has_no_libtpu_start_up_errors(tmp_path):
  """The report and nothing of libtpu's start-up log on a host without a TPU (the README's clean console)."""
  r = subprocess.run([sys.executable, str(scripts.SCRIPTS_DIR / "compile_check.py"), "--topology=v6e:1x1",
                      "--model=tiny-qwen3", "--geometries=20x4x8", "dtype=bfloat16", "weight_dtype=bfloat16"],
                     capture_output=True, text=True, timeout=600, cwd=tmp_path, env=processes.subprocess_env(1))
  assert r.returncode == 0, r.stderr[-3000:]
  assert "=> FITS" in r.stdout, r.stdout[-3000:]
  assert not [n for n in LIBTPU_NOISE if n in r.stderr], r.stderr[-3000:]


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_deviceless_compiles_keep_out_of_the_persistent_cache(tmp_path):
  """Two compile_check runs sharing a persistent compilation cache: the second prints no "Error reading persistent
  compilation cache entry ... PjRtCompiler must be constructed with a Client" (a TPU executable compiled on this
  host cannot be read back, so none is written), and the setting is back where it was after each compile."""
  env = dict(processes.subprocess_env(1), JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  argv = [sys.executable, str(scripts.SCRIPTS_DIR / "compile_check.py"), "--topology=v6e:1x1", "--model=tiny-qwen3",
          "--geometries=20x4x8", "dtype=bfloat16", "weight_dtype=bfloat16"]
  for _ in range(2):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0 and "=> FITS" in r.stdout, r.stderr[-3000:]
    assert "persistent compilation cache" not in r.stderr, r.stderr[-3000:]
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  lowered = jax.jit(lambda x: x + 1).lower(np.float32(1))
  assert sharding.compile_deviceless(lowered) is not None
  assert jax.config.jax_persistent_cache_min_compile_time_secs == before


def test_libtpu_filter_keeps_what_is_not_its_start_up_noise(capfd):
  noise = ("Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type\n"
           "WARNING: Logging before InitGoogle() is written to STDERR\n=== Source Location Trace: ===\n"
           "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n")
  with compile_report.libtpu_start_up_filtered():
    os.write(2, (noise + "a real error\n").encode())
  assert capfd.readouterr().err == "a real error\n"


@pytest.mark.tpu_aot
def test_two_slices_dcn_data_parallel_compiles_process_zeros_group():
  """A pod-shaped job: 2 slices of v6e:2x2 with dcn_data_parallelism=2; process 0 scores on its slice's group."""
  scorer = abstract_scorer("v6e:2x2", num_slices=2, model="tiny-qwen3", dcn_data_parallelism=2,
                           ici_tensor_parallelism=2, **SMALL)
  mesh = scorer.runner.mesh
  assert mesh.size == 4 and {d.slice_index for d in mesh.devices.flat} == {0}
  assert dict(mesh.shape) == dict(data=2, fsdp=1, tensor=2)
  _assert_ok(compile_report.compile_workload(scorer, (200, 40, 8, 2), V6E), "packed", ["packed_logprobs"])
  _assert_ok(compile_report.compile_workload(scorer, (200, 40, 8), V6E, "prefill_extend"), "prefill_extend",
             ["prefill", "extend_logprobs"])


@pytest.mark.tpu_aot
def test_unknown_topology_and_failed_compile_are_reported():
  with pytest.raises(chips.TopologyError, match="v6e:3x3"):
    compile_report.describe_topology("v6e:3x3")
  scorer = abstract_scorer("v6e:1x1", model="tiny-qwen3", **SMALL)
  too_long = scorer.config.buckets.prefix_buckets[-1] + 1
  result = compile_report.compile_workload(scorer, (too_long, 2, 4), V6E)
  assert not result["fits"] and "query" in result["error"] and result["items_per_s"] is None


@pytest.mark.tpu_aot
@pytest.mark.slow
def test_int8_fit_report_holds_int8_weights_and_runs_its_dense_flops_at_the_int8_peak(tmp_path, capsys):
  """--quantization: the weights each chip holds (int8 projections + float32 scales + float embeddings) and the
  compiler's argument bytes shrink against bf16; w8a8's dense FLOPs count at the chip's int8 peak."""
  v5e = chips.CHIPS["v5e"]
  args = ["compile_check", "--topology=v5e:1x1", "--model=tiny-qwen3", "--geometries=64x16x8", "--algorithms=packed",
          *(f"{k}={v}" for k, v in WIDE.items())]
  reports = {q: compile_check.run(args + [f"--quantization={q}"]) for q in ("none", "int8_weights", "int8")}
  text = capsys.readouterr().out
  assert "393 TOP/s int8" in text and "quantization=int8," in text and "int8 projections + float32 scales" in text
  cfg = load_config({"model_name": "tiny-qwen3", **WIDE}).model
  projections = cfg.non_embedding_params()  # (the norms in it are small)
  bf16, w8, w8a8 = (reports[q] for q in ("none", "int8_weights", "int8"))
  assert w8["weights_bytes"] == w8a8["weights_bytes"]
  # int8 halves each bf16 projection; its float32 scales add one value per output channel.
  assert bf16["weights_bytes"] - w8["weights_bytes"] == pytest.approx(projections, rel=0.05)
  rows = {q: r["workloads"][0]["programs"][0] for q, r in reports.items()}
  assert all(r["workloads"][0]["fits"] for r in reports.values())
  saved = rows["none"]["memory"]["arguments"] - rows["int8"]["memory"]["arguments"]
  assert saved == pytest.approx(bf16["weights_bytes"] - w8["weights_bytes"], rel=0.1)
  assert rows["int8"]["int8_flops_per_device"] > 0.5 * rows["int8"]["flops_per_device"]
  assert rows["none"]["int8_flops_per_device"] == rows["int8_weights"]["int8_flops_per_device"] == 0
  t = lambda r: compile_report.compute_time(r["flops_per_device"], r["int8_flops_per_device"], v5e)  # noqa: E731
  assert t(rows["int8"]) < 0.8 * t(rows["none"]) and t(rows["int8_weights"]) == t(rows["none"])

  # The verdict: on a chip whose HBM lies between the two peaks, bf16 does not fit and int8 does.
  peaks = {q: r["workloads"][0]["peak_hbm_bytes"] for q, r in reports.items()}
  assert peaks["int8"] < peaks["none"]
  squeezed = dataclasses.replace(v5e, hbm_bytes=(peaks["int8"] + peaks["none"]) // 2)
  for q, fits in (("none", False), ("int8", True)):
    scorer = abstract_scorer("v5e:1x1", model="tiny-qwen3", quantization=q, **WIDE)
    w = compile_report.compile_workload(scorer, (64, 16, 8), squeezed, "packed")
    assert w["fits"] is fits and w["error"] is None
    verdict = compile_summary.summary(dict(reports[q], chip=dataclasses.asdict(squeezed), workloads=[w], searches=[]))
    assert ("=> FITS" if fits else "=> DOES NOT FIT") in verdict
