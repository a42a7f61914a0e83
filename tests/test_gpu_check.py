"""scripts/gpu_check.py (`make gpu-check`) on CPU: every part at toy sizes in Pallas interpret mode, so the
path a GPU machine runs is the one tested here; its figures come from the GPU (BENCHMARKS.md)."""

import json

import pytest

from maxscore.bench import gpu_check
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
