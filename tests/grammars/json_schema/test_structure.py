"""Keyword families of the JSON Schema front end, judged against ``jsonschema`` on concrete texts.

Every case is (schema, instances): each instance is serialized (compactly, with ``ensure_ascii``
both ways, and pretty-printed under flexible whitespace) and the compiled grammar must accept a
text exactly when ``jsonschema`` says the instance is valid. Cases that exercise key order use
``property_order="any"`` (every order is valid JSON Schema-wise); the order policies themselves
are tested separately.
"""

from __future__ import annotations

import pytest
from schema_check import Checker

from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    analyze_json_schema,
    load_schema,
)
from grammars.ir import Alt

DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"

ANY = [None, True, False, 0, -1, 2.5, "", "a", [], [1, "a"], {}, {"a": 1}]

CASES = {
    # --- types -----------------------------------------------------------------------------
    "type-each": ({"type": "null"}, ANY),
    "type-boolean": ({"type": "boolean"}, ANY),
    "type-integer": ({"type": "integer"}, ANY + [-7, 10**20]),  # 3.0: integer texts only (scalars)
    "type-number": ({"type": "number"}, ANY + [1e-5, -0.0]),
    "type-list": ({"type": ["string", "null"]}, ANY),
    "type-integer-number": ({"type": ["integer", "number"]}, ANY),
    "true": (True, ANY),
    "false": (False, ANY),
    "empty": ({}, ANY),
    # --- enum / const ----------------------------------------------------------------------
    "enum-mixed": ({"enum": ["a", 1, None, True, [1, "x"], {"k": [1, 2], "j": "v"}]},
                   ANY + [1.0, True, ["x", 1], {"j": "v", "k": [1, 2]}, {"k": [1, 2]}, "A", "\u00e9"]),
    "enum-with-type": ({"type": "string", "enum": ["a", 1, "b"]}, ["a", "b", 1, "c"]),
    "const-number": ({"const": 1}, [1, 1.0, True, "1", 2]),
    "const-string-escapes": ({"const": 'q"\\/\u00e9\n'}, ['q"\\/\u00e9\n', "q", 'q"\\/e\n']),
    "const-false": ({"const": False}, [False, 0, None, True]),
    "enum-and-const": ({"enum": [1, 2, 3], "const": 2}, [1, 2, 3]),
    # --- objects ---------------------------------------------------------------------------
    "properties-required": (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]},
        [{"a": 1}, {"a": 1, "b": "x"}, {"b": "x"}, {"a": "x"}, {"a": 1, "c": [1]}, {"c": 1, "a": 1}, {}, [], 1],
    ),
    "additional-false": (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "additionalProperties": False},
        [{}, {"a": 1}, {"a": 1, "b": None}, {"a": 1, "c": 1}, {"c": 1}, {"a": "x"}],
    ),
    "additional-schema": (
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}},
        [{}, {"a": "x"}, {"a": 1}, {"b": 1}, {"b": "x"}, {"a": "x", "b": 2, "c": 3}],
    ),
    "required-not-declared": (
        {"type": "object", "properties": {"a": {}}, "required": ["a", "z"]},
        [{"a": 1}, {"a": 1, "z": 2}, {"z": 2}],
    ),
    "required-forbidden": (
        {"type": "object", "properties": {"a": {}}, "required": ["z"], "additionalProperties": False},
        [{}, {"a": 1}, {"z": 1}],
    ),
    "properties-false": (
        {"type": "object", "properties": {"a": False, "b": {"type": "integer"}}},
        [{}, {"a": 1}, {"b": 1}, {"b": 1, "c": 2}],
    ),
    "min-max-properties": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1, "maxProperties": 2},
        [{}, {"a": 1}, {"x": 1}, {"a": 1, "b": 2}, {"a": 1, "x": 2}, {"a": 1, "b": 2, "x": 3}, {"x": 1, "y": 2, "z": 3}],
    ),
    "max-properties-closed": (
        {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "additionalProperties": False, "maxProperties": 1},
        [{}, {"a": 1}, {"a": 1, "b": 2}, {"c": 3}],
    ),
    "pattern-properties-closed": (
        {"type": "object", "properties": {"id": {"type": "string"}},
         "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
        [{}, {"id": "a"}, {"x-a": 1}, {"x-a": "s"}, {"y": 1}, {"id": 1}, {"id": "a", "x-b": 2, "x-c": 3}],
    ),
    "pattern-properties-open": (
        {"type": "object", "patternProperties": {"^x-": {"type": "integer"}, "y$": {"type": "string"}}},
        [{}, {"x-a": 1}, {"x-a": "s"}, {"ay": "s"}, {"ay": 1}, {"x-y": 1}, {"x-y": "s"}, {"z": None}],
    ),
    "pattern-properties-additional": (
        {"type": "object", "properties": {"x-known": {"type": "boolean"}},
         "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
        [{}, {"x-a": 1}, {"x-a": "s"}, {"b": "s"}, {"b": 1}, {"x-known": True}, {"x-known": 1}],
    ),
    "pattern-matches-declared-name": (
        {"type": "object", "properties": {"id": {"type": "string"}},
         "patternProperties": {"^[0-9a-z]{1,30}$": {"type": "integer"}}, "additionalProperties": False},
        [{}, {"id": "x"}, {"id": 1}, {"ab": 1}, {"ab": "x"}, {"AB": 1}, {"id": "x", "b2": 3}],
    ),
    "property-names-pattern": (
        {"type": "object", "propertyNames": {"pattern": "^[a-c]+$"}, "properties": {"ab": {"type": "integer"}}},
        [{}, {"a": 1}, {"d": 1}, {"ab": 1}, {"ab": "x"}, {"abc": [], "b": None}],
    ),
    "property-names-enum": (
        {"type": "object", "propertyNames": {"enum": ["a", "b"]}, "properties": {"a": {"type": "integer"}}},
        [{}, {"a": 1}, {"a": "x"}, {"b": "x"}, {"c": 1}, {"b": 1, "a": 2}],
    ),
    "property-names-not": (
        {"type": "object", "propertyNames": {"not": {"enum": ["x", "y"]}, "maxLength": 3}},
        [{}, {"x": 1}, {"a": 1}, {"abcd": 1}, {"xy": 2}],
    ),
    "escaped-known-key": (
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        [{"a": 1}, {"a": "x"}, {"\u00e9": "x"}, {"\u00e9a": 1}],
    ),
    # --- arrays ----------------------------------------------------------------------------
    "items-bounds": ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
                     [[], [1], [1, 2, 3], [1, 2, 3, 4], ["a"], [1, "a"]]),
    "prefix-items": ({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
                     [[], [1], [1, "a"], [1, "a", 2], ["a"], "x"]),
    "prefix-items-rest": ({"type": "array", "prefixItems": [{"const": 0}], "items": {"type": "string"}, "minItems": 2},
                          [[], [0], [0, "a"], [0, "a", "b"], [1, "a"], [0, 1]]),
    "items-array-draft7": ({"$schema": DRAFT7, "items": [{"type": "integer"}], "additionalItems": {"type": "null"}},
                           [[], [1], [1, None], [1, None, None], [1, 2], ["a"]]),
    "contains": ({"type": "array", "contains": {"const": 1}}, [[], [1], [2, 1, 3], [2, 3], [1, 1]]),
    "min-contains": ({"$schema": DRAFT2019, "type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}, "minContains": 2},
                     [[], [5], [5, 6], [1, 5, 2, 7], [5, "x", 6], [1, 2]]),
    "unique-single": ({"type": "array", "uniqueItems": True, "maxItems": 1}, [[], [1], [1, 1]]),
    # --- combinators -----------------------------------------------------------------------
    "anyOf": ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 3}]}, ANY + [3, 2, "abc"]),
    "anyOf-siblings": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
        [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"c": 1}, "x"],
    ),
    "oneOf-types": ({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}, ANY + [["a"]]),
    "oneOf-discriminator": (
        {"type": "object", "oneOf": [
            {"properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
            {"properties": {"kind": {"const": "b"}, "x": {"type": "string"}}, "required": ["kind"]}]},
        [{"kind": "a", "x": 1}, {"kind": "b", "x": "s"}, {"kind": "a", "x": "s"}, {"kind": "c"}, {}],
    ),
    "oneOf-enums": ({"oneOf": [{"enum": [1, 2]}, {"enum": [3, "x"]}]}, [1, 2, 3, "x", 4]),
    # overlapping branches: each branch minus the others
    "oneOf-required-exclusive": ({"type": "object", "properties": {"a": {}, "b": {}}, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
                                 [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"c": 1}]),
    "oneOf-overlapping-enums": ({"oneOf": [{"enum": [1, 2]}, {"enum": [2, 3]}]}, [1, 2, 3, 4]),
    "oneOf-string-or-enum": ({"oneOf": [{"type": "string"}, {"enum": ["a", 1]}]}, ["a", "b", 1, 2]),
    "oneOf-ranges": ({"type": "integer", "oneOf": [{"minimum": 3}, {"maximum": 5}]}, [1, 3, 4, 5, 6]),
    "oneOf-properties": ({"type": "object", "oneOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"a": {"type": "integer"}}}]},
                         [{}, {"a": 1}, {"a": "x"}, {"a": None}]),
    "allOf-merge": (
        {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                   {"properties": {"a": {"minimum": 2}, "b": {"type": "string"}}, "required": ["a"]},
                   {"additionalProperties": False, "properties": {"a": True, "b": True}}]},
        [{"a": 1}, {"a": 2}, {}, {"a": 2, "b": "s"}, {"a": 2, "b": 1}, {"a": 2, "c": 1}],
    ),
    "allOf-closed-branch": (
        {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]},
        [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 1}],
    ),
    "allOf-strings": ({"allOf": [{"type": "string", "minLength": 2}, {"maxLength": 3}, {"pattern": "a"}, {"pattern": "b"}]},
                      ["ab", "ba", "a", "abab", "cab", "aa", 5]),
    "not-type": ({"not": {"type": ["string", "object"]}}, ANY),
    "not-enum-string": ({"type": "string", "not": {"enum": ["a", "b"]}}, ["a", "b", "c", "", "ab"]),
    "not-required": ({"type": "object", "not": {"required": ["a"]}}, [{}, {"a": 1}, {"b": 1}]),
    "not-anyOf": ({"not": {"anyOf": [{"type": "string"}, {"type": "number", "minimum": 3}]}}, ANY + [3, 2]),
    "not-pattern": ({"type": "string", "pattern": "^a", "not": {"pattern": "b"}}, ["a", "ab", "ba", "ac", "b"]),
    "not-properties": ({"type": "object", "not": {"properties": {"a": {"const": "x"}}}}, [{}, {"a": "x"}, {"a": "y"}, {"b": "x"}]),
    "not-bounds": ({"not": {"minimum": 3, "maxLength": 2}}, ANY + [3, 2, "abc", "ab"]),
    "if-then-else": (
        {"$schema": DRAFT7, "if": {"properties": {"t": {"const": "x"}}, "required": ["t"]},
         "then": {"required": ["a"]}, "else": {"required": ["b"]}},
        [{"t": "x", "a": 1}, {"t": "x"}, {"t": "y", "b": 1}, {"t": "y"}, {"b": 1}, {}, 5],
    ),
    "dependencies-draft7": (
        {"$schema": DRAFT7, "type": "object", "dependencies": {"a": ["b"], "c": {"required": ["d"]}}},
        [{}, {"a": 1}, {"a": 1, "b": 2}, {"c": 1}, {"c": 1, "d": 1}, {"b": 1}],
    ),
    "dependent-required": ({"type": "object", "dependentRequired": {"a": ["b"]}}, [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": 1}]),
    "dependencies-ignored-2020": ({"type": "object", "dependencies": {"a": ["b"]}}, [{"a": 1}, {}]),
    "const-ignored-draft4": ({"$schema": DRAFT4, "const": 1}, [1, 2]),
    # --- scalars through the structure -------------------------------------------------------
    "string-lengths": ({"type": "string", "minLength": 1, "maxLength": 3}, ["", "a", "abc", "abcd", "\u00e9\u00e9"]),
    "integer-range": ({"type": "integer", "minimum": -2, "exclusiveMaximum": 5}, [-3, -2, 0, 4, 5, 1.5]),
    "draft4-exclusive": ({"$schema": DRAFT4, "type": "number", "minimum": 0, "exclusiveMinimum": True}, [0, 0.5, -1, 1]),
}


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


@pytest.mark.parametrize("name", sorted(CASES))
def test_agrees_with_jsonschema(checker, name):
    schema, instances = CASES[name]
    assert not checker.disagreements(schema, instances, property_order="any")


@pytest.mark.parametrize("name", ["properties-required", "anyOf-siblings", "pattern-properties-closed", "enum-mixed", "items-bounds"])
def test_agrees_with_flexible_whitespace(checker, name):
    schema, instances = CASES[name]
    assert not checker.disagreements(schema, instances, whitespace="flexible", property_order="any")


# --- layout ---------------------------------------------------------------------------------

OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"}}, "required": ["a"]}


def test_compact_whitespace_rejects_insignificant_whitespace(checker):
    assert checker.accepts(OBJECT, '{"a":1,"b":[]}')
    for text in ('{ "a":1}', '{"a": 1}', '{"a":1 }', ' {"a":1}', '{"a":1,"b":[ ]}', '{"a":1}\n'):
        assert not checker.accepts(OBJECT, text), text


def test_flexible_whitespace_is_bounded_per_run(checker):
    options = {"whitespace": "flexible", "max_whitespace": 3}
    assert checker.accepts(OBJECT, '\n{ "a" :\t1 ,\r\n"b":[ ] }  ', **options)
    assert checker.accepts(OBJECT, '{   "a":1}', **options)
    assert not checker.accepts(OBJECT, '{    "a":1}', **options)
    assert not checker.accepts(OBJECT, '{"a":1,"b":[    ]}', **options)
    assert not checker.accepts(OBJECT, '{"a":1\x0b}', **options)  # vertical tab is not JSON whitespace


def test_whitespace_inside_strings_is_content(checker):
    schema = {"type": "string", "maxLength": 2}
    assert checker.accepts(schema, '"  "', whitespace="flexible")
    assert not checker.accepts(schema, '"   "', whitespace="flexible")


def test_schema_order_accepts_extras_anywhere_but_declared_keys_in_order(checker):
    schema = {"type": "object", "properties": {"a": {}, "b": {}}}
    for text in ('{"a":1,"b":2}', '{"x":0,"a":1,"y":0,"b":2,"z":0}', '{"b":2}', "{}"):
        assert checker.accepts(schema, text), text
    assert not checker.accepts(schema, '{"b":2,"a":1}')
    assert checker.accepts(schema, '{"b":2,"a":1}', property_order="any")


def test_required_first_order(checker):
    schema = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "required": ["c"], "additionalProperties": False}
    assert checker.accepts(schema, '{"c":3,"a":1,"b":2}', property_order="required_first")
    assert not checker.accepts(schema, '{"a":1,"c":3}', property_order="required_first")
    assert checker.accepts(schema, '{"a":1,"c":3}', property_order="schema")


