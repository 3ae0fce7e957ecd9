"""The Matcher contract (grammars.testing.laws.MatcherLaws) on every matcher kind, at every step.

Matcher kinds: ``Matcher`` over regular constraints, GBNF CFGs with overlapping terminals, a
Lark grammar with left recursion and %ignore, and JSON Schemas (objects, arrays, enums, any-order
members, recursion); ``DFAMatcher`` (``TokenDFA.matcher()``); ``UnconstrainedMatcher``. Every
kind is a ``grammars.TokenMatcher``. Vocabularies: the byte vocabulary (every token id checked)
and Llama 3 (a sample of ids plus every allowed one).
"""

from __future__ import annotations

import numpy as np
import pytest

import inspect
import json

from grammars import Compiler, TokenMatcher, UnconstrainedMatcher
from grammars.testing.laws import MatcherLaws, allowed_tokens

ARITHMETIC = r"""
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""

SMALL_JSON = r"""
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ("," ws string ws ":" ws value ws)* )? "}"
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\] | "\\" ["\\/bfnrtu] )* "\""
number ::= "-"? [0-9]+ ("." [0-9]+)?
ws     ::= [ ]?
"""

LARK_SUM = r"""
?start: sum
?sum: product | sum "+" product | sum "-" product
?product: atom | product "*" atom
?atom: NUMBER | "(" sum ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""

CASES = [
    ("regex", r"[a-z]+@[a-z]+\.(com|org)", ["abc@example.com", "x@y.org"]),
    ("regex", r"\d{4}-\d{2}-\d{2}", ["2024-01-31"]),
    ("regex", r"(ab|a)*c?é+", ["abaabcéé", "é"]),
    ("gbnf", ARITHMETIC, ["1+2*(3-4)/5=x\n", "a = b \n\n"]),
    ("gbnf", SMALL_JSON, ['{"a": [1, 2.5, "x\\n"], "b": {"c": null}}', '["é", true]']),
    ("lark", LARK_SUM, ["1 + 2*(3 - 4)", "12*3"]),
]


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", 3]}, "maxItems": 3},
        "kind": {"const": "person"},
    },
    "required": ["name", "kind"],
    "additionalProperties": False,
}
TREE = {
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
                                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v"], "additionalProperties": False}},
    "$ref": "#/$defs/node",
}
SCHEMA_CASES = [
    (PERSON, {}, [{"name": "Al", "tags": ["bc", 3], "kind": "person"}, {"name": "", "age": 7, "kind": "person"}]),
    (PERSON, {"whitespace": "flexible", "property_order": "any"}, [{"age": 150, "kind": "person", "name": "é\n"}]),
    (TREE, {}, [{"v": 1.5, "kids": [{"v": -2}, {"v": 0, "kids": []}]}]),
]


def _compile(compiler: Compiler, kind: str, source):
    if kind == "regex":
        return compiler.compile_regex(source)
    if kind == "gbnf":
        return compiler.compile_gbnf(source)
    if kind == "json_schema":
        schema, options = source
        return compiler.compile_json_schema(schema, **options)
    return compiler.compile_lark(source)


def _walk_with_laws(compiled, vocab, text: str, sample: int | None, matcher=None) -> None:
    matcher = matcher if matcher is not None else compiled.matcher()
    laws = MatcherLaws(matcher, vocab, sample=sample)
    for token in vocab.encode(text):
        laws.check_all()
        assert matcher.allows(token), f"valid text {text!r} rejected at token {token} {vocab.token_bytes[token]!r}"
        matcher.advance(token)
    laws.check_all()
    assert matcher.is_accepting(), f"{text!r} not accepted at its end"


