"""The benchmark harness: the cost model by hand and against the mask, and both modes end to end on tiny shapes."""

import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

from layers.config import ModelConfig
from layers.kernels import SegmentLayout
from layers.kernels.reference import visibility
from maxscore import bench as benchmark, config as config_lib
from maxscore.scoring import cost_model
from maxscore.scoring.scorer import Scorer
from maxscore.testing import scripts

bench_script = scripts.load_script("bench")

TINY_SCORE = ["bench.py", "--model=tiny-qwen3", "--num_layers=1", "--labels=3,7", "--query_len=40",
              "--num_items=12", "--item_len=6", "--repeats=1", "--serial_items=5",
              "--peak_sizes=256"]  # the matmul peak at a small size: no seconds on [4096, 4096] products
SMALL_PEAK = dict(peak_sizes=(256,))


def test_model_flops_by_hand():
  cfg = ModelConfig(vocab_size=10, hidden_size=4, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=2, mlp_dim=8)
  # q 4*2*2 + k,v 2*(4*1*2) + o 2*2*4 + qk-norm 2*2 + mlp 3*4*8 + 2 norms*4, + final norm 4
  assert cfg.non_embedding_params() == 16 + 16 + 16 + 4 + 96 + 8 + 4 == 160
  f = cost_model.model_flops(cfg, query_len=3, item_lens=[2, 0, 1], algorithm="packed")  # P = 3 + separator = 4
  assert f["tokens"] == 4 + 3 and f["dense"] == 2 * 160 * 7
  # pairs: prefix 4*5/2 = 10; item of 2: 2*4 + 3 = 11; empty: 0; item of 1: 4 + 1 = 5.
  assert f["attention"] == 4 * 2 * 2 * (10 + 11 + 0 + 5)
  assert f["lm_head"] == 2 * 4 * 10 * 3
  assert f["total"] == 2240 + 416 + 240 == f["shared_total"]
  s = cost_model.model_flops(cfg, query_len=3, item_lens=[2, 0, 1], algorithm="serial")
  # serial sequences of 6, 4 and 5 tokens, each causal: 21 + 10 + 15 pairs.
  assert s["total"] == 2 * 160 * 15 + 4 * 2 * 2 * 46 + 240 == f["serial_total"]
  assert f["flop_ratio"] == pytest.approx(5776 / 2896)
  assert cost_model.model_flops(cfg, 3, [2, 0, 1], separator=False)["prefix_len"] == 3


@pytest.mark.parametrize("p,lens", [(1, [1]), (7, [3, 0, 5, 5]), (16, [4] * 6)])
def test_attention_pairs_equal_the_visibility_mask(p, lens):
  """The cost model counts exactly the (query, key) pairs the layout's mask allows."""
  n, l = len(lens), max(lens)
  layout = SegmentLayout(jnp.asarray([p]), jnp.asarray([lens]), p, l, n)
  seg = layout.segment_ids()
  mask = np.asarray(visibility(seg, seg, 0))[0] & (np.asarray(seg)[0] >= 0)[:, None]  # real queries only
  assert mask.sum() == cost_model.attention_pairs(p, lens)


def test_matmul_peak_is_positive():
  peak = benchmark.measure_matmul_peak(sizes=(128, 256), repeats=2)
  assert peak["flops_per_s"] == max(peak["by_size"].values()) > 0 and set(peak["by_size"]) == {"128", "256"}


