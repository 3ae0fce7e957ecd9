"""Negations under old drafts, and disjointness tests on recursive schemas.

Both were found by the full MaskBench run: a draft-04 ``not``/``oneOf`` over ``items`` accepted
every array (the negation is written with ``contains``, which the draft-04 keyword filter
dropped), and a recursive ``oneOf`` sent the disjointness test into unbounded recursion. A
negation the rest of its conjunction already implies is dropped (provably disjoint from it).
"""

from __future__ import annotations

import json

import pytest
from schema_check import Checker, oracle

from grammars import UnsupportedSchemaError
from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    load_schema,
    parse_json_schema,
)

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT6 = "http://json-schema.org/draft-06/schema#"


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


NEGATIONS = [
    ({"not": {"items": {"type": "string"}}}, [[], ["a"], [1], ["a", 1], {}, 1]),
    ({"not": {"items": {"properties": {}}}}, [[], [1], {}]),
    ({"oneOf": [{"properties": {"m": {"items": {"properties": {}}}}}, {}]}, [{"m": []}, {"m": [1]}, {}, 1]),
    ({"not": {"required": ["a"]}}, [{"a": 1}, {}, 1]),
    ({"not": {"maxItems": 1}}, [[], [1], [1, 2]]),
]


@pytest.mark.parametrize("draft", [DRAFT4, DRAFT6, None])
@pytest.mark.parametrize("schema,instances", NEGATIONS)
def test_negations_follow_the_documents_draft(checker, draft, schema, instances):
    schema = dict(schema, **({"$schema": draft} if draft else {}))
    validator = oracle(schema)
    for instance in instances:
        text = json.dumps(instance, separators=(",", ":"))
        assert checker.accepts(schema, text, whitespace="flexible") == validator.is_valid(instance), (schema, text)


def test_negated_tuple_items_are_refused(checker):
    with pytest.raises(UnsupportedSchemaError) as info:
        checker.compile({"$schema": DRAFT4, "not": {"items": [{"type": "string"}]}})
    assert info.value.keyword == "items" and info.value.pointer == "#/not"


def test_keywords_a_draft_does_not_define_stay_ignored(checker):
    """The fix keeps the filter for the document's own schemas: draft-04 has no ``contains``."""
    schema = {"$schema": DRAFT4, "contains": {"type": "string"}}
    assert checker.accepts(schema, "[1]") and oracle(schema).is_valid([1])


def test_recursive_one_of_refuses_instead_of_recursing(checker):
    from shared_data import shared_path

    path = shared_path("jsonschemabench", "maskbench", "Github_hard---o82273.json")
    schema = json.loads(path.read_text(encoding="utf-8"))["schema"]
    try:
        compiled = checker.compile(schema, whitespace="flexible", property_order="any")
    except UnsupportedSchemaError as exc:  # a typed refusal is fine; a RecursionError is not
        assert exc.keyword and exc.pointer
    else:
        assert compiled.matcher() is not None


def test_value_checks_are_memoised_per_schema_and_json_text(monkeypatch):
    """``SchemaCompiler.satisfies`` asks ``jsonschema`` once per (schema, value): the leaves of an
    expanded ``anyOf`` filter the same ``enum`` values against the same atoms (one schema took
    115,000 checks). The key is the value's JSON text, so draft 4's ``1`` (an integer) and ``1.0``
    (not one) are judged apart."""
    from grammars.frontends.json_schema import combinators
    from grammars.frontends.json_schema.compiler import SchemaCompiler
    from grammars.frontends.json_schema.document import SchemaDocument
    from grammars.frontends.json_schema.options import JsonSchemaOptions

    calls = []
    evaluate = combinators.evaluate
    monkeypatch.setattr(combinators, "evaluate", lambda c, part, value, enum_known=False: calls.append(value) or evaluate(c, part, value, enum_known))
    compiler = SchemaCompiler(SchemaDocument.of({"$schema": DRAFT4, "type": "integer"}), JsonSchemaOptions())
    root = compiler.document.located_root()
    assert [compiler.satisfies(v, root) for v in (1, 1, 1.0, 1.0, "1", 1)] == [True, True, False, False, False, True]
    assert calls == [1, 1.0, "1"]


