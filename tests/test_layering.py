"""The import direction ``grammars <- samplers <- engine <- server | integrations <- jsonschemabench``, the layers
inside ``grammars``, and no import cycle anywhere, checked with ``ast``.

Every ``.py`` file under the six packages is parsed (not imported), and every import in it —
``import x``, ``from x import y``, relative ``from ..x import y``, imports inside functions or
``if TYPE_CHECKING:`` blocks, and ``importlib.import_module("x")`` / ``__import__("x")`` with a
literal name — is resolved to an absolute module name and checked against ``FORBIDDEN``,
``GRAMMARS_LAYERS`` and for cycles.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("grammars", "samplers", "engine", "server", "integrations", "jsonschemabench")

# package -> top-level modules it must not import (the web stack stays in ``server``: ``engine``
# reaches ``corral serve`` through a subprocess, as it reaches the benchmarks)
FORBIDDEN: dict[str, frozenset[str]] = {
    "grammars": frozenset({"samplers", "engine", "server", "integrations", "jsonschemabench", "torch", "fastapi", "uvicorn"}),
    "samplers": frozenset({"engine", "server", "integrations", "jsonschemabench", "fastapi", "uvicorn"}),
    "engine": frozenset({"server", "integrations", "jsonschemabench", "fastapi", "uvicorn"}),
    "server": frozenset({"integrations", "jsonschemabench"}),
    # the engines' plugins build on grammars and engine; nothing of corral's imports them
    "integrations": frozenset({"server", "jsonschemabench"}),
    "jsonschemabench": frozenset(),
}


@dataclass(frozen=True)
class Import:
    """One import statement, resolved: the absolute module name and where it was written."""

    module: str
    line: int


def module_name(path: Path, root: Path = REPO_ROOT) -> tuple[str, bool]:
    """Dotted module name of a file under ``root``, and whether it is a package ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level > len(package):
        # beyond the top-level package: Python refuses this at import time; flag it loudly
        return "<relative import beyond top-level package>"
    base = package[: len(package) - level + 1]
    return ".".join(base + ([target] if target else []))


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every module ``source`` (the text of ``module``) imports, as absolute dotted names.

    ``from pkg import name`` yields both ``pkg`` and ``pkg.name`` (the name may be a submodule).
    """
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _resolve_relative(module, is_package, node.level, node.module)
            else:
                base = node.module or ""
            found.append(Import(base, node.lineno))
            found += [Import(f"{base}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            first = node.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if name in ("import_module", "__import__") and literal:
                found.append(Import(first.value, node.lineno))
    return found


def violations_in(source: str, module: str, is_package: bool = False, where: str = "") -> list[str]:
    """Import-direction violations in one module's source, as readable messages."""
    package = module.split(".")[0]
    forbidden = FORBIDDEN.get(package, frozenset())
    messages = []
    for imp in imports_of(source, module, is_package):
        top = imp.module.split(".")[0]
        if top in forbidden or imp.module.startswith("<"):
            messages.append(f"{where or module}:{imp.line}: {package} must not import {imp.module}")
    return messages


def package_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (REPO_ROOT / pkg).is_dir() for p in (REPO_ROOT / pkg).rglob("*.py"))


