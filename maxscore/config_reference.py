"""The configuration reference (docs/configuration.md), generated from configs/*.yml and configs/models/*.yml:
each file's own description (its leading comment), its sections (`# --- name ---` lines) and every key with its
default and the comment beside it, so the reference says what the files say and cannot drift from them.

    text = reference(pathlib.Path("configs"))
    python -m maxscore.config_reference docs/configuration.md     # what `make docs` runs
"""

import pathlib
import re
import sys

_KEY = re.compile(r"^(?P<key>[A-Za-z_][\w.-]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
_SECTION = re.compile(r"^#\s*-{2,}\s*(?P<name>.*?)\s*-*\s*$")
HEADER = ("# Configuration reference\n\n"
          "Generated from `configs/*.yml` by `make docs` (maxscore/config_reference.py): every key with its default "
          "and its comment. `configs/base.yml` holds the scorer's runtime settings, which every entry point reads "
          "(override any of them as `key=value`); `configs/<entry>.yml` holds one script's own settings, each also a "
          "flag (`--key=value`); `configs/models/*.yml` the architectures.\n")


class ReferenceError(ValueError):
  """A config file line the reference cannot read (a nested or unparsable key)."""


def _cell(text: str) -> str:
  return text.replace("|", "\\|").strip()


def file_section(path: pathlib.Path, title: str) -> str:
  """One file's part of the reference: its description, then a table of its keys per section."""
  description, rows, started = [], [], False
  for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    if not line.strip():
      started = started or bool(description)
      continue
    section = _SECTION.match(line)
    if section:
      rows.append(("section", section.group("name"), "", ""))
      started = True
    elif line.startswith("#"):
      if not started and not rows:
        description.append(line.lstrip("#").strip())
      else:  # a note between keys: it says something about the keys after it
        rows.append(("note", line.lstrip("#").strip(), "", ""))
    else:
      key = _KEY.match(line)
      if key is None:
        raise ReferenceError(f"{path}:{number}: expected 'key: value  # comment' at the top level, got {line!r}")
      rows.append(("key", key.group("key"), key.group("value").strip(), key.group("comment") or ""))
      started = True
  out = [f"## {title}", ""]
  if description:
    out += [" ".join(description), ""]
  table_open = False
  for kind, name, value, comment in rows:
    if kind in ("section", "note"):
      out += ["", f"**{_cell(name)}**" if kind == "section" else name, ""]
      table_open = False
      continue
    if not table_open:
      out += ["| key | default | meaning |", "|---|---|---|"]
      table_open = True
    out.append(f"| `{name}` | `{_cell(value)}` | {_cell(comment)} |")
  return "\n".join(out).replace("\n\n\n", "\n\n") + "\n"


def reference(configs_dir: pathlib.Path) -> str:
  """The whole reference: base.yml first, then every entry's file, then the model architectures."""
  entries = sorted(p for p in configs_dir.glob("*.yml") if p.name != "base.yml")
  parts = [HEADER, file_section(configs_dir / "base.yml", "base.yml: the scorer's runtime settings")]
  parts += [file_section(p, p.name) for p in entries]
  parts += [file_section(p, f"models/{p.name}") for p in sorted((configs_dir / "models").glob("*.yml"))]
  return "\n".join(parts)


if __name__ == "__main__":
  pathlib.Path(sys.argv[1]).write_text(reference(pathlib.Path(__file__).resolve().parents[1] / "configs"),
                                       encoding="utf-8")
