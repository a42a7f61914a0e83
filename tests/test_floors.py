"""The package floors stay in order (docs/ARCHITECTURE.md section 6): the model's layers import nothing of the
scorer, evaluation or trainer built on them, and checkpoints/ imports only what stands below it. Read from the
code's own imports (ast), top level and inside functions alike, so the check costs no import of the code."""

import ast
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# What checkpoints/ may import from this repository: the packages below it and itself.
CHECKPOINTS_MAY_IMPORT = ("layers", "maxscore.checkpoints", "maxscore.config", "maxscore.errors", "maxscore.files",
                          "maxscore.heads")
# What layers/ must never import: the scorer's, the evaluation's and the trainer's packages above it.
LAYERS_MUST_NOT_IMPORT = ("maxscore.rerank", "maxscore.training")


def imported_modules(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, dotted module) for every import in a file; `from a import b` counts as a.b too, since b may be a
  module (`from maxscore import rerank`)."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
    if isinstance(node, ast.Import):
      out += [(node.lineno, alias.name) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.append((node.lineno, node.module))
      out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
  return out


def _within(module: str, packages) -> bool:
  return any(module == p or module.startswith(p + ".") for p in packages)


def violations(folder: pathlib.Path, allowed=None, forbidden=()) -> list[str]:
  """`file:line imports module` for each repository import of a file under `folder` that is not `allowed` (when
  given) or is `forbidden`."""
  found = []
  for path in sorted(folder.rglob("*.py")):
    for line, module in imported_modules(path):
      ours = _within(module, ("maxscore", "layers"))
      if ours and ((allowed is not None and not _within(module, allowed)) or _within(module, forbidden)):
        found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
  return found


def test_layers_import_nothing_of_the_scorer_eval_or_trainer():
  assert violations(REPO / "layers", forbidden=LAYERS_MUST_NOT_IMPORT) == []


def test_checkpoints_import_only_the_floors_below_them():
  assert violations(REPO / "maxscore" / "checkpoints", allowed=CHECKPOINTS_MAY_IMPORT) == []


@pytest.mark.parametrize("source,allowed,forbidden,bad", [
    ("from maxscore.training import lora\n", None, LAYERS_MUST_NOT_IMPORT, "maxscore.training"),
    ("def f():\n  from maxscore import rerank\n", None, LAYERS_MUST_NOT_IMPORT, "maxscore.rerank"),
    ("import maxscore.rerank.eval as e\n", None, LAYERS_MUST_NOT_IMPORT, "maxscore.rerank.eval"),
    ("from maxscore.scoring.scorer import Scorer\n", CHECKPOINTS_MAY_IMPORT, (), "maxscore.scoring.scorer"),
    ("def f():\n  from maxscore.training import lora as l\n", CHECKPOINTS_MAY_IMPORT, (), "maxscore.training"),
])
def test_the_checks_catch_an_import_that_runs_back_up(tmp_path, monkeypatch, source, allowed, forbidden, bad):
  monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "mod.py").write_text("import numpy\nfrom layers import decoder\n" + source)
  found = violations(tmp_path / "pkg", allowed=allowed, forbidden=forbidden)
  assert found and all(f.startswith("pkg/mod.py:") for f in found) and any(f.endswith(f"imports {bad}")
                                                                            for f in found), found
  assert not any("numpy" in f or "layers" in f for f in found)
