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


UNIQUE = {
    "booleans": {"prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "items": False, "uniqueItems": True},
    "enum-items": {"items": {"enum": [1, "a", [1]]}, "maxItems": 3, "uniqueItems": True},
    "with-contains": {"items": {"enum": [1, 2, 3]}, "maxItems": 3, "uniqueItems": True, "contains": {"const": 2}},
}
SMALL_ARRAYS = [list(t) for n in range(4) for t in itertools.product([1, 2, True, False, "a", [1]], repeat=n)]


@pytest.mark.parametrize("name", sorted(UNIQUE))
def test_unique_items_over_finite_sets_agree_with_jsonschema(checker, name):
    assert not checker.disagreements(UNIQUE[name], SMALL_ARRAYS)


def test_unique_items_over_open_elements_is_unsupported():
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema({"properties": {"a": {"items": {"type": "integer"}, "maxItems": 3, "uniqueItems": True}}})
    assert (info.value.keyword, info.value.pointer) == ("uniqueItems", "#/properties/a")


@pytest.mark.parametrize("schema", [
    {"type": "integer"},
    {"type": "integer", "minimum": 2, "maximum": 10},
    {"type": "integer", "multipleOf": 3},
    {"type": "integer", "not": {"const": 3}},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"},
])
@pytest.mark.parametrize("text", ["1.0", "3.00", "-0.0", "12.0", "3", "1.5"])
def test_zero_fraction_integers_follow_the_draft(checker, schema, text):
    """``1.0`` is an integer from draft 6 on (not in draft 4); the oracle reads the text."""
    import json

    from schema_check import oracle

    assert checker.accepts(schema, text) == oracle(schema).is_valid(json.loads(text))


def test_long_zero_fraction_integers_stay_rejected(checker):
    assert not checker.accepts({"type": "integer"}, "1234567890123456.0")
