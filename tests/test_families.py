"""Gemma, Gemma 2, Gemma 3, Qwen2 and Mistral: converted from transformers and scored exactly as it computes.

Tiny random models (maxscore/testing/hf_models.py) with sliding windows of 5-6 tokens, so queries
are longer than the window, items are longer than it, and one geometry has prefix == item == W.
"""

import json

import numpy as np
import pytest

from conftest import FAMILY_VARIANTS
from maxscore import Scorer
from maxscore.scoring import loading
from maxscore.testing.hf_models import hf_logits

FAMILIES = sorted(FAMILY_VARIANTS)
ALGORITHMS = ("serial", "packed", "prefill_extend")
LABELS = [5, 17, 300]
SEP = 3


def _hf_label_logits(model, query, items):
  rows = [hf_logits(model, query + [SEP] + item)[-1].astype(np.float64) for item in items]
  return np.stack([r[LABELS] for r in rows]), np.stack([np.log(np.exp(r - r.max()).sum()) + r.max() for r in rows])


@pytest.fixture(scope="module")
def family(hf_checkpoints, request):
  model, _, ckpt = hf_checkpoints(request.param)
  return model, Scorer.from_checkpoint(ckpt, attention="shared_prefix", separator_token_id=SEP)


@pytest.mark.parametrize("family", FAMILIES, indirect=True)
def test_logits_match_transformers(family):
  model, scorer = family
  rng = np.random.default_rng(1)
  for t in (1, 40):  # 40 tokens: well past every window
    tokens = rng.integers(0, 520, t)
    np.testing.assert_allclose(scorer.logits(tokens), hf_logits(model, tokens), atol=1e-4, rtol=0)


def _geometry(scorer, name):
  rng = np.random.default_rng(7)
  w = scorer.config.model.window
  if name == "window_shorter":  # the window is shorter than the prefix and than most items
    return rng.integers(0, 520, 11).tolist(), [rng.integers(0, 520, n).tolist() for n in (9, 0, 3, 14, 1)]
  return rng.integers(0, 520, w - 1).tolist(), [rng.integers(0, 520, w).tolist() for _ in range(3)]  # Q + s == I == W


FAST = {("gemma2", "window_shorter"), ("mistral", "window_equal")}  # the rest is in the slow tier
WINDOWED = ("gemma2", "gemma3", "mistral")


@pytest.mark.parametrize("family,geometry", [
    pytest.param(f, g, marks=() if (f, g) in FAST else pytest.mark.slow)
    for f in FAMILIES for g in ("window_shorter", "window_equal") if g == "window_shorter" or f in WINDOWED],
    indirect=["family"])
def test_every_algorithm_matches_transformers(family, geometry):
  model, scorer = family
  query, items = _geometry(scorer, geometry)
  logits, lse = _hf_label_logits(model, query, items)
  for algorithm in ALGORITHMS:
    probs = scorer.score(query, items, LABELS, apply_softmax=False, algorithm=algorithm).scores
    np.testing.assert_allclose(probs, np.exp(logits - lse[:, None]), atol=1e-5, rtol=0, err_msg=algorithm)
    if algorithm == "packed":
      raw = scorer.label_logits(query, items, LABELS, algorithm=algorithm).scores
      np.testing.assert_allclose(raw, logits, atol=1e-4, rtol=0, err_msg=algorithm)
  assert np.ptp(lse) > 1e-3  # raw logits and probabilities differ by a per-item log-sum-exp


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES, indirect=True)
@pytest.mark.parametrize("kernel,extra", [
    ("reference", {}),
    ("splash", dict(kernel_interpret=True, splash_block_q=16, splash_block_kv=128)),
    ("pallas_gpu", dict(kernel_interpret=True, gpu_block_q=8, gpu_block_kv=8)),
])
def test_every_kernel_matches_transformers(family, kernel, extra):
  model, base = family
  scorer = Scorer.from_checkpoint(base.config.runtime.checkpoint_dir, attention=kernel, separator_token_id=SEP,
                                  **extra)
  query, items = _geometry(scorer, "window_shorter")
  logits, lse = _hf_label_logits(model, query, items)
  for algorithm in ALGORITHMS:
    probs = scorer.score(query, items, LABELS, apply_softmax=False, algorithm=algorithm).scores
    np.testing.assert_allclose(probs, np.exp(logits - lse[:, None]), atol=1e-5, rtol=0, err_msg=algorithm)


@pytest.mark.slow
def test_fast_kernels_honour_mixed_windows_on_gemma2(hf_checkpoints):
  """splash and pallas_gpu (interpret) with Gemma 2's local/global layers and soft-caps: packed == serial."""
  _, _, ckpt = hf_checkpoints("gemma2")
  query, items = np.arange(11).tolist(), [list(range(20, 20 + n)) for n in (9, 0, 3)]
  want = None
  for kernel, extra in (("shared_prefix", {}),
                        ("splash", dict(kernel_interpret=True, splash_block_q=16, splash_block_kv=128)),
                        ("pallas_gpu", dict(kernel_interpret=True, gpu_block_q=8, gpu_block_kv=8))):
    scorer = Scorer.from_checkpoint(ckpt, attention=kernel, separator_token_id=SEP, **extra)
    got = scorer.score(query, items, LABELS, algorithm="packed").scores
    want = scorer.score(query, items, LABELS, algorithm="serial").scores if want is None else want
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=kernel)


