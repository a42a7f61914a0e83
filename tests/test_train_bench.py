"""The CPU fine-tuning bench: its report, the 2-device subprocess, and its option errors."""

import numpy as np
import pytest

from maxscore.bench import train_bench


@pytest.mark.slow
def test_one_and_two_devices_train_the_same_step():
  """The 2-device run (a subprocess, batch over data=2) computes the same losses as 1 device."""
  opts = train_bench.TrainBenchOptions(model="tiny-qwen3", modes=("full",), devices=(1, 2), batch_size=2,
                                       query_len=16, num_items=4, item_len=4, repeats=1,
                                       overrides=("matmul_precision=highest",), peak_sizes=(256,))
  report = train_bench.run(opts)
  one, two = (run["rows"][0] for run in report["runs"])
  assert (one["devices"], two["devices"]) == (1, 2)
  assert one["loss"] == pytest.approx(two["loss"], abs=1e-5)
  for run in report["runs"]:
    assert run["matmul_peak"]["flops_per_s"] > 0 and run["rows"][0]["peak_fraction"] > 0
    assert set(run["matmul_peak"]["by_size"]) == {"256"}, "the subprocess run measures at the sizes asked for"
  assert one["flops"] == two["flops"] and one["tokens"] == 2 * (16 + 4 * 4)
  assert "% peak" in train_bench.summary(report)


@pytest.mark.parametrize("kwargs, field", [(dict(modes=("all",)), "modes"), (dict(devices=(3,)), "devices"),
                                           (dict(remat="some"), "remat"), (dict(item_len=0), "item_len"),
                                           (dict(peak_sizes=()), "peak_sizes")])
def test_bad_options_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    train_bench.TrainBenchOptions(**kwargs).validate()


@pytest.mark.slow
def test_qlora_is_timed_beside_lora_with_their_ratio():
  opts = train_bench.TrainBenchOptions(model="tiny-qwen3", modes=("lora", "qlora"), devices=(1,), batch_size=2,
                                       query_len=16, num_items=4, item_len=4, repeats=1, peak_sizes=(256,))
  report = train_bench.run(opts)
  lora, qlora = report["runs"][0]["rows"]
  assert (lora["mode"], qlora["mode"]) == ("lora", "qlora") and lora["flops"] == qlora["flops"]
  assert qlora["step_s"] > 0 and np.isfinite(qlora["loss"])
  assert "qlora / lora step time, 1 device(s): " in train_bench.summary(report)
