"""int8 quantized scoring (layers/quantization.py; its arithmetic alone: tests/test_quantization_rounding.py): the
quantized params, the logits' error on converted Qwen3 and Llama models against a derived bound, every algorithm
and kernel quantized (packed and prefill_extend reproduce serial as in float), and the settings that cannot use
quantization refused by name."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layers import quantization as quant
from layers.config import ModelConfig
from layers.decoder import Decoder, init_params
from layers.kernels import SegmentLayout, get_kernel
from layers.lora import LoraConfig
from maxscore.config import ConfigError, load_config
from maxscore.files import identity
from maxscore.scoring.scorer import Scorer

MODES = ("int8_weights", "int8")


def test_quantized_params_hold_int8_projections_and_float_embeddings_and_norms(hf_checkpoints):
  _, _, ckpt = hf_checkpoints("qwen3_kv1_untied")
  float_scorer = Scorer.from_checkpoint(ckpt, mesh=None)
  scorer = Scorer(float_scorer.config.replace(quantization="int8_weights"), float_scorer.runner.params, mesh=None)
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): x
          for path, x in jax.tree_util.tree_flatten_with_path(scorer.runner.params)[0]}
  int8 = sorted(k for k, x in flat.items() if x.dtype == jnp.int8)
  assert int8 == sorted(["lm_head"] + [f"layers/{m}/{n}" for m, ns in (("attn", "qkvo"), ("mlp", ("gate", "up",
                                                                                                    "down")))
                                       for n in ns])
  assert all(flat[f"{k}_scale"].dtype == jnp.float32 for k in int8)
  assert flat["layers/attn/o_scale"].shape == (2, 64)  # per layer and output channel
  assert flat["embed/embedding"].dtype == jnp.float32 and flat["final_norm/scale"].dtype == jnp.float32
  float_bytes = sum(float_scorer.runner.params["layers"]["mlp"][n].nbytes for n in ("gate", "up", "down"))
  int8_bytes = sum(flat[f"layers/mlp/{n}{s}"].nbytes for n in ("gate", "up", "down") for s in ("", "_scale"))
  assert int8_bytes < float_bytes * 0.3


@pytest.mark.parametrize("variant", ["qwen3_kv1_untied", "llama_kv2_untied_scaled_bias"])
@pytest.mark.parametrize("mode", MODES)
def test_int8_logits_error_against_float32_is_within_the_derived_bound(hf_checkpoints, variant, mode):
  """The derivation. One projection (test above): |dy_j| <= s_j / 2 ||x||_1 (+ s_x / 2 ||W_j||_1 in int8).
  With s_j = max|W_j| / 127 <= ||W_j||_2 / 127 and ||x||_1 <= sqrt(D_in) ||x||_2 (likewise for the activation
  term), |dy_j| <= eps ||x||_2 ||W_j||_2 with eps = sqrt(D_in) / 254 per quantized operand: relative to the largest
  value the output can take, the worst-case error of one projection is eps (2 eps in int8, weights and
  activations). To first order the relative errors of the quantized projections in series add up; on the longest
  path through the model there are 2 per attention block (v, then o), 2 per MLP block (gate/up, then down) and
  the lm_head: n = 4 * layers + 1. RMSNorm takes out the scale of the residual stream, so the bound on the logits
  of a token is
      max_v |d logit_v| <= n * eps * max_v |logit_v|,    eps = sqrt(max D_in) / 254 (x2 in int8)
  (D_in = mlp_dim = 128 here: eps = 0.045, bound 0.40 (int8: 0.80) of the largest logit). First order and
  worst case per projection: not a proof for every input, and loose (the rounding errors do not align).
  Measured on these random models (init std 0.25, 40 tokens): Qwen3 0.053 (int8 0.088) of the largest logit,
  Llama 0.11 (0.16)."""
  _, _, ckpt = hf_checkpoints(variant)
  ref = Scorer.from_checkpoint(ckpt, mesh=None)
  scorer = Scorer.from_checkpoint(ckpt, mesh=None, quantization=mode)
  cfg = ref.config.model
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, 40)
  want, got = ref.logits(tokens), scorer.logits(tokens)
  eps = np.sqrt(max(cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.mlp_dim)) / 254 * (2 if mode == "int8" else 1)
  bound_T = (4 * cfg.num_layers + 1) * eps * np.abs(want).max(axis=-1)
  err_T = np.abs(got - want).max(axis=-1)
  assert np.all(err_T <= bound_T), (err_T / np.abs(want).max(axis=-1)).max()
  assert err_T.max() > 0


# w8a8 rounds each token's activations to int8 steps of s_x = max|x| / 127. Two algorithms (serial, packed,
# prefill_extend) compute the same x up to float rounding (~1e-7 relative, and which way depends on XLA's CPU code
# for the machine's ISA), and an x within that of a rounding tie rounds the other way in one of them: one step of
# s_x in one activation element, which moves a score far more than 1e-5. So w8a8 algorithms agree within what a
# few such steps can move, derived per score below; the float paths stay at 1e-5.
ROUNDING_STEPS = 4  # flips allowed per score (a measured disagreement, AVX2 with the suite's XLA flags: 1.5)


def one_step_bounds(scorer: Scorer, query, items, labels, apply_softmax: bool, separator: int) -> np.ndarray:
  """[N, K]: for each score, the most one activation rounding step can move it, to first order: the max over
  every w8a8 projection (each layer's q/k/v/o/gate/up/down and the lm_head), token t and input element i of
      s_x(t) * |d score / d xhat_ti|,
  xhat = xq * s_x the dequantized activation that a flip moves by s_x. The gradient is that of the serial score
  (plain causal rows Q + [s] + I_n) through the int8 model with straight-through roundings: each projection's
  value is its int8 result, its derivative that of the float einsum of its dequantized weight."""
  runner = scorer.runner
  decoder = runner.decoder("reference")
  seqs = [list(query) + [separator] + list(item) for item in items]
  n, length = len(seqs), max(map(len, seqs))
  ids = jnp.asarray([q + [0] * (length - len(q)) for q in seqs], jnp.int32)
  valid = jnp.asarray([len(q) for q in seqs], jnp.int32)
  found_N = np.zeros(n)
  int8_einsum = quant.einsum

  def keep(effect_N):
    np.maximum(found_N, np.asarray(effect_N), out=found_N)

  @jax.custom_vjp
  def tap(x, s_x):  # the identity; its backward reports max s_x |d score / d x| per row
    del s_x
    return x

  def tap_bwd(s_x, ct):
    effect = jnp.abs(ct) * s_x
    jax.debug.callback(keep, jnp.max(effect.reshape(effect.shape[0], -1), axis=1))
    return ct, jnp.zeros_like(s_x)
  tap.defvjp(lambda x, s_x: (x, s_x), tap_bwd)

  def straight_through(equation, x, w, nc, mode, dtype, precision=None):
    y = int8_einsum(equation, x, w, nc, mode, dtype, precision)
    if mode != "int8":
      return y
    x_t = tap(x, quant.quantize_activations(jax.lax.stop_gradient(x), nc)[1])
    w_float = quant.dequantize(*w, tuple(range(nc))).astype(x.dtype)
    slope = jnp.einsum(equation, x_t - jax.lax.stop_gradient(x_t), w_float, precision=jax.lax.Precision.HIGHEST)
    return jax.lax.stop_gradient(y) + slope.astype(y.dtype)

  def score(embedding, pick_K):  # the embedding table as the input: every projection lies downstream of it
    params = dict(runner.params, embed={"embedding": embedding})
    positions = jnp.broadcast_to(jnp.arange(length), ids.shape)
    hidden, _ = decoder.apply({"params": params}, ids, positions, SegmentLayout.causal(valid, length))
    logits = decoder.apply({"params": params}, hidden[jnp.arange(n), valid - 1], method=Decoder.logits)
    lp_NxK = jax.nn.log_softmax(logits, axis=-1)[:, jnp.asarray(labels)]
    scores_NxK = jax.nn.softmax(lp_NxK, axis=-1) if apply_softmax else jnp.exp(lp_NxK)
    return jnp.sum(scores_NxK * pick_K), scores_NxK

  bounds = np.zeros((n, len(labels)))
  with mock.patch.object(quant, "einsum", straight_through):
    grad = jax.jit(jax.grad(score, has_aux=True))
    for k in range(len(labels)):
      found_N[:] = 0
      _, scores_NxK = grad(runner.params["embed"]["embedding"], jnp.eye(len(labels))[k])
      jax.effects_barrier()
      bounds[:, k] = found_N
  # It differentiates the serial score: padded rows of another kernel, so within the same few steps of it.
  serial = scorer.score(query, items, labels, apply_softmax, algorithm="serial").scores
  assert np.all(np.abs(scores_NxK - serial) <= 1e-5 + ROUNDING_STEPS * bounds), np.abs(scores_NxK - serial)
  return bounds


@pytest.fixture(scope="module")
def w8a8_bounds():
  """one_step_bounds of the qwen3_kv1_untied request (_request) per apply_softmax, computed once: every kernel
  and algorithm scoring it shares them."""
  cache = {}

  def get(scorer, query, items, labels, apply_softmax):
    key = apply_softmax
    if key not in cache:
      cache[key] = one_step_bounds(scorer, query, items, labels, apply_softmax, separator=3)
    return cache[key]
  return get


def _request():
  rng = np.random.default_rng(5)
  query = rng.integers(0, 520, 37).tolist()
  return query, [rng.integers(0, 520, n).tolist() for n in (5, 0, 12, 3, 9)], [5, 17, 300]


@pytest.mark.parametrize("kernel,extra,mode", [
    ("shared_prefix", {}, "int8_weights"),
    ("shared_prefix", {}, "int8"),
    ("reference", {}, "int8"),
    ("splash", dict(kernel_interpret=True, splash_block_q=32, splash_block_kv=128), "int8"),
    ("pallas_gpu", dict(kernel_interpret=True, gpu_block_q=16, gpu_block_kv=16), "int8"),
])
@pytest.mark.parametrize("algorithm", ["packed", "prefill_extend"])
def test_quantized_scorer_with_each_kernel_reproduces_serial(hf_checkpoints, w8a8_bounds, kernel, extra, mode,
                                                            algorithm):
  """Quantization is in the projections, per output channel and per token, so a token's result does not depend
  on its neighbours in the row: packed and prefill_extend agree with serial as they do in float (int8_weights:
  1e-5), and under w8a8 within ROUNDING_STEPS activation rounding steps of each score (one_step_bounds)."""
  _, _, ckpt = hf_checkpoints("qwen3_kv1_untied")
  scorer = Scorer.from_checkpoint(ckpt, attention=kernel, separator_token_id=3, quantization=mode, mesh=None,
                                  **extra)
  query, items, labels = _request()
  for apply_softmax in (False, True):  # the full-vocabulary lm_head and its K label columns
    want = scorer.score(query, items, labels, apply_softmax, algorithm="serial").scores
    got = scorer.score(query, items, labels, apply_softmax, algorithm=algorithm).scores
    steps = ROUNDING_STEPS * w8a8_bounds(scorer, query, items, labels, apply_softmax) if mode == "int8" else 0
    err = np.abs(got - want)
    assert np.all(err <= 1e-5 + steps), (err, steps)


def test_the_w8a8_rounding_bound_catches_an_activation_scale_shared_by_the_row(hf_checkpoints, w8a8_bounds):
  """The tolerance above can fail: a packed row whose activations share one scale (max|x| over the whole row,
  not per token: a token's rounding then depends on its neighbours) moves some score by more than
  ROUNDING_STEPS steps, and those steps are a fraction of each item's largest score."""
  _, _, ckpt = hf_checkpoints("qwen3_kv1_untied")
  scorer = Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=3, quantization="int8",
                                  mesh=None)
  query, items, labels = _request()
  want = scorer.score(query, items, labels, False, algorithm="serial").scores
  steps = ROUNDING_STEPS * w8a8_bounds(scorer, query, items, labels, False)
  assert np.all(steps < 0.25 * np.abs(want).max(axis=1, keepdims=True))  # a fraction of each item's scores
  per_token = quant.quantize_activations

  def per_row(x, num_contracting):
    xq, scale = per_token(x, num_contracting)
    row_scale = jnp.max(scale, axis=tuple(range(1, x.ndim - num_contracting)), keepdims=True)
    xq = jnp.clip(jnp.round(x / row_scale), -quant.INT8_MAX, quant.INT8_MAX).astype(jnp.int8)
    return xq, jnp.broadcast_to(row_scale, scale.shape)
  with mock.patch.object(quant, "quantize_activations", per_row):
    shared = Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=3, quantization="int8",
                                    mesh=None)
    got = shared.score(query, items, labels, False, algorithm="packed").scores
  assert np.any(np.abs(got - want) > 1e-5 + steps), np.max(np.abs(got - want) / steps)


