"""Fuzzing every front end: random schemas, regexes and grammars, then random walks and mutants.

For each generated input the only acceptable outcomes are a compiled grammar or a typed error
(``ConstraintError``; ``TypeError``/``ValueError`` only for a wrong argument, which these inputs
never are), within a time and memory bound. When it compiles:

* random walks through the masks (byte vocabulary, so every text is reachable) that end in an
  accepting state produce text the oracle accepts — ``jsonschema`` for schemas, Python's ``re``
  for regexes, a character-level Earley parse for GBNF — so no invalid text is ever accepted;
* mutants of accepted texts (a byte inserted, deleted or replaced) that the matcher accepts whole
  are accepted by the oracle too.

Bounded for CI: a few dozen examples per front end, small sizes, deadlines off (the bound is
asserted explicitly, generously, as a safety property rather than a speed target).
"""

from __future__ import annotations

import json
import re
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammars import Compiler, ConstraintError, Limits, parse_gbnf
from grammars.testing.laws import allowed_tokens
from grammars.testing.oracles import char_level_accepts

#: generous safety bounds per input: compiling plus every walk
MAX_SECONDS = 30.0
MAX_PEAK_BYTES = 512 << 20
WALKS = 3
MAX_STEPS = 60
#: small limits, so adversarial inputs hit a bound instead of the machine's
LIMITS = Limits(max_dfa_states=20_000, max_nfa_states=200_000, max_productions=50_000,
                max_parser_stacks=5_000, max_configurations=20_000)
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


# --- inputs ------------------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "id", "x1", "é", "k-k", ""])
NUMBERS = st.one_of(st.integers(-5, 5), st.integers(-(10**30), 10**30), st.sampled_from([0.5, 1.5, -2.25, 1e300, 10**309]))
SCALAR_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "a", "é", "ab"]))