def test_any_order_falls_back_to_schema_order_beyond_the_limit(checker):
    """With a property count bound, members cannot repeat (see the next test): schema order."""
    names = [f"p{i}" for i in range(6)]
    schema = {"type": "object", "properties": {n: {} for n in names}, "required": names[:5], "additionalProperties": False,
              "maxProperties": 5}
    in_order = "{" + ",".join(f'"{n}":0' for n in names[:5]) + "}"
    reversed_ = "{" + ",".join(f'"{n}":0' for n in reversed(names[:5])) + "}"
    assert checker.accepts(schema, reversed_, property_order="any", any_order_limit=6)
    assert checker.accepts(schema, in_order, property_order="any", any_order_limit=4)
    assert not checker.accepts(schema, reversed_, property_order="any", any_order_limit=4)
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(property_order="any", any_order_limit=4))
    assert report.narrowed and report.exact


def test_property_count_bounds_every_object_meets_are_dropped(checker):
    """``maxProperties`` no closed object can exceed, and ``minProperties`` its required members
    already meet, constrain nothing: without them a large object may use the repeating any-order
    layout (every order accepted, nothing narrowed)."""
    names = [f"p{i}" for i in range(5)]
    schema = {"type": "object", "properties": {n: {} for n in names}, "required": names[:3], "additionalProperties": False,
              "maxProperties": 5, "minProperties": 3}
    text = "{" + ",".join(f'"{n}":0' for n in reversed(names)) + "}"
    assert checker.accepts(schema, text, property_order="any", any_order_limit=4)
    assert not checker.accepts(schema, '{"p0":0,"p1":0}', property_order="any", any_order_limit=4)
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(property_order="any", any_order_limit=4))
    assert not report.narrowed_values


