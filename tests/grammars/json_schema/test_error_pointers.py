"""Errors point at the right place: the keyword and the JSON pointer of the schema (or value) that
caused them, however the compiler reached it (``propertyNames``, ``patternProperties``, merged
conjunctions, negations, expanded alternatives, references)."""

from __future__ import annotations

import pytest

from grammars import GrammarError, UnsupportedSchemaError
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    analyze_json_schema,
    load_schema,
)


def analyze(schema, **options):
    return analyze_json_schema(load_schema(schema), JsonSchemaOptions(**options))


@pytest.mark.parametrize(
    "schema, pointer",
    [
        ({"propertyNames": {"pattern": "a("}}, "#/propertyNames/pattern"),
        ({"patternProperties": {"a(": {"type": "string"}}}, "#/patternProperties/a("),
        ({"patternProperties": {"x/[": {}}}, "#/patternProperties/x~1["),
        ({"type": "string", "pattern": "a("}, "#/pattern"),
        ({"not": {"pattern": "[z"}}, "#/not/pattern"),
        ({"allOf": [{"minLength": 1}, {"pattern": "(b"}]}, "#/allOf/1/pattern"),
        ({"properties": {"k": {"type": "object", "propertyNames": {"pattern": "(", "maxLength": 3}}}},
         "#/properties/k/propertyNames/pattern"),
    ],
)
def test_a_malformed_pattern_is_reported_at_the_pattern(schema, pointer):
    with pytest.raises(GrammarError) as info:
        analyze(schema)
    message = str(info.value)
    assert f"malformed schema at {pointer}" in message
    assert "<regex>" not in message


@pytest.mark.parametrize(
    "schema, keyword, pointer",
    [
        ({"propertyNames": {"pattern": "(?=a)"}}, "pattern", "#/propertyNames"),
        ({"patternProperties": {"(?=a)": {"type": "string"}}}, "patternProperties", "#/patternProperties/(?=a)"),
        ({"allOf": [{"minLength": 1}, {"pattern": "(?=a)"}]}, "pattern", "#/allOf/1"),
        ({"allOf": [{"type": "string"}, {"format": "regex"}]}, "format", "#/allOf/1"),
        ({"allOf": [{"type": "number"}, {"minimum": 0}, {"multipleOf": 0.01}]}, "multipleOf", "#/allOf/2"),
        ({"type": "array", "contains": {"type": "integer"}, "minContains": 100_000}, "minContains", "#"),
        ({"items": {"type": "array", "contains": {}, "minContains": 10**9}}, "minContains", "#/items"),
    ],
)
def test_unsupported_keywords_are_reported_at_their_own_schema(schema, keyword, pointer):
    with pytest.raises(UnsupportedSchemaError) as info:
        analyze(schema)
    assert (info.value.keyword, info.value.pointer) == (keyword, pointer)
    assert "nested too deeply" not in str(info.value) and "<regex>" not in str(info.value)


def test_a_pattern_error_message_names_the_pattern_pointer_as_its_source():
    with pytest.raises(UnsupportedSchemaError) as info:
        analyze({"patternProperties": {"(?=a)": {}}})
    assert "#/patternProperties/(?=a):1:1" in str(info.value)


def test_a_missing_reference_is_echoed_as_written():
    with pytest.raises(GrammarError) as info:
        analyze({"$ref": "#/$defs/a~2b", "$defs": {"a": {}}})
    message = str(info.value)
    assert "#/$defs/a~2b does not exist" in message and "~02" not in message


def test_a_reference_with_escapes_still_resolves():
    report = analyze({"$ref": "#/$defs/a~1b~0c", "$defs": {"a/b~c": {"type": "string"}}})
    assert report.grammar.rules


def test_running_out_of_combinations_names_the_disjunction():
    branches = [{"anyOf": [{"properties": {f"p{i}": {"type": "string"}}}, {"properties": {f"p{i}": {"maxLength": 2}}}]}
                for i in range(9)]
    schema = {"properties": {"deep": {"allOf": branches}}}
    with pytest.raises(UnsupportedSchemaError) as info:
        analyze(schema)
    assert info.value.keyword == "anyOf" and info.value.pointer.startswith("#/properties/deep/allOf/")


def test_malformed_values_deep_inside_are_reported_at_their_own_pointer():
    with pytest.raises(GrammarError) as info:
        analyze({"properties": {"a": {"items": {"properties": {"b": {"maxItems": "3"}}}}}})
    assert "malformed schema at #/properties/a/items/properties/b/maxItems" in str(info.value)
