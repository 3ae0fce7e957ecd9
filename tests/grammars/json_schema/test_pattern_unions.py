"""Strings under disjunctions of patterns: the leaves of an ``anyOf``/``not`` over patterns united on
code points (``combinators.merge_string_leaves``), negated patterns encoded from their code-point
automaton (``strings.encode_value_automaton``), and search patterns whose branches share one
padding (``regex``). Each must keep the language exact: checked against ``jsonschema`` on strings
chosen to sit on either side of every pattern and length bound, and against the leaf-by-leaf
construction.
"""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
from schema_check import Checker, oracle

from grammars.automata.byte_dfa import compile_regular, minimize
from grammars.automata.codepoint import CodePointDFA
from grammars.frontends import parse_regex
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    combinators,
    parse_json_schema,
    scalars,
    strings,
)
from grammars.ir import Alt
from grammars.limits import Limits

SCHEMAS = {
    "anyOf patterns, shared bounds": {
        "type": "string", "minLength": 2, "maxLength": 6,
        "anyOf": [{"pattern": "^a"}, {"pattern": "b$"}, {"pattern": "^[0-9]+$"}],
    },
    "anyOf of nots": {
        "type": "string", "maxLength": 5,
        "anyOf": [{"not": {"pattern": "a"}}, {"not": {"pattern": "b"}}],
    },
    "nested not anyOf": {
        "type": "string", "minLength": 1, "maxLength": 7, "pattern": "[ab]",
        "anyOf": [
            {"not": {"anyOf": [{"pattern": "^a"}, {"pattern": "z"}]}},
            {"not": {"anyOf": [{"pattern": "b$"}, {"pattern": "^.{3}$"}]}},
        ],
    },
    "anyOf with excluded values": {
        "type": "string", "maxLength": 4,
        "anyOf": [{"pattern": "^x", "not": {"enum": ["xa", "xb"]}}, {"pattern": "y", "not": {"const": "yy"}}],
    },
    "one leaf without patterns": {
        "type": "string", "maxLength": 3, "anyOf": [{"pattern": "^q"}, {"minLength": 0}],
    },
    "no string at all": {
        "type": "string", "anyOf": [{"pattern": "^a", "not": {"pattern": "a"}}, {"pattern": "^b", "not": {"pattern": "b"}}],
    },
    "mixed anchors in one pattern": {"type": "string", "pattern": "^ab|cd|ef$"},
    "negated mixed anchors": {"type": "string", "maxLength": 5, "not": {"pattern": "^a|b|c$"}},
}

#: no newline: ECMA-262's ``$`` (corral's) is the end of the text, Python's (the oracle's) also
#: the place before a final newline
ALPHABET = ["a", "b", "c", "d", "e", "f", "q", "x", "y", "z", "0", "7", "é", "\t", '"', "\\", "😀"]


def _strings(seed: str, n: int = 400) -> list[str]:
    rng = random.Random(seed)
    fixed = ["".join(p) for k in range(4) for p in itertools.product("abxyz0", repeat=k)]
    return fixed + ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8))) for _ in range(n)]


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_pattern_unions_agree_with_jsonschema(checker, name):
    schema = SCHEMAS[name]
    assert checker.disagreements(schema, _strings(name)) == []


def _leaf_by_leaf(monkeypatch, schema):
    """The grammar built with every leaf on its own (the construction before merging)."""
    with monkeypatch.context() as patch:
        patch.setattr(combinators, "merge_string_leaves", lambda c, leaves: list(leaves))
        return parse_json_schema(schema, JsonSchemaOptions(whitespace="compact"))


@pytest.mark.parametrize("name", ["anyOf patterns, shared bounds", "anyOf of nots", "nested not anyOf",
                                  "anyOf with excluded values"])
def test_merged_leaves_are_one_automaton_of_the_same_language(monkeypatch, name):
    schema = SCHEMAS[name]
    merged = parse_json_schema(schema, JsonSchemaOptions(whitespace="compact")).rule_map()["#"]
    separate = _leaf_by_leaf(monkeypatch, schema).rule_map()["#"]  # the root value's rule
    assert isinstance(separate, Alt) and not isinstance(merged, Alt)  # one automaton instead of one per leaf
    assert compile_regular(merged) == compile_regular(separate)  # the same minimal DFA: the same language


def test_a_union_too_large_for_the_limits_keeps_the_leaves():
    # alternatives of long literals bounded to 40..60 characters: each leaf has ~4,700 states,
    # their union met with the bounds ~22,000, past this ``max_dfa_states``: the leaves stay
    words = ["".join(random.Random(i).choice("abcdefgh") for _ in range(9)) for i in range(12)]
    schema = {"type": "string", "minLength": 40, "maxLength": 60, "anyOf": [{"pattern": w} for w in words]}
    grammar = parse_json_schema(schema, JsonSchemaOptions(whitespace="compact"), limits=Limits(max_dfa_states=10_000))
    value = grammar.rule_map()["#"]
    assert isinstance(value, Alt) and len(value.items) > 1
    validator = oracle(schema)
    rng = random.Random(3)
    leaves = [compile_regular(item) for item in value.items]  # their union is past the limits too
    for _ in range(300):
        text = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(38, 62)))
        text = text[:10] + rng.choice(words) + text[10:] if rng.random() < 0.7 else text
        token = json.dumps(text).encode()
        assert any(leaf.matches(token) for leaf in leaves) == validator.is_valid(text), text


def test_union_product_accepts_what_either_accepts():
    a = CodePointDFA.of(parse_regex("a[0-9]*"))
    b = CodePointDFA.of(parse_regex("[0-9]+z?"))
    union = a.product(b, "or")
    for text in _strings("union"):
        assert union.matches(text) == (a.matches(text) or b.matches(text)), text
    with pytest.raises(ValueError):
        a.product(b, "xor")


@pytest.mark.parametrize("pattern", [r"^[a-z]+(_[a-z]+)*$", r"^\d+\.\d+$", r"abc", r".*", r"^(é|😀){1,3}$",
                                     r"^list|date|number$", r"[^a]b"])
def test_encoded_automaton_equals_encoded_expression(pattern):
    expr = scalars.parse_pattern(pattern, "#/pattern")
    language = CodePointDFA.of(expr)
    for escapes in ("all", "minimal"):
        from_automaton = strings.encode_value_automaton(language, escapes)
        from_expression = compile_regular(strings.encode_value_language(expr, escapes))
        assert from_automaton == from_expression, (pattern, escapes)


@pytest.mark.parametrize("pattern", [r"^ab|cd|ef$", r"x|^y|z$|^w$", r"^a|", r"|b$", r"^(a|b)$|c", r"a|b|c"])
def test_search_branches_share_their_padding_exactly(pattern):
    dfa = CodePointDFA.of(parse_regex(pattern, search=True))
    for text in _strings(pattern, 600):
        assert dfa.matches(text) == (re.search(pattern, text) is not None), (pattern, text)


def test_a_minimal_dfa_is_not_minimised_again():
    dfa = compile_regular(parse_regex("[a-c]{2,5}x"))
    assert minimize(dfa) is dfa
    rebuilt = type(dfa)(dfa.table.copy(), dfa.accepting.copy(), dfa.start)  # no longer known minimal
    again = minimize(rebuilt)
    assert again is not rebuilt and again == dfa
