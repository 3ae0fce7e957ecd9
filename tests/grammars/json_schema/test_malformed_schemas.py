"""Malformed and paradoxical schemas are refused with a ``GrammarError`` naming the place.

Malformed: a keyword value its draft's meta-schema rejects (``check_schema`` of ``jsonschema``
agrees on every case here), reported at the pointer of the value. Paradoxical: a negation that
reaches its own schema through in-place references, for the same instance (validators recurse
forever on it). Schemas validators accept, including the Test Suite's, still compile.
"""

from __future__ import annotations

import jsonschema
import pytest
from schema_check import Checker

from grammars import GrammarError, UnsupportedSchemaError
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    analyze_json_schema,
    load_schema,
)

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


def analyze(schema, **options):
    return analyze_json_schema(load_schema(schema), JsonSchemaOptions(**options))


def meta_valid(schema) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return not list(cls(cls.META_SCHEMA).iter_errors(schema))


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"exclusiveMinimum": True}, "#/exclusiveMinimum"),
        ({"properties": {"a": {"exclusiveMaximum": False}}}, "#/properties/a/exclusiveMaximum"),
        ({"$schema": DRAFT4, "exclusiveMinimum": 5, "minimum": 1}, "#/exclusiveMinimum"),
        ({"$schema": DRAFT4, "exclusiveMinimum": True}, "#/exclusiveMinimum"),  # needs minimum beside it
        ({"$schema": DRAFT4, "properties": {"a": True}}, "#/properties/a"),  # no boolean schemas in draft 4
        ({"minLength": -1}, "#/minLength"),
        ({"minLength": 1.5}, "#/minLength"),
        ({"type": "strin"}, "#/type"),
        ({"required": ["a", "a"]}, "#/required"),
        ({"items": [{"type": "string"}]}, "#/items"),  # 2020-12: items is one schema
        ({"$defs": {"x": {"multipleOf": 0}}}, "#/$defs/x/multipleOf"),  # unused, still malformed
        ({"anyOf": [{"type": "string"}, 3]}, "#/anyOf/1"),
        ({"dependentRequired": {"a": "b"}}, "#/dependentRequired/a"),
        ({"format": 5}, "#/format"),
        ({"$schema": DRAFT4, "enum": [1, 1]}, "#/enum"),
    ],
)
def test_malformed_keyword_values_are_grammar_errors_at_the_value(schema, pointer):
    assert not meta_valid(schema)  # the validators' own judgement
    with pytest.raises(GrammarError) as info:
        analyze(schema, lenient=True)  # never relaxed: a malformed schema has no meaning to relax to
    assert not isinstance(info.value, UnsupportedSchemaError)
    assert f"malformed schema at {pointer}" in str(info.value)


def test_exclusive_minimum_true_is_no_longer_silently_ignored(checker):
    with pytest.raises(GrammarError, match="#/exclusiveMinimum"):
        checker.compile({"exclusiveMinimum": True})


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": DRAFT4, "minimum": 1, "exclusiveMinimum": True},
        {"$schema": DRAFT7, "exclusiveMinimum": 1, "items": [{"type": "string"}], "additionalItems": False},
        {"type": ["string", "null"], "enum": ["a", None]},
        {"properties": {"a": True, "b": False}, "patternProperties": {"^x": {}}, "$defs": {"d": {}}},
        {"dependencies": {"a": ["b"], "c": {"required": ["d"]}}},
        {"x-vendor": {"anything": [1, 2]}, "format": "not-a-known-format"},
        {"$schema": "https://example.com/custom-meta", "type": "string"},
    ],
)
def test_schemas_validators_accept_still_compile(checker, schema):
    assert meta_valid(schema)
    analyze(schema)
    checker.compile(schema)


def test_registry_documents_are_not_judged_as_the_main_document():
    """A registry document is a resource the schema may reference, written in its own draft."""
    registry = {"http://example.com/old.json": {"definitions": {"x": {"$id": "#x", "type": "string"}}}}
    analyze({"$ref": "http://example.com/old.json#/definitions/x"}, registry=registry)


# --- paradoxes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"not": {"$ref": "#"}}, "#/not"),
        ({"$ref": "#/$defs/a", "$defs": {"a": {"not": {"$ref": "#/$defs/a"}}}}, "#/$defs/a/not"),
        ({"allOf": [{"not": {"$ref": "#"}}]}, "#/allOf/0/not"),
        ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}},
          "properties": {"x": {"$ref": "#/$defs/a"}}}, "#/$defs/b/not"),
        ({"if": {"$ref": "#"}, "then": {"type": "string"}}, "#/if"),
        ({"oneOf": [{"allOf": [{"$ref": "#"}]}, {"type": "string"}]}, "#/oneOf"),
    ],
)
def test_self_referential_negation_is_refused(schema, pointer):
    with pytest.raises(GrammarError) as info:
        analyze(schema, lenient=True)
    assert not isinstance(info.value, UnsupportedSchemaError)
    assert f"paradoxical schema at {pointer}" in str(info.value)


def test_self_reference_is_refused_too():
    with pytest.raises(UnsupportedSchemaError) as info:
        analyze({"$ref": "#"})
    assert info.value.keyword == "$ref"


@pytest.mark.parametrize(
    "schema, good, bad",
    [
        # the negation applies to a member, a different instance: well founded
        ({"type": "object", "properties": {"x": {"not": {"$ref": "#"}}}}, ['{"x":1}', "{}"], ['{"x":{}}']),
        # an unused paradoxical definition is never evaluated, as validators never do
        ({"type": "integer", "$defs": {"p": {"not": {"$ref": "#/$defs/p"}}}}, ["1"], ['"s"']),
        # a negation of another definition that merely refers onward
        ({"$defs": {"s": {"type": "string"}}, "not": {"$ref": "#/$defs/s"}}, ["1", "null"], ['"s"']),
    ],
)
def test_well_founded_negations_compile_and_match_the_oracle(checker, schema, good, bad):
    validator = jsonschema.Draft202012Validator(schema)
    import json

    for text in good:
        assert validator.is_valid(json.loads(text)) and checker.accepts(schema, text), text
    for text in bad:
        assert not validator.is_valid(json.loads(text)) and not checker.accepts(schema, text), text