@pytest.mark.parametrize("kernel,extra", [
    ("shared_prefix", {}), ("pallas_gpu", dict(kernel_interpret=True, gpu_block_q=16, gpu_block_kv=16))])
def test_grouped_int8_weights_score_as_their_dequantized_float_model(hf_checkpoints, kernel, extra):
  """quantization_group_size=16 on a converted random Qwen3 (untied lm_head): serial, packed and prefill_extend
  agree, the scores and logits are those of the float model holding the dequantized weights up to float32
  rounding, and the logits are closer to float32's than with one scale per channel."""
  _, _, ckpt = hf_checkpoints("qwen3_kv1_untied")
  kw = dict(attention=kernel, separator_token_id=3, mesh=None, **extra)
  scorer = Scorer.from_checkpoint(ckpt, quantization="int8_weights", quantization_group_size=16, **kw)
  assert scorer.runner.quantization_group == 16
  assert scorer.runner.params["layers"]["attn"]["o_scale"].shape == (2, 4, 1, 64)  # [layers, N, H / 16, D]
  flt = Scorer(scorer.config.replace(quantization="none", quantization_group_size=0),
               quant.dequantize_params(scorer.runner.params), mesh=None)
  per_channel = Scorer.from_checkpoint(ckpt, quantization="int8_weights", **kw)  # one scale per channel
  rng = np.random.default_rng(5)
  query, items = rng.integers(0, 520, 37).tolist(), [rng.integers(0, 520, n).tolist() for n in (5, 0, 12, 3, 9)]
  labels = [5, 17, 300]
  tokens = rng.integers(0, 520, 40).tolist()
  want_logits = flt.logits(tokens)
  # The int8 model and its dequantized float model compute the same numbers with float32 roundings in another
  # order (an int8 weight times its group's scale inside the product, or the float weight rounded first), and
  # XLA's CPU code for the machine's ISA picks the order: bit-equal with the suite's flags, up to 6e-8 apart in 9
  # of 15 scores under --xla_cpu_max_isa=AVX2 on another machine. Each matmul a logit passes through (q, k, v, o,
  # gate, up, down per layer, then the lm_head) may move it by a few (4) ulps of the logits' magnitude, and a
  # log-probability moves as much; a score exp(lp), or its softmax over the labels, moves that much relative to
  # itself. So the scores are compared in log space and the logits absolutely, within that bound: 7e-5 here,
  # where one scale per channel instead of per 16 moves them by 1e-3 to 1e-1.
  ulps = 4 * (7 * scorer.config.model.num_layers + 1)
  bound = ulps * np.finfo(np.float32).eps * np.abs(want_logits).max()
  for apply_softmax in (False, True):  # the full-vocabulary lm_head and its K label columns
    want = scorer.score(query, items, labels, apply_softmax, algorithm="serial").scores
    dequantized = flt.score(query, items, labels, apply_softmax, algorithm="serial").scores
    np.testing.assert_allclose(np.log(want), np.log(dequantized), atol=bound, rtol=0)
    other = per_channel.score(query, items, labels, apply_softmax, algorithm="serial").scores
    assert np.abs(np.log(other) - np.log(dequantized)).max() > 100 * bound  # a real difference fails the bound
    for algorithm in ("packed", "prefill_extend"):
      got = scorer.score(query, items, labels, apply_softmax, algorithm=algorithm).scores
      np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  ref = Scorer.from_checkpoint(ckpt, mesh=None).logits(tokens)
  grouped = scorer.logits(tokens)
  np.testing.assert_allclose(grouped, want_logits, atol=bound, rtol=0)
  assert np.abs(grouped - ref).max() < np.abs(per_channel.logits(tokens) - ref).max()


