"""Write ``docs/layers.md``: the layers of ``rlinf.scheduler`` as the code has them.

Run ``hatch run python docs/layers.py`` after moving a module or changing
imports between layers; ``tests/test_architecture_doc.py`` fails while the
committed ``docs/layers.md`` differs from what this prints.  The layer list
comes from the ``[importlinter:contract:layers]`` section of ``.importlinter``
(the rules ``hatch run layers`` checks); the imports from ``grimp``, the
graph library import-linter uses, counted the way the contract counts them:
imports inside functions included, ``if TYPE_CHECKING:`` imports left out.
Nothing of rlinf is imported: grimp reads the sources.

``docs/architecture.md`` includes the result (``--8<-- "docs/layers.md"``).
The output is sorted throughout, so that one tree always gives the same text.
"""

from __future__ import annotations

import configparser
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "layers.md"
CONTAINER = "rlinf.scheduler"
BACKENDS = ("rlinf.ray", "rlinf.mpi", "rlinf.nccl")
SOURCES = sorted(ROOT.glob("packages/*/src"))
#: a diagram node's module list is wrapped after this many characters a line
WRAP = 44
#: a diagram node names this many modules of one family (``cpu_*``) or more by the family alone
FAMILY = 3
#: line counts are rounded to this, so that small edits do not call for a new file
ROUND_LINES = 100


@dataclass
class Layer:
    """One line of the contract's ``layers``: its components (``a | b``: independent siblings)."""

    name: str
    components: list[str]
    independent: bool
    modules: list[str] = field(default_factory=list)  # every module of the layer, full names, sorted

    @property
    def node(self) -> str:
        return "L_" + re.sub(r"[^A-Za-z0-9]+", "_", self.name).strip("_")


def read_layers(config_path: Path = ROOT / ".importlinter") -> list[Layer]:
    """The contract's layers, top first, as ``.importlinter`` lists them."""
    parser = configparser.ConfigParser()
    parser.read(config_path, encoding="utf-8")
    section = parser["importlinter:contract:layers"]
    containers = section["containers"].split()
    if containers != [CONTAINER]:
        raise SystemExit(f"the layers contract covers {containers}; this script draws {CONTAINER} only")
    layers = []
    for line in section["layers"].splitlines():
        line = line.strip()
        if not line:
            continue
        independent = ":" not in line
        parts = [p.strip().strip("()") for p in re.split(r"[|:]", line)]
        layers.append(Layer(line, parts, independent))
    return layers


def build_graph() -> grimp.ImportGraph:
    return grimp.build_graph(CONTAINER, *BACKENDS, exclude_type_checking_imports=True, cache_dir=None)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def module_file(module: str) -> Path:
    """The source file of ``module`` under ``packages/*/src``."""
    rel = Path(*module.split("."))
    for src in SOURCES:
        for candidate in (src / rel / "__init__.py", src / rel.with_suffix(".py")):
            if candidate.is_file():
                return candidate
    raise SystemExit(f"no source file for {module} under packages/*/src")


def line_count(modules) -> int:
    return sum(len(module_file(m).read_text(encoding="utf-8").splitlines()) for m in modules)


def rounded(lines: int) -> str:
    return f"{max(ROUND_LINES, round(lines / ROUND_LINES) * ROUND_LINES):,}"


def groups(package: str, modules) -> list[tuple[str, list[str]]]:
    """``modules`` below ``package`` for a reader, as ``(subpackage or "", names)`` groups.

    A ``package`` that is a plain module is ``("", ["name.py"])``; a
    subpackage's modules are named relative to it."""
    if modules == [package] and module_file(package).name != "__init__.py":
        return [("", [package.rsplit(".", 1)[1] + ".py"])]
    direct, nested = [], {}
    for m in modules:
        rel = m[len(package) + 1:]
        if not rel:
            continue  # the package's own __init__
        head, _, rest = rel.partition(".")
        if rest:
            nested.setdefault(head, []).append(rest)
        elif module_file(m).name == "__init__.py":
            nested.setdefault(head, [])
        else:
            direct.append(head)
    found = [("", sorted(direct))] if direct else []
    return found + [(sub, sorted(rest)) for sub, rest in sorted(nested.items())]


def layer_groups(layer: Layer) -> list[tuple[str, list[str]]]:
    found = []
    for component in layer.components:
        package = f"{CONTAINER}.{component}"
        found += groups(package, [m for m in layer.modules if _within(m, package)])
    merged: dict[str, list[str]] = {}
    for sub, names in found:
        merged.setdefault(sub, []).extend(names)
    return list(merged.items())


def brief(names: list[str]) -> list[str]:
    """``names`` with every family of at least ``FAMILY`` (``cpu_link``, ``cpu_wire``, ...) as ``cpu_* (n)``."""
    families: dict[str, list[str]] = {}
    for name in names:
        if "_" in name.strip("_"):
            families.setdefault(name.split("_", 1)[0], []).append(name)
    out, shown = [], set()
    for name in names:
        family = name.split("_", 1)[0] if "_" in name.strip("_") else None
        if family is None or len(families[family]) < FAMILY:
            out.append(name)
        elif family not in shown:
            shown.add(family)
            out.append(f"{family}_* ({len(families[family])})")
    return out


