"""Every scheduler item RLinf's own application code uses exists here.

``tests/data/rlinf_scheduler_uses.json`` lists the scheduler items (module paths, imported names,
attributes and keyword arguments) that RLinf's workers, runners, engines, envs and utilities use,
with how often; ``tools/rlinf_usage_scan.py`` extracts it statically from RLinf's source (see its
docstring).  Here each item is looked up in this project: a module path imports, a name is an
attribute of its module, ``Owner.attr`` an attribute of the class (or of a worker built outside a
group, for the attributes a worker sets on itself), ``Owner.method(kw)`` a call taking ``kw``.
"""

import importlib
import inspect
import json
from pathlib import Path

import pytest

import rlinf.scheduler as scheduler

DATA = json.loads((Path(__file__).parent / "data" / "rlinf_scheduler_uses.json").read_text())

#: owners the scan names that ``rlinf.scheduler`` does not export under that name
OWNER_PATHS = {}


def _owner(name: str):
    if hasattr(scheduler, name):
        return getattr(scheduler, name)
    for item in DATA["items"]:  # a name the application imported from another scheduler module
        if item["kind"] == "name" and item["item"].endswith(f":{name}"):
            module, _, attr = item["item"].partition(":")
            return getattr(importlib.import_module(module), attr)
    raise LookupError(name)


_worker = None


def _local_worker():
    global _worker
    if _worker is None:
        _worker = scheduler.Worker()  # a worker built outside a group: a group of one
    return _worker


def _accepts(fn, keyword: str) -> bool:
    if isinstance(fn, type):
        fn = fn.__init__
    params = inspect.signature(fn).parameters
    return keyword in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def provided(kind: str, item: str) -> bool:
    """Whether the scheduler item exists here."""
    try:
        if kind == "module":
            importlib.import_module(item)
            return True
        if kind == "name":
            module, _, name = item.partition(":")
            return hasattr(importlib.import_module(module), name)
        if kind == "attr":
            owner, _, attr = item.partition(".")
            cls = _owner(owner)
            if hasattr(cls, attr):
                return True
            return cls is scheduler.Worker and hasattr(_local_worker(), attr)
        if kind == "kwarg":
            target, _, rest = item.partition("(")
            keyword = rest.rstrip(")")
            owner, _, method = target.partition(".")
            fn = _owner(owner)
            if method:
                fn = getattr(fn, method)
            return _accepts(fn, keyword)
    except (ImportError, LookupError, AttributeError, ValueError, TypeError):
        return False
    raise AssertionError(f"unknown kind {kind!r}")


def _shares():
    uses = provided_uses = public = provided_public = 0
    missing = []
    for entry in DATA["items"]:
        ok = provided(entry["kind"], entry["item"])
        uses += entry["uses"]
        provided_uses += entry["uses"] if ok else 0
        if entry["public"]:
            public += entry["uses"]
            provided_public += entry["uses"] if ok else 0
        if not ok:
            missing.append((entry["item"], entry["uses"]))
    return provided_uses / uses, provided_public / public, missing


def test_the_scan_covers_rlinf_application_code():
    kinds = {e["kind"] for e in DATA["items"]}
    assert kinds == {"module", "name", "attr", "kwarg"}
    assert DATA["files_scanned"] > 500 and len(DATA["module_imports"]) > 80
    assert sum(e["uses"] for e in DATA["items"]) > 1000


def test_at_least_98_percent_of_the_uses_of_rlinf_public_items_are_provided():
    all_share, public_share, missing = _shares()
    print(f"\nprovided: {all_share:.1%} of all uses, {public_share:.1%} of the uses of RLinf-public items; "
          f"missing: {missing}")
    assert public_share >= 0.98, missing


@pytest.mark.parametrize("module", sorted(DATA["module_imports"]))
def test_no_application_module_lacks_a_scheduler_import(module):
    missing = [path for path in DATA["module_imports"][module]
               if not provided("name" if ":" in path else "module", path)]
    assert not missing, f"{module} imports scheduler paths that do not exist here: {missing}"
