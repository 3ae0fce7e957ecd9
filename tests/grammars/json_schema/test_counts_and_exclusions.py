"""``contains`` with ``minContains``/``maxContains``/prefixes/length bounds, and excluded numbers."""

from __future__ import annotations

import itertools

import pytest
from schema_check import Checker

from grammars import UnsupportedSchemaError
from grammars.frontends.json_schema import parse_json_schema

ARRAYS = [list(t) for n in range(5) for t in itertools.product([1, 2, "a"], repeat=n)] + ["x", {}]
CONTAINS = {
    "max": {"contains": {"const": 1}, "maxContains": 1},
    "min-max": {"contains": {"const": 1}, "minContains": 2, "maxContains": 2},
    "zero": {"contains": {"const": 1}, "minContains": 0, "maxContains": 0},
    "min-with-maxItems": {"contains": {"const": 1}, "minContains": 2, "maxItems": 3},
    "minItems-above": {"contains": {"const": 1}, "minItems": 3},
    "prefix": {"prefixItems": [{"const": 2}], "contains": {"const": 1}},
    "prefix-items-max": {"prefixItems": [{"type": "integer"}], "items": {"type": "integer"}, "contains": {"const": 1},
                         "maxContains": 1, "minItems": 2},
    "items-and-max": {"contains": {"type": "string"}, "maxContains": 1, "items": {"enum": [1, "a"]}},
    "two-contains": {"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 2}, "maxContains": 1}]},
    "three-contains": {"allOf": [{"contains": {"const": 1}, "minContains": 2}, {"contains": {"enum": [1, 2]}, "maxContains": 2},
                                 {"contains": {"const": "a"}}]},
    "not-contains": {"not": {"contains": {"const": 1}}},
    "not-contains-range": {"not": {"contains": {"const": 1}, "minContains": 2, "maxContains": 3}},
    "not-prefixItems": {"not": {"prefixItems": [{"const": 1}, {"type": "string"}]}},
    "if-contains": {"if": {"contains": {"const": "a"}}, "then": {"maxItems": 2}, "else": {"contains": {"const": 2}}},
}
NUMBERS = [0, 1, 1.0, 0.5, 2, -1, 3, 2.5, 1.5, 0.9999999999999999, 1.0000000000000002, "a", None]
EXCLUSIONS = {
    "not-const": {"not": {"const": 1}},
    "integer-not-enum": {"type": "integer", "not": {"enum": [1, 3]}},
    "bounded-not-enum": {"minimum": 0, "maximum": 2, "not": {"enum": [1, 2.5]}},
    "if-then": {"if": {"exclusiveMaximum": 0}, "then": {"minimum": -10}, "else": {"not": {"const": 1}}},
}


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


@pytest.mark.parametrize("name", sorted(CONTAINS))
def test_contains_agrees_with_jsonschema(checker, name):
    assert not checker.disagreements(CONTAINS[name], ARRAYS, whitespace="flexible")


@pytest.mark.parametrize("name", sorted(EXCLUSIONS))
def test_excluded_numbers_agree_with_jsonschema(checker, name):
    assert not checker.disagreements(EXCLUSIONS[name], NUMBERS)


def test_too_many_contains_are_unsupported():
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema({"items": {"allOf": [{"contains": {"const": i}} for i in range(4)]}})
    assert info.value.keyword == "contains" and info.value.pointer.startswith("#/items")


def test_not_prefix_items_with_items_is_unsupported():
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema({"not": {"prefixItems": [{"const": 1}], "items": {"type": "string"}}})
    assert info.value.pointer == "#/not"


def test_max_contains_needs_a_negatable_contains():
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema({"contains": {"type": "string", "format": "date"}, "maxContains": 1})
    assert info.value.pointer == "#/contains"


NON_INTEGERS = {
    "not-integer": {"not": {"type": "integer"}},
    "not-integer-or-boolean": {"not": {"type": ["integer", "boolean"]}},
    "bounded": {"type": "number", "not": {"type": "integer"}, "minimum": 1},
    "oneOf-overlap": {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
    "nested": {"anyOf": [{"not": {"type": "integer"}}, {"type": "string"}]},
}
MIXED = [0, 1, 0.5, -0.5, 2.25, 1.5, 123456789012.5, 0.1, -3, 3, "a", None, True, [1]]


@pytest.mark.parametrize("name", sorted(NON_INTEGERS))
def test_non_integer_numbers_agree_with_jsonschema(checker, name):
    assert not checker.disagreements(NON_INTEGERS[name], MIXED)


@pytest.mark.parametrize("text", ["1.0", "1234567890123456.5", "0.0000000000000000001", "-7"])
def test_non_integer_numbers_reject_integers_and_risky_texts(checker, text):
    assert not checker.accepts({"not": {"type": "integer"}}, text)
