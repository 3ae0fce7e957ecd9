"""Typed errors and the lenient report: what fails, with which class, keyword and pointer."""

from __future__ import annotations

import json

import pytest
from schema_check import Checker

from grammars import (
    EmptyLanguageError,
    GrammarError,
    GrammarSyntaxError,
    UnsupportedSchemaError,
    compile_json_schema,
)
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    analyze_json_schema,
    load_schema,
    parse_json_schema,
)


def parse(schema, **options):
    return parse_json_schema(load_schema(schema), JsonSchemaOptions(**options))


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


# --- malformed schemas: GrammarError (not "unsupported") with the pointer ------------------------


@pytest.mark.parametrize(
    "schema, pointer, word",
    [
        ({"type": 5}, "#", "type"),
        ({"type": "strin"}, "#", "strin"),
        ({"properties": {"a": {"type": ["string", 3]}}}, "#/properties/a", "type"),
        ({"properties": []}, "#", "properties"),
        ({"required": "a"}, "#", "required"),
        ({"items": {"minItems": -1}}, "#/items", "minItems"),
        ({"anyOf": []}, "#", "anyOf"),
        ({"enum": "abc"}, "#", "enum"),
        ({"additionalProperties": 3}, "#", "additionalProperties"),
        ({"properties": {"a": 7}}, "#/properties/a", "schema"),
        ({"type": "string", "pattern": "a("}, "#", "pattern"),
    ],
)
def test_malformed_schema_is_a_grammar_error_naming_the_place(schema, pointer, word):
    with pytest.raises(GrammarError) as info:
        parse(schema)
    message = str(info.value)
    assert pointer in message and word in message
    assert not isinstance(info.value, UnsupportedSchemaError) or info.value.keyword == word


def test_false_schema_is_an_empty_language(byte_vocab):
    with pytest.raises(EmptyLanguageError):
        compile_json_schema(False, byte_vocab)
    with pytest.raises(EmptyLanguageError):
        compile_json_schema({"type": "string", "minLength": 3, "maxLength": 2}, byte_vocab)


# --- unsupported keywords: UnsupportedSchemaError(keyword, pointer) -------------------------------


@pytest.mark.parametrize(
    "schema, keyword, pointer",
    [
        ({"properties": {"a": {"type": "array", "uniqueItems": True}}}, "uniqueItems", "#/properties/a"),
        ({"$defs": {"x": {"$id": "http://e.com/x", "$dynamicRef": "#y", "$defs": {"y": {"$dynamicAnchor": "y"}}},
                    "y2": {"$id": "http://e.com/b", "$dynamicAnchor": "y"}},
          "$id": "http://e.com/r", "items": {"$ref": "#/$defs/x"}}, "$dynamicRef", "#/$defs/x"),
        ({"not": {"unevaluatedProperties": False}}, "unevaluatedProperties", "#/not"),
        ({"items": {"oneOf": [{"format": "date"}, {"maxLength": 12}]}}, "oneOf", "#/items"),
        ({"type": "array", "not": {"const": [3]}}, "not", "#"),
        ({"not": {"multipleOf": 2}}, "multipleOf", "#/not"),
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, "$schema", "#"),
        ({"type": "array", "allOf": [{"contains": {"const": i}} for i in range(4)]}, "contains", "#/allOf/0"),
    ],
)
def test_unsupported_keyword_carries_keyword_and_pointer(schema, keyword, pointer):
    with pytest.raises(UnsupportedSchemaError) as info:
        parse(schema)
    assert (info.value.keyword, info.value.pointer) == (keyword, pointer)
    assert keyword in str(info.value) and pointer in str(info.value)


def test_unsupported_keyword_on_an_impossible_type_does_not_matter(checker):
    # uniqueItems constrains arrays only, and the negated multipleOf only numbers: a string-only
    # schema needs neither, so neither raises
    schema = {"type": "string", "uniqueItems": True, "anyOf": [{"minLength": 1}, {"not": {"multipleOf": 3}}]}
    assert checker.accepts(schema, '"x"')
    assert not checker.accepts(schema, '""')


def test_lenient_drops_the_constraint_and_reports_it(checker):
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(lenient=True))
    assert not report.exact
    assert [(r.keyword, r.pointer) for r in report.relaxed] == [("uniqueItems", "#/properties/tags")]
    # the relaxed grammar accepts a superset: duplicates pass, everything else is still enforced
    assert checker.accepts(schema, '{"tags":["a","a"]}', lenient=True)
    assert not checker.accepts(schema, '{"tags":[1]}', lenient=True)


