"""scripts/gpu_check.py (`make gpu-check`) on CPU: every part at toy sizes in Pallas interpret mode, so the
path a GPU machine runs is the one tested here; its figures come from the GPU (BENCHMARKS.md)."""

import json
import pathlib

import pytest

from maxscore.bench import gpu_check, gpu_check_report
from maxscore.config import ConfigError


def test_the_quick_check_passes_on_cpu_and_writes_each_part(load_script, tmp_path):
  out = tmp_path / "gpu_check.json"
  status = load_script("gpu_check").run(["gpu_check.py", "--quick", "--speed_workloads=", f"--output_json={out}"])
  report = json.loads(out.read_text())
  assert status == 0 and report["interpret"] and report["speed_parts"] == []
  assert [r["name"] for r in report["kernels"]] == [c[0] for c in gpu_check._KERNEL_CASES]
  assert all(r["ok"] and r["max_abs_diff"] <= gpu_check._TOLERANCE[r["dtype"]] for r in report["kernels"])
  assert [r["name"] for r in report["kernel_grads"]] == [c[0] for c in gpu_check._KERNEL_CASES]
  assert all(r["ok"] and set(r["relative_error"]) == {"loss", "dq", "dk", "dv"} for r in report["kernel_grads"])
  train = report["train"]
  assert set(train["runs"]) == {"pallas_gpu", "shared_prefix"}
  assert {r["kernel"] for r in train["runs"]["pallas_gpu"]["rows"]} == {"pallas_gpu"}
  assert {r["mode"] for r in train["runs"]["shared_prefix"]["rows"]} == {"full", "lora"}
  # Same weights, batch and steps: the two kernels' losses agree (float32 here, bfloat16 on the GPU).
  assert all(c["loss_relative_diff"] < 1e-3 for c in train["shared_prefix_over_pallas_gpu"].values())
  checks = report["scorer_parity"]["checks"]
  assert set(checks["max_abs_logprob_diff_vs_serial[pallas_gpu]"]) == {
      f"{a}[{k}]" for a in ("packed", "prefill_extend", "serial") for k in ("pallas_gpu", "shared_prefix")
  } - {"serial[pallas_gpu]"}
  assert checks["hf_agrees_1e4"]
  assert gpu_check.all_ok(report)


def test_a_kernel_case_off_or_a_failed_part_fails_the_check():
  good = dict(kernels=[dict(ok=True)], kernel_grads=[dict(ok=True)], scorer_parity=dict(checks={"max_abs_logprob_diff_vs_serial[x]": {"a": 1e-6},
                                                                  "hf_agrees_1e4": True}))
  assert gpu_check.all_ok(good)
  assert not gpu_check.all_ok(dict(good, kernels=[dict(ok=True), dict(ok=False)]))
  assert not gpu_check.all_ok(dict(good, kernels=dict(error="ImportError: no triton")))
  assert not gpu_check.all_ok(dict(good, kernel_grads=[dict(ok=False)]))
  assert not gpu_check.all_ok(dict(good, kernel_grads=dict(error="ValueError: ...")))
  assert not gpu_check.all_ok(dict(good, train=dict(error="XlaRuntimeError: out of memory")))
  assert not gpu_check.all_ok({}), "no part ran"
  assert gpu_check.all_ok(dict(kernel_grads=[dict(ok=True)])), "a rerun of one part"
  off = {"max_abs_logprob_diff_vs_serial[x]": {"a": 2e-4}, "hf_agrees_1e4": True}
  assert not gpu_check.all_ok(dict(good, scorer_parity=dict(checks=off)))
  assert not gpu_check.all_ok(dict(good, scorer_parity=dict(error="ValueError: ...")))


@pytest.mark.parametrize("flag, message", [
    ("--speed_workloads=qwen3-0.6b:beir=32x100x256", "is not model:layers:name=QxNxL"),
    ("--dtype=float16", "dtype='float16' must be float32 or bfloat16"),
    ("--parts=kernels,speeds", "each must be one of"),
    ("--seed_workloads=qwen3-0.6b:reference=2000x500x20", "is not model:layers:name=QxNxL"),
    ("--int8_workload=qwen3-0.6b:28:beir=32x100", "is not name=QUERYxITEMSxITEM_LEN"),
    ("--int8_xla_variants=xla_gpu_triton_gemm_any", "is not flag=value[+flag=value...]"),
    ("--hf_kv_gib=0", "must be > 0"),
])
def test_bad_settings_are_one_line_errors(load_script, flag, message, capsys):
  with pytest.raises(SystemExit) as e:
    load_script("gpu_check").run(["gpu_check.py", flag])
  assert e.value.code == 2 and message in capsys.readouterr().err


