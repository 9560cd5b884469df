"""mkdocs hook: ``docs/NAME.md`` named in a page links to that page.

README.md (the home page), the guides and the docstrings name the guides as
code (`docs/security.md`), which reads right on GitHub, in a terminal and in
``help()``.  On the site each such name becomes a link to the page, so none
of them needs site-specific syntax.  Names of files that are not pages of
the site, and code blocks, are left alone.
"""

from __future__ import annotations

import re

# a whole inline code span; a code block's <code> holds more than one name
_NAME = re.compile(r"<code>docs/([A-Za-z0-9_./-]+\.md)</code>")


def link(html: str, url_of) -> str:
    """``html`` with each ``<code>docs/NAME.md</code>`` wrapped in a link to ``url_of(NAME)`` (None: left alone)."""

    def one(match):
        url = url_of(match.group(1))
        return match.group(0) if url is None else f'<a href="{url}">{match.group(0)}</a>'

    return _NAME.sub(one, html)


def on_page_content(html, page, config, files):
    def url_of(name):
        target = files.get_file_from_path(name)
        if target is None or not target.is_documentation_page():
            return None
        return target.url_relative_to(page.file)

    return link(html, url_of)
