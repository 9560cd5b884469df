"""mkdocs hook: nav entries for guides that may not exist yet.

mkdocs warns about a nav entry whose file is missing, and the site is built
with ``--strict``.  Pages named in ``OPTIONAL`` are dropped from the nav while
their file is absent (saying so at INFO level) and appear once it is added,
without touching ``mkdocs.yml``.  Every other nav entry is checked as usual.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("mkdocs.hooks.optional_pages")

OPTIONAL = frozenset({"tracing.md", "observability.md"})


def _prune(items, docs_dir: str) -> list:
    kept = []
    for item in items:
        if isinstance(item, dict):
            title, value = next(iter(item.items()))
            if isinstance(value, list):
                item = {title: _prune(value, docs_dir)}
            elif isinstance(value, str) and value in OPTIONAL and not os.path.isfile(os.path.join(docs_dir, value)):
                log.info("optional page %s is not there: left out of the nav", value)
                continue
        elif isinstance(item, str) and item in OPTIONAL and not os.path.isfile(os.path.join(docs_dir, item)):
            log.info("optional page %s is not there: left out of the nav", item)
            continue
        kept.append(item)
    return kept


def on_config(config):
    if config.nav:
        config.nav = _prune(config.nav, config.docs_dir)
    return config
