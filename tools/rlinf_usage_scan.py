"""Scan RLinf's application code for every scheduler item it uses; write the list the tests check.

RLinf's own programs (its workers, runners, hybrid engines, envs, utilities) are the largest body
of code written against the scheduler API.  This tool reads them statically (``ast``, nothing is
imported or run) and lists each scheduler item they use, with how often:

* ``module``: a module path imported (``rlinf.scheduler.manager.worker_manager``);
* ``name``: a name imported from a scheduler module (``rlinf.scheduler.cluster:Cluster``);
* ``attr``: an attribute of a scheduler class or module, ``Owner.attr``: ``Cluster.find_free_port``
  on an imported name, ``Worker.device_lock`` through ``self`` in a ``Worker`` subclass, and the
  methods of groups, group results, channels and clusters whose names only RLinf's classes define
  (``WorkerGroup.execute_on``, ``WorkerGroupFuncResult.consume_duration``, ...);
* ``kwarg``: a keyword argument of such a call, ``Owner.method(keyword)``.

An item is RLinf-public when no part of it starts with ``_``.  Usage::

    python tools/rlinf_usage_scan.py /path/to/rlinf-src "RLinf main (commit)"   # the folder holding rlinf/

writes ``tests/data/rlinf_scheduler_uses.json``, which ``tests/test_rlinf_usage_scan.py`` checks
against this project (each item must exist here).  The source used is a checkout of RLinf's main
branch (its ``rlinf/``, ``examples/`` and ``toolkits/``); RLinf 0.3.0's wheel (``pip download rlinf==0.3.0
--no-deps``, unpacked) works too and holds ``rlinf/`` only.
"""

from __future__ import annotations

import ast
import collections
import json
import sys
from pathlib import Path

#: the folders of an RLinf checkout that hold programs written against the scheduler (a wheel has only rlinf/)
APP_DIRS = ("rlinf", "examples", "toolkits")
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "rlinf_scheduler_uses.json"

#: RLinf scheduler classes whose method names, when only they define them, mark a use on any receiver
OWNER_FILES = {
    "WorkerGroup": ("worker/worker_group.py", "WorkerGroup"),
    "WorkerGroupFuncResult": ("worker/worker_group.py", "WorkerGroupFuncResult"),
    "Channel": ("channel/channel.py", "Channel"),
    "Cluster": ("cluster/cluster.py", "Cluster"),
}
#: names too common to attribute to a scheduler class when the receiver is unknown
GENERIC = {
    "get", "put", "wait", "done", "empty", "full", "qsize", "create", "connect", "launch", "num_nodes",
    "get_nowait", "put_nowait", "get_batch", "items", "keys", "values", "update", "close", "start", "stop",
    "shutdown", "name", "nodes", "allocate", "num_accelerators",
    "send", "recv", "broadcast", "send_tensor", "recv_tensor",  # torch.distributed has them too
}


