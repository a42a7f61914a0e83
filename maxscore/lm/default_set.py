"""The embedded default's rerank data: queries over CPython's reference paragraphs, in the JSONL form and in
the BEIR layout with a BM25 first-stage run over the whole corpus.

    files = build_files(layout_tok, seed=0, num_candidates=24, min_tokens=36, max_tokens=116, bm25_top_k=100)
    files.records                     # pydoc_rerank.jsonl's records (JSONL form, a `split` field)
    files.beir                        # {relative path: text} of pydoc_beir/ (see below)

JSONL form: one query per section with >= 2 prose paragraphs (query = the section title); candidates mix
graded and random paragraphs; grade 2 = a paragraph of that section, 1 = of the same topic. Paragraphs are
cut with a fixed layout tokenizer (`layout_tok`), so the set does not move when the model's tokenizer does.

BEIR layout (pydoc_beir/): corpus.jsonl holds every paragraph of the topics (the candidates' pool);
queries.jsonl the same queries; qrels/{train,dev,test}.tsv judge the whole corpus by the same grades (every
paragraph of the query's section 2, every other paragraph of its topic 1); bm25.trec is BM25's top
`bm25_top_k` paragraphs of the whole corpus per query (maxscore.datasets.bm25, computed by bm25s), every split.
Everything is deterministic in the seed and the Python version.
"""

import collections
import dataclasses
import json

import numpy as np

from maxscore.datasets import bm25, data
from maxscore.lm import corpus as corpus_lib
from maxscore.lm import pairs as pairs_lib

BEIR_DIR = data.DEFAULT_BEIR_DIR.name
RUN_FILE = data.DEFAULT_RUN.name
RUN_TAG = "bm25"
SPLITS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class DefaultSet:
  records: list[dict]        # the JSONL form's records
  beir: dict[str, str]       # path under pydoc_beir/ -> file text


def paragraph_pool(tok, min_tokens: int, max_tokens: int) -> tuple[list[dict], list[tuple[str, str, int, str]]]:
  """(sections with their paragraphs cut to [min_tokens, max_tokens] layout tokens, the pool of every kept
  paragraph as (docid, topic, section index, text)); a docid is <topic>.<section>.<paragraph>."""
  sections = corpus_lib.pydoc_sections()
  pool = []
  for si, s in enumerate(sections):
    kept = [pairs_lib.clip(tok, p, max_tokens) for p in s["paragraphs"]]
    s["paragraphs"] = [p for p in kept if len(tok.encode(p)) >= min_tokens]
    for pi, p in enumerate(s["paragraphs"]):
      pool.append((f"{s['topic']}.{si}.{pi}", s["topic"], si, p))
  return sections, pool


def build_rerank_set(tok, seed: int, num_candidates: int, min_tokens: int, max_tokens: int) -> list[dict]:
  """The JSONL form's records (see the module docstring), split 60/20/20 into train/dev/test.

  Paragraph lengths stay within [min_tokens, max_tokens] so that with the plain template every item
  fits one 128-token slot bucket and one length group: the default eval compiles only a few shapes."""
  rng = np.random.default_rng(seed)
  sections, pool = paragraph_pool(tok, min_tokens, max_tokens)
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
    records.append({
        "qid": f"pydoc-{si}",
        "query": s["title"].replace('"', ""),
        "candidates": [{"docid": pool[j][0], "text": pool[j][3]} for j in cands],
        "qrels": {pool[j][0]: 2 if j in rel else 1 for j in rel + near},
    })
  order = rng.permutation(len(records))
  n_train, n_dev = round(0.6 * len(records)), round(0.2 * len(records))
  for rank, i in enumerate(order):
    records[i]["split"] = "train" if rank < n_train else "dev" if rank < n_train + n_dev else "test"
  return records


def beir_files(tok, records: list[dict], min_tokens: int, max_tokens: int, bm25_top_k: int) -> dict[str, str]:
  """The BEIR layout of `records` over the whole paragraph pool, with the BM25 run (module docstring)."""
  _, pool = paragraph_pool(tok, min_tokens, max_tokens)
  corpus = {docid: text for docid, _, _, text in pool}
  queries = {r["qid"]: r["query"] for r in records}
  qrels = {s: ["query-id\tcorpus-id\tscore"] for s in SPLITS}
  for r in records:
    si = corpus_lib.section_index(r["qid"])
    topic = next(t for _, t, s, _ in pool if s == si)
    for docid, t, s, _ in pool:
      if t == topic:
        qrels[r["split"]].append(f"{r['qid']}\t{docid}\t{2 if s == si else 1}")
  run = bm25.first_stage_run(corpus, queries, bm25_top_k)
  run_lines = [line for qid, scores in run.items()
               for line in data.trec_lines(qid, list(scores), list(scores.values()), RUN_TAG)]
  files = {"corpus.jsonl": _jsonl({"_id": d, "text": t} for d, t in corpus.items()),
           "queries.jsonl": _jsonl({"_id": q, "text": t} for q, t in queries.items()),
           RUN_FILE: "".join(l + "\n" for l in run_lines)}
  files |= {f"qrels/{s}.tsv": "".join(l + "\n" for l in lines) for s, lines in qrels.items()}
  return files


def _jsonl(records) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def build_files(tok, seed: int, num_candidates: int, min_tokens: int, max_tokens: int,
                bm25_top_k: int) -> DefaultSet:
  """Both forms of the embedded rerank data (module docstring)."""
  records = build_rerank_set(tok, seed, num_candidates, min_tokens, max_tokens)
  return DefaultSet(records, beir_files(tok, records, min_tokens, max_tokens, bm25_top_k))