def test_score_mode_end_to_end(tmp_path, capsys):
  out = tmp_path / "bench.json"
  bench_script.run(TINY_SCORE + [f"--output_json={out}"])
  printed = capsys.readouterr().out
  report = json.loads(out.read_text())
  rows = {r["algorithm"]: r for r in report["rows"]}
  assert set(rows) == {"serial", "packed", "prefill_extend", "auto", "hf_prefix_reuse"}
  assert len(report["load_before"]) == len(report["load_after"]) == 3 and "load average" in printed
  # The FLOPs are the cost model's for the geometry: P = 40 + separator, 12 items of 6, full-vocabulary lm_head.
  model = config_lib.model_config_from_dict(report["workload"]["model_config"])
  assert report["flops"] == cost_model.model_flops(model, 40, [6] * 12, "packed", separator=True)
  peak = report["peak"]["flops_per_s"]
  assert set(report["peak"]["by_size"]) == set(report["peak_end"]["by_size"]) == {"256"}  # --peak_sizes
  for name, r in rows.items():
    assert r["items_per_s"] > 0 and r["best_s"] > 0 and 0 < r["pct_peak"], name
    assert r["items_per_s"] == pytest.approx(r["items_timed"] / r["best_s"]), name
    assert r["ms_per_request"] == pytest.approx(1e3 * r["best_s"] * 12 / r["items_timed"])
    # FLOP/s: the timed items' share of one request's FLOPs over the best time, and its share of the peak.
    assert r["flops_per_s"] == pytest.approx(r["flops_per_request"] * r["items_timed"] / 12 / r["best_s"]), name
    assert r["pct_peak"] == pytest.approx(100 * r["flops_per_s"] / peak), name
    assert r["x_serial"] == pytest.approx(r["items_per_s"] / rows["serial"]["items_per_s"]), name
    assert r["x_hf"] == pytest.approx(r["items_per_s"] / rows["hf_prefix_reuse"]["items_per_s"]), name
    assert r["name"].split("[")[0] in printed or r["name"] in printed
  for name in ("serial", "packed", "prefill_extend"):
    assert rows[name]["picked"] == [name]  # each row times the algorithm it names
  assert rows["auto"]["picked"] == [report["selector"]["algorithm"]]
  assert rows["hf_prefix_reuse"]["flops_per_request"] == report["flops"]["total"]
  assert rows["serial"]["subset"] and rows["serial"]["items_timed"] == 5 and not rows["packed"]["subset"]
  assert rows["packed"]["flops_per_request"] == report["flops"]["total"]
  assert rows["serial"]["flops_per_request"] == pytest.approx(report["flops"]["serial_total"])
  for name in ("packed", "prefill_extend"):
    assert rows[name]["compile_s"] > 0 and rows[name]["model_executables"] >= 1
    assert rows[name]["xla_compiles_warm"] == 0  # warm runs reuse the executables
    assert rows[name]["memory"]["temp_bytes"] > 0 and rows[name]["rss_peak_bytes"] > 0
  assert rows["auto"]["picked"] and rows["auto"]["model_executables"] == 0  # reuses what packed compiled
  checks = report["checks"]
  assert checks["hf_agrees_1e4"] and checks["hf_max_abs_logprob_diff"] < 1e-4
  vs_serial = next(iter(v for k, v in checks.items() if k.startswith("max_abs")))
  assert set(vs_serial) == {"packed[shared_prefix]", "prefill_extend[shared_prefix]", "auto[shared_prefix]"}
  assert max(vs_serial.values()) < 1e-5
  assert report["flops"]["flop_ratio"] > 1 and report["peak"]["flops_per_s"] > 0


def test_batch_requests_and_a_refusing_kernel():
  """score_batch rows count every request; a kernel refusing the shape is an error row, not a crash."""
  # packed rows hold 32 + 8 slots x 8 = 96 tokens, extend chunks 32 + 2 x 8 = 48: only packed is refused.
  opts = benchmark.BenchOptions(model="tiny-qwen3", num_layers=1, labels=(3,), query_len=30, num_items=8,
                                item_len=5, algorithms=("packed", "prefill_extend"), kernels=("reference",),
                                repeats=1, hf_baseline=False, batch_requests=3,
                                overrides=("max_reference_len=50", "extend_batch_size=2"), **SMALL_PEAK)
  report = benchmark.run_benchmark(opts)
  packed, extend = report["rows"]
  assert "max_reference_len" in packed["error"] and "items_per_s" not in packed
  assert extend["requests"] == 3 and extend["items_timed"] == 24 and extend["items_per_s"] > 0
  assert extend["flops_per_request"] == pytest.approx(report["flops"]["total"])
  assert "refuses" in benchmark.format_table(report["rows"])


