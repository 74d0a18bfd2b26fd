"""Who may import whom: ``hw`` imports no other part of the project, ``sim`` imports only
``hw``, ``soc`` (the LiteX SoC) ``hw`` and ``sim``, and no production module imports a test module. Every import counts, those inside
functions too."""

import ast
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = ("hw", "sw", "sim", "soc", "fpga", "formal")
TEST_MODULES = {"tb"} | {path.stem for path in (ROOT / "tb").glob("*.py")}
#: The project packages each production package may import, besides itself.
ALLOWED = {"hw": set(), "sim": {"hw"}, "soc": {"hw", "sim"}, "sw": {"hw", "sim", "soc"},
           "fpga": {"hw", "sim", "sw", "soc"}, "formal": {"hw", "sim", "sw"}}


def imported_modules(path):
    """The absolute module names ``path`` imports, with their line numbers."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module, node.lineno


def production_files():
    return sorted(path for package in PRODUCTION for path in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", production_files(),
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_imports_follow_the_layers(path):
    name = str(path.relative_to(ROOT))
    package = name.split("/")[0]
    forbidden = set(PRODUCTION) - ALLOWED[package] - {package}
    found = [(module, line) for module, line in imported_modules(path)
             if module.split(".")[0] in forbidden | TEST_MODULES]
    assert not found, f"{name} imports " + ", ".join(f"{module} (line {line})"
                                                       for module, line in found)

