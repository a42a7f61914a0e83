"""Builds the embedded default under maxscore/assets/default/ from CPython's pydoc_data topics.

  python scripts/build_default_assets.py [--output_dir=maxscore/assets/default] [--seed=0]

Writes
  pydoc-tiny-qwen3/     a random-init Qwen3-family checkpoint (hidden 128, 2 layers) with its
                        sentencepiece tokenizer (trained on the same topics; Yes/No single tokens)
  pydoc_rerank.jsonl    rerank queries in the JSONL form with a train/dev/test `split` field:
                        query = a section title of the Python reference, candidates = paragraphs;
                        grade 2 = a paragraph of that section, 1 = of the same topic, 0 = elsewhere
  manifest.json         sizes, counts, seed and the Python version the topics came from

The model is random-init: its metrics mean nothing until a score head is trained on the
train split. Everything is a function of the seed and the Python version (pydoc_data differs
between versions); the Orbax files differ byte-wise between builds, the arrays do not.
"""

import collections
import dataclasses
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
from typing import Optional

import jax
import numpy as np
from absl import flags, logging

from layers.config import ModelConfig
from layers.decoder import Decoder, init_params
from layers.kernels import get_kernel
from maxscore import cli
from maxscore.checkpoints import storage as checkpointing
from maxscore.files import safety
from maxscore.rerank import data
from maxscore.testing.tokenizers import sample_texts, train_sentencepiece
from maxscore.checkpoints.tokenizer import load_tokenizer

@dataclasses.dataclass(frozen=True)
class AssetOptions:
  """What the embedded default is built from (configs/assets.yml documents each key)."""
  output_dir: Optional[str] = None    # None = the packaged default, maxscore/assets/default
  seed: int = 0
  vocab_size: int = 2048
  num_candidates: int = 24
  min_tokens: int = 36
  max_tokens: int = 116

  def validate(self) -> "AssetOptions":
    if not 0 < self.min_tokens <= self.max_tokens or self.num_candidates < 2 or self.vocab_size < 256:
      raise ValueError(f"need 0 < min_tokens <= max_tokens, num_candidates >= 2, vocab_size >= 256; got {self}")
    return self


ENTRY = "assets"
SECTIONS = {"assets": AssetOptions}


def define_flags(fv: flags.FlagValues) -> None:
  """Every key of configs/assets.yml as a flag."""
  cli.define_entry_flags(fv, ENTRY, SECTIONS)


_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")


def _model_config(vocab_size: int) -> ModelConfig:
  return ModelConfig(family="qwen3", vocab_size=vocab_size, hidden_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=32, mlp_dim=256, rope_theta=1e6, rms_norm_eps=1e-6,
                     tie_word_embeddings=True, max_position_embeddings=4096).validate()


def _clip(tok, text: str, max_tokens: int) -> str:
  """`text` with whitespace collapsed, cut at a word boundary to at most max_tokens tokens."""
  text = " ".join(text.split())
  while len(tok.encode(text)) > max_tokens:
    keep = tok.decode(tok.encode(text)[:max_tokens - 2]).rsplit(" ", 1)[0]
    text = keep.rstrip(" ,.;:") + " ..."
    max_tokens -= 2
  return text


def _sections(topic: str, doc: str) -> list[dict]:
  """A topic's sections: title and prose paragraphs (indented code and grammar blocks dropped)."""
  lines = doc.split("\n")
  sections, title, paras, buf = [], None, [], []

  def flush_para():
    text = "\n".join(buf).strip()
    buf.clear()
    if text and not text.startswith((" ", "-[")) and len(text.split()) >= 8:
      paras.append(text)

  for i, line in enumerate(lines):
    if i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1].strip()) and line.strip() and \
        len(lines[i + 1].strip()) >= len(line.strip()) - 1:
      flush_para()
      if title is not None:
        sections.append({"topic": topic, "title": title, "paragraphs": list(paras)})
      title, paras = line.strip(), []
      continue
    if _UNDERLINE.match(line.strip()):
      continue
    if not line.strip():
      flush_para()
    else:
      buf.append(line)
  flush_para()
  if title is not None:
    sections.append({"topic": topic, "title": title, "paragraphs": list(paras)})
  return sections


