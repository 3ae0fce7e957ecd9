"""Property tests: what the grammar generates is valid, and it accepts exactly the valid instances.

1. Random walks through the matcher's masks (byte vocabulary) that end in an accepting state
   must produce text that ``json.loads`` parses and ``jsonschema`` validates.
2. Random JSON instances (serialized compactly and with ``json.dumps``' default separators under
   flexible whitespace) must be accepted exactly when ``jsonschema`` says they are valid.

The schemas are ones the front end supports exactly; ``property_order="any"`` so that key order,
which ``jsonschema`` ignores, does not matter. Floats with an integral value (``2.0``) are left
out of the instances: ``type: integer`` accepts integer texts only (a documented narrowing of
the scalars module).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_check import Checker, oracle

from grammars.testing.laws import allowed_tokens

SCHEMAS = {
    "object": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "name": {"type": "string", "maxLength": 3},
                       "tags": {"type": "array", "items": {"enum": ["a", "b", 1]}, "maxItems": 2}},
        "required": ["id"],
    },
    "closed": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": ["null", "string"]}},
        "patternProperties": {"^x": {"type": "integer"}},
        "additionalProperties": False,
        "minProperties": 1,
    },
    "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "null"}, "maxItems": 4},
    "union": {"anyOf": [{"type": "string", "pattern": "^[ab]*$"}, {"type": "integer", "minimum": 5}, {"const": {"k": [1, 2]}}]},
    "tagged": {
        "type": "object",
        "oneOf": [
            {"properties": {"t": {"const": "p"}, "x": {"type": "integer"}}, "required": ["t", "x"], "additionalProperties": False},
            {"properties": {"t": {"const": "q"}, "y": {"type": "string"}}, "required": ["t"], "additionalProperties": False},
        ],
    },
    "negations": {"type": "object", "propertyNames": {"maxLength": 2}, "not": {"required": ["b"]},
                  "additionalProperties": {"not": {"type": ["object", "array"]}}},
    "tree": {"$defs": {"t": {"type": "object", "properties": {"v": {"type": "number"}, "c": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                             "required": ["v"], "additionalProperties": False}},
             "$ref": "#/$defs/t"},
    "open": {"type": "object", "properties": {"a": {"type": "string"}}, "patternProperties": {"^n": {"type": "number"}}},
    # more declared properties than any_order_limit: any order with repeats (objects.py)
    "large": {"type": "object", "properties": {f"p{i}": [{"type": "integer"}, {"type": "boolean"}, {"enum": ["a", 1]}][i % 3]
                                               for i in range(10)},
              "required": ["p1", "p4"], "additionalProperties": {"type": "null"}},
}

#: bytes a walk prefers when allowed, so walks close strings and containers instead of wandering
PREFERRED = [ord(c) for c in '"{}[],:0123456789abnpqtxyvc-.e ']
MAX_STEPS = 200
FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def checker(byte_vocab):
    return Checker(byte_vocab)


def walk(checker: Checker, schema, whitespace: str, draw) -> str | None:
    """One random path through the masks; the text when it reached EOS, else None."""
    vocab = checker.vocab
    eos = min(vocab.eos_token_ids)
    matcher = checker.compile(schema, whitespace=whitespace, property_order="any").matcher()
    out = bytearray()
    for _ in range(MAX_STEPS):
        allowed = allowed_tokens(matcher, vocab.logits_width)
        assert allowed.any(), f"dead end after {bytes(out)!r}"
        others = [t for t in np.flatnonzero(allowed).tolist() if t != eos]
        if allowed[eos] and (not others or draw(st.integers(0, 2)) == 0):
            return out.decode("utf-8")
        preferred = [t for t in PREFERRED if allowed[t]]
        pool = preferred if preferred and draw(st.integers(0, 3)) else others
        token = pool[draw(st.integers(0, len(pool) - 1))]
        matcher.advance(token)
        out += vocab.token_bytes[token]
    return None


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("whitespace", ["compact", "flexible"])
@FAST
@given(data=st.data())
def test_random_walks_generate_valid_instances(checker, name, whitespace, data):
    schema = SCHEMAS[name]
    text = walk(checker, schema, whitespace, data.draw)
    if text is None:
        return
    instance = json.loads(text)
    assert oracle(schema).is_valid(instance), text
    if whitespace == "compact":  # no insignificant whitespace outside string literals
        assert not re.search(r"[ \t\n\r]", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)), text


KEYS = st.sampled_from(["id", "name", "tags", "a", "b", "x1", "xy", "t", "x", "y", "v", "c", "n", "k", "ab", "abc", "q"])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 120), st.floats(-10, 10, allow_nan=False).map(lambda f: round(f, 2)).filter(lambda f: not f.is_integer()),
    st.sampled_from(["", "a", "ab", "ba", "p", "q", "abcd", "\u00e9", 'a"b']),
)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=8)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(instance=JSON)
def test_random_instances_accepted_iff_valid(checker, name, instance):
    schema = SCHEMAS[name]
    expected = oracle(schema).is_valid(instance)
    for whitespace, text in (("compact", json.dumps(instance, separators=(",", ":"))), ("flexible", json.dumps(instance))):
        assert checker.accepts(schema, text, whitespace=whitespace, property_order="any") == expected, text