def test_grouped_scales_where_they_cannot_be_used_are_one_clear_error(hf_checkpoints):
  """Per-group scales are for int8_weights, must divide every contracting dim, and params quantized per group
  keep their group: w8a8 regroups them per channel, any other group size is refused by name."""
  with pytest.raises(ConfigError, match=r"quantization_group_size=16 must be 0 .*quantization='int8'"):
    load_config(["quantization=int8", "quantization_group_size=16"])
  with pytest.raises(ConfigError, match=r"quantization_group_size=16 must be 0 .*quantization='none'"):
    load_config(["quantization_group_size=16"])
  with pytest.raises(ConfigError, match=r"quantization_group_size=48 must divide each contracting dim .*head_dim 16"):
    load_config(["quantization=int8_weights", "quantization_group_size=48"])
  _, _, ckpt = hf_checkpoints("qwen3_kv1_untied")
  grouped = Scorer.from_checkpoint(ckpt, mesh=None, quantization="int8_weights", quantization_group_size=16)
  cfg = grouped.config.replace(quantization_group_size=0)
  w8a8 = Scorer(cfg.replace(quantization="int8"), grouped.runner.params, mesh=None)
  assert w8a8.runner.quantization_group == 0 and quant.params_group_size(w8a8.runner.params) == 0
  want = quant.quantize_params(quant.dequantize_params(grouped.runner.params), "int8")
  assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.array_equal, w8a8.runner.params, want)))
  assert Scorer(cfg, grouped.runner.params, mesh=None).runner.quantization_group == 16  # 0: as stored
  with pytest.raises(ValueError, match="hold int8 weights with quantization_group_size=16.*not 8"):
    Scorer(cfg.replace(quantization_group_size=8), grouped.runner.params, mesh=None)