def node_lines(layer_groups_: list[tuple[str, list[str]]]) -> list[str]:
    """A node's module list, brief and wrapped, one block per subpackage (``p2p: api, ...``)."""
    lines = []
    for sub, names in layer_groups_:
        names = brief(names)
        if sub:
            names = [f"{sub}: {names[0]}", *names[1:]] if names else [f"{sub}:"]
        lines += wrapped(names)
    return lines


def table_names(layer_groups_: list[tuple[str, list[str]]]) -> str:
    """A table cell's module list: names relative to the layer (``p2p.api``)."""
    return ", ".join(f"`{sub + '.' if sub else ''}{name}`" for sub, names in layer_groups_ for name in names)


def md_name(layer: Layer) -> str:
    """The layer's name in a table cell (a pipe there would end the cell)."""
    joint = " \\| " if layer.independent else " : "
    return joint.join(f"`{c}`" for c in layer.components)


def wrapped(items: list[str]) -> list[str]:
    lines, current = [], ""
    for item in items:
        candidate = f"{current}, {item}" if current else item
        if current and len(candidate) > WRAP:
            lines.append(current + ",")
            current = item
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines


def import_pairs(graph, importers, imported) -> int:
    """How many (importing module, imported module) pairs lead from ``importers`` into ``imported``."""
    targets = set(imported)
    return sum(len(graph.find_modules_directly_imported_by(m) & targets) for m in importers)


def render(graph=None, layers=None) -> str:
    graph = graph if graph is not None else build_graph()
    layers = layers if layers is not None else read_layers()
    core = sorted(m for m in graph.modules if _within(m, CONTAINER))
    for layer in layers:
        packages = [f"{CONTAINER}.{c}" for c in layer.components]
        layer.modules = [m for m in core if any(_within(m, p) for p in packages)]
    placed = {m for layer in layers for m in layer.modules}
    outside = [m for m in core if m not in placed]
    backends = {b: sorted(m for m in graph.modules if _within(m, b)) for b in BACKENDS}

    out = [
        "<!-- Generated by docs/layers.py from the import graph (grimp) and .importlinter: do not edit.",
        "     Run `hatch run python docs/layers.py` after moving modules or changing imports between layers. -->",
        "",
        "```mermaid",
        # closer than mermaid's defaults: the edges that skip layers make the diagram wide enough
        '%%{init: {"flowchart": {"nodeSpacing": 12, "rankSpacing": 36}}}%%',
        "flowchart TB",
    ]
    for name, modules in backends.items():
        rel = [m[len(name) + 1:] for m in modules if m != name]
        label = "<br/>".join([f"<b>{name}</b>", *wrapped(sorted(rel))])
        out.append(f'    B_{name.rsplit(".", 1)[1]}["{label}"]:::backend')
    for layer in layers:
        label = "<br/>".join([f"<b>{layer.name}</b>", *node_lines(layer_groups(layer))])
        out.append(f'    {layer.node}["{label}"]')
    for i, upper in enumerate(layers):
        for j, lower in enumerate(layers):
            if i == j:
                continue
            count = import_pairs(graph, upper.modules, lower.modules)
            if count:
                mark = "" if i < j else " upward!"
                out.append(f"    {upper.node} -->|{count}{mark}| {lower.node}")
    for name, modules in backends.items():
        for layer in layers:
            count = import_pairs(graph, modules, layer.modules)
            if count:
                out.append(f'    B_{name.rsplit(".", 1)[1]} -.->|{count}| {layer.node}')
    out += [
        "    classDef backend stroke-dasharray: 5 5",
        "```",
        "",
        "An arrow from A to B: modules of A import modules of B; its number counts the (importing module,",
        "imported module) pairs, imports inside functions included, `if TYPE_CHECKING:` imports left out.",
        "Dashed: the backends, which reach core only from above.",
        "",
        "| layer | modules | lines | may import |",
        "|---|---|---|---|",
    ]
    for i, layer in enumerate(layers):
        below = [md_name(lower) for lower in layers[i + 1:]]
        may = ", ".join(below) if below else "nothing of `rlinf.scheduler` outside itself"
        if len(layer.components) > 1:
            may += " (not each other)" if layer.independent else " (and each other)"
        out.append(f"| {md_name(layer)} | {table_names(layer_groups(layer))} | "
                   f"{rounded(line_count(layer.modules))} | {may} |")
    out += [
        "",
        "| backend | modules | lines | imports from core |",
        "|---|---|---|---|",
    ]
    for name, modules in backends.items():
        used = [md_name(layer) for layer in layers if import_pairs(graph, modules, layer.modules)]
        rel = ", ".join(f"`{m[len(name) + 1:]}`" for m in modules if m != name)
        out.append(f"| `{name}` | {rel} | {rounded(line_count(modules))} | {', '.join(used) or 'nothing'} |")
    out.append("")
    for module in outside:
        imported = graph.find_modules_directly_imported_by(module)
        used = [md_name(layer) for layer in layers if imported & set(layer.modules)]
        out.append(
            f"`{module}` (its `{module_file(module).name}`, {rounded(line_count([module]))} lines) is the "
            f"container, in no layer: it re-exports the public names from {', '.join(used) or 'nothing'}."
        )
    out.append(
        f"Lines: every line of the layer's files, rounded to the nearest {ROUND_LINES}."
    )
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    target = Path(argv[1]) if len(argv) > 1 else OUTPUT
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
