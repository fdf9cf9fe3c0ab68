"""The marked sections of docs/benchmarks.md.

A section that `scripts/bench --only NAME` refreshes on its own sits in the
page between two lines, `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`.
Rewriting it changes nothing outside those two lines. "What is left"
(`bench:left`) is written by hand; every run keeps it, and it stays last.
"""

import os
import re
import sys

PAGE = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                                    "benchmarks.md"))
LEFT = "left"


def block(name, body):
    """`body` between NAME's markers, ending in a newline."""
    return "<!-- bench:%s -->\n%s\n\n<!-- /bench:%s -->\n" % (name, body.strip("\n"), name)


def _find(text, name):
    n = re.escape(name)
    return re.search(r"^<!-- bench:%s -->\n(.*?)^<!-- /bench:%s -->(\n|$)" % (n, n), text, re.M | re.S)


def section(text, name):
    """The body between NAME's markers in `text` (no surrounding blank
    lines), or None when the markers are not there."""
    m = _find(text, name)
    return m.group(1).strip("\n") if m else None


def replace_section(path, name, body):
    """Puts `body` between NAME's markers in the page at `path`, leaving
    every byte outside them as it was. Without the markers, the section is
    added with them before "What is left" (at the end if there is none),
    and stderr says so."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    new = block(name, body)
    m = _find(text, name)
    if m:
        text = text[:m.start()] + new + text[m.end():]
    else:
        left = _find(text, LEFT) or re.search(r"^## What is left$", text, re.M)
        if left and name != LEFT:
            at, where = left.start(), 'before "What is left"'
            text = text[:at] + new + "\n" + text[at:]
        else:
            where = "at the end"
            text = text.rstrip("\n") + "\n\n" + new if text.strip() else new
        print("%s had no <!-- bench:%s --> markers: added the section %s" % (path, name, where),
              file=sys.stderr, flush=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