@pytest.mark.parametrize("kind,source,texts", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_laws_byte_vocab(byte_vocab, kind, source, texts):
    compiled = _compile(Compiler(byte_vocab), kind, source)
    for text in texts:
        _walk_with_laws(compiled, byte_vocab, text, sample=None)


@pytest.mark.parametrize("kind,source,texts", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_laws_llama3(llama3_compiler, kind, source, texts):
    compiled = _compile(llama3_compiler, kind, source)
    for text in texts:
        _walk_with_laws(compiled, llama3_compiler.vocab, text, sample=1500)


def _schema_texts(schema_case) -> list[str]:
    schema, options, values = schema_case
    separators = (", ", ": ") if options.get("whitespace") == "flexible" else (",", ":")
    return [json.dumps(v, ensure_ascii=False, separators=separators) for v in values]


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=[f"schema-{i}" for i in range(len(SCHEMA_CASES))])
def test_laws_json_schema_byte_vocab(byte_vocab, case):
    compiled = _compile(Compiler(byte_vocab), "json_schema", case[:2])
    for text in _schema_texts(case):
        _walk_with_laws(compiled, byte_vocab, text, sample=None)


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=[f"schema-{i}" for i in range(len(SCHEMA_CASES))])
def test_laws_json_schema_llama3(llama3_compiler, case):
    compiled = _compile(llama3_compiler, "json_schema", case[:2])
    for text in _schema_texts(case):
        _walk_with_laws(compiled, llama3_compiler.vocab, text, sample=600)


REGULAR = [(source, texts) for kind, source, texts in CASES if kind == "regex"] + [
    (r'"[a-z]{0,3}"(,"x")?', ['"ab","x"', '""']),  # forced runs: the closing quote after three letters, ',"x"'
]


@pytest.mark.parametrize("source,texts", REGULAR, ids=[f"dfa-{i}" for i in range(len(REGULAR))])
def test_laws_token_dfa_matcher(byte_vocab, source, texts):
    compiled = Compiler(byte_vocab).compile_regex(source)
    for text in texts:
        _walk_with_laws(compiled, byte_vocab, text, sample=None, matcher=compiled.as_dfa().matcher())


@pytest.mark.parametrize("source,texts", REGULAR[:2], ids=["dfa-0", "dfa-1"])
def test_laws_token_dfa_matcher_llama3(llama3_compiler, source, texts):
    compiled = llama3_compiler.compile_regex(source)
    for text in texts:
        _walk_with_laws(compiled, llama3_compiler.vocab, text, sample=600, matcher=compiled.as_dfa().matcher())


def test_token_dfa_matcher_agrees_with_matcher(byte_vocab):
    """The two cursors over one regular constraint allow the same tokens at every step."""
    compiled = Compiler(byte_vocab).compile_regex(r'"[a-z]{0,3}"(,"x")?')
    dfa_matcher, matcher = compiled.as_dfa().matcher(), compiled.matcher()
    for token in byte_vocab.encode('"ab","x"'):
        assert np.array_equal(allowed_tokens(dfa_matcher, byte_vocab.logits_width),
                              allowed_tokens(matcher, byte_vocab.logits_width))
        assert dfa_matcher.forced_tokens() == matcher.forced_tokens()
        dfa_matcher.advance(token)
        matcher.advance(token)
    assert dfa_matcher.is_accepting() and matcher.is_accepting()


@pytest.mark.parametrize("vocab_fixture", ["byte_vocab", "llama3_vocab"])
def test_laws_unconstrained_matcher(request, vocab_fixture):
    vocab = request.getfixturevalue(vocab_fixture)
    matcher = UnconstrainedMatcher(vocab)
    laws = MatcherLaws(matcher, vocab, sample=None if len(vocab) < 1000 else 600)
    for token in vocab.encode("any text at all {]"):
        laws.check_all()
        matcher.advance(token)
    laws.check_all()
    eos = next(iter(vocab.eos_token_ids))
    matcher.advance(eos)
    assert matcher.is_terminated() and not matcher.allows(0)
    laws.check_all()


def _kinds(byte_vocab):
    compiler = Compiler(byte_vocab)
    return {
        "Matcher": compiler.compile_gbnf(ARITHMETIC).matcher(),
        "Matcher(json schema)": compiler.compile_json_schema(PERSON).matcher(),
        "DFAMatcher": compiler.compile_regex("ab+").as_dfa().matcher(),
        "UnconstrainedMatcher": UnconstrainedMatcher(byte_vocab),
    }


