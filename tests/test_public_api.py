"""Each package's public surface is its ``__all__``, and changing it is a deliberate act.

For every package: ``__all__`` equals the literal set in ``EXPECTED`` (edit it here when you add
or remove a public name), has no duplicates or private names, every name resolves from
``from package import name``, ``import *`` exports exactly ``__all__``, and every exported class
or function is corral's own and carries its own docstring.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

EXPECTED: dict[str, frozenset[str]] = {
    "grammars": frozenset(
        {
            "TokenVocabulary",
            "Grammar",
            "compile_regex",
            "compile_lark",
            "compile_gbnf",
            "compile_grammar",
            "compile_json_schema",
            "Compiler",
            "CompiledGrammar",
            "shared_compiler",
            "TokenMatcher",
            "Matcher",
            "DFAMatcher",
            "UnconstrainedMatcher",
            "TokenCheck",
            "TokenDFA",
            "Limits",
            "allocate_token_bitmask",
            "parse_regex",
            "parse_gbnf",
            "parse_lark",
            "builtin_grammar",
            "ConstraintError",
            "GrammarError",
            "GrammarSyntaxError",
            "UnsupportedGrammarError",
            "UnsupportedSchemaError",
            "EmptyLanguageError",
            "VocabularyError",
            "LimitExceeded",
            "MatchError",
            "TokenRejected",
            "RollbackError",
            "NoAllowedToken",
        }
    ),
    "samplers": frozenset(
        {
            "SamplingParams",
            "Draw",
            "SamplingRun",
            "TokenSampler",
            "NoAllowedToken",
            "MaskedSampler",
            "sample_categorical",
            "apply_token_bitmask_inplace",
            "ASAp",
            "AWRS",
            "SMC",
            "SMCResult",
            "dingo_map",
            "dingo_sample",
            "NoValidBlock",
        }
    ),
    "engine": frozenset(
        {
            "CanvasHookError",
            "ClosingPlanner",
            "Completion",
            "CorralCanvasProcessor",
            "DiffusionDraft",
            "DraftTree",
            "JacobiDraft",
            "CorralLogitsProcessor",
            "DecodeOptions",
            "GenerationOptions",
            "GenerationResult",
            "FIMTokens",
            "HoleReport",
            "InfillResult",
            "UncompletableError",
            "infill",
            "HFCausalLM",
            "LanguageModel",
            "ScriptedLM",
            "MaskedDiffusionLM",
            "HFMaskedDiffusionLM",
            "ScriptedDiffusionLM",
            "SequenceOutput",
            "SequenceSampler",
            "decode",
            "generate",
            "generate_batch",
            "resolve_sampler",
            "speculative_decode",
            "DraftModel",
            "PromptLookup",
            "GoodputController",
            "ForcedTokens",
        }
    ),
    "jsonschemabench": frozenset(),
}

PACKAGES = sorted(EXPECTED)

#: Names a package exports on purpose from a lower package: (package, name) -> the defining package.
#: Samplers raise ``NoAllowedToken``, which belongs to the error tree in ``grammars``.
REEXPORTS: dict[tuple[str, str], str] = {("samplers", "NoAllowedToken"): "grammars"}


def _public_all(package: str) -> list[str]:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{package}/__init__.py defines no __all__"
    assert isinstance(exported, (list, tuple)), f"{package}.__all__ must be a list or tuple"
    assert all(isinstance(name, str) for name in exported), f"{package}.__all__ holds non-strings"
    return list(exported)


def _own_doc(obj: object) -> str:
    """The docstring written for ``obj`` itself: not inherited, not dataclass-generated."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if not doc:
        return ""
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
        return ""  # @dataclass fills in the signature when the class has no docstring
    return doc.strip()


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_docstring(package):
    assert (importlib.import_module(package).__doc__ or "").strip(), f"{package}/__init__.py has no docstring"


@pytest.mark.parametrize("package", PACKAGES)
def test_all_matches_expected(package):
    exported = _public_all(package)
    duplicates = sorted({n for n in exported if exported.count(n) > 1})
    assert not duplicates, f"{package}.__all__ lists {duplicates} more than once"
    missing = sorted(EXPECTED[package] - set(exported))
    extra = sorted(set(exported) - EXPECTED[package])
    assert not missing and not extra, (
        f"{package}.__all__ differs from tests/test_public_api.py::EXPECTED; "
        f"missing {missing}, unexpected {extra} (update EXPECTED if the change is deliberate)"
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_names_exported(package):
    private = [name for name in _public_all(package) if name.startswith("_")]
    assert not private, f"{package}.__all__ exports private names {private}"


@pytest.mark.parametrize("package", PACKAGES)
def test_exported_names_resolve(package):
    module = importlib.import_module(package)
    for name in _public_all(package):
        assert hasattr(module, name), f"{package}.__all__ lists {name!r}, which {package} does not define"
        namespace: dict = {}
        exec(f"from {package} import {name}", namespace)  # the spelling users write
        assert namespace[name] is getattr(module, name)


@pytest.mark.parametrize("package", PACKAGES)
def test_star_import_is_exactly_all(package):
    namespace: dict = {}
    exec(f"from {package} import *", namespace)
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(_public_all(package))


@pytest.mark.parametrize("package", PACKAGES)
def test_exported_classes_and_functions_are_documented_and_ours(package):
    module = importlib.import_module(package)
    undocumented, foreign = [], []
    for name in _public_all(package):
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            continue
        if not _own_doc(obj):
            undocumented.append(name)
        owner = getattr(obj, "__module__", "") or ""
        home = REEXPORTS.get((package, name), package)
        if owner != home and not owner.startswith(home + "."):
            foreign.append(f"{name} (from {owner})")
    assert not undocumented, f"{package} exports without a docstring: {undocumented}"
    assert not foreign, f"{package} re-exports names it does not define: {foreign}"


def test_doc_check_can_fail():
    """The docstring check rejects inherited and dataclass-generated docstrings."""

    class Base:
        """Documented."""

    class Child(Base):
        pass

    @dataclasses.dataclass
    class Plain:
        x: int

    @dataclasses.dataclass
    class Documented:
        """A point."""

        x: int

    def bare():
        pass

    assert _own_doc(Base) and _own_doc(Documented)
    assert not _own_doc(Child)
    assert not _own_doc(Plain)
    assert not _own_doc(bare)