def test_speed_workloads_group_by_model_and_depth():
  opts = gpu_check.GpuCheckOptions(speed_workloads=("m:30:a=1x2x3", "n:28:b=4x5x6", "m:30:c=7x8x9"))
  assert opts.speed_groups() == {("m", 30): ("a=1x2x3", "c=7x8x9"), ("n", 28): ("b=4x5x6",)}
  with pytest.raises(ValueError, match="not model:layers"):
    gpu_check.GpuCheckOptions(speed_workloads=("m:x:a=1x2x3",)).validate()


def test_the_seed_and_int8_parts_run_at_tiny_shapes_on_cpu(load_script, tmp_path):
  """`make gpu-check GPU_CHECK_FLAGS=--parts=seed,int8` at toy sizes: the same code the GPU call runs."""
  out = tmp_path / "gpu_check.json"
  status = load_script("gpu_check").run([
      "gpu_check.py", "--quick", "--parts=seed,int8", "--seed_workloads=tiny-qwen3:1:reference=20x6x4",
      "--int8_workload=tiny-qwen3:1:beir=8x3x16", "--int8_repeats=1", "--int8_inner=1",
      "--int8_xla_variants=xla_gpu_triton_gemm_any=true,xla_no_such_flag=1", f"--output_json={out}"])
  report = json.loads(out.read_text())
  assert status == 0 and gpu_check.all_ok(report)
  assert report["seed_parts"] == ["seed_reference"] and report["speed_parts"] == [] and "kernels" not in report
  (w,) = report["seed_reference"]["workloads"]
  names = {r["name"] for r in w["rows"]}
  assert {"serial[pallas_gpu]", "packed[pallas_gpu]", "prefill_extend[pallas_gpu]", "auto[pallas_gpu]"} <= names
  hf = [r for r in w["rows"] if r["algorithm"] == "hf_prefix_reuse"]
  assert len(hf) == 1 and set(hf[0]["items_per_s_by_batch_size"]) == {"16", "64", "256"}  # all fit at 21 tokens
  assert all(r["pct_peak"] > 0 for r in w["rows"])
  assert max(w["checks"]["max_abs_logprob_diff_vs_serial[pallas_gpu]"].values()) <= gpu_check._SEED_BAND

  int8 = report["int8"]
  assert int8["packed_row_tokens"] == 16 + 3 * 16  # prefix 9 -> bucket 16, 3 slots of 16
  proj = int8["projections"]
  assert [p["name"] for p in proj["projections"]] == ["q", "k/v", "o", "gate/up", "down"]
  for p in proj["projections"]:
    assert p["hlo"]["w8a8"]["int8_dots"] >= 1 and p["hlo"]["int8_dot"]["int8_dots"] == 1, p["name"]
    assert p["hlo"]["bf16"]["int8_dots"] == 0 and not p["hlo"]["bf16"]["quantizations"], p["name"]
    assert len(p["hlo"]["w8a8"]["quantizations"]) == 1, p["name"]
    assert {"bf16", "int8_weights", "w8a8", "quantize", "int8_dot", "dequantize",
            "w8a8 [xla_gpu_triton_gemm_any=true]"} <= set(p["ms"]), p["name"]
    assert "No such compile option" in p["errors"]["w8a8 [xla_no_such_flag=1]"], "an unknown flag is recorded"
  assert "w8a8 weight [out, in]" in proj["projections"][3]["ms"]
  (program,) = int8["program"].values()
  # One layer: q, k, v, o, gate, up, down as int8 dots, and the four distinct inputs quantized once each
  # (q/k/v and gate/up share theirs); the tied lm_head stays float.
  assert program["dots"]["dot s8xs8 -> s32"] == 7 and len(program["quantizations"]) == 4
  assert pathlib.Path(program["file"]).parent == tmp_path / "gpu_check_hlo"
  assert (tmp_path / "gpu_check_hlo" / "gate_up_w8a8.hlo.txt").exists()
  rows = {r["name"]: r for r in int8["model"]["rows"]}
  assert set(rows) == {"auto[pallas_gpu]", "auto[pallas_gpu][int8_weights]", "auto[pallas_gpu][int8]"}
  assert all(r["x_float"] > 0 for n, r in rows.items() if n != "auto[pallas_gpu]")
  assert any(line.startswith("program packed_logprobs int8") for line in gpu_check_report.int8_lines(int8))


