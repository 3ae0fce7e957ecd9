"""``format_assertion=False``: ``format`` is an annotation (drafts 2019-09/2020-12 by default)."""

from __future__ import annotations

import pytest
from schema_check import Checker

from grammars import UnsupportedSchemaError
from grammars.frontends.json_schema import JsonSchemaOptions, parse_json_schema


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


def test_format_is_asserted_by_default(checker):
    assert not checker.accepts({"format": "date"}, '"not a date"')
    assert checker.accepts({"format": "date"}, '"2020-01-01"')


@pytest.mark.parametrize("schema, text, ok", [
    ({"format": "date"}, '"not a date"', True),
    ({"format": "date", "maxLength": 3}, '"abcd"', False),
    ({"type": "string", "format": "email"}, "12", False),
    ({"format": "uri-template"}, '"{"', True),  # unsupported under assertion, nothing under annotation
    ({"format": "no-such-format"}, "[1]", True),
    ({"not": {"format": "date"}}, '"2020-01-01"', False),  # not(annotation only) = nothing
    ({"enum": ["x", "2020-01-01"], "format": "date"}, '"x"', True),
])
def test_format_as_annotation(checker, schema, text, ok):
    assert checker.accepts(schema, text, format_assertion=False) is ok


def test_unsupported_format_still_raises_when_asserted():
    with pytest.raises(UnsupportedSchemaError) as info:
        parse_json_schema({"properties": {"t": {"format": "uri-template"}}}, JsonSchemaOptions())
    assert (info.value.keyword, info.value.pointer) == ("format", "#/properties/t")


def test_format_assertion_must_be_bool():
    with pytest.raises(TypeError):
        JsonSchemaOptions(format_assertion="no")
