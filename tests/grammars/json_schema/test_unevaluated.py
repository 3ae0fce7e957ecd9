"""``unevaluatedProperties``/``unevaluatedItems``: exact per set of annotation sources, or unsupported."""

from __future__ import annotations

import pytest
from schema_check import Checker

from grammars import UnsupportedSchemaError
from grammars.frontends.json_schema import parse_json_schema

S = {"type": "string"}
CASES = {
    "static": ({"properties": {"a": S}, "patternProperties": {"^x": {"type": "integer"}}, "unevaluatedProperties": False},
               [{}, {"a": "s"}, {"x1": 1}, {"a": "s", "b": 1}, {"x1": "s"}, [1], "s"]),
    "schema-valued": ({"properties": {"a": S}, "unevaluatedProperties": {"type": "integer"}},
                      [{"a": "s", "b": 1}, {"b": "s"}, {"a": 1}]),
    "allOf-and-ref": ({"$defs": {"d": {"properties": {"b": S}}}, "allOf": [{"properties": {"a": S}}], "$ref": "#/$defs/d",
                       "unevaluatedProperties": False}, [{"a": "s", "b": "t"}, {"b": "t"}, {"c": 1}]),
    "cousins-not-visible": ({"allOf": [{"properties": {"a": True}}, {"unevaluatedProperties": False}]},
                            [{}, {"a": 1}]),
    "nested-additional-evaluates-all": ({"allOf": [{"additionalProperties": True}], "unevaluatedProperties": False},
                                        [{"z": 1}, {}]),
    "anyOf-overlapping": ({"anyOf": [{"properties": {"a": S}, "required": ["a"]}, {"properties": {"b": S}, "required": ["b"]}],
                           "unevaluatedProperties": False},
                          [{"a": "s"}, {"b": "s"}, {"a": "s", "b": "t"}, {"a": "s", "b": 1}, {"a": "s", "c": 1}, {}]),
    "oneOf": ({"oneOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]}, {"properties": {"b": {"const": 2}}, "required": ["b"]}],
               "unevaluatedProperties": False},
              [{"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"a": 1, "b": 3}, {"a": 2, "b": 2}]),
    "if-then-else": ({"if": {"properties": {"k": {"const": "x"}}, "required": ["k"]}, "then": {"properties": {"t": S}},
                      "else": {"properties": {"e": S}}, "unevaluatedProperties": False},
                     [{"k": "x", "t": "s"}, {"k": "x", "e": "s"}, {"k": "y", "e": "s"}, {"e": "s"}, {"k": "y"}, {"t": "s"}]),
    "if-alone": ({"if": {"properties": {"k": {"const": 1}}}, "unevaluatedProperties": False},
                 [{"k": 1}, {"k": 2}, {}]),
    "dependentSchemas": ({"properties": {"d": True}, "dependentSchemas": {"d": {"properties": {"e": S}}},
                          "unevaluatedProperties": False}, [{"d": 1, "e": "s"}, {"e": "s"}, {"d": 1}, {"d": 1, "e": 1}]),
    "recursive-ref": ({"$defs": {"n": {"properties": {"v": {"type": "integer"}, "next": {"$ref": "#"}}}},
                       "$ref": "#/$defs/n", "unevaluatedProperties": False},
                      [{"v": 1, "next": {"v": 2}}, {"v": 1, "next": {"w": 2}}, {"w": 1}]),
    "items-static": ({"prefixItems": [S], "allOf": [{"prefixItems": [True, {"type": "integer"}]}], "unevaluatedItems": False},
                     [[], ["a"], ["a", 1], ["a", 1, 2], [1], {"a": 1}]),
    "items-schema": ({"prefixItems": [S], "unevaluatedItems": {"type": "integer"}}, [["a", 1, 2], ["a", "b"], [1]]),
    "items-evaluates-all": ({"allOf": [{"items": True}], "unevaluatedItems": False}, [[1, 2], []]),
    "items-contains": ({"contains": {"type": "string"}, "unevaluatedItems": {"type": "integer"}},
                       [["a"], ["a", 1], ["a", 1, None], [1]]),
    "items-anyOf": ({"anyOf": [{"prefixItems": [{"const": 1}]}, {"prefixItems": [True, {"const": 2}]}], "unevaluatedItems": False},
                    [[1], [1, 2], [0, 2], [1, 3], [1, 2, 3], []]),
}


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


@pytest.mark.parametrize("name", sorted(CASES))
def test_unevaluated_agrees_with_jsonschema(checker, name):
    schema, instances = CASES[name]
    assert not checker.disagreements(schema, instances, property_order="any")


def test_true_is_no_constraint(checker):
    assert checker.accepts({"unevaluatedProperties": True, "unevaluatedItems": {}}, '{"a":[1]}')


@pytest.mark.parametrize("schema, keyword, pointer", [
    ({"not": {"properties": {"a": True}, "unevaluatedProperties": False}}, "unevaluatedProperties", "#/not"),
    ({"$defs": {"d": {"$recursiveAnchor": True, "properties": {"a": True}}}, "$schema": "https://json-schema.org/draft/2019-09/schema",
      "properties": {"p": {"unevaluatedProperties": False, "allOf": [{"$recursiveRef": "#"}]}}},
     "unevaluatedProperties", "#/properties/p/allOf/0"),
    ({"anyOf": [{"properties": {f"p{i}": True}} for i in range(7)], "unevaluatedProperties": False},
     "unevaluatedProperties", "#"),
])
def test_unsupported_cases_name_keyword_and_pointer(schema, keyword, pointer):
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema(schema)
    assert (info.value.keyword, info.value.pointer) == (keyword, pointer)


def test_nested_one_of_sources(checker):
    """Conditions through nested ``oneOf``s (negations of ``oneOf`` for the exclusive branches)."""
    schema = {"$defs": {"two": {"oneOf": [{"required": ["c"], "properties": {"c": True}},
                                          {"required": ["d"], "properties": {"d": True}}]}},
              "oneOf": [{"$ref": "#/$defs/two"}, {"required": ["a"], "properties": {"a": True}}],
              "unevaluatedProperties": False}
    instances = [{"a": 1}, {"c": 1}, {"d": 1}, {"c": 1, "d": 1}, {"a": 1, "c": 1}, {"c": 1, "x": 1}, {}]
    assert not checker.disagreements(schema, instances, property_order="any")


def test_recursive_one_of_is_not_negated():
    """Excluding a ``oneOf`` branch that refers back to the ``oneOf`` would pair branches without end."""
    schema = {"$defs": {"t": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#/$defs/t"}}]}},
              "oneOf": [{"$ref": "#/$defs/t"}, {"type": "array", "maxItems": 1}]}
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema(schema)
    assert info.value.keyword == "oneOf"
