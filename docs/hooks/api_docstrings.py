"""mkdocs hook: the build fails on a public name the API reference would show undocumented.

mkdocstrings shows every public name, docstring or not (``show_if_no_docstring``),
so a missing docstring would otherwise pass the strict build as an empty entry.
This hook walks what ``tests/test_docstrings.py`` walks, read statically with
griffe as mkdocstrings reads it (nothing is imported, so the docs environment
needs neither Ray nor torch): the names in ``__all__`` of ``MODULES``, and of
each class the public methods, properties and methods bound by assignment
(``timer = staticmethod(timing.timer)``, a dataclass field defaulting to a
function) defined in rlinf's classes along its bases.  Each is held to
``problem``, the rule the test applies too: a docstring, and for a callable
with arguments more than one line naming every argument.  Each name that
fails is a warning, which the strict build turns into a failure.
"""

from __future__ import annotations

import ast
import logging
import re

log = logging.getLogger("mkdocs.hooks.api_docstrings")

MODULES = ("rlinf.scheduler", "rlinf.scheduler.plugins", "rlinf.testing")


def problem(doc: str | None, params: list[str]) -> str | None:
    """What is missing from ``doc`` for a public name whose callable takes ``params``; None when nothing is.

    Args:
        doc: the docstring (of a class, its class and ``__init__`` docstrings together), or None.
        params: the callable's argument names besides ``self``/``cls`` (``[]`` for a property).
    """
    if not doc or not doc.strip():
        return "no docstring"
    if not params:
        return None
    if len(doc.strip().splitlines()) < 2:
        return f"a one-line docstring for a callable with arguments {params}"
    unnamed = [p for p in params if not re.search(rf"(?<![A-Za-z0-9_]){re.escape(p)}(?![A-Za-z0-9_])", doc)]
    if unnamed:
        return f"arguments not described: {unnamed}"
    return None


def _ours(obj) -> bool:
    return obj.path.split(".")[0] == "rlinf"


def _doc(obj) -> str:
    return obj.docstring.value if obj.docstring else ""


def _params(fn) -> list[str]:
    return [p.name for p in fn.parameters if p.name not in ("self", "cls")]


def _lookup(collection, expr):
    """The griffe object a name or dotted name in an expression refers to (aliases followed); None if not loaded."""
    try:
        obj = collection[expr.canonical_path]
        return obj.final_target if obj.is_alias else obj
    except Exception:  # outside the loaded packages, or not resolvable statically
        return None


def _bound_function(collection, attribute):
    """The function an attribute is bound to (``name = func``, ``staticmethod(func)``), else None."""
    import griffe

    value = attribute.value
    if isinstance(value, griffe.ExprCall) and str(value.function) in ("staticmethod", "classmethod"):
        value = value.arguments[0] if len(value.arguments) == 1 else None
    if not isinstance(value, (griffe.ExprName, griffe.ExprAttribute)):
        return None
    target = _lookup(collection, value)
    return target if target is not None and target.is_function else None


def _all_names(module) -> list[str]:
    """The module's ``__all__``: as griffe reads it, else its assignment evaluated over the module's literals.

    griffe leaves ``__all__`` empty when it is computed (``sorted(set(NAMES) | {...})``); the
    expression is then evaluated with only ``sorted``, ``set``, ``list``, ``tuple`` and the module-level
    names bound to literals, so reading the source runs none of it.
    """
    if module.exports:
        return [str(name) for name in module.exports]
    tree = ast.parse(module.filepath.read_text(encoding="utf-8"))
    scope: dict = {"sorted": sorted, "set": set, "list": list, "tuple": tuple}
    expression = None
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name = stmt.targets[0].id
        if name == "__all__":
            expression = stmt.value
            continue
        try:
            scope[name] = ast.literal_eval(stmt.value)
        except ValueError:
            pass
    if expression is None:
        return []
    return list(eval(compile(ast.Expression(expression), str(module.filepath), "eval"), {"__builtins__": {}}, scope))


def _is_fixture(function) -> bool:
    """A pytest fixture (``@pytest.fixture``): pytest's object, which neither the test nor the reference lists."""
    return any("fixture" in str(d.value) for d in function.decorators)


def _bases(klass) -> list:
    """``klass`` and the rlinf classes it derives from, each once (bases griffe cannot resolve are not ours)."""
    out, todo = [], [klass]
    while todo:
        k = todo.pop(0)
        if k in out or not _ours(k):
            continue
        out.append(k)
        try:
            todo.extend(k.resolved_bases)
        except Exception:
            pass
    return out


def _class_targets(collection, cls, walked: set):
    init = cls.all_members.get("__init__")
    init = init.final_target if init is not None and init.is_alias else init
    if init is not None and _ours(init):
        yield cls.path, "\n".join([_doc(cls), _doc(init)]).strip() or None, _params(init)
    else:
        yield cls.path, _doc(cls) or None, []
    for klass in _bases(cls):
        if klass.path in walked:
            continue
        walked.add(klass.path)
        for name, member in klass.members.items():
            if name.startswith("_") or member.is_alias:
                continue
            where = f"{klass.path}.{name}"
            if "property" in member.labels:
                yield where, _doc(member) or None, []
            elif member.is_function and not _is_fixture(member):
                yield where, _doc(member) or None, _params(member)
            elif member.is_attribute:
                fn = _bound_function(collection, member)
                if fn is not None:  # the reference shows the attribute: its own docstring counts
                    yield where, _doc(member) or None, _params(fn)


def targets(search_paths: list[str]):
    """``(path, docstring, argument names)`` of every public name of ``MODULES`` the reference documents.

    Args:
        search_paths: the folders the packages are read from (mkdocstrings' ``paths``).
    """
    import griffe

    loader = griffe.GriffeLoader(search_paths=search_paths)
    for name in MODULES:
        loader.load(name)
    loader.resolve_aliases(implicit=False, external=False)
    collection = loader.modules_collection
    seen: set = set()  # exported names, each once however many modules export it
    walked: set = set()  # classes whose members were walked
    for modname in MODULES:
        module = collection[modname]
        for export in _all_names(module):
            try:
                obj = module[str(export)]
                obj = obj.final_target if obj.is_alias else obj
            except Exception:  # re-exported from outside rlinf (pluggy's markers)
                continue
            if not _ours(obj) or obj.path in seen:
                continue
            seen.add(obj.path)
            if obj.is_function:
                yield obj.path, _doc(obj) or None, _params(obj)
            elif obj.is_class:
                yield from _class_targets(collection, obj, walked)


def _search_paths(config) -> list[str]:
    handler = config.plugins["mkdocstrings"].config["handlers"]["python"]
    return list(handler.get("paths", ["."]))


def on_pre_build(config):
    found = 0
    for path, doc, params in targets(_search_paths(config)):
        found += 1
        what = problem(doc, params)
        if what:
            log.warning("API reference: %s: %s (tests/test_docstrings.py has the rule)", path, what)
    log.info("checked the docstrings of %d public names", found)