def test_quantized_label_columns_equal_the_full_quantized_lm_head(hf_checkpoints):
  """apply_softmax reads only the K label columns of the int8 lm_head: the same numbers as the full product."""
  _, _, ckpt = hf_checkpoints("llama_kv2_untied_scaled_bias")
  scorer = Scorer.from_checkpoint(ckpt, mesh=None, quantization="int8", separator_token_id=3)
  query, items, labels = [4, 9, 33, 7], [[5, 6], [100, 200, 300]], [5, 17, 300]
  logits = scorer.label_logits(query, items, labels, algorithm="serial").scores
  full = np.stack([scorer.logits(query + [3] + item)[-1] for item in items])
  np.testing.assert_allclose(logits, full[:, labels], atol=1e-5, rtol=0)


def test_where_quantization_cannot_be_used_is_one_clear_error():
  with pytest.raises(ConfigError, match=r"quantization='int4' is not one of \['none', 'int8_weights', 'int8'\]"):
    load_config(["quantization=int4"])
  decoder = Decoder(ModelConfig(), get_kernel("reference"), quantization="int8", lora=LoraConfig(4, 8.0))
  with pytest.raises(ValueError, match=r"quantization='int8' \(w8a8\) rounds the activations.*int8_weights"):
    init_params(decoder, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="is not one of"):
    quant.quantize_params({}, "int4")


