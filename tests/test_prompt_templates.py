"""Each reranker template builds exactly the token sequence of its model card's construction.

The references below are written from the public descriptions: bge-reranker-v2-gemma tokenizes
BOS + "A: query", "\\n", "B: passage", "\\n" and its prompt separately; mxbai-rerank-v2 tokenizes
one chat text; the generic template renders the tokenizer's own chat template as transformers'
apply_chat_template does. A query and a document are split across the shared prefix and the item.
"""

import json
import shutil

import pytest

from maxscore.checkpoints.tokenizer import load_tokenizer
from maxscore.errors import ScoreInputError
from maxscore.rerank import prompts

QUERY = "how do I sort a list in place"
DOC = "Use list.sort(); sorted() returns a new list. {Braces} stay as they are."
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tok(hf_tokenizer_path):
  return load_tokenizer(hf_tokenizer_path)


def _build(tok, name):
  b = prompts.PromptBuilder(tok, prompts.TEMPLATES[name])
  return list(b.query(QUERY)[0]) + list(b.item(DOC)[0])


def test_bge_gemma_matches_flagembedding_construction(tok):
  enc = tok.encode
  want = ([tok.bos_id] + enc(f"A: {QUERY}") + enc("\n") + enc(f"B: {DOC}") + enc("\n")
          + enc("Given a query A and a passage B, determine whether the passage contains an answer to the query by "
                "providing a prediction of either 'Yes' or 'No'."))
  assert tok.bos_id is not None and _build(tok, "bge_gemma") == want
  assert prompts.TEMPLATES["bge_gemma"].default_labels[0] == "Yes"


def test_mxbai_v2_matches_its_chat_text(tok):
  text = ("<|endoftext|><|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n"
          f"<|im_end|>\n<|im_start|>user\nquery: {QUERY} \ndocument: {DOC} \nYou are a search relevance expert who "
          "evaluates how well documents match search queries. For each query-document pair, carefully analyze the "
          "semantic relationship between them, then provide your binary relevance judgment (0 for not relevant, "
          "1 for relevant).\nRelevance:<|im_end|>\n<|im_start|>assistant\n")
  assert _build(tok, "mxbai_v2") == tok.encode(text)


def test_chat_template_matches_transformers_apply_chat_template(tmp_path, hf_tokenizer_path):
  import transformers
  shutil.copy2(hf_tokenizer_path, tmp_path / "tokenizer.json")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "bos_token": "<s>"}))
  tok = load_tokenizer(tmp_path / "tokenizer.json")
  hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), chat_template=CHATML)
  content = prompts.CHAT_USER_MESSAGE.format(instruction=prompts.DEFAULT_INSTRUCTION, query=QUERY, doc=DOC)
  text = hf.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
  assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
  assert _build(tok, "chat") == tok.encode(text)


def test_chat_template_missing_is_one_clear_error(tok):
  with pytest.raises(ScoreInputError, match="chat_template"):
    prompts.PromptBuilder(tok, prompts.TEMPLATES["chat"])


def test_chat_on_a_tokenizer_without_a_chat_template_names_the_template_not_the_labels(tok):
  """The default tokenizer encodes "yes" to two tokens and has no chat template: the template is the error."""
  with pytest.raises(ScoreInputError, match="label 'yes' encodes to 2 tokens"):
    prompts.resolve_labels(tok, prompts.TEMPLATES["chat"].default_labels)
  with pytest.raises(ScoreInputError, match="template='chat' needs the tokenizer's chat template"):
    prompts.prompt_and_labels(tok, "chat", (), "", 32, 32)
  builder, labels = prompts.prompt_and_labels(tok, "plain", (5, 6), "", 32, 32)
  assert labels == (5, 6) and isinstance(builder, prompts.PromptBuilder)