# --- the checker itself can fail -------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "module", "is_package", "bad"),
    [
        ("import torch", "grammars.vocab", False, "torch"),
        ("import torch.nn.functional as F", "grammars.vocab", False, "torch.nn.functional"),
        ("from samplers import awrs", "grammars.compile", False, "samplers"),
        ("def f():\n    from engine.lm import LanguageModel\n", "samplers.asap", False, "engine.lm"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import engine\n", "samplers.smc", False, "engine"),
        ("from ..engine import decoders", "samplers.sub.mod", False, "samplers.engine"),  # stays in samplers
        ("from .. import awrs", "samplers.sub.mod", False, "samplers.awrs"),
        ("from .. import dfa", "grammars.automata", True, "grammars.dfa"),
        ("from . import trie", "grammars.automata", True, "grammars.automata.trie"),
        ("from ... import engine", "samplers.sub.mod", False, "<relative import beyond top-level package>"),
        ("import importlib\nimportlib.import_module('jsonschemabench.peers')", "engine.cli", False,
         "jsonschemabench.peers"),
        ("__import__('torch')", "grammars.kernels", False, "torch"),
        ("from .... import x", "grammars.automata.dfa", False, "<relative import beyond top-level package>"),
    ],
)
def test_checker_resolves_imports(source, module, is_package, bad):
    assert bad in {imp.module for imp in imports_of(source, module, is_package)}


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import torch", "grammars.vocab", False),
        ("from samplers import awrs", "grammars.compile", False),
        ("def f():\n    from engine.lm import LanguageModel\n", "samplers.asap", False),
        ("from ... import engine", "samplers.sub.mod", False),
        ("from .. import x", "engine", True),
        ("import jsonschemabench.peers", "engine.cli", False),
        ("def f():\n    from server.app import create_app\n", "engine.cli", False),
        ("import fastapi", "engine.generate", False),
        ("from jsonschemabench import serve_bench", "server.runtime", False),
        ("import grammars\nfrom jsonschemabench import samples", "samplers.asap", False),
        ("import importlib\nimportlib.import_module('torch')", "grammars.vocab", False),
    ],
)
def test_checker_reports_violations(source, module, is_package):
    assert violations_in(source, module, is_package)


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import numpy as np\nfrom . import ir\nfrom .automata import dfa", "grammars.compile", False),
        ("from .frontends import gbnf\nfrom .errors import GrammarError", "grammars", True),
        ("from ..errors import GrammarError", "grammars.frontends.gbnf", False),
        ("import torch\nfrom grammars import Matcher", "samplers.masked", False),
        ("import torch\nimport samplers\nfrom grammars.errors import TokenRejected", "engine.decode", False),
        ("import grammars, samplers, engine\nfrom .peers import ENGINES", "jsonschemabench.grammar_bench", False),
        ("import engine, samplers, grammars\nimport fastapi", "server.app", False),
        ("import server\nfrom server.config import ServerConfig", "jsonschemabench.serve_bench", False),
        ("from ..engine_utils import x", "grammars.automata.trie", False),  # a module *named* like a package
    ],
)
def test_checker_accepts_allowed_imports(source, module, is_package):
    assert violations_in(source, module, is_package) == []


# --- the real tree -----------------------------------------------------------------------------


def test_packages_are_found():
    files = package_files()
    assert any(module_name(f)[0].startswith("grammars") for f in files), "no grammars/*.py found to check"
    for pkg in PACKAGES:
        assert (REPO_ROOT / pkg / "__init__.py").is_file(), f"{pkg}/__init__.py is missing"


def test_import_direction():
    messages = []
    for path in package_files():
        module, is_package = module_name(path)
        source = path.read_text(encoding="utf-8")
        messages += violations_in(source, module, is_package, where=str(path.relative_to(REPO_ROOT)))
    rule = "import direction is grammars <- samplers <- engine <- server <- jsonschemabench"
    assert not messages, rule + ":\n" + "\n".join(messages)


def test_nothing_outside_jsonschemabench_imports_it():
    messages = []
    for path in package_files():
        module, is_package = module_name(path)
        if module.split(".")[0] == "jsonschemabench":
            continue
        for imp in imports_of(path.read_text(encoding="utf-8"), module, is_package):
            if imp.module.split(".")[0] == "jsonschemabench":
                messages.append(f"{path.relative_to(REPO_ROOT)}:{imp.line}: imports {imp.module}")
    assert not messages, "\n".join(messages)


# --- layers inside grammars ------------------------------------------------------------------

#: Each part of ``grammars`` and its layer: a module may import its own part and parts of lower
#: layers only (docs/ARCHITECTURE.md, "Where each piece lives").
GRAMMARS_LAYERS: dict[str, int] = {
    "grammars.errors": 0,
    "grammars.limits": 0,
    "grammars.contract": 1,  # the Matcher contract: numpy, typing and the errors
    "grammars.ir": 1,
    "grammars.bitmask": 1,
    "grammars.memo": 1,  # bounded memo tables, and the process-wide one for automata
    "grammars.automata": 2,  # byte DFAs, code-point DFAs, CFG lowering, LR(0)
    "grammars.vocab": 2,  # token bytes, GGUF tokenizers, the token trie
    "grammars.frontends": 3,  # regex, GBNF, Lark, JSON Schema -> IR
    "grammars.builtin": 3,  # built-in grammars: Lark source text only
    "grammars.masks": 3,  # the mask engine: match states -> allowed tokens
    "grammars.matcher": 4,
    "grammars.compile": 5,
    "grammars.testing": 6,  # the test kit: laws and oracles over the public surface
    "grammars": 7,  # the package itself: the public names
}


