"""The process-wide automata table (``grammars.memo``) and the value semantics of ``ByteDFA``.

Sharing automata across compilers must change only time: a grammar compiled with the table warm
fills the same masks as one compiled with it empty, and the table stays within its bounds.
"""

from __future__ import annotations

import numpy as np

from grammars import Compiler, allocate_token_bitmask
from grammars.automata.byte_dfa import ByteDFA, compile_regular
from grammars.frontends.json_schema.strings import json_string_values
from grammars.frontends.regex import parse_regex
from grammars.memo import BoundedCache, shared_automata

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 9},
        "n": {"type": "integer", "minimum": -40, "maximum": 1234},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
    },
    "required": ["name", "n"],
}
TEXT = '{"name":"Zoë","n":1200,"kind":"beta"}'


def _masks_along(compiled, vocab, text: str) -> list[bytes]:
    """The mask at every byte of ``text`` (one byte token each), then the final one; ``text``
    must be a complete sentence."""
    matcher = compiled.matcher()
    mask = allocate_token_bitmask(1, vocab.logits_width)
    by_byte = {b[0]: i for i, b in enumerate(vocab.token_bytes) if len(b) == 1}
    out = []
    for byte in text.encode():
        matcher.fill_mask(mask, 0)
        out.append(mask.tobytes())
        matcher.advance(by_byte[byte])
    matcher.fill_mask(mask, 0)
    out.append(mask.tobytes())
    assert matcher.is_accepting()
    return out


def test_byte_dfas_are_values():
    a = compile_regular(parse_regex("ab|ac"))
    b = compile_regular(parse_regex("a[bc]"))
    c = compile_regular(parse_regex("a[bd]"))
    assert a is not b and a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2


def test_a_second_compiler_builds_no_new_automata(byte_vocab):
    shared_automata().clear()
    cold = Compiler(byte_vocab).compile_json_schema(SCHEMA)
    table = shared_automata()
    held = len(table)
    assert held > 0
    misses = table.misses
    warm = Compiler(byte_vocab).compile_json_schema(SCHEMA)
    assert table.misses == misses  # every automaton came from the table
    assert len(table) == held
    assert warm is not cold
    assert _masks_along(warm, byte_vocab, TEXT) == _masks_along(cold, byte_vocab, TEXT)


def test_warm_and_cold_tables_give_the_same_masks(byte_vocab):
    """Other schemas filling the table first (sharing string bodies, ranges and keys) leave the
    compiled constraint exactly as a cold compile makes it."""
    shared_automata().clear()
    cold = _masks_along(Compiler(byte_vocab).compile_json_schema(SCHEMA), byte_vocab, TEXT)
    shared_automata().clear()
    for other in ({"type": "string", "minLength": 2, "maxLength": 9}, {"enum": ["alpha", "beta", "gamma"]},
                  {"type": "integer", "minimum": -40, "maximum": 1234},
                  {"type": "object", "properties": {"name": {"type": "string"}}}):
        Compiler(byte_vocab).compile_json_schema(other)
    warm = _masks_along(Compiler(byte_vocab).compile_json_schema(SCHEMA), byte_vocab, TEXT)
    assert warm == cold


def test_string_value_sets_are_told_apart():
    """Value sets whose naive concatenations agree are different keys."""
    one = json_string_values(["a\0", "b"])
    two = json_string_values(["a", "\0b"])
    assert one != two
    assert json_string_values(("x", "y")) is json_string_values(["x", "y"])


def test_bounded_cache_keeps_its_bounds():
    cache = BoundedCache(3, max_bytes=100, size_of=len)
    for i in range(5):
        cache.put(i, "x" * 30)
    assert len(cache) == 3 and cache.nbytes == 90
    assert cache.get(0) is None and cache.get(4) == "x" * 30
    cache.put("big", "y" * 101)  # larger than the whole bound: not kept, nothing evicted
    assert cache.get("big") is None and len(cache) == 3
    cache.put(5, "z" * 60)  # evicts least recently used until the bytes fit
    assert cache.nbytes <= 100 and cache.get(5) == "z" * 60 and cache.get(4) == "x" * 30
    cache.put(5, "w" * 10)  # replacing a key replaces its size
    assert cache.nbytes == 40
    cache.put(6, None)  # misses are never stored
    assert 6 not in cache._data


def test_shared_table_is_bounded_in_bytes():
    table = shared_automata()
    assert table.max_bytes is not None and table.nbytes <= table.max_bytes
    big = ByteDFA(np.full((4, 256), -1, dtype=np.int32), np.array([True, False, False, False]), 0)
    assert table._size_of(big) >= big.table.nbytes