def test_every_matcher_kind_is_a_token_matcher(byte_vocab):
    members = [name for name, _ in inspect.getmembers(TokenMatcher) if not name.startswith("_")]
    assert {"fill_mask", "allows", "advance", "rollback", "fork", "shortest_completion"} <= set(members)
    for kind, matcher in _kinds(byte_vocab).items():
        assert isinstance(matcher, TokenMatcher), kind
        for name in members:
            declared = getattr(TokenMatcher, name)
            if callable(declared):
                wanted = list(inspect.signature(declared).parameters)
                got = list(inspect.signature(getattr(type(matcher), name)).parameters)
                assert got == wanted, f"{kind}.{name}{tuple(got)} differs from the contract's {tuple(wanted)}"


def test_misuse_leaves_every_kind_unchanged(byte_vocab):
    from grammars import RollbackError, TokenRejected

    for kind, matcher in _kinds(byte_vocab).items():
        before = allowed_tokens(matcher, byte_vocab.logits_width)
        bad = int(np.flatnonzero(~before[: len(byte_vocab)])[0]) if (~before[: len(byte_vocab)]).any() else None
        if bad is not None:
            with pytest.raises(TokenRejected):
                matcher.advance(bad)
        with pytest.raises(RollbackError):
            matcher.rollback(1)
        assert matcher.num_consumed == 0, kind
        assert np.array_equal(allowed_tokens(matcher, byte_vocab.logits_width), before), kind


def test_terminated_after_eos(byte_vocab):
    compiled = Compiler(byte_vocab).compile_regex("ab")
    matcher = compiled.matcher()
    matcher.try_advance(byte_vocab.encode("ab"))
    eos = next(iter(byte_vocab.eos_token_ids))
    assert matcher.is_accepting() and not matcher.is_terminated()
    matcher.advance(eos)
    assert matcher.is_terminated() and not matcher.is_accepting()
    words = np.zeros((1, (byte_vocab.logits_width + 31) // 32), dtype=np.int32)
    matcher.fill_mask(words, 0)
    assert not words.any(), "nothing may follow EOS"
    matcher.rollback(1)
    assert matcher.is_accepting()


@pytest.mark.parametrize("pattern", ["a*", "a?", "(ab)*", "(ab|c)*d?"])
def test_nullable_regexes_are_regular_and_their_dfa_accepts_the_empty_text(byte_vocab, pattern):
    """A nullable regex lowers to a chain of unit productions over one terminal (S -> A, A -> T):
    still one regular language, with a token DFA that accepts at its start."""
    import re

    compiled = Compiler(byte_vocab).compile_regex(pattern)
    assert compiled.is_regular
    dfa = compiled.as_dfa()
    assert dfa.is_accepting(dfa.start)
    for text in ["", "a", "ab", "abab", "c", "d", "abcd", "b"]:
        state = dfa.start
        for token in byte_vocab.encode(text):
            state = dfa.next_state(state, token) if state >= 0 else -1
        assert (state >= 0 and dfa.is_accepting(state)) == bool(re.fullmatch(pattern, text)), (pattern, text)


def test_regular_constraint_exposes_token_dfa(byte_vocab):
    compiled = Compiler(byte_vocab).compile_regex(r"a(bc)*")
    assert compiled.is_regular
    dfa = compiled.as_dfa()
    state = dfa.start
    for token in byte_vocab.encode("abcbc"):
        state = dfa.next_state(state, token)
        assert state >= 0
    assert dfa.is_accepting(state)
    # the explicit DFA and the matcher agree on every token from every visited state
    matcher = compiled.matcher()
    state = dfa.start
    for token in byte_vocab.encode("abc"):
        tokens, _ = dfa.transitions(state)
        allowed = {t for t in range(len(byte_vocab)) if matcher.allows(t) and t not in byte_vocab.eos_token_ids}
        assert set(tokens.tolist()) == allowed
        matcher.advance(token)
        state = dfa.next_state(state, token)


def test_context_free_constraint_has_no_token_dfa(byte_vocab):
    from grammars import UnsupportedGrammarError

    compiled = Compiler(byte_vocab).compile_gbnf(ARITHMETIC)
    assert not compiled.is_regular
    with pytest.raises(UnsupportedGrammarError):
        compiled.as_dfa()
