"""The documentation: the configuration reference says what configs/*.yml say, the README's links lead to pages
that exist, the module paths that comments and pages cite exist, and the site builds with mkdocs in strict mode (a
warning, such as a broken link, fails the build)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from maxscore import config_reference

REPO = pathlib.Path(__file__).resolve().parents[1]


def _mkdocs_build(root: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                         "-d", str(site)], capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))


def test_the_configuration_reference_is_generated_from_the_configs():
  assert (REPO / "docs" / "configuration.md").read_text() == config_reference.reference(REPO / "configs"), (
      "docs/configuration.md is stale: run `make docs` (python -m maxscore.config_reference docs/configuration.md)")


def test_every_config_key_is_in_the_reference_with_its_comment():
  text = config_reference.reference(REPO / "configs")
  files = sorted((REPO / "configs").glob("*.yml")) + sorted((REPO / "configs" / "models").glob("*.yml"))
  keys = 0
  for path in files:
    for line in path.read_text().splitlines():
      m = re.match(r"^(\w[\w.-]*):[^#]*#\s?(.*)$", line)
      if m:
        keys += 1
        assert f"| `{m.group(1)}` |" in text and m.group(2).replace("|", "\\|").strip() in text, (path, line)
  assert keys > 200


def test_a_nested_or_unparsable_key_is_one_clear_error(tmp_path):
  (tmp_path / "models").mkdir()
  (tmp_path / "base.yml").write_text("# base\nmodel_name: tiny  # the model\nbuckets:\n  - 1\n")
  with pytest.raises(config_reference.ReferenceError, match=r"base.yml:4: expected 'key: value"):
    config_reference.reference(tmp_path)


def test_the_readme_links_to_pages_that_exist():
  links = re.findall(r"\]\(([^)#]+)\)", (REPO / "README.md").read_text())
  assert len(links) >= 10
  assert [link for link in links if not (REPO / link).is_file()] == []


def test_every_module_path_the_code_and_docs_name_exists():
  """A `maxscore/...py` or `scripts/...py` named in a comment, docstring or page points at a file of this repo:
  a module moved or split leaves no citation pointing at nothing. (A path under another directory, such as a
  benchmark's tmp/before/scripts/x.py, is not a citation of this tree and is skipped.)"""
  files = (sorted(REPO.glob("maxscore/**/*.py")) + sorted(REPO.glob("scripts/*.py")) + sorted(REPO.glob("docs/*.md"))
           + [REPO / "BENCHMARKS.md"])
  cited = re.compile(r"(?<![\w/.])((?:maxscore|scripts)/[\w/]+\.py)")
  named, missing = 0, []
  for path in files:
    for number, line in enumerate(path.read_text().splitlines(), 1):
      for m in cited.finditer(line):
        named += 1
        if not (REPO / m.group(1)).is_file():
          missing.append(f"{path.relative_to(REPO)}:{number}: {m.group(1)}")
  assert named > 100
  assert missing == []


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
  done = _mkdocs_build(REPO, tmp_path / "site")
  assert done.returncode == 0, done.stderr[-3000:]
  assert (tmp_path / "site" / "evaluate" / "index.html").is_file()


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path):
  shutil.copytree(REPO / "docs", tmp_path / "docs")
  shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
  with open(tmp_path / "docs" / "serve.md", "a") as f:
    f.write("\nSee [the missing page](no-such-page.md).\n")
  done = _mkdocs_build(tmp_path, tmp_path / "site")
  assert done.returncode != 0 and "no-such-page.md" in done.stderr, done.stderr[-3000:]
