"""Duplicate undeclared keys and counting: ``{"x":1,"x":2}`` parses to one property.

A grammar cannot exclude repeated undeclared keys, so a ``minProperties`` that undeclared
members must help meet is either met by distinct declared keys (finite pattern names become
declared members), narrowed to count one undeclared member, or refused — never satisfied by
counting the same key twice.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammars import UnsupportedSchemaError


def _accepts(compiled, vocab, text: str) -> bool:
    m = compiled.matcher()
    for token in vocab.encode(text):
        if not m.allows(token):
            return False
        m.advance(token)
    return m.is_accepting()


CLOSED_PATTERN = {"type": "object", "patternProperties": {"^[a-d]$": True}, "additionalProperties": False,
                  "required": ["d"], "minProperties": 3}


@pytest.mark.parametrize("text", ['{"a":1,"a":1,"d":1}', '{"d":1,"a":{},"a":1}', '{"d":1,"b":1,"b":2}'])
def test_repeated_pattern_key_does_not_meet_min_properties(llama3_compiler, llama3_vocab, text):
    compiled = llama3_compiler.compile_json_schema(CLOSED_PATTERN)
    assert not jsonschema.Draft202012Validator(CLOSED_PATTERN).is_valid(json.loads(text))
    assert not _accepts(compiled, llama3_vocab, text)


@pytest.mark.parametrize("text", ['{"d":1,"a":1,"b":2}', '{"d":1,"b":1,"c":2}', '{"d":1,"a":1,"b":2,"c":3}'])
def test_finite_pattern_names_become_declared_members(llama3_compiler, llama3_vocab, text):
    compiled = llama3_compiler.compile_json_schema(CLOSED_PATTERN)
    assert jsonschema.Draft202012Validator(CLOSED_PATTERN).is_valid(json.loads(text))
    assert _accepts(compiled, llama3_vocab, text)


def test_open_object_counts_one_undeclared_member_toward_min_properties(llama3_compiler, llama3_vocab):
    schema = {"type": "object", "properties": {"p": {}}, "minProperties": 2, "maxProperties": 3}
    compiled = llama3_compiler.compile_json_schema(schema)
    assert _accepts(compiled, llama3_vocab, '{"p":1,"x":2}')
    assert _accepts(compiled, llama3_vocab, '{"p":1,"x":2,"y":3}')
    assert not _accepts(compiled, llama3_vocab, '{"x":1,"x":2}')  # one distinct key: invalid
    assert not _accepts(compiled, llama3_vocab, '{"p":1,"x":1,"y":1,"z":1}')  # four members: too many


def test_min_properties_needing_distinct_undeclared_keys_is_refused(llama3_compiler):
    with pytest.raises(UnsupportedSchemaError) as info:
        llama3_compiler.compile_json_schema({"type": "object", "minProperties": 2})
    assert info.value.keyword == "minProperties"
    assert info.value.pointer == "#"


def test_min_properties_of_one_still_counts_undeclared_members(llama3_compiler, llama3_vocab):
    compiled = llama3_compiler.compile_json_schema({"type": "object", "minProperties": 1})
    assert _accepts(compiled, llama3_vocab, '{"x":1}')
    assert not _accepts(compiled, llama3_vocab, "{}")
