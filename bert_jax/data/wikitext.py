"""Reading MediaWiki XML dumps (`enwiki-*-pages-articles*.xml[.bz2]`) as plain-text articles.

Only main-namespace (ns 0) pages that are not redirects are kept. The markup is reduced to prose
with a small set of rules (templates, tables, references, files/categories, HTML tags and
comments are dropped; `[[target|label]]` keeps the label; `'''bold'''`/`''italic''` keep the
text; headings and lists end a paragraph and are dropped). This is the common "wikiextractor
lite" treatment; it loses some text in odd markup but never emits markup as words.
"""

import bz2
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator

_COMMENT_RE = re.compile(r"<!--.*?-->", re.S)
_REF_RE = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S | re.I)
_BLOCK_TAG_RE = re.compile(
  r"<(math|gallery|timeline|syntaxhighlight|source|pre|code|score|imagemap|table)[^>]*>.*?</\1>",
  re.S | re.I,
)
_TAG_RE = re.compile(r"</?[a-zA-Z][^>]*>")
_EXTERNAL_LINK_RE = re.compile(r"\[(?:https?|ftp)://[^\s\]]+\s*([^\]]*)\]")
_BOLD_ITALIC_RE = re.compile(r"'{2,}")
_FILE_PREFIXES = ("file:", "image:", "category:", "media:")


def _strip_nested(text: str, open_tok: str, close_tok: str) -> str:
  """Removes balanced `open_tok ... close_tok` spans (templates, tables), nesting aware."""
  out = []
  depth = 0
  kept_from = 0
  for match in re.finditer(f"{re.escape(open_tok)}|{re.escape(close_tok)}", text):
    if match.group() == open_tok:
      if not depth:
        out.append(text[kept_from : match.start()])
      depth += 1
    elif depth:
      depth -= 1
      if not depth:
        kept_from = match.end()
  if not depth:
    out.append(text[kept_from:])
  return "".join(out)


def _replace_links(text: str) -> str:
  """`[[a|b]]` -> b, `[[a]]` -> a, `[[File:...]]`/`[[Category:...]]` -> '' (nesting aware)."""
  out = []
  i = 0
  while True:
    start = text.find("[[", i)
    if start < 0:
      out.append(text[i:])
      break
    out.append(text[i:start])
    depth, j = 0, start
    while j < len(text):
      if text.startswith("[[", j):
        depth += 1
        j += 2
      elif text.startswith("]]", j):
        depth -= 1
        j += 2
        if not depth:
          break
      else:
        j += 1
    inner = text[start + 2 : j - 2]
    if not inner.lower().lstrip(":").startswith(_FILE_PREFIXES):
      out.append(_replace_links(inner.split("|")[-1]) if "[[" in inner else inner.split("|")[-1])
    i = j
  return "".join(out)


def wikitext_to_paragraphs(wikitext: str) -> list[str]:
  """Reduces one article's wikitext to a list of prose paragraphs."""
  text = _COMMENT_RE.sub("", wikitext)
  text = _REF_RE.sub("", text)
  text = _BLOCK_TAG_RE.sub("", text)
  text = _strip_nested(text, "{{", "}}")
  text = _strip_nested(text, "{|", "|}")
  text = _replace_links(text)
  text = _EXTERNAL_LINK_RE.sub(r"\1", text)
  text = _TAG_RE.sub("", text)
  text = _BOLD_ITALIC_RE.sub("", text)
  text = text.replace("&nbsp;", " ").replace("&ndash;", "-").replace("&mdash;", "-")
  paragraphs, current = [], []
  for line in text.split("\n"):
    stripped = line.strip()
    if not stripped or stripped[0] in "=*#:;|!" or stripped.startswith("__"):
      if current:
        paragraphs.append(" ".join(current))
        current = []
      continue
    current.append(stripped)
  if current:
    paragraphs.append(" ".join(current))
  # Very short leftovers ("See also", stray fragments) are not prose.
  return [p for p in paragraphs if len(p.split()) >= 4]


def _local(tag: str) -> str:
  return tag.rsplit("}", 1)[-1]


def iter_wiki_articles(path: str) -> Iterator[tuple[str, str]]:
  """Yields (title, wikitext) of the main-namespace, non-redirect pages of a dump file.

  Streams the XML (bz2-compressed when the name ends in .bz2), so memory stays bounded by one page.
  """
  opener = bz2.open if path.endswith(".bz2") else open
  with opener(path, "rb") as f:
    title, ns, redirect, text, root = None, None, False, None, None
    try:
      for event, elem in ET.iterparse(f, events=("start", "end")):
        if event == "start":
          if root is None:
            root = elem
          continue
        tag = _local(elem.tag)
        if tag == "title":
          title = elem.text or ""
        elif tag == "ns":
          ns = (elem.text or "").strip()
        elif tag == "redirect":
          redirect = True
        elif tag == "text":
          text = elem.text or ""
        elif tag == "page":
          if (
            ns == "0"
            and not redirect
            and text
            and not text.lstrip().upper().startswith("#REDIRECT")
          ):
            yield title, text
          title, ns, redirect, text = None, None, False, None
          root.clear()  # Drop finished pages: memory stays at one page however long the dump.
    except (ET.ParseError, EOFError, OSError) as e:
      raise ValueError(f"{path}: not a readable MediaWiki XML dump ({e})") from e