def _class_surface(path: Path, cls_name: str) -> set[str]:
    """Methods, properties, class attributes and ``self.X =`` attributes of one class."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    for t in item.targets if isinstance(item, ast.Assign) else [item.target]:
                        if isinstance(t, ast.Name):
                            names.add(t.id)
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                    for t in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            names.add(t.attr)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


class _Scanner(ast.NodeVisitor):
    def __init__(self, worker_attrs, distinctive, worker_classes, counts, module_imports, worker_methods=()):
        self.worker_attrs = worker_attrs
        self.worker_methods = worker_methods
        self.distinctive = distinctive  # attr -> owner
        self.worker_classes = worker_classes
        self.counts = counts
        self.module_imports = module_imports
        self.bound: dict[str, str] = {}  # local name -> "module:Name" or "module"
        self.class_stack: list[str] = []
        self.own_stack: list[set] = []

    def add(self, kind, item):
        self.counts[(kind, item)] += 1

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.startswith("rlinf.scheduler"):
                self.add("module", alias.name)
                self.module_imports.append(alias.name)

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        if node.level == 0 and (mod == "rlinf.scheduler" or mod.startswith("rlinf.scheduler.")):
            self.add("module", mod)
            self.module_imports.append(mod)
            for alias in node.names:
                self.add("name", f"{mod}:{alias.name}")
                self.module_imports.append(f"{mod}:{alias.name}")
                self.bound[alias.asname or alias.name] = alias.name

    def visit_ClassDef(self, node):
        own = set()  # attributes the class sets itself (``self._lock = ...``): its own, not the scheduler's
        for sub in ast.walk(node):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, ast.AnnAssign) else []
            own.update(t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                       and t.value.id == "self")
        self.class_stack.append(node.name)
        self.own_stack.append(own)
        self.generic_visit(node)
        self.own_stack.pop()
        self.class_stack.pop()

    def _in_worker(self) -> bool:
        return bool(self.class_stack) and self.class_stack[-1] in self.worker_classes

    def _owner_of(self, value, attr):
        if isinstance(value, ast.Name) and value.id in self.bound:
            return self.bound[value.id]
        if isinstance(value, ast.Name) and value.id == "self" and self._in_worker() and attr in self.worker_attrs:
            return None if attr in self.own_stack[-1] else "Worker"
        if attr in self.distinctive:
            return self.distinctive[attr]
        if attr in self.worker_methods and not (isinstance(value, ast.Name) and value.id == "self"):
            return "Worker"  # a Worker method called on a group (``self.actor.start_profile(step)``)
        return None

    def visit_Attribute(self, node):
        owner = self._owner_of(node.value, node.attr)
        if owner is not None:
            self.add("attr", f"{owner}.{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        owner = None
        if isinstance(func, ast.Attribute):
            owner = self._owner_of(func.value, func.attr)
            if owner is None and func.attr == "launch" and isinstance(func.value, ast.Call) and \
                    isinstance(func.value.func, ast.Attribute) and func.value.func.attr == "create_group":
                owner = "WorkerGroup"
                self.add("attr", "WorkerGroup.launch")
            target = f"{owner}.{func.attr}" if owner else None
        elif isinstance(func, ast.Name) and func.id in self.bound:
            target = self.bound[func.id]
        else:
            target = None
        if target is not None:
            for kw in node.keywords:
                if kw.arg is not None:
                    self.add("kwarg", f"{target}({kw.arg})")
        self.generic_visit(node)


def _worker_classes(files: dict[Path, ast.Module]) -> set[str]:
    """Names of the application classes that subclass ``Worker``, directly or through each other."""
    bases: dict[str, set[str]] = {}
    for tree in files.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = set()
                for b in node.bases:
                    if isinstance(b, ast.Name):
                        names.add(b.id)
                    elif isinstance(b, ast.Attribute):
                        names.add(b.attr)
                    elif isinstance(b, ast.Subscript) and isinstance(b.value, ast.Name):
                        names.add(b.value.id)
                bases.setdefault(node.name, set()).update(names)
    found = {"Worker"}
    changed = True
    while changed:
        changed = False
        for name, bs in bases.items():
            if name not in found and bs & found:
                found.add(name)
                changed = True
    return found - {"Worker"}


def scan(src: Path, label: str) -> dict:
    """The scheduler items RLinf's application code under ``src/rlinf`` uses, and its modules' imports."""
    sched = src / "rlinf" / "scheduler"
    worker_attrs = _class_surface(sched / "worker" / "worker.py", "Worker")
    surfaces = {owner: _class_surface(sched / f, c) for owner, (f, c) in OWNER_FILES.items()}
    everywhere = collections.Counter(n for s in surfaces.values() for n in s)
    distinctive = {n: owner for owner, s in surfaces.items() for n in s
                   if everywhere[n] == 1 and n not in GENERIC and not n.startswith("_") and n not in worker_attrs}
    files = {}
    roots = [src / d for d in APP_DIRS if (src / d).is_dir()]
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        if sched in path.parents:
            continue
        try:
            files[path] = ast.parse(path.read_text())
        except SyntaxError:
            continue
    workers = _worker_classes(files)
    # Worker methods only RLinf's Worker defines (no application class defines one of that name)
    app_defined = {n.name for tree in files.values() for n in ast.walk(tree)
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    worker_methods = {n for n in worker_attrs if not n.startswith("_") and n not in GENERIC and n not in app_defined
                      and n not in everywhere}
    counts: collections.Counter = collections.Counter()
    modules = {}
    for path, tree in files.items():
        imports: list[str] = []
        _Scanner(worker_attrs, distinctive, workers, counts, imports, worker_methods).visit(tree)
        if imports:
            modules[str(path.relative_to(src))] = sorted(set(imports))
    items = [
        {"kind": kind, "item": item, "uses": n,
         "public": not any(part.startswith("_") for part in item.replace(":", ".").replace("(", ".").rstrip(")").split("."))}
        for (kind, item), n in sorted(counts.items())
    ]
    return {"source": f"{label}: application code ({', '.join(APP_DIRS)}) outside rlinf/scheduler",
            "files_scanned": len(files), "items": items, "module_imports": modules}


def main(argv: list[str]) -> int:
    src = Path(argv[1] if len(argv) > 1 else "/tmp/rlinf-ref/src")
    result = scan(src, argv[2] if len(argv) > 2 else f"RLinf source at {src.name}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    uses = sum(i["uses"] for i in result["items"])
    print(f"{len(result['items'])} items, {uses} uses, {len(result['module_imports'])} modules importing the "
          f"scheduler, from {result['files_scanned']} files -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
