"""mkdocs hook: a single colon before the literal blocks of docstrings.

The docstrings introduce an example with reStructuredText's ``::`` ("in this
group::" followed by an indented block), which reads well in ``help()`` and
in the source.  Markdown renders the indented block as code but keeps both
colons; this hook keeps one (and drops a paragraph that is only ``::``), so
the docstrings need no rewriting for the site.
"""

from __future__ import annotations

import re

_BEFORE_CODE = r'(?=</p>\s*<div class="(?:[^"]* )?highlight")'
_ALONE = re.compile(r"<p>::</p>" + _BEFORE_CODE.replace("</p>", ""))
_TRAILING = re.compile(r"::" + _BEFORE_CODE)


def fix(html: str) -> str:
    """``html`` with each ``::`` that ends a paragraph before a code block made ``:``."""
    return _TRAILING.sub(":", _ALONE.sub("", html))


def on_page_content(html, page, config, files):
    return fix(html)
