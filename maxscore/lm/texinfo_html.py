"""A Texinfo manual's HTML (makeinfo's one-page output) as plain text, heading by heading: what the R FAQ set
(maxscore/lm/rfaq_set.py) reads from Debian's r-doc-html, in the blocks the Perl FAQ set reads from POD.

    blocks = read_blocks(html_text)   # [Block(kind="head2", text="What is R?"), Block(kind="para", ...), ...]

- Headings: a chapter (or an appendix, or the unnumbered chapters) is head1, a section head2, a subsection
  head3, a subsubsection head4; the text without its number ("2.1 What is R?" -> "What is R?"). The title
  page's headings (before the first chapter) are no block.
- Text: paragraphs, list items, definition terms and their descriptions, table cells and block quotes are
  "para" blocks, examples (`<pre>`) "verbatim" ones, whitespace collapsed as in pod_text.
- Dropped, because they repeat headings (a question's text would then answer itself): the navigation line above
  every node, the table of contents, the lists and menus of child nodes, and the indices. Footnotes are dropped
  too (they sit at the page's end, under no section).
"""

import html.parser
import re
from typing import Callable, Optional

from maxscore.lm.pod_text import Block

_HEADINGS = {"chapter": "head1", "appendix": "head1", "unnumbered": "head1", "section": "head2",
             "appendixsec": "head2", "appendixsection": "head2", "unnumberedsec": "head2", "subsection": "head3",
             "appendixsubsec": "head3", "unnumberedsubsec": "head3", "subsubsection": "head4",
             "appendixsubsubsec": "head4", "unnumberedsubsubsec": "head4"}
_HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5")
_NUMBER = re.compile(r"^(?:[A-Z]|\d+)(?:\.\d+)*\s+")  # "2.1 What is R?", "A.1 ..." -> the title
_DROPPED_DIVS = ("header", "nav-panel", "contents", "shortcontents", "footnote")
_BLOCKS = {"p", "li", "dt", "dd", "td", "th", "pre"}
_VOID = {"br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr"}


def _dropped(tag: str, classes: list[str]) -> bool:
  if tag == "div" and any(c in _DROPPED_DIVS for c in classes):
    return True
  if tag == "ul" and "section-toc" in classes:  # a chapter's or section's list of its child nodes
    return True
  return tag == "table" and any(c == "menu" or c.startswith("index-") for c in classes)


class _Reader(html.parser.HTMLParser):
  def __init__(self, replace_link: Optional[Callable[[str], Optional[str]]]):
    super().__init__(convert_charrefs=True)
    self.replace_link = replace_link
    self.link_start: Optional[int] = None     # where the open link's text starts in self.text
    self.blocks: list[Block] = []
    self.stack: list[tuple[str, bool]] = []  # open elements: (tag, whether it starts a dropped part)
    self.dropped = 0                         # how many dropped parts are open
    self.kind = None                         # the open block's kind, or None
    self.text: list[str] = []
    self.started = False                     # a chapter heading was seen (the title page is over)

  def _flush(self):
    text = "".join(self.text)
    if self.kind == "verbatim":
      lines = [line.rstrip() for line in text.strip("\n").split("\n")]
      text = "\n".join(lines).strip()
    else:
      text = " ".join(text.split())
    if self.kind and text and self.started:
      if self.kind.startswith("head"):
        text = _NUMBER.sub("", text)
      self.blocks.append(Block(self.kind, text))
    self.kind, self.text, self.link_start = None, [], None

  def handle_starttag(self, tag, attrs):
    classes = (dict(attrs).get("class") or "").split()
    if tag in _VOID:
      if tag == "br" and self.kind:
        self.text.append("\n" if self.kind == "verbatim" else " ")
      return
    if tag == "a" and self.kind and not self.dropped:
      self.link_start = len(self.text)
    drop = _dropped(tag, classes)
    self.stack.append((tag, drop))
    self.dropped += drop
    if self.dropped:
      return
    heading = tag in _HEADING_TAGS and next((_HEADINGS[c] for c in classes if c in _HEADINGS), None)
    if heading:
      self._flush()
      self.started = self.started or heading == "head1"
      self.kind = heading
    elif tag in _BLOCKS and self.kind != "verbatim" and not (self.kind or "").startswith("head"):
      self._flush()
      self.kind = "verbatim" if tag == "pre" else "para"

  def handle_endtag(self, tag):
    if tag in _VOID or not any(t == tag for t, _ in self.stack):
      return
    if tag == "a" and self.link_start is not None:
      if self.replace_link and self.link_start <= len(self.text):
        stand_in = self.replace_link(" ".join("".join(self.text[self.link_start:]).split()))
        if stand_in is not None:
          self.text[self.link_start:] = [stand_in]
      self.link_start = None
    while self.stack:  # close what HTML left open inside it (a <p> without its </p>)
      t, drop = self.stack.pop()
      self.dropped -= drop
      if t in _BLOCKS or t in _HEADING_TAGS:
        if not self.dropped and self.kind and (t == "pre") == (self.kind == "verbatim"):
          self._flush()
      if t == tag:
        break

  def handle_data(self, data):
    if not self.dropped and self.kind:
      self.text.append(data)

  def close(self):
    super().close()
    self._flush()


def read_blocks(text: str, replace_link: Optional[Callable[[str], Optional[str]]] = None) -> list[Block]:
  """The manual's blocks in document order (module docstring). `replace_link(text)`, when given, may return a
  stand-in for a link's text (the R FAQ set: a cross-reference to a question becomes the FAQ's name, as
  pod_text's drop_section renders one as its page for the Perl FAQ)."""
  reader = _Reader(replace_link)
  reader.feed(text)
  reader.close()
  return reader.blocks