def test_large_any_order_objects_repeat_members_but_stay_exact(checker):
    """Beyond ``any_order_limit``, any order with required-member tracking; a declared member may
    appear again, each occurrence checked (a JSON parser keeps the last one), so every accepted
    text is valid and nothing is narrowed."""
    names = [f"p{i}" for i in range(12)]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": ["p3", "p7"],
              "additionalProperties": False}

    def text(pairs):
        return "{" + ",".join(f'"{k}":{v}' for k, v in pairs) + "}"

    shuffled = [(n, i) for i, n in enumerate(names)][::-1]
    assert checker.accepts(schema, text(shuffled), property_order="any")
    assert checker.accepts(schema, text([("p7", 1), ("p3", 2)]), property_order="any")
    assert checker.accepts(schema, text([("p7", 1), ("p1", 0), ("p3", 2), ("p1", 5)]), property_order="any")
    assert not checker.accepts(schema, text([("p7", 1), ("p1", 0)]), property_order="any")  # p3 missing
    assert not checker.accepts(schema, text([("p7", 1), ("p3", 2), ("p5", '"x"')]), property_order="any")
    assert not checker.accepts(schema, text([("p7", 1), ("p3", 2), ("p3", '"x"')]), property_order="any")
    assert not checker.accepts(schema, text([("p7", 1), ("p3", 2), ("zz", 0)]), property_order="any")
    assert not checker.accepts(schema, "{}", property_order="any")
    open_schema = {**schema, "additionalProperties": {"type": "string"}}
    assert checker.accepts(open_schema, text([("zz", '"s"'), ("p7", 1), ("p3", 2)]), property_order="any")
    assert not checker.accepts(open_schema, text([("zz", 0), ("p7", 1), ("p3", 2)]), property_order="any")
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(property_order="any"))
    assert not report.narrowed_values
    optional_only = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    assert checker.accepts(optional_only, "{}", property_order="any")
    assert checker.accepts(optional_only, text([("p11", 1), ("x", '"y"'), ("p0", 2)]), property_order="any")