def _leaf_schemas() -> st.SearchStrategy:
    type_names = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
    keyword = st.one_of(
        st.tuples(st.just("type"), st.one_of(type_names, st.lists(type_names, min_size=1, max_size=3, unique=True))),
        st.tuples(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"]), NUMBERS),
        st.tuples(st.sampled_from(["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"]),
                  st.one_of(st.integers(0, 4), st.just(10**20))),
        st.tuples(st.just("pattern"), st.sampled_from(["^a", "b$", "^[a-c]*$", "(", "x{2,3}", "\\d+"])),
        st.tuples(st.just("enum"), st.lists(SCALAR_VALUES, min_size=1, max_size=4)),
        st.tuples(st.just("const"), SCALAR_VALUES),
        st.tuples(st.just("format"), st.sampled_from(["date", "email", "uuid", "nonsense"])),
        st.tuples(st.just("required"), st.lists(NAMES, max_size=2, unique=True)),
        st.tuples(st.just("uniqueItems"), st.booleans()),
    )
    return st.one_of(st.booleans(), st.lists(keyword, max_size=3).map(dict))


def _compound(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.builds(lambda props, extra: {"type": "object", "properties": props, "additionalProperties": extra},
                  st.dictionaries(NAMES, inner, max_size=3), st.one_of(st.booleans(), inner)),
        st.builds(lambda items, k: {"type": "array", "items": items, "maxItems": k}, inner, st.integers(0, 3)),
        st.builds(lambda prefix: {"prefixItems": prefix}, st.lists(inner, max_size=2)),
        st.builds(lambda branches, kw: {kw: branches}, st.lists(inner, min_size=1, max_size=3),
                  st.sampled_from(["anyOf", "oneOf", "allOf"])),
        st.builds(lambda sub: {"not": sub}, inner),
        st.builds(lambda cond, then: {"if": cond, "then": then}, inner, inner),
        st.builds(lambda sub: {"$defs": {"d": sub}, "$ref": "#/$defs/d"}, inner),
        st.builds(lambda names: {"propertyNames": names}, inner),
    )


SCHEMAS = st.recursive(_leaf_schemas(), _compound, max_leaves=6)

REGEX_ATOMS = st.sampled_from(["a", "b", "é", "[a-c]", "[^x]", ".", "\\d", "\\w", "(a|bc)", "[é€]", "x?", "\\.", "(", ")", "[", "\\"])
REGEXES = st.lists(st.tuples(REGEX_ATOMS, st.sampled_from(["", "*", "+", "?", "{2}", "{1,3}", "{0,}"])),
                   min_size=1, max_size=6).map(lambda parts: "".join(a + q for a, q in parts))

GBNF_ATOMS = st.sampled_from(['"a"', '"b"', '"é"', "[a-c]", "[^x]", "x", "y", "root", '"("', "( x | y )"])
GBNF_RULE = st.lists(st.lists(st.tuples(GBNF_ATOMS, st.sampled_from(["", "*", "+", "?"])), min_size=1, max_size=3),
                     min_size=1, max_size=3)
GRAMMARS = st.tuples(GBNF_RULE, GBNF_RULE, GBNF_RULE).map(
    lambda rules: "\n".join(f"{name} ::= " + " | ".join(" ".join(a + q for a, q in alt) for alt in rule)
                            for name, rule in zip(["root", "x", "y"], rules)))


# --- the harness -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab, limits=LIMITS)


def bounded(run):
    """``run()`` under the time and memory bound; the compiled grammar, or None on a typed error."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        result = run()
    except ConstraintError:
        result = None
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < MAX_SECONDS, f"{elapsed:.1f} s"
    assert peak < MAX_PEAK_BYTES, f"{peak >> 20} MiB"
    return result


def random_walk(compiled, vocab, draw) -> bytes | None:
    """Bytes of one random path that ended at EOS, or None (ran out of steps or hit a limit)."""
    eos = min(vocab.eos_token_ids)
    matcher = compiled.matcher()
    out = bytearray()
    try:
        for _ in range(MAX_STEPS):
            allowed = allowed_tokens(matcher, vocab.logits_width)
            assert allowed.any() or matcher.is_terminated(), f"dead end after {bytes(out)!r}"
            others = [t for t in np.flatnonzero(allowed).tolist() if t != eos]
            if allowed[eos] and (not others or draw(st.integers(0, 3)) == 0):
                return bytes(out)
            token = others[draw(st.integers(0, len(others) - 1))]
            matcher.advance(token)
            out += vocab.token_bytes[token]
    except ConstraintError:  # a limit during the walk: the matcher refuses, never accepts wrongly
        return None
    return None


def mutants(text: bytes, draw) -> list[bytes]:
    out = []
    for _ in range(3):
        i = draw(st.integers(0, len(text)))
        byte = draw(st.sampled_from([bytes([b]) for b in b'"{}[],:0a\\ -.e'] + ["é".encode()]))
        out += [text[:i] + byte + text[i:], text[:i] + text[i + 1:], text[:i] + byte + text[i + 1:]]
    return out


def fully_accepts(compiled, text: bytes) -> bool:
    matcher = compiled.matcher()
    try:
        return matcher.try_advance(list(text)) == len(text) and matcher.is_accepting()
    except ConstraintError:
        return False


def check_walks_and_mutants(compiled, vocab, draw, in_language) -> None:
    for _ in range(WALKS):
        text = random_walk(compiled, vocab, draw)
        if text is None:
            continue
        assert in_language(text), f"accepted invalid text {text!r}"
        for mutant in mutants(text, draw):
            if fully_accepts(compiled, mutant):
                assert in_language(mutant), f"accepted invalid mutant {mutant!r} of {text!r}"


# --- the targets -------------------------------------------------------------------------------


@FUZZ
@given(schema=SCHEMAS, data=st.data())
def test_fuzz_json_schemas(compiler, byte_vocab, schema, data):
    import jsonschema

    compiled = bounded(lambda: compiler.compile_json_schema(schema, property_order="any"))
    if compiled is None:
        return
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)

    def valid(text: bytes) -> bool:
        try:
            return validator.is_valid(json.loads(text.decode("utf-8")))
        except (UnicodeDecodeError, ValueError):
            return False

    bounded(lambda: check_walks_and_mutants(compiled, byte_vocab, data.draw, valid))


@FUZZ
@given(pattern=REGEXES, data=st.data())
def test_fuzz_regexes(compiler, byte_vocab, pattern, data):
    compiled = bounded(lambda: compiler.compile_regex(pattern))
    if compiled is None:
        return
    python = re.compile(pattern)

    def matches(text: bytes) -> bool:
        try:
            return python.fullmatch(text.decode("utf-8")) is not None
        except UnicodeDecodeError:
            return False

    bounded(lambda: check_walks_and_mutants(compiled, byte_vocab, data.draw, matches))


@FUZZ
@given(text=GRAMMARS, data=st.data())
def test_fuzz_gbnf(compiler, byte_vocab, text, data):
    compiled = bounded(lambda: compiler.compile_gbnf(text))
    if compiled is None:
        return
    grammar = parse_gbnf(text)

    def in_grammar(candidate: bytes) -> bool:
        try:
            return char_level_accepts(grammar, candidate.decode("utf-8"))
        except UnicodeDecodeError:
            return False

    bounded(lambda: check_walks_and_mutants(compiled, byte_vocab, data.draw, in_grammar))


@pytest.mark.parametrize("source", [5, None, b"a", ["a"]])
def test_fuzz_non_text_sources_are_type_errors(compiler, source):
    for compile_ in (compiler.compile_regex, compiler.compile_gbnf, compiler.compile_lark):
        with pytest.raises((TypeError, ConstraintError)):
            compile_(source)
