"""DESIGN.md §3: imports only go down the layers; simpy, matplotlib, torch and ray stay in their packages."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "simulator"

# bottom to top; a module may import only from its own layer or below
LAYERS = [
    {"units"},
    {"model", "hardware"},
    {"tasks", "trace"},
    {"strategy", "defaults", "scenario_checks", "scenario_fields", "scenario", "reliability"},
    {"cost"},
    {"engine"},
    {"analysis"},
    {"pipeline"},
    {"explore", "calibration"},
    {"__main__", "__init__"},
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}
ALLOWED_HOME = {"simpy": {"engine"}, "matplotlib": {"analysis"}, "torch": {"calibration"}, "ray": {"explore"}}


def _top(module_path: Path) -> str:
    rel = module_path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    pkg = path.relative_to(ROOT).parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module or "", None
            else:
                base = list(pkg)[: len(pkg) - (node.level - 1)] if node.level > 1 else list(pkg)
                target = base + (node.module.split(".") if node.module else [])
                if not target:  # "from . import x" at the package root
                    target = [node.names[0].name]
                yield "", target[0]


def test_every_module_is_in_a_layer():
    for path in ROOT.rglob("*.py"):
        assert _top(path) in LEVEL, f"{path} is in no layer of tests/test_layering.py"


def test_imports_only_go_down():
    bad = []
    for path in ROOT.rglob("*.py"):
        me = _top(path)
        for absolute, internal in _imports(path):
            if internal is not None and LEVEL[internal] > LEVEL[me]:
                bad.append(f"{path.relative_to(ROOT)} imports {internal} (layer {LEVEL[internal]} > {LEVEL[me]})")
            if absolute.startswith("simulator."):
                other = absolute.split(".")[1]
                if LEVEL.get(other, 0) > LEVEL[me]:
                    bad.append(f"{path.relative_to(ROOT)} imports {absolute}")
    assert not bad, "\n".join(bad)


def test_heavy_dependencies_stay_home():
    bad = []
    for path in ROOT.rglob("*.py"):
        me = _top(path)
        for absolute, _ in _imports(path):
            root = absolute.split(".")[0]
            if root in ALLOWED_HOME and me not in ALLOWED_HOME[root]:
                bad.append(f"{path.relative_to(ROOT)} imports {root}")
    assert not bad, "\n".join(bad)


def test_no_module_exceeds_400_lines():
    """The style guide: modules of at most 400 lines, so none grows into a god module."""
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over 400 lines: {long}"