def test_converted_config_keeps_the_family_options(hf_checkpoints):
  _, hf_dir, ckpt = hf_checkpoints("gemma3")
  cfg = Scorer.from_checkpoint(ckpt).config.model
  hf = json.loads((hf_dir / "config.json").read_text())
  assert cfg.family == "gemma3" and cfg.layer_pattern == "LLG" and cfg.sliding_window == hf["sliding_window"]
  assert cfg.rope_local_theta == 10000.0 and cfg.rope_theta == 1e6 and cfg.rope_scaling_type == "linear"


def test_eval_rerank_bge_template_raw_logit_end_to_end(load_script, tmp_path, hf_tokenizer_path):
  """scripts/eval_rerank.py --template=bge_gemma --score_mode=raw_logit on a converted Gemma 2 model."""
  from maxscore.checkpoints.convert import convert_hf_checkpoint
  from maxscore.rerank import prompts
  from maxscore.testing.hf_models import make_hf_model, save_hf_model
  hf = save_hf_model(make_hf_model("gemma2", vocab_size=520), tmp_path / "hf", tokenizer_file=hf_tokenizer_path)
  ckpt = convert_hf_checkpoint(hf, tmp_path / "ckpt")
  docs = ["sorting a list in place", "the garbage collector", "binary search trees", "list comprehension"]
  records = [{"qid": f"q{i}", "query": q, "candidates": [{"docid": f"d{j}", "text": t} for j, t in enumerate(docs)],
              "qrels": {"d0": 1}} for i, q in enumerate(["how to sort a list", "memory management"])]
  data_path = tmp_path / "set.jsonl"
  data_path.write_text("".join(json.dumps(r) + "\n" for r in records))
  script = load_script("eval_rerank")
  out = tmp_path / "out"
  script.run(["eval_rerank.py", f"--jsonl={data_path}", "--split=all", f"--checkpoint_dir={ckpt}",
              "--template=bge_gemma", "--score_mode=raw_logit", f"--output_dir={out}", "--noprogress",
              "attention=shared_prefix"])
  results = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()[1:]]
  assert [r["qid"] for r in results] == ["q0", "q1"]
  scorer = Scorer.from_checkpoint(ckpt, attention="shared_prefix")
  builder = prompts.PromptBuilder(scorer.tokenizer, prompts.TEMPLATES["bge_gemma"])
  yes = scorer.tokenizer.label_id("Yes")
  want = scorer.label_logits(builder.query(records[0]["query"])[0], [builder.item(t)[0] for t in docs], [yes])
  np.testing.assert_allclose(results[0]["scores"], want.scores[:, 0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("hf,pattern,window", [
    (dict(model_type="gemma2", sliding_window=4096), "LG", 4096),
    (dict(model_type="gemma3_text", sliding_window=512, num_hidden_layers=26, rope_theta=1e6), "LLLLLG", 512),
    (dict(model_type="qwen2", use_sliding_window=True, sliding_window=64, max_window_layers=1, num_hidden_layers=3),
     "GLL", 64),
    (dict(model_type="mistral", sliding_window=None), "G", None),
    (dict(model_type="mistral", sliding_window=4096), "L", 4096),
])
def test_layer_pattern_from_configs_without_layer_types(hf, pattern, window):
  """Older config.json files carry no layer_types: each family's own rule gives the pattern."""
  from maxscore.checkpoints.hf_config import model_config_from_hf
  base = dict(vocab_size=8, hidden_size=8, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
              intermediate_size=8, head_dim=4, hidden_activation="gelu_pytorch_tanh")  # (absent: transformers' default)
  cfg = model_config_from_hf(dict(base, **hf))
  assert (cfg.layer_pattern, cfg.window) == (pattern, window)


def test_score_script_raw_logit_mode(load_script, tmp_path, hf_checkpoints):
  """scripts/score.py --score_mode=raw_logit answers with the labels' raw logits; through a score head (the
  embedded default has one) it is an error line, as a head gives log-probs."""
  script = load_script("score")
  request = {"query": [10, 11, 12], "items": [[13, 14], [], [7]], "label_token_ids": [4, 5], "apply_softmax": True}
  src, dst = tmp_path / "req.jsonl", tmp_path / "resp.jsonl"
  src.write_text(json.dumps(request) + "\n")
  with pytest.raises(SystemExit) as e:  # default: has a head; the failed line makes the exit status 3
    script.run(["score.py", f"--input={src}", f"--output={dst}", "--score_mode=raw_logit"])
  assert e.value.code == script.SOME_FAILED
  assert "score_mode=raw_logit" in json.loads(dst.read_text())["error"]
  _, _, ckpt = hf_checkpoints("gemma")
  script.run(["score.py", f"--input={src}", f"--output={dst}", "--score_mode=raw_logit", f"--checkpoint_dir={ckpt}",
              "--overwrite"])
  got = json.loads(dst.read_text())["scores"]
  scorer = loading.build_scorer(str(ckpt))
  want = scorer.label_logits(request["query"], request["items"], request["label_token_ids"]).scores
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  probs = scorer.score(request["query"], request["items"], request["label_token_ids"], apply_softmax=False).scores
  assert np.abs(np.asarray(got) - np.log(probs)).min() > 1e-3  # logits, not log-probabilities