def build_rerank_set(tok, seed: int, num_candidates: int, min_tokens: int, max_tokens: int) -> list[dict]:
  """One query per section with >= 2 prose paragraphs; candidates mix graded and random paragraphs.

  Paragraph lengths stay within [min_tokens, max_tokens] so that with the plain template every item
  fits one 128-token slot bucket and one length group: the default eval compiles only a few shapes."""
  import pydoc_data.topics  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(seed)
  sections = [s for topic, doc in sorted(pydoc_data.topics.topics.items()) for s in _sections(topic, doc)]
  pool = []  # (docid, topic, section index, text)
  for si, s in enumerate(sections):
    kept = [_clip(tok, p, max_tokens) for p in s["paragraphs"]]
    s["paragraphs"] = [p for p in kept if len(tok.encode(p)) >= min_tokens]
    for pi, p in enumerate(s["paragraphs"]):
      pool.append((f"{s['topic']}.{si}.{pi}", s["topic"], si, p))
  by_section: dict[int, list[int]] = {}
  by_topic: dict[str, list[int]] = {}
  for j, (_, topic, si, _) in enumerate(pool):
    by_section.setdefault(si, []).append(j)
    by_topic.setdefault(topic, []).append(j)
  titles = collections.Counter(s["title"] for s in sections)
  records = []
  for si, s in enumerate(sections):
    if len(s["paragraphs"]) < 2 or titles[s["title"]] > 1:  # ambiguous titles ("Examples") are no query
      continue
    rel = list(rng.permutation(by_section[si])[:4])
    near = [j for j in by_topic[s["topic"]] if pool[j][2] != si]
    near = list(rng.permutation(near)[:3]) if near else []
    others = [j for j in range(len(pool)) if pool[j][1] != s["topic"]]
    rest = list(rng.choice(others, size=num_candidates - len(rel) - len(near), replace=False))
    cands = [int(j) for j in rng.permutation(rel + near + rest)]
    query = s["title"].replace('"', "")
    records.append({
        "qid": f"pydoc-{si}",
        "query": query,
        "candidates": [{"docid": pool[j][0], "text": pool[j][3]} for j in cands],
        "qrels": {pool[j][0]: 2 if j in rel else 1 for j in rel + near},
    })
  order = rng.permutation(len(records))
  n_train, n_dev = round(0.6 * len(records)), round(0.2 * len(records))
  for rank, i in enumerate(order):
    records[i]["split"] = "train" if rank < n_train else "dev" if rank < n_train + n_dev else "test"
  return records


def _dir_bytes(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv, fv: flags.FlagValues = flags.FLAGS):
  del argv
  with cli.one_line_errors():
    o = cli.entry_from_flags(fv, ENTRY, SECTIONS)["assets"]
  out = pathlib.Path(o.output_dir or data.DEFAULT_DIR)
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    # A relative prefix keeps the temporary path out of the model file, so builds are byte-identical.
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
      sp_model = pathlib.Path(tmp) / train_sentencepiece("tokenizer", sample_texts(), o.vocab_size)
    finally:
      os.chdir(cwd)
    tok = load_tokenizer(sp_model)
    for label in ("Yes", "No"):
      tok.label_id(label)  # raises unless a single token
    records = build_rerank_set(tok, o.seed, o.num_candidates, o.min_tokens, o.max_tokens)
    jsonl = out / data.DEFAULT_JSONL.name
    safety.atomic_write_text(jsonl, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    model = _model_config(tok.vocab_size)
    decoder = Decoder(model, get_kernel("reference"))
    params = init_params(decoder, jax.random.PRNGKey(o.seed))
    ckpt = out / data.DEFAULT_CHECKPOINT.name
    if ckpt.exists():
      shutil.rmtree(ckpt)
    checkpointing.save_checkpoint(ckpt, params, model, tokenizer_files=(sp_model,))

  splits = collections.Counter(r["split"] for r in records)
  manifest = {
      "seed": o.seed,
      "python": sys.version.split()[0],
      "source": "pydoc_data.topics (CPython's bundled reference topics)",
      "model": {"checkpoint": ckpt.name, "init": "random (untrained)", "vocab_size": model.vocab_size,
                "hidden_size": model.hidden_size, "num_layers": model.num_layers,
                "params": model.num_params(), "bytes": _dir_bytes(ckpt)},
      "rerank_set": {"file": jsonl.name, "queries": len(records), "splits": dict(sorted(splits.items())),
                     "candidates_per_query": o.num_candidates, "bytes": jsonl.stat().st_size,
                     "paragraph_tokens": [o.min_tokens, o.max_tokens],
                     "grades": {"2": "paragraph of the query's section", "1": "paragraph of the same topic",
                                "0": "unjudged (another topic)"}},
  }
  safety.atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
  logging.info("wrote %s", out)
  print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
  cli.run_script(main, define_flags)  # quiet console: library INFO with -v only (no log file inside the output)