def grammars_part(module: str) -> str | None:
    """The ``GRAMMARS_LAYERS`` entry a ``grammars`` module belongs to (longest prefix), if any."""
    best = None
    for part in GRAMMARS_LAYERS:
        if (module == part or module.startswith(part + ".")) and (best is None or len(part) > len(best)):
            best = part
    return best


def layer_violations_in(source: str, module: str, is_package: bool = False, where: str = "") -> list[str]:
    own = grammars_part(module)
    if own is None or not module.startswith("grammars"):
        return []
    messages = []
    for imp in imports_of(source, module, is_package):
        if not imp.module.startswith("grammars"):
            continue
        target = grammars_part(imp.module)
        if target is None:
            messages.append(f"{where or module}:{imp.line}: {imp.module} belongs to no layer of grammars")
        elif target != own and GRAMMARS_LAYERS[target] >= GRAMMARS_LAYERS[own]:
            messages.append(f"{where or module}:{imp.line}: {own} (layer {GRAMMARS_LAYERS[own]}) must not import "
                            f"{imp.module} (layer {GRAMMARS_LAYERS[target]})")
    return messages


@pytest.mark.parametrize(
    ("source", "module", "bad"),
    [
        ("from grammars.matcher import Matcher", "grammars.masks.token_dfa", True),
        ("def f():\n    from grammars.compile import Compiler\n", "grammars.frontends.json_schema.values", True),
        ("from grammars.frontends.regex import parse_regex", "grammars.masks.token_slices", True),
        ("from grammars.masks.runtime import BoundedCache", "grammars.frontends.gbnf", True),
        ("from grammars.vocab.trie import TokenTrie", "grammars.automata.byte_dfa", True),
        ("from grammars.nowhere import x", "grammars.masks.runtime", True),
        ("from grammars.automata.byte_dfa import ByteDFA", "grammars.masks.token_walk", False),
        ("from grammars.masks.token_walk import WalkCache", "grammars.masks.token_dfa", False),
        ("from grammars.contract import TokenCheck", "grammars.masks.token_dfa", False),
        ("from grammars.compile import Compiler", "grammars.testing.laws", False),
    ],
)
def test_layer_checker(source, module, bad):
    assert bool(layer_violations_in(source, module)) == bad


def test_grammars_layers():
    messages = []
    for path in package_files():
        module, is_package = module_name(path)
        messages += layer_violations_in(path.read_text(encoding="utf-8"), module, is_package,
                                        where=str(path.relative_to(REPO_ROOT)))
    assert not messages, "layers inside grammars (see GRAMMARS_LAYERS):\n" + "\n".join(messages)


def test_every_grammars_module_has_a_layer():
    missing = [module_name(p)[0] for p in package_files()
               if module_name(p)[0].startswith("grammars") and grammars_part(module_name(p)[0]) is None]
    assert not missing, f"modules of grammars outside GRAMMARS_LAYERS: {missing}"


# --- no import cycles ------------------------------------------------------------------------


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a ``from pkg import name`` counts as importing
    ``pkg.name`` when that is a module, else ``pkg``)."""
    files = package_files()
    modules = {module_name(p)[0] for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        module, is_package = module_name(path)
        edges = set()
        for imp in imports_of(path.read_text(encoding="utf-8"), module, is_package):
            if imp.module in modules and imp.module != module:
                edges.add(imp.module)
        graph[module] = edges
    # ``from pkg import name`` also yields ``pkg``; a package's __init__ importing its own
    # submodules is how packages export names, not a cycle through the submodule
    for module, edges in graph.items():
        edges.difference_update({m for m in edges if module.startswith(m + ".")})
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules around it, or None (iterative DFS)."""
    colour: dict[str, int] = {}
    for root in sorted(graph):
        if colour.get(root):
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        colour[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child, 0) == 1:
                return path[path.index(child):] + [child]
            elif colour.get(child, 0) == 0:
                colour[child] = 1
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
    return None


def test_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