def test_warmup_check_and_mixed_shapes():
  scorer = Scorer.from_config(benchmark.bench_config(benchmark.BenchOptions(model="tiny-qwen3", num_layers=1,
                                                                             labels=(3,))))
  req = benchmark.make_requests(scorer.config.model.vocab_size, 20, 3, 4, [3])[0]
  w = benchmark.warmup_check(scorer, req)
  assert w["status"] == "ok" or w["status"].startswith("skipped"), w
  if w["status"] == "ok":
    assert w["first_request_after_warmup_s"] < w["first_request_cold_s"]
  m = benchmark.mixed_shape_run(scorer, 4, query_len=20, num_items=3, item_len=4, labels=[3])
  assert m["requests"] == 4 and 1 <= m["distinct_buckets"] and m["executables_within_buckets"]


def test_kernels_mode_small(tmp_path, capsys):
  out = tmp_path / "k.json"
  bench_script.run(["bench.py", "--mode=kernels", "--query_len=40", "--num_items=6", "--item_len=5",
                    "--num_heads=4", "--num_kv_heads=2", "--head_dim=16", "--repeats=2", "--peak_sizes=256",
                    f"--output_json={out}"])
  report = json.loads(out.read_text())
  rows = {r["name"]: r for r in report["rows"]}
  assert report["geometry"]["row_len"] == 41 + 30
  # Useful FLOPs: 4 x heads x head_dim per visible (query, key) pair; reference computes the whole T x T square.
  useful = 4 * 4 * 16 * cost_model.attention_pairs(41, [5] * 6)
  assert report["useful_attention_flops"] == useful
  assert rows["reference"]["executed_flops"] == 4 * 4 * 16 * 71 * 71
  assert rows["shared_prefix"]["executed_flops"] == useful
  for name in ("shared_prefix", "reference"):
    assert rows[name]["status"] == "run" and rows[name]["best_s"] > 0 and rows[name]["memory"]["temp_bytes"] > 0
    assert rows[name]["flops"] == useful and rows[name]["flops_per_s"] == pytest.approx(useful / rows[name]["best_s"])
    assert rows[name]["pct_peak"] == pytest.approx(100 * rows[name]["flops_per_s"] / report["peak"]["flops_per_s"])
  assert rows["shared_prefix"]["max_abs_diff_vs_reference"] < 2e-5
  for name in ("splash(128/128)", "pallas_gpu(64/64)"):
    r = rows[name]
    assert r["status"] == "interpret-verified"
    assert 0 < r["blocks_run"] <= r["blocks_causal_grid"] <= r["blocks_full_grid"]
  assert "interpret-verified" in capsys.readouterr().out


def test_kernels_mode_skips_what_would_not_fit():
  opts = benchmark.BenchOptions(mode="kernels", query_len=20, num_items=4, item_len=4, num_heads=2, num_kv_heads=1,
                                head_dim=8, kernels=("reference",), repeats=1, kernel_memory_fraction=1e-12,
                                **SMALL_PEAK)
  row = benchmark.run_benchmark(opts)["rows"][0]
  assert row["status"].startswith("not run") and row["memory"]["temp_bytes"] > 0 and "best_s" not in row


def test_apply_softmax_rows_count_only_the_label_rows():
  opts = benchmark.BenchOptions(model="tiny-qwen3", num_layers=1, labels=(3, 7), query_len=30, num_items=8,
                                item_len=5, algorithms=("packed",), repeats=1, hf_baseline=False, apply_softmax=True,
                                **SMALL_PEAK)
  report = benchmark.run_benchmark(opts)
  row, = report["rows"]
  f, d = report["flops"], report["workload"]["model_config"]["hidden_size"]
  assert row["lm_head"] == f["lm_head_mode"] == "labels" and f["lm_head"] == 2 * d * 2 * 8
  assert row["flops_per_request"] == pytest.approx(f["total"]) and row["pct_peak"] > 0
  assert "lm_head" in benchmark.format_table(report["rows"])


