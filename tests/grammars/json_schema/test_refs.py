"""``$ref`` resolution: pointers, escapes, anchors, ``$id`` bases, recursion, sibling rules, errors."""

from __future__ import annotations

import pytest
from schema_check import Checker

from grammars import GrammarError, UnsupportedSchemaError
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    load_schema,
    parse_json_schema,
)

DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT6 = "http://json-schema.org/draft-06/schema#"
DRAFT4 = "http://json-schema.org/draft-04/schema#"

CASES = {
    "defs": ({"$defs": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/n"}}, [[1], ["a"], []]),
    "definitions": ({"definitions": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/definitions/n"}}},
                    [{"a": 1}, {"a": "x"}, {}]),
    "escaped-pointer": (
        {"$defs": {"a/b": {"const": 1}, "c~d": {"const": 2}, "e%f": {"const": 3}, "g h": {"const": 4}},
         "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}, {"$ref": "#/$defs/e%25f"}, {"$ref": "#/$defs/g%20h"}]},
        [[1, 2, 3, 4], [1, 2, 3, 5], [2], []],
    ),
    "pointer-into-properties": (
        {"properties": {"a": {"type": "string", "maxLength": 2}, "b": {"$ref": "#/properties/a"}}},
        [{"b": "xy"}, {"b": "xyz"}, {"b": 1}],
    ),
    "pointer-into-array": ({"anyOf": [{"type": "null"}, {"type": "boolean"}], "items": {"$ref": "#/anyOf/1"}},
                           [[True], [None], None]),
    "anchor": ({"$defs": {"x": {"$anchor": "num", "type": "number"}}, "items": {"$ref": "#num"}}, [[1.5], ["a"]]),
    "draft6-plain-name-id": ({"$schema": DRAFT6, "definitions": {"x": {"$id": "#num", "type": "number"}},
                              "items": {"$ref": "#num"}}, [[1.5], ["a"]]),
    "draft4-id": ({"$schema": DRAFT4, "definitions": {"x": {"id": "#num", "type": "number"}}, "items": {"$ref": "#num"}},
                  [[1.5], ["a"]]),
    "id-relative": (
        {"$id": "http://example.com/root.json",
         "$defs": {"item": {"$id": "item.json", "type": "object", "properties": {"k": {"$ref": "#/$defs/leaf"}},
                            "$defs": {"leaf": {"type": "integer"}}},
                   "leaf": {"type": "string"}},
         "type": "array", "items": {"$ref": "item.json"}},
        [[{"k": 1}], [{"k": "s"}], []],
    ),
    "absolute-ref-to-own-id": ({"$id": "urn:example:root", "$defs": {"a": {"const": 7}},
                                "items": {"$ref": "urn:example:root#/$defs/a"}}, [[7], [8]]),
    "root-recursion": (
        {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}, "additionalProperties": False},
        [{}, {"v": 1, "next": {"v": 2, "next": {}}}, {"next": {"v": "x"}}, {"next": 1}],
    ),
    "mutual-recursion": (
        {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}},
                   "b": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/a"}]}},
         "$ref": "#/$defs/a"},
        [[], [1, [2, [3]]], [1, ["x"]], [[[[[]]]]]],
    ),
    "recursion-through-anyOf-merge": (
        {"$defs": {"node": {"type": "object", "properties": {"c": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
                            "required": ["c"], "additionalProperties": False}},
         "allOf": [{"$ref": "#/$defs/node"}]},
        [{"c": None}, {"c": {"c": None}}, {"c": {"c": {"c": 1}}}, {}],
    ),
    "ref-siblings-apply-2020": ({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2},
                                ["ab", "abc", 1]),
    "ref-siblings-ignored-draft7": ({"$schema": DRAFT7, "definitions": {"s": {"type": "string"}},
                                     "$ref": "#/definitions/s", "maxLength": 2}, ["ab", "abc", 1]),
    "ref-chain": ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"}, "c": {"enum": ["x"]}},
                   "$ref": "#/$defs/a"}, ["x", "y"]),
}


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


@pytest.mark.parametrize("name", sorted(CASES))
def test_refs_agree_with_jsonschema(checker, name):
    schema, instances = CASES[name]
    assert not checker.disagreements(schema, instances, property_order="any")


def test_many_uses_of_one_definition_share_its_rule():
    """A definition used 200 times is compiled once: each use costs the outer object a few
    states (rules), not a copy of the definition (about 100 rules of its own)."""
    defs = {"thing": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20)}}}
    few = {"$defs": defs, "properties": {"a": {"$ref": "#/$defs/thing"}}}
    many = {"$defs": defs, "properties": {f"a{i}": {"$ref": "#/$defs/thing"} for i in range(200)}}

    def size(schema):
        return len(parse_json_schema(load_schema(schema), JsonSchemaOptions()).rules)

    assert size(many) - size(few) < 10 * 200


def test_dangling_ref_names_the_pointer():
    with pytest.raises(GrammarError, match=r"#/\$defs/missing.*#/properties/a") as info:
        parse_json_schema({"properties": {"a": {"$ref": "#/$defs/missing"}}})
    assert not isinstance(info.value, UnsupportedSchemaError)


def test_unknown_anchor_is_an_error():
    with pytest.raises(GrammarError, match="nowhere|no anchor"):
        parse_json_schema({"items": {"$ref": "#nowhere"}})


def test_remote_ref_is_unsupported_with_pointer():
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema({"properties": {"a": {"$ref": "http://json-schema.org/draft-07/schema#"}}})
    assert info.value.keyword == "$ref"
    assert info.value.pointer == "#/properties/a"


