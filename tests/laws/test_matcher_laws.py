"""The Matcher contract (grammars.testing.laws.MatcherLaws) on every backend and at every step.

Backends: a regular constraint (one terminal, token DFA), a GBNF CFG with overlapping
terminals, a Lark grammar with left recursion and %ignore. Vocabularies: the byte vocabulary
(every token id checked) and Llama 3 (a sample of ids plus every allowed one).
"""

from __future__ import annotations

import numpy as np
import pytest

from grammars import Compiler
from grammars.testing.laws import MatcherLaws

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


def _compile(compiler: Compiler, kind: str, source: str):
    if kind == "regex":
        return compiler.compile_regex(source)
    if kind == "gbnf":
        return compiler.compile_gbnf(source)
    return compiler.compile_lark(source)


def _walk_with_laws(compiled, vocab, text: str, sample: int | None) -> None:
    matcher = compiled.matcher()
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