def test_the_attention_sweep_runs_at_tiny_shapes_on_cpu_and_scores_with_the_fastest_agreeing_setting(
    load_script, tmp_path):
  """`--parts=attention` at toy sizes (interpret mode): every setting timed on the seed workload's packed row and
  compared with the first (the default); the scorer then runs with the default and the fastest that agrees."""
  out = tmp_path / "gpu_check.json"
  status = load_script("gpu_check").run([
      "gpu_check.py", "--quick", "--parts=attention", "--seed_workloads=tiny-qwen3:1:reference=20x6x4",
      "--attention_settings=16x16x0x2,32x16x4x2,8x8x8x3,12x8x4x2", "--dtype=float32", f"--output_json={out}"])
  report = json.loads(out.read_text())
  assert status == 0 and gpu_check.all_ok(report), report
  att = report["attention"]
  rows = {r["setting"]: r for r in att["rows"]}
  assert "power of two" in rows["12x8x4x2"]["error"], "a setting Triton cannot take is recorded, not fatal"
  for name in ("16x16x0x2", "32x16x4x2", "8x8x8x3"):
    assert rows[name]["finite"] and rows[name]["max_abs_diff_vs_first"] <= 2e-5 and rows[name]["ms"] > 0
  assert att["best"] in ("16x16x0x2", "32x16x4x2", "8x8x8x3")
  assert set(att["scored"]) == {"16x16x0x2", att["best"]}
  for scored in att["scored"].values():
    assert {"serial[pallas_gpu]", "packed[pallas_gpu]", "auto[pallas_gpu]"} <= {r["name"] for r in scored["rows"]}
  assert any("scorer with 16x16x0x2" in line for line in gpu_check_report.attention_lines(att))
  # The sweep's FLOPs are the visible pairs: prefix 21 causally, each of 6 items sees it and itself causally.
  from maxscore.bench import attention_sweep  # pylint: disable=import-outside-toplevel
  assert attention_sweep.visible_pairs(gpu_check._workload("m:1:r=20x6x4")[2]) == 21 * 22 // 2 + 6 * (4 * 21 + 10)


def test_transformers_batches_are_those_whose_prefix_kv_fits():
  reference = gpu_check._workload("m:28:r=2000x500x20")[2]
  # Qwen3-0.6B, 28 layers: 2 (K, V) x 28 x 8 heads x 128 x 2,021 tokens x 2 bytes = 0.23 GB per item.
  assert gpu_check.hf_batch_sizes("qwen3-0.6b", 28, reference, 16.0) == (16, 64)
  assert gpu_check.hf_batch_sizes("qwen3-0.6b", 28, gpu_check._workload("m:28:r=8000x500x20")[2], 16.0) == (16,)
  assert gpu_check.hf_batch_sizes("qwen3-0.6b", 28, reference, 60.0) == (16, 64, 256)
  assert gpu_check.hf_batch_sizes("qwen3-0.6b", 28, reference, 0.1) == (16,), "the smallest always"


def test_seed_and_int8_results_gate_the_check():
  seed = lambda diff, rows=(dict(name="packed"),): dict(workloads=[dict(
      rows=list(rows), checks={"max_abs_logprob_diff_vs_serial[k]": {"packed[k]": diff}})])
  int8 = dict(projections={}, program={}, model={})
  good = dict(seed_parts=["seed_a"], seed_a=seed(0.02), int8=int8)
  assert gpu_check.all_ok(good)
  assert not gpu_check.all_ok(dict(good, seed_a=seed(0.5)))
  assert not gpu_check.all_ok(dict(good, seed_a=seed(float("nan"))))
  assert not gpu_check.all_ok(dict(good, seed_a=seed(0.0, rows=(dict(name="packed", error="OOM"),))))
  assert not gpu_check.all_ok(dict(good, seed_a=dict(error="ValueError: ...")))
  assert not gpu_check.all_ok(dict(good, int8=dict(int8, model=dict(error="XlaRuntimeError: ..."))))
  assert not gpu_check.all_ok(dict(good, int8=dict(error="ValueError: ...")))
