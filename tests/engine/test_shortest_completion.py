"""``Matcher.shortest_completion``: reaches acceptance, and is minimal — checked by brute force
over every byte on small grammars, and for reachability on MaskBench schemas with GPT-2."""

from __future__ import annotations

import json
from collections import deque

import pytest

from grammars import Compiler, TokenVocabulary


@pytest.fixture(scope="module")
def bytes_only():
    """256 single-byte tokens and an EOS: token counts are byte counts."""
    pieces = [bytes([b]) for b in range(256)] + [b""]
    return TokenVocabulary.from_bytes(pieces, eos_token_ids=[256], special_token_ids=[256])


@pytest.fixture(scope="module")
def compiler(bytes_only):
    return Compiler(bytes_only)


def walk(grammar, text: str):
    m = grammar.matcher()
    for b in text.encode():
        m.advance(b)
    return m


def brute_force_bytes(matcher, limit: int = 10) -> int | None:
    """Fewest bytes to an accepting state, breadth-first over all 256 bytes (states deduplicated)."""
    if matcher.is_accepting():
        return 0
    seen = {matcher.freeze()}
    queue = deque([(matcher.fork(), 0)])
    while queue:
        m, depth = queue.popleft()
        if depth >= limit:
            continue
        for b in range(256):
            if not m.allows(b):
                continue
            nxt = m.fork()
            nxt.advance(b)
            if nxt.is_accepting():
                return depth + 1
            if nxt.freeze() not in seen:
                seen.add(nxt.freeze())
                queue.append((nxt, depth + 1))
    return None


def reaches_acceptance(matcher, tokens) -> bool:
    probe = matcher.fork()
    return probe.try_advance(tokens) == len(tokens) and probe.is_accepting()


CASES = [
    ("regex", r"\[[a-z]+(,[a-z]+)*\]", ["", "[", "[ab", "[ab,", "[a,b,c"]),
    ("regex", r"(ab|cd)+e", ["", "a", "ab", "abc", "abcd"]),
    ("regex", r"x[0-9]{3,5}y?", ["", "x", "x1", "x12", "x1234"]),
    ("regex", r"(aaaa|b)(c|dddd)", ["", "a", "b", "aaaa"]),
    ("gbnf", 'root ::= "(" root ")" | "x"', ["", "(", "((", "(((x", "((x)"]),
    ("gbnf", 'root ::= item+ "."\nitem ::= "ab" | "c" item "d"', ["", "c", "cc", "ab", "cab", "ccabd"]),
    ("gbnf", 'root ::= "[" (v ("," v)*)? "]"\nv ::= "[" (v ("," v)*)? "]" | "12" | "t"',
     ["", "[", "[[", "[[1", "[[12,[", "[t,[[", "[[],[[]"]),
]


@pytest.mark.parametrize(("kind", "source", "prefixes"), CASES)
def test_minimal_and_accepting_on_small_grammars(compiler, kind, source, prefixes):
    grammar = compiler.compile_regex(source) if kind == "regex" else compiler.compile_gbnf(source)
    for prefix in prefixes:
        m = walk(grammar, prefix)
        tokens = m.shortest_completion()
        text = m.shortest_completion_text()
        assert tokens is not None and text is not None, prefix
        assert bytes(tokens) == text  # byte tokens: the tokens are the bytes
        assert reaches_acceptance(m, tokens), (prefix, text)
        assert len(text) == brute_force_bytes(m), (prefix, text)
        assert m.num_consumed == len(prefix.encode())  # the matcher did not move


def test_accepting_terminated_and_cached(compiler, bytes_only):
    grammar = compiler.compile_regex(r"ab?")
    m = walk(grammar, "a")
    assert m.shortest_completion() == () and m.shortest_completion_text() == b""
    m.advance(256)  # EOS
    assert m.is_terminated() and m.shortest_completion() is None
    other = walk(grammar, "")
    assert other.shortest_completion() == (ord("a"),)
    assert other.shortest_completion() is other.shortest_completion()  # memoised per state


def test_json_grammar_where_any_value_may_go(compiler, json_gbnf):
    grammar = compiler.compile_gbnf(json_gbnf)
    for prefix in ['{"a":[[{"b":[1,', '{"k": {"x": "abc', '{"a":[1,2,{"b":tr', '{"a":[[[[[[[[[[[[', '{"a":"\\u12']:
        m = walk(grammar, prefix)
        text = m.shortest_completion_text()
        assert reaches_acceptance(m, m.shortest_completion())
        json.loads(prefix + text.decode())
        if prefix.count("[") < 6:  # deep nests are past the brute force's depth limit
            assert len(text) == brute_force_bytes(m, limit=8), prefix


def test_fewest_tokens_for_the_text(byte_vocab):
    """With multi-byte tokens the text is spelled in as few tokens as it can be."""
    grammar = Compiler(byte_vocab).compile_regex(r'\{"ab":(true|null)\}')
    m = grammar.matcher()
    tokens = m.shortest_completion()
    assert byte_vocab.decode(tokens) in (b'{"ab":true}', b'{"ab":null}')
    assert len(tokens) == 5  # '{"' 'ab' '":' 'true' (or 'null') '}'
    assert reaches_acceptance(m, tokens)


def test_maskbench_schemas_reach_acceptance(gpt2_compiler, gpt2_vocab, maskbench_dir):
    pytest.importorskip("grammars.frontends.json_schema")
    files = sorted(maskbench_dir.glob("*.json"))[::400][:12]
    checked = 0
    for path in files:
        case = json.loads(path.read_text(encoding="utf-8"))
        try:
            grammar = gpt2_compiler.compile_json_schema(case["schema"])
        except Exception:  # noqa: BLE001 - unsupported schemas are the compiler's business
            continue
        for test in [t for t in case["tests"] if t["valid"]][:2]:
            ids = gpt2_vocab.encode(json.dumps(test["data"]))
            for cut in (0, len(ids) // 3, len(ids) // 2, len(ids) - 1):
                m = grammar.matcher()
                if m.try_advance(ids[:cut]) != cut:
                    continue
                tokens = m.shortest_completion()
                assert tokens is not None and reaches_acceptance(m, tokens), (path.name, cut)
                checked += 1
    assert checked >= 10
