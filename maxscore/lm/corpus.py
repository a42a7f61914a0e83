"""Local text for pretraining and fine-tuning: CPython's reference topics and the standard library.

    sections = pydoc_sections()                        # the reference manual, section by section
    docs = collect(held_out={3, 17}, sources=("pydoc", "docstrings", "source"))
    docs.texts, docs.dropped                           # documents, and how many the leak check removed

Sources (all from the running Python, so the text depends on its version):
  pydoc       each section of `pydoc_data.topics` (title, then its prose paragraphs) except the
              held-out ones: the sections whose titles are the dev/test queries of a rerank set
  docstrings  every module, class and function docstring of the standard library, as
              "<dotted name>\\n\\n<docstring>"
  source      the standard library's .py files as they are (code, comments and docstrings)
The standard library's tests, `encodings` (codec tables), `site-packages` and `pydoc_data` (which
holds the reference topics verbatim) are left out. Leak check: a document that contains the
opening of any held-out paragraph (whitespace collapsed) is dropped, whatever its source.
"""

import ast
import bisect
import dataclasses
import inspect
import math
import os
import pathlib
import re
import sysconfig
from typing import Collection, Iterable, Optional, Sequence

SOURCES = ("pydoc", "docstrings", "source")
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "pydoc_data", "encodings", "__pycache__"})
LEAK_PREFIX_CHARS = 80  # a held-out paragraph is found in a document by its first this-many characters

_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")


def pydoc_sections() -> list[dict]:
  """Every section of the reference topics, in (sorted topic, document) order: topic, title and prose
  paragraphs (indented code and grammar blocks dropped). A section's index in this list is its id."""
  import pydoc_data.topics  # pylint: disable=import-outside-toplevel

  return [s for topic, doc in sorted(pydoc_data.topics.topics.items()) for s in _sections(topic, doc)]


def _sections(topic: str, doc: str) -> list[dict]:
  """A topic's sections: a line underlined by a row of one punctuation character starts one."""
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


def section_index(qid: str) -> int:
  """The pydoc section id of a rerank query id `pydoc-<section>` (the embedded rerank set's form)."""
  if not re.fullmatch(r"pydoc-\d+", qid):
    raise ValueError(f"query id {qid!r} is not of the form pydoc-<section index>")
  return int(qid.split("-")[1])


def stdlib_files(root: Optional[pathlib.Path] = None) -> list[pathlib.Path]:
  """The standard library's .py files in sorted order, SKIPPED_DIRS left out."""
  root = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
  return sorted(p for p in root.rglob("*.py") if not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1]))


def docstrings(path: pathlib.Path, module: str) -> list[tuple[str, str]]:
  """(dotted name, cleaned docstring) of the module and each class and function in it, source order."""
  try:
    tree = ast.parse(path.read_text(encoding="utf-8"))
  except (SyntaxError, UnicodeDecodeError, ValueError):
    return []
  out = []

  def visit(node, name):
    doc = ast.get_docstring(node, clean=False)
    if doc and doc.strip():
      out.append((name, inspect.cleandoc(doc)))
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        visit(child, f"{name}.{child.name}")

  visit(tree, module)
  return out


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = list(path.relative_to(root).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts) or path.stem


@dataclasses.dataclass
class Corpus:
  """Documents (text) with their source name; `dropped` counts the documents the leak check removed."""
  texts: list[str]
  sources: list[str]
  dropped: dict[str, int]

  def counts(self) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for text, source in zip(self.texts, self.sources):
      c = out.setdefault(source, {"documents": 0, "chars": 0})
      c["documents"] += 1
      c["chars"] += len(text)
    return out


def pydoc_text(section: dict) -> str:
  return section["title"] + "\n\n" + "\n\n".join(section["paragraphs"])


def held_out_text(sections: Sequence[dict], held_out: Iterable[int]) -> list[str]:
  """The held-out sections' text (the perplexity check of pretraining reads it)."""
  return [pydoc_text(sections[i]) for i in sorted(held_out)]


