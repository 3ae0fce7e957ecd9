"""Code-point DFAs, read back from byte DFAs, against Python's ``re`` on random texts.

Texts mix ASCII, every UTF-8 length and the edges of each (U+007F/U+0080, U+07FF/U+0800, the
surrogate gap, U+FFFF/U+10000, U+10FFFF), where a wrong interval would first show.
"""

from __future__ import annotations

import random
import re

import pytest

from grammars.automata.codepoint import CodePointDFA
from grammars.errors import LimitExceeded
from grammars.frontends import parse_regex

ALPHABET = ["a", "b", "c", "x", "z", "-", "1", "\n", '"', "\\", "\x7f", "\x80", "é", "Ā", "\u07ff", "\u0800", "€",
            "\ud7ff", "\ue000", "\uffff", "\U00010000", "😀", "\U0010ffff"]
PATTERNS = [
    r"[a-z]+", r"x.*", r"é|€|😀", r'[^"\\]*', r"[a-c]+-\d{2}", r"[\u0100-\u07ff]{1,3}", r"[\U00010000-\U0010ffff]",
    r"(ab|a)*c?é+", r"[^a]", r"[\ud7ff\ue000]", r"[\x7f-\u0800]*z", r"(€|\U0010ffff)?[^\n]{2}",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_matches_like_python_re(pattern):
    dfa = CodePointDFA.of(parse_regex(pattern))
    rng = random.Random(pattern)
    for _ in range(2000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 4)))
        assert dfa.matches(text) == (re.fullmatch(pattern, text) is not None), (pattern, text)


def test_products_and_regex_round_trip():
    letters = CodePointDFA.of(parse_regex(r"[a-c]{1,3}"))
    names = CodePointDFA.of_strings(["ab", "c"])
    rest = letters.product(names, "diff")
    assert rest.matches("a") and rest.matches("abc") and not rest.matches("ab") and not rest.matches("c")
    again = CodePointDFA.of(parse_regex(rest.to_regex()))
    for text in ["", "a", "ab", "c", "cc", "abc", "abca", "é"]:
        assert again.matches(text) == rest.matches(text), text


def test_too_many_states_is_a_limit():
    with pytest.raises(LimitExceeded):
        CodePointDFA.of(parse_regex(r"[ab]*a[ab]{13}"))  # 2**14 states at the code-point level


@pytest.mark.parametrize("word", ["", "a", "name", "aaa", "naïve\U0001f600", "x" * 50])
def test_one_word_is_its_chain_of_characters(word):
    # the one-word shortcut of ``of_words`` gives the trie of the word (already minimal)
    dfa = CodePointDFA.of_words([word], max_states=len(word) or 1)
    assert (dfa.trans, dfa.accept) == (CodePointDFA.of_strings([word]).trans, CodePointDFA.of_strings([word]).accept)
    if word:
        with pytest.raises(LimitExceeded):
            CodePointDFA.of_words([word], max_states=len(word) - 1)
