"""The traps of the mask engine (docs/ARCHITECTURE.md, "Invariants of the mask engine") and the
error contract, on small vocabularies built in the test."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from grammars import (
    Compiler,
    EmptyLanguageError,
    GrammarSyntaxError,
    Limits,
    LimitExceeded,
    RollbackError,
    TokenRejected,
    TokenVocabulary,
    UnsupportedGrammarError,
    allocate_token_bitmask,
)
from grammars.testing.laws import MatcherLaws, allowed_tokens


def _vocab(pieces: list[bytes], *, padding: int = 0) -> TokenVocabulary:
    """Pieces plus EOS and a special token; logits width padded by ``padding`` ids."""
    eos = len(pieces)
    special = eos + 1
    return TokenVocabulary.from_bytes(
        pieces + [b"", b""],
        eos_token_ids=[eos],
        special_token_ids=[eos, special],
        logits_width=len(pieces) + 2 + padding,
    )


def _ids(vocab, *pieces: bytes) -> list[int]:
    return [vocab.token_bytes.index(p) for p in pieces]


def test_token_spanning_several_terminals():
    vocab = _vocab([b"[", b"]", b"1", b",", b"1,", b",1", b"[1,1]", b"1]", b"]]"])
    grammar = Compiler(vocab).compile_gbnf('root ::= "[" num ("," num)* "]"\nnum ::= [0-9]+')
    matcher = grammar.matcher()
    assert matcher.allows(_ids(vocab, b"[1,1]")[0]), "a token holding five terminals"
    assert not matcher.allows(_ids(vocab, b"]]")[0])
    for tok in _ids(vocab, b"[", b"1,", b"1", b",1", b"]"):
        MatcherLaws(matcher, vocab).check_all()
        matcher.advance(tok)
    assert matcher.is_accepting()
    assert not matcher.allows(_ids(vocab, b"1]")[0]), "nothing after the closing bracket"


def test_utf8_character_split_across_tokens():
    # "é" is C3 A9, "日" is E6 97 A5; tokens hold the bytes of half a character
    vocab = _vocab([b"\xc3", b"\xa9", b"\xe6\x97", b"\xa5", b"\xe6", b"\x97\xa5", b"a"])
    grammar = Compiler(vocab).compile_regex("(é|日)+")
    for split in ([b"\xc3", b"\xa9"], [b"\xe6\x97", b"\xa5"], [b"\xe6", b"\x97\xa5"]):
        matcher = grammar.matcher()
        first, second = _ids(vocab, *split)
        matcher.advance(first)
        assert not matcher.is_accepting(), "half a character is not text"
        assert not matcher.allows(_ids(vocab, b"a")[0])
        MatcherLaws(matcher, vocab).check_all()
        matcher.advance(second)
        assert matcher.is_accepting()
    matcher = grammar.matcher()
    with pytest.raises(TokenRejected):
        matcher.advance(_ids(vocab, b"\xa9")[0])  # a continuation byte cannot start a character


def test_special_tokens_and_padding_never_allowed():
    vocab = _vocab([b"a", b"b"], padding=30)
    grammar = Compiler(vocab).compile_regex("[ab]*")
    matcher = grammar.matcher()
    allowed = allowed_tokens(matcher, vocab.logits_width)
    special = max(vocab.special_token_ids)
    eos = next(iter(vocab.eos_token_ids))
    assert allowed[eos] and matcher.is_accepting()
    assert not allowed[special] and not allowed[len(vocab):].any()
    assert not matcher.allows(special) and not matcher.allows(vocab.logits_width + 5) and not matcher.allows(-1)
    with pytest.raises(TokenRejected):
        matcher.advance(special)


def test_eos_only_when_accepting():
    vocab = _vocab([b"a", b"b"])
    matcher = Compiler(vocab).compile_regex("ab").matcher()
    eos = next(iter(vocab.eos_token_ids))
    assert not matcher.allows(eos)
    with pytest.raises(TokenRejected):
        matcher.advance(eos)
    matcher.try_advance(_ids(vocab, b"a", b"b"))
    assert matcher.allows(eos)


def test_rejection_leaves_state_unchanged_and_rollback_errors():
    vocab = _vocab([b"a", b"b"])
    grammar = Compiler(vocab).compile_regex("a+b")
    matcher = grammar.matcher()
    a, b = _ids(vocab, b"a", b"b")
    matcher.advance(a)
    before = matcher.freeze()
    with pytest.raises(TokenRejected) as info:
        matcher.advance(next(iter(vocab.eos_token_ids)))
    assert info.value.token == next(iter(vocab.eos_token_ids))
    assert matcher.freeze() == before and matcher.num_consumed == 1
    assert matcher.try_advance([a, b, a]) == 2, "stops at the first rejected token"
    with pytest.raises(RollbackError):
        matcher.rollback(4)
    matcher.rollback(3)
    assert matcher.num_consumed == 0 and matcher.freeze() == grammar.matcher().freeze()


def test_forced_tokens_follow_a_literal():
    vocab = _vocab([b"{", b'"', b"name", b'"na', b"me", b":", b'{"name":'])
    grammar = Compiler(vocab).compile_gbnf('root ::= "{\\"name\\":" [0-9]')
    matcher = grammar.matcher()
    # several tokenizations exist, so no single token is forced at the start
    assert matcher.forced_tokens() == []
    matcher.advance(_ids(vocab, b'{"name":')[0])
    assert matcher.forced_tokens() == []  # a digit follows, but no digit token exists: nothing allowed
    single = _vocab([b"{", b"x", b"}"])
    m = Compiler(single).compile_regex("{x}").matcher()
    assert m.forced_tokens() == _ids(single, b"{", b"x", b"}")
    assert m.num_consumed == 0, "forced_tokens does not consume"


def test_empty_language_and_syntax_errors():
    vocab = _vocab([b"a"])
    with pytest.raises(EmptyLanguageError):
        Compiler(vocab).compile_gbnf("root ::= [^\\x00-\\U0010FFFF]")
    with pytest.raises(EmptyLanguageError):
        Compiler(vocab).compile_gbnf("root ::= loop\nloop ::= \"a\" loop")
    with pytest.raises(GrammarSyntaxError) as info:
        Compiler(vocab).compile_gbnf('root ::= "a" |\n  ( "b" ')
    assert info.value.line == 2 and "^" in str(info.value)
    with pytest.raises(UnsupportedGrammarError):
        Compiler(vocab).compile_regex(r"(a)\1")


@pytest.mark.parametrize("grammar", ["root ::= [^\\x00-\\U0010FFFF]", 'root ::= loop\nloop ::= "a" loop'])
def test_allowed_empty_language_rejects_everything(grammar):
    vocab = _vocab([b"a", b"aa"])
    compiled = Compiler(vocab, allow_empty_language=True).compile_gbnf(grammar)
    assert compiled.accepts_nothing
    matcher = compiled.matcher()
    assert not matcher.is_accepting()
    assert not allowed_tokens(matcher, vocab.logits_width).any(), "not even EOS"
    assert not matcher.allows(_ids(vocab, b"a")[0]) and not matcher.allows(min(vocab.eos_token_ids))
    with pytest.raises(TokenRejected):
        matcher.advance(_ids(vocab, b"a")[0])
    assert matcher.shortest_completion_text() is None
    # a nonempty language is unaffected by the option
    assert not Compiler(vocab, allow_empty_language=True).compile_gbnf('root ::= "a"').accepts_nothing


def test_empty_string_language_accepts_immediately():
    vocab = _vocab([b"a"])
    matcher = Compiler(vocab).compile_gbnf('root ::= ""').matcher()
    assert matcher.is_accepting()
    assert not allowed_tokens(matcher, vocab.logits_width)[: len(vocab) - 2].any()


def test_limits_raise_typed_errors():
    vocab = _vocab([b"a", b"b"])
    with pytest.raises(LimitExceeded) as info:
        Compiler(vocab, limits=Limits(max_dfa_states=10)).compile_regex("[ab]{0,50}")
    assert info.value.limit == "max_dfa_states"


def test_left_recursion_and_ambiguity():
    vocab = _vocab([b"a", b"+", b"a+", b"+a"])
    lark = 'start: e\ne: e "+" e | "a"\n'  # ambiguous and left-recursive
    matcher = Compiler(vocab).compile_lark(lark).matcher()
    for tok in _ids(vocab, b"a+", b"a", b"+a", b"+", b"a"):
        MatcherLaws(matcher, vocab).check_all()
        matcher.advance(tok)
    assert matcher.is_accepting()


def test_compiler_caches_and_compiled_grammar_is_shareable():
    vocab = _vocab([b"a", b"b", b"ab"])
    compiler = Compiler(vocab)
    grammar = compiler.compile_regex("(ab)+")
    assert compiler.compile_regex("(ab)+") is grammar
    assert compiler.compile_regex("(ab)*") is not grammar
    results = []

    def worker(tokens):
        m = grammar.matcher()
        ok = m.try_advance(tokens) == len(tokens)
        words = allocate_token_bitmask(1, vocab.logits_width)
        m.fill_mask(words, 0)
        results.append((ok, words.copy(), m.is_accepting()))

    threads = [threading.Thread(target=worker, args=(_ids(vocab, b"ab", b"a", b"b"),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(ok and acc for ok, _, acc in results)
    assert all(np.array_equal(results[0][1], w) for _, w, _ in results)


def test_fill_mask_checks_width():
    """Too narrow a row is refused; a wider one (serving engines size masks by the model's
    logits) is filled and its extra words cleared."""
    vocab = _vocab([b"a"])
    matcher = Compiler(vocab).compile_regex("a").matcher()
    with pytest.raises(ValueError, match="allocate_token_bitmask"):
        matcher.fill_mask(np.zeros((1, 0), dtype=np.int32), 0)
    wide = np.full((1, 7), -1, dtype=np.int32)
    matcher.fill_mask(wide, 0)
    assert wide[0, 1:].tolist() == [0] * 6 and wide[0, 0] != -1


def test_deeply_nested_input_compiles_or_is_a_typed_error():
    """Deep nesting compiles (every walk over it uses an explicit stack); past a bound, or past
    what a dependency's own recursion allows, it is a typed error, never a RecursionError."""
    vocab = _vocab([b"a"])
    assert Compiler(vocab).compile_regex("(" * 5000 + "a" + ")" * 5000).matcher().allows(0)
    schema: dict = {"type": "string"}
    for _ in range(10_010):  # past the document depth ceiling
        schema = {"type": "array", "items": schema}
    with pytest.raises(LimitExceeded) as info:
        Compiler(vocab).compile_json_schema(schema)
    assert info.value.limit == "schema_depth"
    with pytest.raises(LimitExceeded) as info:  # Lark's loader recurses per parenthesis
        Compiler(vocab).compile_lark("start: " + '("a" ' * 3000 + '"a"' + ")" * 3000)
    assert info.value.limit == "recursion"
    assert Compiler(vocab).compile_regex("(a)").matcher() is not None  # the compiler stays usable