def test_lenient_retries_a_string_without_the_keyword_the_scalars_module_refused(checker):
    schema = {"type": "object", "properties": {"re": {"type": "string", "format": "regex", "maxLength": 3}}}
    with pytest.raises(UnsupportedSchemaError) as info:
        parse(schema)
    assert (info.value.keyword, info.value.pointer) == ("format", "#/properties/re")
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(lenient=True))
    assert [(r.keyword, r.pointer) for r in report.relaxed] == [("format", "#/properties/re")]
    assert checker.accepts(schema, '{"re":"(("}', lenient=True)  # not a regex: format dropped
    assert not checker.accepts(schema, '{"re":"(((("}', lenient=True)  # maxLength kept


def test_lenient_one_of_becomes_any_of(checker):
    schema = {"oneOf": [{"format": "date"}, {"maxLength": 12}]}
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(lenient=True))
    assert [r.keyword for r in report.relaxed] == ["oneOf"]
    assert checker.accepts(schema, "5", lenient=True)


def test_unknown_keywords_are_ignored_and_reported_unless_asked_to_fail():
    schema = {"type": "string", "markdownDescription": "x", "x-vendor": 1, "javaType": "String"}
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions())
    assert report.exact and {k for k, _ in report.ignored} == {"markdownDescription", "x-vendor", "javaType"}
    with pytest.raises(UnsupportedSchemaError) as info:
        parse(schema, unknown_keywords="error")
    assert info.value.keyword in ("markdownDescription", "javaType")
    parse({"type": "string", "x-vendor": 1}, unknown_keywords="error")  # x- is never an error


def test_keywords_of_other_drafts_are_not_keywords():
    report = analyze_json_schema({"$schema": "http://json-schema.org/draft-04/schema#", "const": 1}, JsonSchemaOptions())
    assert ("const", "#") in report.ignored


# --- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, error",
    [
        ({"whitespace": "pretty"}, ValueError),
        ({"whitespace": 1}, TypeError),
        ({"property_order": "alphabetical"}, ValueError),
        ({"max_whitespace": -1}, ValueError),
        ({"max_whitespace": 2.5}, TypeError),
        ({"any_order_limit": 40}, ValueError),
        ({"any_order_budget": -1}, ValueError),
        ({"lenient": "yes"}, TypeError),
        ({"additional_properties_default": None}, TypeError),
        ({"unknown_keywords": "warn"}, ValueError),
        ({"no_such_option": 1}, TypeError),
    ],
)
def test_bad_options_are_typed_errors(byte_vocab, options, error):
    with pytest.raises(error):
        JsonSchemaOptions(**options)
    with pytest.raises(error):
        compile_json_schema({"type": "string"}, byte_vocab, **options)


def test_options_are_frozen_and_hashable():
    options = JsonSchemaOptions(whitespace="flexible")
    assert hash(options) == hash(JsonSchemaOptions(whitespace="flexible"))
    with pytest.raises(AttributeError):
        options.whitespace = "compact"  # type: ignore[misc]


# --- loading ---------------------------------------------------------------------------------------


def test_load_schema_accepts_text_bytes_bools_and_copies_dicts():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert load_schema(json.dumps(schema)) == schema
    assert load_schema(json.dumps(schema).encode()) == schema
    assert load_schema(True) is True
    copy = load_schema(schema)
    copy["properties"]["a"]["type"] = "integer"
    assert schema["properties"]["a"]["type"] == "string"


def test_load_schema_from_a_pydantic_model(checker):
    pydantic = pytest.importorskip("pydantic")

    class Point(pydantic.BaseModel):
        x: int
        label: str | None = None

    document = load_schema(Point)
    assert document["required"] == ["x"]
    assert checker.accepts(Point, '{"x":1,"label":null}')
    assert not checker.accepts(Point, '{"label":"a"}')


def test_bad_json_text_is_a_syntax_error_with_position():
    with pytest.raises(GrammarSyntaxError) as info:
        load_schema('{"type": "object",\n  "properties": {,}}')
    assert info.value.line == 2


@pytest.mark.parametrize("value", [5, [{"type": "string"}], None, {1: "a"}, {"const": float("nan")}, {"enum": [{1, 2}]}])
def test_not_a_schema_document(value):
    with pytest.raises(GrammarError):
        load_schema(value)


def test_max_combinations_bounds_the_leaves():
    schema = {"allOf": [{"anyOf": [{"properties": {f"p{i}": {"type": "string"}}}, {"properties": {f"p{i}": {"maxLength": 2}}}]}
                        for i in range(9)]}  # 2**9 leaves
    with pytest.raises(UnsupportedSchemaError, match="more than 256 combinations") as info:
        parse(schema)
    assert info.value.keyword == "anyOf"
    assert parse_json_schema(load_schema(schema), JsonSchemaOptions(max_combinations=1024)).rules
    with pytest.raises(ValueError):
        JsonSchemaOptions(max_combinations=0)
