"""Compiled regex matchers against Python's ``re.fullmatch`` on random strings, end to end.

The front end is tested against ``re`` on its own; this checks the whole path — IR, byte DFA,
terminal lowering, token trie, matcher — with tokenizations that split characters and lexemes.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammars import Compiler, TokenVocabulary

PATTERNS = [
    r"[a-z]+@[a-z]+\.(com|org)",
    r"\d{4}-\d{2}-\d{2}",
    r"(ab|a)*c?",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    r"[^\"\\]*",
    r"(é|ü|日本)+x?",
    r"a{2,5}b{0,3}",
    r"(\+|-)?[0-9]{1,3}(,[0-9]{3})*",
]
ALPHABET = "ab@.com0123456789-+,x\"\\éü日本c"


def _pieces() -> list[bytes]:
    """All single bytes plus multi-byte pieces that straddle characters and lexemes."""
    pieces = [bytes([b]) for b in range(256)]
    extra = ["ab", "a@", "@b", ".co", "om", "12", "-0", "0.", ".5", "é", "日", "本x", "aa", "bb", ",1", "00"]
    pieces += [p.encode() for p in extra]
    pieces += [b"\xc3", b"\xa9x", b"\xe6\x97", b"\xa5\xe6"]  # partial UTF-8
    return pieces


@pytest.fixture(scope="module")
def mixed_vocab():
    pieces = _pieces()
    return TokenVocabulary.from_bytes(pieces + [b""], eos_token_ids=[len(pieces)], special_token_ids=[len(pieces)])


def _segment(vocab, data: bytes, seed: int) -> list[int]:
    """A seeded random tokenization of ``data`` over the vocabulary's pieces."""
    import random

    rng = random.Random(seed)
    index = {p: i for i, p in enumerate(vocab.token_bytes) if p}
    out, i = [], 0
    while i < len(data):
        choices = [index[data[i:j]] for j in range(i + 1, min(len(data), i + 3) + 1) if data[i:j] in index]
        tok = rng.choice(choices)
        out.append(tok)
        i += len(vocab.token_bytes[tok])
    return out


def _accepts(compiled, tokens) -> bool:
    matcher = compiled.matcher()
    return matcher.try_advance(tokens) == len(tokens) and matcher.is_accepting()


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=12), seed=st.integers(0, 2**16))
def test_matcher_agrees_with_re_fullmatch(mixed_vocab, pattern, text, seed):
    compiled = Compiler(mixed_vocab).compile_regex(pattern)
    expected = re.fullmatch(pattern, text) is not None
    assert _accepts(compiled, _segment(mixed_vocab, text.encode(), seed)) == expected


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=16))
def test_llama3_canonical_tokenization_agrees_with_re(llama3_compiler, pattern, text):
    compiled = llama3_compiler.compile_regex(pattern)
    expected = re.fullmatch(pattern, text) is not None
    assert _accepts(compiled, llama3_compiler.vocab.encode(text)) == expected