def test_any_order_budget_spent_later_objects_repeat_members(checker):
    """A schema's exact any-order layouts share ``any_order_budget`` subset states: the objects
    built after it is spent repeat members (every order, every value checked, a key may repeat),
    while objects of at most 4 properties and objects with property count bounds stay exact."""
    def obj(n, **extra):
        return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
                "additionalProperties": False, **extra}

    schema = {"type": "object", "properties": {"a": obj(5), "b": obj(5), "small": obj(4),
                                               "counted": obj(5, maxProperties=3)}}
    twice = '{"p3":1,"p0":1,"p3":2}'
    for budget, exact in ((64, ("a", "b")), (32, ("a",)), (0, ())):
        for name in ("a", "b"):
            accepted = checker.accepts(schema, f'{{"{name}":{twice}}}', property_order="any", any_order_budget=budget)
            assert accepted == (name not in exact), (budget, name)
            assert checker.accepts(schema, f'{{"{name}":{{"p4":0,"p1":1}}}}', property_order="any",
                                   any_order_budget=budget)
            assert not checker.accepts(schema, f'{{"{name}":{{"p4":0,"p1":"x"}}}}', property_order="any",
                                       any_order_budget=budget)
            assert not checker.accepts(schema, f'{{"{name}":{{"p4":0,"p3":1,"p3":"x"}}}}', property_order="any",
                                       any_order_budget=budget)
        assert not checker.accepts(schema, '{"small":{"p3":1,"p0":1,"p3":2}}', property_order="any",
                                   any_order_budget=budget)
        assert not checker.accepts(schema, '{"counted":' + twice + "}", property_order="any", any_order_budget=budget)
        assert checker.accepts(schema, '{"counted":{"p4":0,"p1":1,"p0":2}}', property_order="any",
                               any_order_budget=budget)
        assert not checker.accepts(schema, '{"counted":{"p4":0,"p1":1,"p0":2,"p2":3}}', property_order="any",
                                   any_order_budget=budget)
        options = JsonSchemaOptions(property_order="any", any_order_budget=budget)
        report = analyze_json_schema(load_schema(schema), options)
        assert not any("order" in note for note in report.narrowed) and report.exact


