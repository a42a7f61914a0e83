"""Perl's POD (plain old documentation) as plain text, heading by heading: what the Perl FAQ set
(maxscore/lm/perlfaq_set.py) reads from Debian's perl-doc.

    blocks = read_pod(text)        # [Block(kind="head2", text="How do I ...?"), Block(kind="para", ...), ...]
    render("Use C<< $x >> and L<perlfunc/rand>")   # 'Use $x and rand in perlfunc'

Only what the FAQ set needs: headings (=head1 to =head4), ordinary and verbatim paragraphs, and =item
labels as paragraphs; =for, =begin/=end blocks and the list and encoding commands are dropped. Formatting
codes (perlpod's "Formatting Codes") become their text: C/B/I/F/S keep their content, X (index entries) and
Z are dropped, E<name> becomes the character, L<text|target> its text, L<name/"section"> the section and the
page, L<name> the name. A link's section can be replaced by the page alone (`drop_section`): the FAQ set uses
it so that no passage repeats another FAQ question through a cross-reference.
"""

import dataclasses
import html
import re
from typing import Callable, Optional

HEADINGS = ("head1", "head2", "head3", "head4")
_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}
_CODE_START = re.compile(r"([A-Z])<")
_COMMAND = re.compile(r"^=([a-zA-Z][a-zA-Z0-9]*)\s*(.*)$", re.S)


@dataclasses.dataclass(frozen=True)
class Block:
  kind: str   # "head1" .. "head4", "para" (ordinary text or an =item label) or "verbatim" (code)
  text: str   # rendered: formatting codes resolved, whitespace collapsed (verbatim: lines kept, dedented)


def _escape(name: str) -> str:
  if name in _ESCAPES:
    return _ESCAPES[name]
  if name.isdigit() or name.lower().startswith("0x"):
    try:
      return chr(int(name, 0) if not name.isdigit() else int(name))
    except (ValueError, OverflowError):
      return ""
  return html.unescape(f"&{name};") if re.fullmatch(r"[A-Za-z]+", name) else ""


def _link(content: str, drop_section: Callable[[str], bool]) -> str:
  """L<...>'s visible text (perlpod: L<text|name/"sec">, L<name/"sec">, L</"sec">, L<name>, L<url>)."""
  if "|" in content:
    return content.split("|", 1)[0]
  if "://" in content:
    return content
  name, _, section = content.partition("/")
  section = section.strip().strip('"')
  if not section:
    return name
  if drop_section(section):
    return name
  return f'"{section}" in {name}' if name else f'"{section}"'


def render(text: str, drop_section: Optional[Callable[[str], bool]] = None) -> str:
  """`text` with its formatting codes resolved (module docstring); whitespace is kept as it is."""
  drop = drop_section or (lambda _: False)
  out, i = [], 0
  while i < len(text):
    m = _CODE_START.search(text, i)
    if not m:
      out.append(text[i:])
      break
    out.append(text[i:m.start()])
    code, j = m.group(1), m.end()
    opens = 1
    while j < len(text) and text[j] == "<":
      opens += 1
      j += 1
    if opens > 1 and j < len(text) and text[j].isspace():  # C<< ... >>: closed by whitespace and as many >
      close = re.compile(r"\s" + ">" * opens)
      end = close.search(text, j)
      if end is None:
        inner, i = text[j:], len(text)
      else:
        inner, i = text[j:end.start()], end.end()
      inner = inner.strip()
    else:  # C<...>: closed by the matching >, nested codes counted
      j, depth, start = m.end(), 1, m.end()
      while j < len(text) and depth:
        if text[j] == ">":
          depth -= 1
        elif text[j] == "<" and j > 0 and text[j - 1].isupper() and text[j - 1].isalpha():
          depth += 1
        j += 1
      inner, i = text[start:j - 1 if depth == 0 else j], j
    if code in ("X", "Z"):
      continue
    if code == "E":
      out.append(_escape(inner.strip()))
    elif code == "L":
      out.append(_link(render(inner, drop), drop))
    else:
      out.append(render(inner, drop))
  return "".join(out)


def _dedent(lines: list[str]) -> str:
  indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
  return "\n".join(line[indent:].rstrip() for line in lines)


def read_pod(text: str, drop_section: Optional[Callable[[str], bool]] = None) -> list[Block]:
  """The POD document `text` as blocks in document order (module docstring)."""
  blocks: list[Block] = []
  in_pod, skipping = text.lstrip().startswith("="), None  # skipping: the =begin format being passed over
  for para in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
    if not para.strip():
      continue
    command = _COMMAND.match(para) if para.startswith("=") else None
    if command:
      name, rest = command.group(1), command.group(2)
      if name == "cut":
        in_pod = False
      else:
        in_pod = True
      if skipping is not None:
        if name == "end":
          skipping = None
        continue
      if name == "begin":
        skipping = rest.split()[0] if rest.split() else ""
      elif name in HEADINGS or name == "item":
        label = " ".join(render(rest, drop_section).split())
        if name == "item":
          label = label.lstrip("*").strip()
        if label:
          blocks.append(Block(name if name in HEADINGS else "para", label))
      continue  # =over, =back, =pod, =encoding, =for (one paragraph), =cut
    if not in_pod or skipping is not None:
      continue
    if para[0] in " \t":
      blocks.append(Block("verbatim", _dedent(para.split("\n"))))
    else:
      rendered = " ".join(render(para, drop_section).split())
      if rendered:
        blocks.append(Block("para", rendered))
  return blocks
