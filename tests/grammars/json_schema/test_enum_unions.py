"""An ``anyOf`` of one-enum branches applied as one enum (``combinators._apply_enum_union``), and
enum values filtered by pattern-only schemas without a validator (``combinators._pattern_only``):
the same language as the disjunction, judged against ``jsonschema``.
"""

from __future__ import annotations

import itertools

import pytest
from schema_check import Checker

from grammars.frontends.json_schema import (
    JsonSchemaOptions,
    analyze_json_schema,
    combinators,
)

TASKS = ["Build@1", "Build@2", "Deploy@1", "Test@3", "build@1"]

#: a task list (an ``anyOf`` of one-value enums with editor hints) met by one object branch per
#: task whose ``pattern`` picks it and whose ``inputs`` differ: the shape of CI pipeline schemas
PIPELINE = {
    "type": "object",
    "properties": {
        "task": {"anyOf": [{"enum": [t], "description": f"the {t} task", "ignoreCase": "value", "doNotSuggest": False}
                           for t in TASKS]},
        "inputs": {"type": "object"},
    },
    "required": ["task"],
    "additionalProperties": False,
    "anyOf": [
        {"properties": {"task": {"pattern": f"^{t}$", "ignoreCase": "value"},
                        "inputs": {"properties": {"n": {"type": "integer", "maximum": i}}}}}
        for i, t in enumerate(TASKS[:4])
    ],
}

SCHEMAS = {
    "pipeline": PIPELINE,
    "numbers and consts": {"anyOf": [{"enum": [1, 2.5]}, {"const": True}, {"enum": ["1", None]}, {"const": 1.0}]},
    "met by a type": {"type": "integer", "anyOf": [{"enum": [1, "a"]}, {"const": 2}, {"enum": [2.5, 3]}]},
    "met by another enum": {"allOf": [{"enum": ["a", "b", "c"]}, {"anyOf": [{"const": "b"}, {"enum": ["c", "d"]}]}]},
    "a branch that is more than an enum": {"anyOf": [{"enum": ["a", 1]}, {"enum": ["b", 2], "type": "string"}]},
}

INSTANCES = [None, True, False, 0, 1, 1.0, 2, 2.5, 3, "1", "a", "b", "c", "d", [], {},
             *({"task": t} for t in TASKS + ["Other@1", "Build@1\n"]),
             *({"task": t, "inputs": {"n": n}} for t, n in itertools.product(TASKS, (0, 2, 5))),
             {"inputs": {}}, {"task": "Build@1", "extra": 1}]


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_enum_unions_agree_with_jsonschema(checker, name):
    assert checker.disagreements(SCHEMAS[name], INSTANCES) == []


def test_one_enum_branches_become_one_enum_and_report_the_same(monkeypatch):
    schema = {"anyOf": [{"enum": ["x"], "ignoreCase": "value"}, {"const": "y", "description": "why"}]}
    report = analyze_json_schema(schema, JsonSchemaOptions())
    distributed: list = []
    original = combinators._enum_union
    monkeypatch.setattr(combinators, "_enum_union", lambda c, branches: distributed.append(1) or original(c, branches))
    analyze_json_schema(schema, JsonSchemaOptions())
    assert distributed  # the anyOf was judged as a union of enums
    monkeypatch.setattr(combinators, "_enum_union", lambda c, branches: None)  # the disjunction, as before
    before = analyze_json_schema(schema, JsonSchemaOptions())
    assert report.ignored == before.ignored and ("ignoreCase", "#/anyOf/0") in report.ignored
    assert report.grammar != before.grammar  # one enum rule instead of an alternative of two


def test_pattern_only_schemas_are_searched_like_jsonschema(checker):
    # Python's ``$`` also matches before a final newline: jsonschema's judgement, kept
    schema = {"enum": ["ab", "ab\n", "b", 7], "anyOf": [{"pattern": "b$", "title": "t"}, {"pattern": "^z"}]}
    assert checker.disagreements(schema, ["ab", "ab\n", "b", 7, "z"]) == []
