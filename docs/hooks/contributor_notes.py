"""Keep contributors' notes out of the API reference.

A package's docstring may end with a note for those who change the code
(``Layer: the public API.  It may import runtime ...``, the rule that
``.importlinter`` enforces): useful in the source, noise to a reader of the
API.  mkdocstrings renders the whole docstring, so each such paragraph (one
that begins with ``Layer:``) is taken out of the rendered pages here.
"""

from __future__ import annotations

import re

#: the labels that begin a contributors' note
NOTE_LABELS = ("Layer:",)
_NOTE = re.compile(r"<p>(?:%s).*?</p>\s*" % "|".join(re.escape(label) for label in NOTE_LABELS), re.DOTALL)


def strip_notes(html: str) -> str:
    """``html`` without the paragraphs that are contributors' notes."""
    return _NOTE.sub("", html)


def on_page_content(html, page, **kwargs):
    return strip_notes(html)
