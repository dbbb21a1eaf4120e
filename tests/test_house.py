"""The house rules of the package's layout (DESIGN.md, "Where each thing
lives"), read from the source: no import cycle, one loader of the compiled
extension, one log-sum-exp for log-probabilities."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "localargmax"


def _modules():
    return {f: ast.parse(f.read_text()) for f in sorted(PACKAGE.rglob("*.py"))}


def test_no_import_cycle_between_modules():
    """No two modules of the package or of bench/ import each other, directly or through
    others (bench/kernel.py and bench/runner.py once did), counting lazy imports too."""
    root = ROOT
    files = [*root.joinpath("localargmax").rglob("*.py"), *root.joinpath("bench").glob("*.py")]
    name = {f: ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__") for f in files}
    known = set(name.values())
    edges = {m: set() for m in known}
    for f, mod in name.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
                for alias in node.names:  # "from . import x" names module x, else a name of `target`
                    found = f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target
                    if found in known and found != mod and not mod.startswith(found + "."):
                        edges[mod].add(found)  # (a name from its own package's __init__: no edge)
            elif isinstance(node, ast.Import):
                edges[mod] |= {a.name for a in node.names if a.name in known and a.name != mod}

    def reaches(start, goal, seen):
        return any(n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen)) for n in edges[start])

    # a package importing its own submodules (localargmax/__init__.py) is not a cycle of two modules
    cycles = [
        (a, b) for a in edges for b in edges[a]
        if not (b.startswith(a + ".") or a.startswith(b + ".")) and reaches(b, a, set())
    ]  # fmt: skip
    assert cycles == [], cycles


def test_only_the_loader_imports_the_compiled_extension():
    """``localargmax/_ext.py`` alone loads ``_C`` (by name); every other module
    takes it from there (``from ._ext import _C``), so a missing or mismatched
    build has one message."""
    loaders, elsewhere = [], []
    for f, tree in _modules().items():
        where = f.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == "_C" for a in node.names):
                if not (node.module or "").endswith("_ext"):
                    elsewhere.append(where)
            elif isinstance(node, ast.Import) and any(a.name.endswith("._C") for a in node.names):
                elsewhere.append(where)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith("._C"):
                loaders.append(where)
    assert elsewhere == [] and loaders == ["localargmax/_ext.py"], (elsewhere, loaders)


def _log_of_a_sum(node) -> bool:
    """``torch.log(...)`` (or ``.log()``) of an expression that sums."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.func.attr != "log":
        return False
    inner = node.args[0] if node.args else node.func.value
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("sum", "logsumexp")
        for n in ast.walk(inner)
    )


def test_one_log_sum_exp_for_log_probabilities():
    """Every log-probability of the package is ``(x - m) - log(s)`` taken in
    one place, ``sampling/logprobs.py``'s ``log_prob_of`` (the C++ op's merge
    aside): no other module takes the log of a sum."""
    found = [
        (f.relative_to(ROOT).as_posix(), node.lineno)
        for f, tree in _modules().items()
        for node in ast.walk(tree)
        if _log_of_a_sum(node)
    ]
    assert [f for f, _ in found] == [], found
