"""The docs' short examples run as written: every ```sh block of README.md and docs/**/*.md that a
`<!-- doc-test -->` line introduces runs in bash, line by line with -e, from a scratch directory that looks
like a checkout with its venv (`.venv/bin/python` is this interpreter; `scripts/` and `maxscore/` are this
checkout's), so the examples' relative paths (out/..., maxscore/assets/default/...) work and their outputs stay
there. Mark only examples that run in seconds on the embedded default model; the rest are parsed against their
scripts' flags (tests/test_entry_config.py)."""

import pathlib
import re
import subprocess
import sys

import pytest

from maxscore.distributed import processes

REPO = pathlib.Path(__file__).resolve().parent.parent
MARK = "<!-- doc-test -->"
_BLOCK = re.compile(r"^" + re.escape(MARK) + r"[ \t]*\n```(?:sh|bash|shell)[ \t]*\n(.*?)^```", re.M | re.S)


def doc_examples(root: pathlib.Path = REPO) -> list[tuple[str, int, str]]:
  """(file relative to `root`, line of the block's first command, the block's text) for each marked block."""
  found = []
  for path in [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]:
    if not path.is_file():
      continue
    text = path.read_text()
    for m in _BLOCK.finditer(text):
      found.append((str(path.relative_to(root)), text.count("\n", 0, m.start(1)) + 1, m.group(1)))
  return found


EXAMPLES = doc_examples()


def test_the_extractor_takes_only_marked_shell_blocks(tmp_path):
  (tmp_path / "docs" / "guide").mkdir(parents=True)
  (tmp_path / "README.md").write_text(f"a\n{MARK}\n```sh\necho one\n```\n```sh\necho unmarked\n```\n"
                                      f"{MARK}\n```python\nprint('not shell')\n```\n")
  (tmp_path / "docs" / "guide" / "x.md").write_text(f"{MARK}\n```bash\necho two \\\n  three\n```\n")
  assert doc_examples(tmp_path) == [("README.md", 4, "echo one\n"), ("docs/guide/x.md", 3, "echo two \\\n  three\n")]
  assert len(EXAMPLES) >= 2  # the README marks some


def _scratch_checkout(tmp_path: pathlib.Path) -> pathlib.Path:
  (tmp_path / ".venv" / "bin").mkdir(parents=True)
  python = tmp_path / ".venv" / "bin" / "python"  # a wrapper, not a link: a venv is found beside the invoked path
  python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
  python.chmod(0o755)
  for name in ("scripts", "maxscore", "configs", "layers"):
    (tmp_path / name).symlink_to(REPO / name)
  return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("where,line,block", EXAMPLES, ids=[f"{w}:{n}" for w, n, _ in EXAMPLES])
def test_a_marked_doc_example_runs_as_written(tmp_path, where, line, block):
  cwd = _scratch_checkout(tmp_path)
  r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=cwd, env=processes.subprocess_env(1),
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, f"{where}:{line} exited {r.returncode}\n{r.stderr[-3000:]}"