def test_remote_ref_relaxed_when_lenient(checker):
    schema = {"properties": {"a": {"$ref": "https://example.com/other.json"}, "b": {"type": "integer"}}}
    assert checker.accepts(schema, '{"a":[1,{}],"b":1}', lenient=True)
    assert not checker.accepts(schema, '{"a":[1,{}],"b":"x"}', lenient=True)


def test_ref_to_non_schema_is_an_error():
    with pytest.raises(GrammarError, match="not a schema"):
        parse_json_schema({"required": ["a"], "items": {"$ref": "#/required"}})
    # a definition that is no schema is malformed before any reference to it is followed
    with pytest.raises(GrammarError, match="malformed schema at #/\\$defs/n"):
        parse_json_schema({"$defs": {"n": 5}, "items": {"$ref": "#/$defs/n"}})


REGISTRY = {
    "http://example.com/common.json": {"$defs": {"id": {"type": "integer", "minimum": 1},
                                                 "name": {"$anchor": "name", "type": "string", "maxLength": 3},
                                                 "rel": {"$ref": "leaf.json"}}},
    "http://example.com/leaf.json": {"enum": ["x", "y"]},
    "http://example.com/old.json": {"$schema": DRAFT7, "type": "string"},
}


@pytest.mark.parametrize("ref, good, bad", [
    ("http://example.com/common.json#/$defs/id", "5", "0"),
    ("http://example.com/common.json#name", '"abc"', '"abcd"'),
    ("http://example.com/common.json#/$defs/rel", '"x"', '"z"'),  # relative to the remote's URI
])
def test_registry_resolves_remote_refs(checker, ref, good, bad):
    schema = {"$ref": ref}
    assert checker.accepts(schema, good, registry=REGISTRY)
    assert not checker.accepts(schema, bad, registry=REGISTRY)


def test_registry_relative_ref_against_own_id(checker):
    schema = {"$id": "http://example.com/main.json", "items": {"$ref": "common.json#/$defs/id"}}
    assert checker.accepts(schema, "[1,2]", registry=REGISTRY)
    assert not checker.accepts(schema, '[1,"a"]', registry=REGISTRY)


def test_registry_missing_uri_and_other_draft_are_unsupported():
    options = JsonSchemaOptions(registry=REGISTRY)
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema({"items": {"$ref": "http://example.com/nope.json"}}, options)
    assert (info.value.keyword, info.value.pointer) == ("$ref", "#/items")
    with pytest.raises(UnsupportedSchemaError, match="draft 7"):
        parse_json_schema({"$ref": "http://example.com/old.json"}, options)


def test_registry_option_is_hashable_and_checked():
    a = JsonSchemaOptions(registry={"http://x/a.json": {"type": "null"}})
    assert a == JsonSchemaOptions(registry=a.registry) and hash(a) == hash(JsonSchemaOptions(registry=a.registry))
    with pytest.raises(TypeError):
        JsonSchemaOptions(registry={"http://x/a.json": 5})
    with pytest.raises(TypeError):
        JsonSchemaOptions(registry=[("a", "b")])


DYNAMIC_CASES = {
    "same-resource": ({"$id": "http://e.com/r", "items": {"$dynamicRef": "#it"}, "$defs": {"f": {"$dynamicAnchor": "it", "type": "string"}}},
                      [["a"], [1], []]),
    "root-anchor-wins": (
        {"$id": "http://e.com/root", "$ref": "list", "$defs": {
            "s": {"$dynamicAnchor": "it", "type": "string"},
            "list": {"$id": "list", "type": "array", "items": {"$dynamicRef": "#it"}, "$defs": {"d": {"$dynamicAnchor": "it"}}}}},
        [["a"], [1], []]),
    "no-bookend-is-a-ref": (
        {"$id": "http://e.com/root", "$ref": "list", "$defs": {
            "s": {"$dynamicAnchor": "it", "type": "string"},
            "list": {"$id": "list", "type": "array", "items": {"$dynamicRef": "#it"}, "$defs": {"d": {"$anchor": "it", "type": "integer"}}}}},
        [["a"], [1]]),
    "recursive-extension": (
        {"$id": "http://e.com/strict", "$dynamicAnchor": "node", "$ref": "tree", "unevaluatedProperties": False,
         "$defs": {"tree": {"$id": "tree", "$dynamicAnchor": "node", "type": "object",
                            "properties": {"v": True, "kids": {"type": "array", "items": {"$dynamicRef": "#node"}}}}}},
        [{"v": 1, "kids": [{"v": 2}]}, {"v": 1, "kids": [{"w": 2}]}, {"x": 1}]),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC_CASES))
def test_dynamic_refs_agree_with_jsonschema(checker, name):
    schema, instances = DYNAMIC_CASES[name]
    assert not checker.disagreements(schema, instances, property_order="any")


def test_dynamic_ref_depending_on_the_path_is_unsupported():
    schema = {"$id": "http://e.com/main", "anyOf": [{"$ref": "a"}, {"$ref": "b"}], "$defs": {
        "g": {"$id": "g", "items": {"$dynamicRef": "#t"}, "$defs": {"d": {"$dynamicAnchor": "t"}}},
        "a": {"$id": "a", "$ref": "g", "$defs": {"t": {"$dynamicAnchor": "t", "type": "string"}}},
        "b": {"$id": "b", "$ref": "g", "$defs": {"t": {"$dynamicAnchor": "t", "type": "integer"}}}}}
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema(schema)
    assert (info.value.keyword, info.value.pointer) == ("$dynamicRef", "#/$defs/g/items")
