"""``ClosingPlanner``: achievable upper bounds on the tokens needed to finish, checked against an
exact breadth-first search over *every* token of the byte vocabulary (``exact_tokens_to_accept``,
also used by the shortest-completion tests)."""

from __future__ import annotations

import json
from collections import deque

import pytest

from engine import ClosingPlanner
from grammars import Compiler

LIST = r"\[[a-z]+(,[a-z]+)*\]"


@pytest.fixture(scope="module")
def compiler(byte_vocab):
    return Compiler(byte_vocab)


def advanced(grammar, vocab, text: str):
    m = grammar.matcher()
    for b in text.encode():
        m.advance(vocab.token_bytes.index(bytes([b])))
    return m


def exact_tokens_to_accept(matcher, vocab, limit: int = 12) -> int | None:
    """Fewest tokens to an accepting state, trying every text token (ground truth, small vocabularies)."""
    if matcher.is_accepting():
        return 0
    start = matcher.fork()
    seen = {start.freeze()}
    queue = deque([(start, 0)])
    while queue:
        m, depth = queue.popleft()
        if depth >= limit:
            continue
        for token in range(vocab.size):
            if token in vocab.eos_token_ids or not m.allows(token):
                continue
            nxt = m.fork()
            nxt.advance(token)
            key = nxt.freeze()
            if key in seen:
                continue
            if nxt.is_accepting():
                return depth + 1
            seen.add(key)
            queue.append((nxt, depth + 1))
    return None


def test_completion_from_the_start_and_inside(byte_vocab, compiler):
    planner = ClosingPlanner(byte_vocab)
    grammar = compiler.compile_regex(LIST)
    start = grammar.matcher()
    found = planner.completion(start)
    assert byte_vocab.decode(found.tokens) == b"[a]" and found.cost == 4
    inside = advanced(grammar, byte_vocab, "[ab,c")
    assert byte_vocab.decode(planner.completion(inside).tokens) == b"]"
    done = advanced(grammar, byte_vocab, "[ab]")
    assert planner.tokens_to_close(done) == 1  # EOS only
    done.advance(min(byte_vocab.eos_token_ids))
    assert planner.tokens_to_close(done) == 0
    assert start.num_consumed == 0 and inside.num_consumed == 5  # the planner never moves matchers


@pytest.mark.parametrize(
    ("pattern", "prefixes"),
    [
        (LIST, ["", "[", "[a", "[ab,", "[abc,d"]),
        (r"(ab|cd)+e", ["", "a", "ab", "abc", "abcd"]),
        (r"x[0-9]{3,5}y?", ["", "x", "x1", "x12", "x1234"]),
        (r"(true|null|12)(,(true|null|12))*", ["", "t", "tr", "true,", "12,n"]),
    ],
)
def test_bound_is_achievable_and_tight_on_small_grammars(byte_vocab, compiler, pattern, prefixes):
    planner = ClosingPlanner(byte_vocab)
    grammar = compiler.compile_regex(pattern)
    for prefix in prefixes:
        m = advanced(grammar, byte_vocab, prefix)
        found = planner.completion(m)
        exact = exact_tokens_to_accept(m, byte_vocab)
        assert found is not None and exact is not None
        assert len(found.tokens) >= exact  # an upper bound ...
        assert len(found.tokens) <= exact + 1, (prefix, found, exact)  # ... and a close one here
        probe = m.fork()
        assert probe.try_advance(found.tokens) == len(found.tokens) and probe.is_accepting()  # achievable


def test_results_are_cached_by_state(byte_vocab, compiler):
    planner = ClosingPlanner(byte_vocab)
    grammar = compiler.compile_regex(LIST)
    m = advanced(grammar, byte_vocab, "[ab,cd")
    first = planner.completion(m)
    searches = planner.searches
    assert planner.completion(advanced(grammar, byte_vocab, "[ab,cd")) == first
    assert planner.searches == searches


def test_long_lexemes_and_unknown_matchers(byte_vocab, compiler):
    grammar = compiler.compile_regex(r"[a-z]{60}x")
    assert ClosingPlanner(byte_vocab).tokens_to_close(grammar.matcher()) == 62  # 61 bytes + EOS

    class Opaque:  # a matcher type without shortest_completion: unknown, so no steering
        def is_terminated(self):
            return False

        def is_accepting(self):
            return False

        def freeze(self):
            return "opaque"

    assert ClosingPlanner(byte_vocab).tokens_to_close(Opaque()) is None


def test_nested_json_where_any_value_may_go(byte_vocab, compiler, json_gbnf):
    """Untyped JSON values make breadth-first search explode; the planner still finds a completion."""
    planner = ClosingPlanner(byte_vocab)
    grammar = compiler.compile_gbnf(json_gbnf)
    for prefix in ['{"a":[[{"b":[1,', '{"k": {"x": "abc', '{"a":[1,2,{"b":tr']:
        m = advanced(grammar, byte_vocab, prefix)
        found = planner.completion(m)
        assert found is not None, prefix
        json.loads(prefix + byte_vocab.decode(found.tokens).decode())


def test_json_schema_with_required_keys_after_free_members(byte_vocab, compiler):
    pytest.importorskip("grammars.frontends.json_schema")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    grammar = compiler.compile_json_schema(schema)
    planner = ClosingPlanner(byte_vocab)
    for prefix in ["", '{"x', '{"x":', '{"x":1,']:
        m = advanced(grammar, byte_vocab, prefix)
        found = planner.completion(m)
        assert found is not None, prefix
        value = json.loads(prefix + byte_vocab.decode(found.tokens).decode())
        assert {"name", "age"} <= set(value)