def test_training_paths_refuse_quantization():
  from maxscore.bench import train_bench
  with pytest.raises(ConfigError, match="quantization='int8_weights' is for scoring only, and the training benchmark"):
    train_bench._config(train_bench.TrainBenchOptions(overrides=("quantization=int8_weights",)))


def test_quantization_is_part_of_the_scorer_identity():
  cfg = load_config(dict(num_layers=1))
  ref = Scorer.from_config(cfg, mesh=None)
  ids = {m: identity.scorer_identity(Scorer(cfg.replace(quantization=m), ref.runner.params, mesh=None,
                                            params_digest="same")) for m in ("none", "int8_weights", "int8")}
  assert "quantization" not in ids["none"]  # float identities are unchanged
  assert ids["int8_weights"]["quantization"] == "int8_weights" and ids["int8"] != ids["int8_weights"]
  grouped = Scorer(cfg.replace(quantization="int8_weights", quantization_group_size=16), ref.runner.params,
                   mesh=None, params_digest="same")
  assert identity.scorer_identity(grouped) == dict(ids["int8_weights"], quantization_group_size=16)


def test_pallas_gpu_warps_and_stages_are_not_part_of_the_scorer_identity():
  """They launch the same tiles in the same order: a run, cache or workdir made before they were keys resumes."""
  cfg = load_config(dict(num_layers=1))
  ref = Scorer.from_config(cfg, mesh=None)
  ident = lambda **kw: identity.scorer_identity(Scorer(cfg.replace(**kw), ref.runner.params, mesh=None,
                                                       params_digest="same"))
  assert "gpu_num_warps" not in ident()["kernel"] and "gpu_num_stages" not in ident()["kernel"]
  assert ident(gpu_num_warps=4, gpu_num_stages=3) == ident()
  assert ident(gpu_block_q=32) != ident(), "block sizes change the summation order: they stay"