def test_an_enum_union_is_not_validated_again_for_its_own_members(monkeypatch, checker):
    """An ``anyOf`` of one-enum branches is applied as the union of their values, so the enum's
    members pass it by construction: filtering them asks only the schema's other keywords (a
    ``pattern`` here, searched without a validator), not ``jsonschema`` over every branch."""
    from grammars.frontends.json_schema.compiler import SchemaCompiler

    built = []
    validator = SchemaCompiler.validator
    monkeypatch.setattr(SchemaCompiler, "validator", lambda self, pointer, node: built.append(pointer) or validator(self, pointer, node))
    schema = {"anyOf": [{"const": "x"}, {"const": "y"}, {"enum": ["z", 1]}], "pattern": "^[xy1]$"}
    accepted = [text for text in ('"x"', '"y"', '"z"', "1") if checker.accepts(schema, text)]
    assert accepted == ['"x"', '"y"', "1"] and [oracle(schema).is_valid(json.loads(t)) for t in accepted] == [True] * 3
    assert built == []


def test_enum_under_nested_any_of_matches_the_oracle(checker):
    """``enum`` values filtered leaf by leaf of two nested ``anyOf``s (the memoised checks above)."""
    schema = {"enum": ["ab", "abc", "b", 1, 1.5, "abcdef"],
              "allOf": [{"anyOf": [{"maxLength": 3}, {"minLength": 5}]},
                        {"anyOf": [{"pattern": "^a"}, {"type": "number", "minimum": 1.2}]}]}
    assert checker.disagreements(schema, ["ab", "abc", "b", 1, 1.5, "abcdef", "a", "abcd"]) == []


