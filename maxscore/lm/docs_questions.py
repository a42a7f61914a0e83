"""Natural questions on the python-docs corpus, for training and selection: the Python FAQ's questions
("Why are Python strings immutable?") against the paragraphs python_docs_beir/ already holds.

    sections = docs_set.read_sections(html_dir, subdirs=("faq",))   # Debian's python3.11-doc
    files = question_files(sections, set_files, seed=0, dev_questions=70)  # python_docs_beir/'s files, rewritten

- The questions: every FAQ section (docs_set.read_sections: a section with a paragraph of at least 150
  characters) whose title ends with "?"; qid `q:<page>#<section>`; grade 2 for the section's own paragraphs
  and nothing else (a question is answered by its answer, not by its page).
- qrels/questions_dev.tsv (`dev_questions` of them, drawn with the seed) selects; qrels/questions_train.tsv
  (the rest) trains. A question's paragraphs belong to no other question, so no judged paragraph is in two
  splits.
- The keyword set gives up its FAQ queries: the FAQ's section titles are these questions, and they sat in
  its train split (whole pages went to a split), so they leave queries.jsonl, qrels/train.tsv and bm25.trec;
  its test and dev splits hold no FAQ page and are unchanged.
- bm25_questions.trec: BM25's top `bm25_top_k` of the whole corpus per question, English stopwords left out
  (maxscore.datasets.bm25), as the Perl FAQ set's run (maxscore/lm/perlfaq_set.py).
The corpus is the shipped one (the FAQ's paragraphs must be the ones it holds: checked), so the keyword set's
figures stay comparable across Debian's updates of the HTML. Deterministic in the sections, the set and the
seed; building from its own output gives the same files.
"""

import json
from typing import Mapping, Sequence

import numpy as np

from maxscore import errors
from maxscore.datasets import bm25, data
from maxscore.lm import docs_set

PREFIX = "q:"
SPLITS = ("questions_dev", "questions_train")
RUN_FILE = "bm25_questions.trec"
RUN_TAG = "bm25"


def _is_faq(qid: str) -> bool:
  return qid.startswith("faq/")


def _without_faq_queries(files: Mapping[str, str]) -> dict[str, str]:
  """The keyword set's queries.jsonl, qrels/train.tsv and bm25.trec without its FAQ queries (and without the
  questions of an earlier build)."""
  queries = [line for line in files["queries.jsonl"].splitlines(keepends=True)
             if not _is_faq(json.loads(line)["_id"]) and not json.loads(line)["_id"].startswith(PREFIX)]
  train = [line for i, line in enumerate(files["qrels/train.tsv"].splitlines(keepends=True))
           if i == 0 or not _is_faq(line.split("\t", 1)[0])]
  run = [line for line in files["bm25.trec"].splitlines(keepends=True) if not _is_faq(line.split(" ", 1)[0])]
  return {"queries.jsonl": "".join(queries), "qrels/train.tsv": "".join(train), "bm25.trec": "".join(run)}


def question_files(sections: Sequence[docs_set.Section], files: Mapping[str, str], seed: int = 0,
                   dev_questions: int = 70, bm25_top_k: int = 30) -> dict[str, str]:
  """{path: text} to write over python_docs_beir/ (`files`: its corpus.jsonl, queries.jsonl, qrels/train.tsv and
  bm25.trec), module docstring."""
  corpus = {r["_id"]: r["text"] for r in map(json.loads, files["corpus.jsonl"].splitlines())}
  asked = [s for s in sections if s.page.startswith("faq/") and s.title.endswith("?")]
  for s in asked:
    for i, p in enumerate(s.paragraphs):
      if corpus.get(docs_set.docid(s, i)) != p:
        raise errors.ScoreInputError(
            f"{docs_set.docid(s, i)}: the FAQ's HTML and the set's corpus.jsonl differ there; the questions "
            "are judged against the shipped corpus, so build them from the HTML it was built from")
  if len(asked) <= dev_questions:
    raise errors.ScoreInputError(f"{len(asked)} FAQ questions cannot give {dev_questions} dev questions and "
                                 "some to train on")
  qids = [PREFIX + docs_set.qid(s) for s in asked]
  dev = {qids[int(i)] for i in np.random.default_rng(seed).permutation(len(asked))[:dev_questions]}
  run = bm25.first_stage_run(corpus, {q: s.title for q, s in zip(qids, asked)}, bm25_top_k,
                             stopwords=bm25.ENGLISH_STOPWORDS)
  out = _without_faq_queries(files)
  out["queries.jsonl"] += "".join(json.dumps({"_id": q, "text": s.title}, ensure_ascii=False) + "\n"
                                  for q, s in zip(qids, asked))
  for split in SPLITS:
    lines = ["query-id\tcorpus-id\tscore"] + [
        f"{q}\t{docs_set.docid(s, i)}\t2" for q, s in zip(qids, asked) if (q in dev) == (split == "questions_dev")
        for i in range(len(s.paragraphs))]
    out[f"qrels/{split}.tsv"] = "".join(line + "\n" for line in lines)
  out[RUN_FILE] = "".join(line + "\n" for q in qids
                          for line in data.trec_lines(q, list(run[q]), list(run[q].values()), RUN_TAG))
  return out
