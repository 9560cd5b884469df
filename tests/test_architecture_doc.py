"""docs/layers.md, the layer diagram docs/architecture.md includes, matches the code and .importlinter."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = "run `hatch run python docs/layers.py`"


def _generator():
    spec = importlib.util.spec_from_file_location("docs_layers", ROOT / "docs" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_layer_diagram_is_up_to_date(tmp_path):
    generator = _generator()
    fresh = tmp_path / "layers.md"
    assert generator.main(["layers.py", str(fresh)]) == 0
    committed = (ROOT / "docs" / "layers.md").read_text(encoding="utf-8")
    # the shape must match; sizes (lines, rounded to 100) may drift with docstrings until the next regeneration
    assert _shape(fresh.read_text(encoding="utf-8")) == _shape(committed), FIX


def _shape(text: str) -> str:
    text = re.sub(r"\| [0-9,]+ \|", "| n |", text)
    return re.sub(r", [0-9,]+ lines\)", ", n lines)", text)


def test_every_layer_of_the_contract_is_in_the_diagram():
    generator = _generator()
    layers = generator.read_layers()
    assert len(layers) > 5 and layers[-1].name == "base", [layer.name for layer in layers]
    committed = (ROOT / "docs" / "layers.md").read_text(encoding="utf-8")
    diagram = committed.split("```mermaid", 1)[1].split("```", 1)[0]
    missing = [layer.name for layer in layers if f'{layer.node}["<b>{layer.name}</b>' not in diagram]
    assert not missing, f"layers of .importlinter missing from docs/layers.md: {missing}; {FIX}"
    assert '--8<-- "docs/layers.md"' in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