INTEGER_ENUMS = [
    {"type": "integer", "enum": [1, 2]},
    {"enum": [1, 2.5], "anyOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},
    {"type": "array", "items": {"type": "integer"}, "enum": [[1], [2.0]]},
    {"oneOf": [{"type": "integer", "enum": [1, 3]}, {"enum": [1.0, 2.0]}]},
    {"type": "integer", "enum": [1.0, 2]},
]


@pytest.mark.parametrize("draft", [DRAFT4, DRAFT6])
@pytest.mark.parametrize("schema", INTEGER_ENUMS)
def test_integral_enum_values_follow_the_drafts_integer(checker, draft, schema):
    """Draft 4's ``integer`` excludes ``1.0`` and ``1e0``: an enum value kept as ``1`` is spelled
    only as an integer there, and one kept as ``1.0`` only with a fraction or exponent."""
    schema = dict(schema, **{"$schema": draft})
    validator = oracle(schema)
    for text in ["1", "1.0", "1e0", "2", "2.0", "2.5", "3", "[1]", "[1.0]", "[2]", "[2.0]"]:
        expected = validator.is_valid(json.loads(text))
        assert checker.accepts(schema, text) == expected, (text, expected)


def test_one_of_overlapping_only_on_a_float_twin_is_not_disjoint(checker):
    """Draft 4: ``enum: [1]`` with ``type: number`` admits ``1.0`` too, which the second branch
    (a non-integer number) also takes, so ``1.0`` matches both and ``oneOf`` must reject it."""
    schema = {"$schema": DRAFT4, "oneOf": [{"type": "number", "enum": [1, 3]},
                                           {"type": "number", "not": {"type": "integer"}}]}
    validator = oracle(schema)
    for text in ["1", "1.0", "3", "2.5", "2"]:
        assert checker.accepts(schema, text) == validator.is_valid(json.loads(text)), text


def _repository(url: dict, kind: str) -> dict:
    return {"type": "object", "required": ["alias", "url", "enabled", "kind", "gpg", "priority"],
            "properties": {"alias": {"type": "string", "minLength": 1}, "url": url, "enabled": {"type": "boolean"},
                           "kind": {"enum": [kind, None]}, "gpg": {"type": "boolean"}, "priority": {"type": "integer"}}}


def _repositories(keyword: str, *items: dict) -> dict:
    return {"type": "object", "required": ["repos"],
            keyword: [{"properties": {"repos": {"type": "array", "items": item}}} for item in items]}


URL_STRING = _repository({"type": "string"}, "a")
URL_LIST = _repository({"type": "array", "items": {"type": "string"}}, "b")
URL_LONG = _repository({"type": "string", "minLength": 3}, "b")


def _rules(schema: dict) -> int:
    return len(parse_json_schema(load_schema(schema), JsonSchemaOptions(property_order="any")).rules)


def test_a_negation_the_rest_excludes_is_dropped():
    """Two ``oneOf`` branches overlap (``{"repos": []}`` matches both), so each takes the other's
    negation, down to its array items: "an item that is not the other branch's item". Where the
    items are provably disjoint (``url`` a string in one, a list in the other) that negation
    holds for every item already; distributed, it was one any-order object automaton per way to
    fail (per member, per required name), 23 times the rules of one branch. Dropped, the grammar
    is a few copies of each branch's items. Items that do overlap keep their negation."""
    single = _rules(_repositories("allOf", URL_STRING))
    assert _rules(_repositories("oneOf", URL_STRING, URL_LIST)) < 5 * single
    assert _rules(_repositories("oneOf", URL_STRING, URL_LONG)) > 10 * single


@pytest.mark.parametrize("other", [URL_LIST, URL_LONG], ids=["disjoint", "overlapping"])
def test_one_of_with_negated_items_matches_the_oracle(checker, other):
    schema = _repositories("oneOf", URL_STRING, other)
    base = {"alias": "x", "enabled": True, "gpg": False, "priority": 1}
    a = dict(base, url="http", kind="a")
    b_list = dict(base, url=["u"], kind="b")
    b_long = dict(base, url="http", kind="b")
    shared = dict(base, url="http", kind=None)  # an item of both URL_STRING and URL_LONG
    instances = [{"repos": []}, {"repos": [a]}, {"repos": [b_list]}, {"repos": [b_long]}, {"repos": [shared]},
                 {"repos": [a, shared]}, {"repos": [shared, b_long]}, {"repos": [a, b_list]},
                 {"repos": [dict(a, priority=1.5)]}, {"repos": [{k: v for k, v in a.items() if k != "gpg"}]}, {}]
    assert checker.disagreements(schema, instances, property_order="any") == []


def test_a_required_member_is_disjoint_from_an_optional_one_with_other_values(checker):
    """An object requiring ``command: "get"`` shares no value with one whose optional ``command``
    may only be ``"set"``: where the member appears it is rejected. Three ``oneOf`` branches told
    apart only that way (``parameters`` overlap) keep each branch's negations of the others from
    multiplying once a leaf has required its own ``command``."""
    from grammars.frontends.json_schema import combinators
    from grammars.frontends.json_schema.compiler import SchemaCompiler
    from grammars.frontends.json_schema.document import SchemaDocument

    defs = {"get": {"type": "object", "required": ["command"], "properties": {"command": {"enum": ["get"]}}},
            "set": {"type": "object", "properties": {"command": {"enum": ["set"]}}},
            "either": {"type": "object", "properties": {"command": {"enum": ["get", "set"]}}}}
    compiler = SchemaCompiler(SchemaDocument.of({"$defs": defs}), JsonSchemaOptions())
    root = compiler.document.located_root()

    def conj(name):
        return compiler.conjunction([compiler.document.child(root, defs[name], "$defs", name)])

    assert combinators.provably_disjoint(compiler, conj("get"), conj("set"))
    assert combinators.provably_disjoint(compiler, conj("set"), conj("get"))
    assert not combinators.provably_disjoint(compiler, conj("get"), conj("either"))

    def branch(command: str, required: list[str]) -> dict:
        members = {n: {"type": "string"} for n in ("pid", "key", "value", "cause")}
        return {"type": "object", "properties": {"command": {"enum": [command]},
                                                 "parameters": {"type": "object", "properties": members, "required": required}}}

    schema = {"oneOf": [branch("get", ["pid", "key"]), branch("set", ["pid", "key", "value"]), branch("fail", ["cause"])]}
    both = {"pid": "p", "key": "k", "value": "v"}
    instances = [{}, {"command": "get", "parameters": both}, {"parameters": both}, {"parameters": {"pid": "p", "key": "k"}},
                 {"command": "fail", "parameters": {"cause": "c"}}, {"parameters": {"cause": "c"}},
                 {"command": "set", "parameters": {"pid": "p"}}, {"command": "other"}]
    assert checker.disagreements(schema, instances, property_order="any") == []
