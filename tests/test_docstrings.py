"""The API reference is complete: every public name has a docstring that documents it.

Walks ``rlinf.scheduler.__all__``, ``rlinf.scheduler.plugins.__all__`` and
``rlinf.testing.__all__``; for each class also its public methods and
properties defined in rlinf's code (along its MRO; what comes from the
standard library or a third-party base is not ours to document).  Each must
have a docstring, and the docstring of a callable that takes arguments
(besides ``self``/``cls``) must be more than one line and name every
argument (in an ``Args:`` section, or for a pytest test in the conformance
suites, the fixtures it uses in its text).  A class is documented together
with its ``__init__`` (the reference merges the two), so its constructor's
arguments may be described in either.

A public method bound by assignment in a class body (``timer =
staticmethod(timing.timer)``) shows in the reference as an attribute: it
needs the attribute docstring, the string literal on the line after it.

There are no exemptions.  The rule (``problem``) and the modules walked come
from ``docs/hooks/api_docstrings.py``, the mkdocs hook that fails ``hatch run
docs`` on the same names, read there statically with griffe.

Imports the packages and reads sources only: no cluster, well under a second.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pathlib
import textwrap

_HOOK = pathlib.Path(__file__).resolve().parents[1] / "docs" / "hooks" / "api_docstrings.py"
_spec = importlib.util.spec_from_file_location("_api_docstrings_hook", _HOOK)
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)

MODULES = hook.MODULES
_problem = hook.problem


def _ours(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == "rlinf"


def _params(fn) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [name for name in sig.parameters if name not in ("self", "cls")]


def _init_owner(cls):
    """The class of ``cls``'s MRO whose ``__init__`` a call of ``cls`` runs."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return klass
    return object


def _assigned_attribute_docs(klass) -> dict[str, str | None]:
    """Names bound by assignment in ``klass``'s body, each with its attribute docstring (or None)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body
    found = {}
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        else:
            targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        nxt = body[i + 1] if i + 1 < len(body) else None
        doc = (
            nxt.value.value
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)
            else None
        )
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = doc
    return found


def _targets():
    """``(qualified name, docstring, parameter names)`` for every public object the reference documents."""
    seen = set()
    for modname in MODULES:
        module = importlib.import_module(modname)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen or not _ours(obj):  # pluggy's hookspec/hookimpl markers are pluggy's
                continue
            seen.add(id(obj))
            qualname = f"{obj.__module__}.{getattr(obj, '__qualname__', name)}"
            if not inspect.isclass(obj):
                yield qualname, obj.__doc__, _params(obj)
                continue
            owner = _init_owner(obj)
            if _ours(owner):
                docs = [obj.__doc__ or "", owner.__init__.__doc__ or ""]
                yield qualname, "\n".join(docs).strip() or None, _params(owner.__init__)
            else:
                yield qualname, obj.__doc__, []
            for klass in obj.__mro__:
                if not _ours(klass) or klass in seen:
                    continue
                seen.add(klass)
                assigned = _assigned_attribute_docs(klass)
                for attr, value in vars(klass).items():
                    if attr.startswith("_"):
                        continue
                    where = f"{klass.__module__}.{klass.__qualname__}.{attr}"
                    if isinstance(value, property):
                        yield where, value.__doc__, []
                        continue
                    fn = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
                    if not inspect.isfunction(fn):
                        continue
                    if attr in assigned:  # bound by assignment: the reference shows the attribute docstring
                        yield where, assigned[attr], _params(fn)
                    else:
                        yield where, fn.__doc__, _params(fn)


def test_the_walk_sees_the_api():
    names = {name for name, _, _ in _targets()}
    assert len(names) > 150
    for expected in (
        "rlinf.scheduler.worker.worker.Worker.log_info",
        "rlinf.scheduler.worker.worker.Worker.timer",
        "rlinf.scheduler.runtime.group.WorkerGroup.launch",
        "rlinf.scheduler.channel.channel.Channel.put",
        "rlinf.scheduler.plugins.manager.PluginRegistry.transport",
        "rlinf.testing.transport.TransportConformance.test_recv_deadline",
    ):
        assert expected in names, expected


def test_the_rules_catch_what_they_should():
    assert _problem(None, []) == "no docstring"
    assert _problem("Do it.", ["x"]).startswith("a one-line docstring")
    assert _problem("Do it.\n\nArgs:\n    y: why.", ["x", "y"]) == "arguments not described: ['x']"
    assert _problem("Do it with ``x``.\n\nArgs:\n    x: how.", ["x"]) is None
    assert _problem("A property.", []) is None


def test_every_public_name_is_documented():
    problems = {
        name: problem
        for name, doc, params in _targets()
        if (problem := _problem(doc, params))
    }
    assert not problems, "public names documented too little for the API reference:\n" + "\n".join(
        f"  {name}: {problem}" for name, problem in sorted(problems.items())
    )
