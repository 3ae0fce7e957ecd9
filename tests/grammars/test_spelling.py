"""``Spelling``: the fewest tokens, and exactly ``n``, against enumeration of every segmentation."""

from __future__ import annotations

import random

import pytest

from grammars import TokenVocabulary
from grammars.vocab.spelling import Spelling

PIECES = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"cab", b"\xe2", b"\xe2\x82\xac"]


def _segmentations(text: bytes, pieces: dict[bytes, int]) -> list[tuple[int, ...]]:
    if not text:
        return [()]
    out = []
    for k in range(1, len(text) + 1):
        if text[:k] in pieces:
            out += [(pieces[text[:k]],) + rest for rest in _segmentations(text[k:], pieces)]
    return out


@pytest.fixture(scope="module")
def spelling() -> Spelling:
    return Spelling.of(PIECES, range(len(PIECES)))


def test_fewest_and_exactly_agree_with_enumeration(spelling):
    rng = random.Random(0)
    for _ in range(300):
        text = b"".join(rng.choice([b"a", b"b", b"c", b"\xe2\x82\xac", b"d"]) for _ in range(rng.randint(0, 7)))
        every = _segmentations(text, spelling.pieces)
        fewest = spelling.fewest(text)
        if not every:
            assert fewest is None and all(spelling.exactly(text, n) is None for n in range(len(text) + 2))
            continue
        assert fewest is not None and len(fewest) == min(map(len, every)) and fewest in every
        counts = {len(s) for s in every}
        for n in range(len(text) + 2):
            found = spelling.exactly(text, n)
            assert (found is not None) == (n in counts), (text, n)
            if found is not None:
                assert len(found) == n and found in every


def test_exactly_prefers_the_longest_token_first(spelling):
    ids = {p: i for i, p in enumerate(PIECES)}
    assert spelling.exactly(b"abc", 1) == (ids[b"abc"],)
    assert spelling.exactly(b"abc", 2) == (ids[b"ab"], ids[b"c"])
    assert spelling.exactly(b"abc", 3) == (ids[b"a"], ids[b"b"], ids[b"c"])
    assert spelling.exactly(b"abc", 4) is None and spelling.exactly(b"abc", -1) is None


def test_unusable_tokens_are_never_spelled():
    spelling = Spelling.of(PIECES, [i for i, p in enumerate(PIECES) if p != b"abc"])
    assert spelling.fewest(b"abc") is not None and len(spelling.fewest(b"abc")) == 2
    assert spelling.exactly(b"abc", 1) is None


def test_a_vocabulary_spelling_skips_special_tokens():
    vocab = TokenVocabulary.from_bytes([b"x", b"y", b"xy", b""], eos_token_ids=[3], special_token_ids=[3])
    spelling = Spelling.of_vocabulary(vocab)
    assert Spelling.of_vocabulary(vocab) is spelling  # cached per vocabulary
    assert spelling.fewest(b"xyx") == (2, 0) and spelling.exactly(b"xyx", 3) == (0, 1, 0)
    assert 3 not in spelling.pieces.values()