def test_bench_times_quantized_rows_beside_the_float_ones():
  from maxscore import bench as benchmark
  opts = benchmark.BenchOptions(model="tiny-qwen3", num_layers=1, labels=(3,), query_len=20, num_items=4, item_len=5,
                                algorithms=("packed",), repeats=1, hf_baseline=False, quantizations=("int8",),
                                peak_sizes=(256,))
  report = benchmark.run_benchmark(opts.validate())
  rows = {r["name"]: r for r in report["rows"]}
  assert set(rows) == {"packed[shared_prefix]", "packed[shared_prefix][int8]"}
  quantized, float_row = rows["packed[shared_prefix][int8]"], rows["packed[shared_prefix]"]
  assert quantized["x_float"] == pytest.approx(quantized["items_per_s"] / float_row["items_per_s"])
  assert "x_float" in benchmark.format_table(report["rows"])
  with pytest.raises(ValueError, match=r"quantizations=\['int4'\] must name each of \['int8_weights', 'int8'\]"):
    benchmark.BenchOptions(quantizations=("int4",)).validate()


def test_each_querys_item_order_barely_moves_under_int8(hf_checkpoints):
  """Kendall tau of each query's item order, quantized against float32, on the converted random Qwen3 (8 queries
  x 30 items x 8 tokens after a 16-token query): measured 0.984 (int8_weights) and 0.976 (int8) mean, 0.963 min;
  BENCHMARKS.md "int8 quantization" has the 32 x 100 x 256 run. The tau is scipy's where no scores tie."""
  from scipy import stats
  from maxscore.bench import precision
  _, _, ckpt = hf_checkpoints("qwen3_kv1_untied")
  ref = Scorer.from_checkpoint(ckpt, mesh=None)
  tests = {m: Scorer.from_checkpoint(ckpt, mesh=None, quantization=m) for m in MODES}
  r = precision.ranking_agreement(ref, tests, 8, 16, 30, 8, [5, 17])
  assert r["int8_weights"]["kendall_tau_mean"] > 0.975 and r["int8"]["kendall_tau_mean"] > 0.965, r
  assert min(x["kendall_tau_min"] for x in r.values()) > 0.95, r
  a, b = np.random.default_rng(0).normal(size=(2, 40))
  assert precision.kendall_tau(a, b) == pytest.approx(stats.kendalltau(a, b).statistic)


def test_a_checkpoint_quantized_at_conversion_equals_one_quantized_at_load(hf_checkpoints, tmp_path):
  """convert --quantize=int8 stores the int8 weights and scales that a scorer computes at load from the float
  checkpoint, bit for bit; maxscore.json says so; the scores are the same; float-only paths refuse it by name."""
  from maxscore.checkpoints import storage
  from maxscore.checkpoints.convert import convert_hf_checkpoint
  from maxscore.checkpoints.export import ExportError, export_hf_checkpoint
  _, hf_dir, float_ckpt = hf_checkpoints("llama_kv2_untied_scaled_bias")
  int8_ckpt = convert_hf_checkpoint(hf_dir, tmp_path / "int8", quantize="int8")
  assert storage.stored_quantization(int8_ckpt) == "int8" and storage.stored_quantization(float_ckpt) == "none"
  at_load = Scorer.from_checkpoint(float_ckpt, mesh=None, quantization="int8", separator_token_id=3)
  stored = Scorer.from_checkpoint(int8_ckpt, mesh=None, quantization="int8", separator_token_id=3)
  same = jax.tree_util.tree_map(lambda a, b: a.dtype == b.dtype and np.array_equal(a, b), at_load.runner.params,
                                stored.runner.params)
  assert all(jax.tree_util.tree_leaves(same))
  query, items, labels = [4, 9, 33, 7], [[5, 6], [100, 200, 300], []], [5, 17, 300]
  np.testing.assert_array_equal(stored.score(query, items, labels).scores, at_load.score(query, items, labels).scores)
  assert Scorer.from_checkpoint(int8_ckpt, mesh=None).config.runtime.quantization == "int8_weights"
  with pytest.raises(ValueError, match="hold int8 weights.*quantization=int8_weights or int8"):
    Scorer.from_checkpoint(int8_ckpt, mesh=None, quantization="none")
  with pytest.raises(ExportError, match="holds int8 weights"):
    export_hf_checkpoint(int8_ckpt, tmp_path / "hf")