def test_many_required_members_follow_properties_or_required_order(checker):
    """Too many required members to track as a subset: optional members anywhere (repeats
    allowed, each checked), required ones once each, in the order of ``properties`` or of
    ``required``; other orders and repeated required members are rejected (a reported
    narrowing), invalid texts always are."""
    names = [f"p{i}" for i in range(12)]
    required = [f"p{i}" for i in (9, 1, 7, 3, 5, 0, 2, 4)]  # 8 required, not in properties order
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": required,
              "additionalProperties": False}

    def text(keys, value="0"):
        return "{" + ",".join(f'"{k}":{value}' for k in keys) + "}"

    by_properties = [n for n in names if n in required]
    assert checker.accepts(schema, text(by_properties), property_order="any")
    assert checker.accepts(schema, text(required), property_order="any")
    assert checker.accepts(schema, text(["p11", *required[:3], "p6", "p6", *required[3:], "p10"]), property_order="any")
    again = ["p11", *required[:3], "p6", required[0], *required[3:]]  # a required member met again
    assert not checker.accepts(schema, text(again), property_order="any")
    swapped = [required[1], required[0], *required[2:]]
    assert not checker.accepts(schema, text(swapped), property_order="any")  # neither order
    assert not checker.accepts(schema, text(required[:-1]), property_order="any")  # p4 missing
    assert not checker.accepts(schema, text(required, value='"x"'), property_order="any")
    assert not checker.accepts(schema, text([*required, "zz"]), property_order="any")
    report = analyze_json_schema(load_schema(schema), JsonSchemaOptions(property_order="any"))
    assert any("order of 'properties' or of 'required'" in note for note in report.narrowed)
    assert report.exact