def test_boundary_walks_served_from_the_collect_memo_give_the_same_masks():
    """Masks recomputed with every whole-mask and boundary memo dropped, so that nested
    (walk end, successor configurations) pairs come from ``_collect``'s memo, equal masks computed
    afresh — and equal the brute force of ``MatcherLaws``."""
    pieces = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"a", b"b", b"1", b'"a"', b'":', b'":[', b"],", b"1,",
              b'1]', b'"},', b"}]", b"},{", b'":{"']
    vocab = _vocab(pieces)
    gbnf = r'''
        root ::= value
        value ::= obj | arr | str | num
        obj ::= "{" ( str ":" value ( "," str ":" value )* )? "}"
        arr ::= "[" ( value ( "," value )* )? "]"
        str ::= "\"" [ab]* "\""
        num ::= [0-9]+
    '''
    text = [b"{", b'"a"', b":", b"[", b"1,", b"1]", b",", b'"', b"b", b'":{"', b"a", b'":', b"1", b"}", b"}"]
    fresh = Compiler(vocab).compile_gbnf(gbnf).matcher()
    replayed = Compiler(vocab).compile_gbnf(gbnf).matcher()
    runtime = replayed._rt
    memo = runtime._collect_memo
    hits = []
    plain_get = memo.get
    memo.get = lambda key: hits.append(plain_get(key) is not None) or plain_get(key)
    for piece in text:
        for _ in range(2):  # the second pass finds every nested pair memoised
            runtime._mask_memo = type(memo)(16)
            runtime._projected_memo = type(memo)(16)
            runtime._boundary_memo = type(memo)(16)
            assert np.array_equal(allowed_tokens(replayed, vocab.logits_width),
                                  allowed_tokens(fresh, vocab.logits_width)), piece
        MatcherLaws(fresh, vocab).check_all()
        (tok,) = _ids(vocab, piece)
        fresh.advance(tok)
        replayed.advance(tok)
    assert fresh.is_accepting() and replayed.is_accepting()
    assert any(hits)