def test_a_checkpoint_quantized_per_group_at_conversion_equals_one_quantized_at_load(hf_checkpoints, tmp_path):
  """convert --quantize=int8 --quantize_group_size=16 stores what a scorer computes at load with that group
  size, bit for bit; maxscore.json records the group size and a scorer reads it back from the checkpoint. A
  group size that does not divide the model's dims, or without quantize=int8, is refused and writes nothing."""
  from maxscore.checkpoints import ConversionError, storage
  from maxscore.checkpoints.convert import convert_hf_checkpoint
  _, hf_dir, float_ckpt = hf_checkpoints("llama_kv2_untied_scaled_bias")
  ckpt = convert_hf_checkpoint(hf_dir, tmp_path / "g16", quantize="int8", quantize_group_size=16)
  assert storage.stored_quantization(ckpt) == "int8" and storage.stored_group_size(ckpt) == 16
  assert storage.stored_group_size(float_ckpt) == 0
  at_load = Scorer.from_checkpoint(float_ckpt, mesh=None, quantization="int8_weights", quantization_group_size=16)
  stored = Scorer.from_checkpoint(ckpt, mesh=None)
  assert stored.runner.quantization == "int8_weights" and stored.runner.quantization_group == 16
  same = jax.tree_util.tree_map(lambda a, b: a.dtype == b.dtype and np.array_equal(a, b), at_load.runner.params,
                                stored.runner.params)
  assert all(jax.tree_util.tree_leaves(same))
  for bad, match in ((dict(quantize="int8", quantize_group_size=48), "quantize_group_size=48 must divide each"),
                     (dict(quantize_group_size=16), "quantize_group_size=16 must be 0, or a group size with")):
    with pytest.raises(ConversionError, match=match):
      convert_hf_checkpoint(hf_dir, tmp_path / "bad", **bad)
    assert not (tmp_path / "bad").exists()


_MESH_SCRIPT = """
import numpy as np
from maxscore.config import load_config
from maxscore.distributed import mesh as mesh_lib
from maxscore.scoring.scorer import Scorer
cfg = load_config(dict(num_layers=2, tie_word_embeddings=False, separator_token_id=3))
params = Scorer.from_config(cfg, mesh=None).runner.params
query, items, labels = [4, 9, 33, 7, 8], [[5, 6], [100, 200, 300], []], [5, 17, 300]
for mode, group in (("int8_weights", 0), ("int8", 0), ("int8_weights", 16)):
  want = Scorer(cfg.replace(quantization=mode, quantization_group_size=group), params,
                mesh=None).score(query, items, labels).scores
  for axis in ("tensor", "fsdp"):
    c = cfg.replace(quantization=mode, quantization_group_size=group, ici_data_parallelism=1,
                    **{f"ici_{axis}_parallelism": 2})
    got = Scorer(c, params, mesh=mesh_lib.default_scoring_mesh(c.mesh)).score(query, items, labels).scores
    assert np.abs(got - want).max() < 1e-6, (mode, axis, np.abs(got - want).max())
print("ok")
"""


def test_quantized_scoring_on_a_two_device_mesh_matches_one_device():
  """The int8 weights and their scales (per channel, and per group) are placed by the same logical-axis rules
  (tensor and fsdp split)."""
  import subprocess
  import sys
  from maxscore.distributed.processes import subprocess_env
  p = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=subprocess_env(2), capture_output=True, text=True,
                     timeout=300)
  assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