def _alternatives(grammar) -> int:
    """Items of every alternative in ``grammar``'s rules: how many productions they lower to."""
    total = 0
    stack = [expr for _, expr in grammar.rules]
    while stack:
        node = stack.pop()
        items = getattr(node, "items", None)
        if items is not None:
            total += len(items) if isinstance(node, Alt) else 0
            stack.extend(items)
        elif hasattr(node, "item"):
            stack.append(node.item)
    return total


def test_many_required_members_grow_the_grammar_linearly():
    """The required-order layout has a state per position, each naming the next member: linear.
    (When each position could repeat every member met before it, a flat alternative per
    position made 587 required members 173,000 productions.)"""
    def size(n: int) -> int:
        names = [f"p{i}" for i in range(n)]
        schema = {"type": "object", "properties": {name: {"type": "integer"} for name in names}, "required": names}
        return _alternatives(analyze_json_schema(load_schema(schema), JsonSchemaOptions(property_order="any")).grammar)

    small, large = size(64), size(256)
    assert large < 5 * small  # quadratic: 16 times


def test_repeating_layout_is_kept_off_ambiguous_recursive_leaves(checker):
    """``dependentRequired`` splits an object into leaves that stay alive together until the object
    ends; when its members also lead back to the object (recursion), the live parses would
    multiply with the depth, so those leaves keep schema order (narrowed). Without recursion
    the leaves repeat members freely."""
    props = {f"p{i}": {"type": "integer"} for i in range(10)}
    flat = {"type": "object", "properties": props, "dependentRequired": {"p0": ["p1"]}}
    report = analyze_json_schema(load_schema(flat), JsonSchemaOptions(property_order="any"))
    assert not report.narrowed_values
    assert checker.accepts(flat, '{"p1":1,"p0":0}', property_order="any")
    assert not checker.accepts(flat, '{"p2":1,"p0":0}', property_order="any")  # p0 needs p1
    recursive = {"type": "object", "properties": {**props, "child": {"$ref": "#"}}, "dependentRequired": {"p0": ["p1"]}}
    report = analyze_json_schema(load_schema(recursive), JsonSchemaOptions(property_order="any"))
    assert any("any_order_limit" in note for note in report.narrowed)
    assert checker.accepts(recursive, '{"p0":0,"p1":1,"child":{"p3":3}}', property_order="any")


