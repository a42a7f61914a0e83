"""What the data-safety tests put on disk and compare before and after a run: a directory's files, a directory
someone else wrote, a tiny rerank set."""

import json
import pathlib

from maxscore.datasets import data


def tree(directory: pathlib.Path) -> dict[str, bytes]:
  """{relative path: bytes} of every file under `directory`."""
  return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def foreign_dir(path: pathlib.Path) -> dict[str, bytes]:
  """Creates `path` holding one file maxscore did not write; its tree()."""
  path.mkdir(parents=True)
  (path / "notes.txt").write_text("mine")
  return tree(path)


def tiny_set(path: pathlib.Path, n: int = 2) -> data.RerankSet:
  """`n` queries of two candidates each (one relevant) written to `path` as JSONL, and loaded back."""
  lines = [json.dumps({"qid": f"q{i}", "query": f"query {i}", "candidates": [
      {"docid": "a", "text": "some text"}, {"docid": "b", "text": f"other text {i}"}], "qrels": {"a": 1}})
           for i in range(n)]
  path.write_text("\n".join(lines) + "\n")
  return data.load_jsonl(path, "all")