def collect(held_out: Collection[int], sources: Sequence[str] = SOURCES,
            stdlib_root: Optional[pathlib.Path] = None) -> Corpus:
  """The documents of `sources`, without the held-out pydoc sections nor any document holding one of
  their paragraphs."""
  unknown = [s for s in sources if s not in SOURCES]
  if unknown or not sources:
    raise ValueError(f"sources={list(sources)}: need one or more of {list(SOURCES)}")
  sections = pydoc_sections()
  bad = [i for i in held_out if not 0 <= i < len(sections)]
  if bad:
    raise ValueError(f"held-out section ids {bad} are not in 0..{len(sections) - 1}")
  texts, names = [], []
  if "pydoc" in sources:
    for i, s in enumerate(sections):
      if i not in held_out and s["paragraphs"]:
        texts.append(pydoc_text(s))
        names.append("pydoc")
  if "docstrings" in sources or "source" in sources:
    root = pathlib.Path(stdlib_root or sysconfig.get_paths()["stdlib"])
    for path in stdlib_files(root):
      module = _module_name(path, root)
      if "docstrings" in sources:
        for name, doc in docstrings(path, module):
          texts.append(f"{name}\n\n{doc}")
          names.append("docstrings")
      if "source" in sources:
        try:
          texts.append(path.read_text(encoding="utf-8"))
          names.append("source")
        except (UnicodeDecodeError, OSError):
          continue
  probes = [" ".join(p.split())[:LEAK_PREFIX_CHARS] for i in held_out for p in sections[i]["paragraphs"]]
  leaking = leaking_documents(texts, probes)
  dropped: dict[str, int] = {}
  for i in sorted(leaking):
    dropped[names[i]] = dropped.get(names[i], 0) + 1
  keep = [i for i in range(len(texts)) if i not in leaking]
  return Corpus([texts[i] for i in keep], [names[i] for i in keep], dropped)


def leaking_documents(texts: Sequence[str], probes: Iterable[str]) -> set[int]:
  """Indices of the documents that contain any probe, whitespace collapsed in both."""
  joined, starts, pos = [], [], 0
  for t in texts:
    norm = " ".join(t.split())
    starts.append(pos)
    joined.append(norm)
    pos += len(norm) + 1
  big = "\x00".join(joined)
  hits = set()
  for probe in set(probes):
    if not probe:
      continue
    at = big.find(probe)
    while at >= 0:
      hits.add(bisect.bisect_right(starts, at) - 1)
      at = big.find(probe, at + 1)
  return hits


def held_out_sections(jsonl: os.PathLike, splits: Sequence[str]) -> set[int]:
  """The pydoc section ids of the queries of `splits` in a rerank set of `pydoc-<section>` query ids."""
  from maxscore.datasets import data  # pylint: disable=import-outside-toplevel

  return {section_index(q.qid) for s in splits for q in data.load_jsonl(jsonl, split=s).queries}


def training_texts(corpus: Corpus, pydoc_repeats: int = 1) -> list[str]:
  """The corpus's documents, each pydoc section `pydoc_repeats` times (the in-domain text weighs more)."""
  out = []
  for text, source in zip(corpus.texts, corpus.sources):
    out.extend([text] * (pydoc_repeats if source == "pydoc" else 1))
  return out


def tokenizer_texts(corpus: Corpus, max_chars: int = 4_000_000, max_piece: int = 8192) -> list[str]:
  """Paragraphs to train a tokenizer on: every pydoc and docstring paragraph, then source paragraphs
  spread evenly over the files until `max_chars` (each paragraph cut to `max_piece` characters)."""
  prose, code = [], []
  for text, source in zip(corpus.texts, corpus.sources):
    parts = [p[:max_piece] for p in text.split("\n\n") if p.strip()]
    (code if source == "source" else prose).extend(parts)
  room = max_chars - sum(len(p) for p in prose)
  total = sum(len(p) for p in code)
  if code and room > 0:
    stride = max(1, math.ceil(total / room))
    prose.extend(code[::stride])
  return prose