@pytest.mark.parametrize("required", [[], ["p1", "p4"]])
def test_repeating_layout_keeps_the_parser_stack_flat(checker, required):
    """After each member of the repeating layout the match state is the same whatever members came
    before (lists are left-recursive: a member is reduced into the list, not pushed as a level),
    so what a mask computed at one member boundary is cached under serves every later one."""
    props = {f"p{i}": {"type": "integer"} for i in range(12)}
    schema = {"type": "object", "properties": props, "required": required}
    matcher_of = checker.compile(schema, property_order="any").matcher

    def state_after(text: str):
        matcher, data = matcher_of(), list(text.encode())
        assert matcher.try_advance(data) == len(data), text
        return matcher.state

    head = "".join(f'"{name}":0,' for name in required)
    once = state_after("{" + head + '"p9":1,')
    assert once == state_after("{" + head + '"p9":1,"p10":2,"p9":3,"p11":4,')
    assert once == state_after("{" + head + '"p11":1,"p9":2,')
    assert checker.accepts(schema, "{" + head + '"p9":1,"p10":2,"p9":3}', property_order="any")


@pytest.mark.parametrize(("order", "declared"), [
    ("any", {}), ("schema", {}), ("schema", {"p": {"type": "integer"}, "q": {"type": "string"}})])
def test_runs_of_extra_members_keep_the_parser_stack_flat(checker, order, declared):
    """The same for runs of undeclared members (a dictionary after its first member, or an open
    object in schema order after a declared member): each extra member leaves the match state as
    it found it. (An any-order state takes its extra members itself, right-recursively: extra
    members among a few declared ones are rare, and a run there would add a rule per state.)"""
    schema = {"type": "object", "properties": declared, "additionalProperties": {"type": "integer"}}
    matcher_of = checker.compile(schema, property_order=order).matcher

    def state_after(text: str):
        matcher, data = matcher_of(), list(text.encode())
        assert matcher.try_advance(data) == len(data), text
        return matcher.state

    head = '"p":1,' if declared else '"w":0,'  # the first member of a dictionary is not in a run
    once = state_after("{" + head + '"x":1,')
    assert once == state_after("{" + head + '"x":1,"y":2,"x":3,')
    assert checker.accepts(schema, "{" + head + '"x":1,"y":2}', property_order=order)
    assert not checker.accepts(schema, "{" + head + '"x":1,"y":"2"}', property_order=order)


def test_duplicate_declared_keys_are_rejected(checker):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not checker.accepts(schema, '{"a":1,"a":2}', property_order="any")
    assert not checker.accepts(schema, '{"a":1,"\\u0061":"x"}', property_order="any")


def test_additional_properties_default_false_mimics_closed_objects(checker):
    schema = {"type": "object", "properties": {"a": {}}}
    assert checker.accepts(schema, '{"a":1,"b":2}')
    assert not checker.accepts(schema, '{"a":1,"b":2}', additional_properties_default=False)
    assert checker.accepts(schema, '{"a":1}', additional_properties_default=False)


def test_recursive_schema_accepts_deep_instances(checker):
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "additionalProperties": False}
    deep = {}
    for _ in range(30):
        deep = {"kids": [deep, {}]}
    assert not checker.disagreements(tree, [deep, {"kids": [{"kids": [{"x": 1}]}]}])


@pytest.mark.parametrize("bounds", [{}, {"maxProperties": 4}, {"minProperties": 2}])
def test_any_order_open_object_takes_extras_between_members_in_every_order(checker, bounds):
    """Every order of the declared members, with undeclared ones before, between and after
    them (the states that take their own extra members, and the counted ones that cannot)."""
    import itertools

    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "null"}},
              "required": ["b"], **bounds}
    instances = []
    for size in range(4):
        for names in itertools.permutations("abc", size):
            for extra_at in range(-1, size + 1):
                members = [(n, {"a": 1, "b": "s", "c": None}[n]) for n in names]
                if extra_at >= 0:
                    members.insert(extra_at, ("x", [True]))
                    members.insert(extra_at, ("y", 2))
                instances.append(dict(members))
    instances += [{"b": 3}, {"b": "s", "a": "t"}, {"b": "s", "c": 0}]
    assert not checker.disagreements(schema, instances, property_order="any")
    for duplicated in ('{"b":"s","a":1,"a":2}', '{"a":1,"b":"s","x":1,"b":"t"}', '{"c":null,"b":"s","c":null}'):
        assert not checker.accepts(schema, duplicated, property_order="any"), duplicated