def test_suite_runs_every_workload_against_one_peak(tmp_path, capsys):
  out = tmp_path / "suite.json"
  bench_script.run(["bench.py", "--model=tiny-qwen3", "--num_layers=1", "--labels=3,7", "--suite",
                    "--suite_workloads=short=20x6x9,batched=8x5x12x3,skipped=4x2x2", "--suite_only=short,batched",
                    "--algorithms=serial,packed,prefill_extend", "--hf_batch_sizes=2", "--repeats=1",
                    "--serial_items=3", "--peak_sizes=256", f"--output_json={out}"])
  printed = capsys.readouterr().out
  report = json.loads(out.read_text())
  assert [w["name"] for w in report["workloads"]] == ["short", "batched"] and report["peak"]["flops_per_s"] > 0
  for w in report["workloads"]:
    s = w["summary"]
    algorithms = {r["algorithm"] for r in w["rows"]}
    assert algorithms == {"serial", "packed", "prefill_extend", "hf_prefix_reuse"}
    assert s["selector"] in algorithms and s["reason"] and s["best"] and 0 < s["selector_vs_best"] <= 1
    assert s["hf_batch_size"] in (2, 32)
    hf = next(r for r in w["rows"] if r["algorithm"] == "hf_prefix_reuse")
    assert set(hf["items_per_s_by_batch_size"]) == {"2", "32"}
    assert max(w["checks"]["max_abs_logprob_diff_vs_serial[shared_prefix]" + (" x3" if w["name"] == "batched" else "")]
               .values()) < 1e-5
  assert "== suite ==" in printed and "auto would pick" in printed and "3 x (8x5x12)" in printed


@pytest.mark.parametrize("flag,message", [
    ("--suite_workloads=beir=32x100", "suite_workloads entry 'beir=32x100' is not name=QUERYxITEMSxITEM_LEN"),
    ("--suite_workloads=a=1x0x3", "every size must be >= 1"),
    ("--suite_only=nope", r"suite_only names \['nope'\] are not suite_workloads names"),
])
def test_suite_refuses_bad_workloads_in_one_line(flag, message, capsys, tmp_path):
  out = tmp_path / "never.json"
  with pytest.raises(SystemExit) as e:
    bench_script.run(["bench.py", "--suite", flag, f"--output_json={out}"])
  assert e.value.code == 2 and not out.exists()
  assert re.search(message, capsys.readouterr().err)


def test_profile_shares_times_every_part_at_a_given_geometry(load_script, capsys):
  script = load_script("profile_shares")
  best = script.run(["profile_shares.py", "--model=tiny-qwen3", "--num_layers=1", "--query_len=10", "--num_items=5",
                     "--item_len=9", "--repeats=1"])
  printed = capsys.readouterr().out
  assert len(best) == 10 and all(s > 0 for s in best.values())
  for name in ("dense matmuls", "own attention", "norms + RoPE", "prefix attention", "lm_head [D, V]", "5 rows"):
    assert name in printed, name
  assert "load average before" in printed and "load average after" in printed


@pytest.mark.filterwarnings("error:`past_key_values` is deprecated:FutureWarning")
def test_eval_bench_times_transformers_on_the_same_ids(load_script, capsys, tmp_path):
  """bench_eval.py --hf_baseline: the embedded default's backbone exported to transformers scores the same
  prepared ids (its label log-probs agree with maxscore's), and each row reports its ratio to transformers;
  modes picks maxscore's rows, and bad modes are one line. The baseline passes its K/V cache by the name the
  installed transformers takes (no deprecation warning)."""
  script = load_script("bench_eval")
  report = script.run(["bench_eval.py", "--max_queries=2", "--repeats=1", "--modes=direct", "--hf_baseline",
                       f"--output_json={tmp_path / 'r.json'}"])
  printed = capsys.readouterr().out
  assert list(report["rows"]) == ["model alone (ids tokenized beforehand)", "transformers (same ids, prefix reused)"]
  assert report["hf_check"]["max_abs_label_logprob_diff"] < 1e-4
  assert all(r["items_per_s"] > 0 and r["x_transformers"] > 0 for r in report["rows"].values())
  assert "x transformers" in printed and json.loads((tmp_path / "r.json").read_text())["items"] == report["items"]
  with pytest.raises(SystemExit) as e:
    script.run(["bench_eval.py", "--modes=nope"])
  assert e.value.code == 2 and "modes=['nope'] must name each of" in capsys.readouterr().err
